# llmgw recipes. `./dev <recipe>` installs what is missing first; `just --list` shows them all.

set positional-arguments

venv := justfile_directory() / ".venv" / "bin"
export PATH := venv + ":" + env_var("PATH")

# List the recipes
default:
    @just --list

# Run llmgw on this machine: NATS, every service, an agent and a demo model
up *args:
    @llmgw up "$@"

# Run the whole test suite: the house rules (format, lint, import contract), unit tests beside
# each package, cross-service tests in tests/, on two workers, each test file whole on one
# (about 20 minutes on 2 cores; one process, `just test -n 0`, takes 35). conftest.py keeps
# files that take the same fixed ports on one worker.
test *args:
    python -m pytest -n 2 --dist loadfile "$@"

# Run one service alone, as Nix and systemd do (catalog, scheduler, mirror, router, agent)
svc name *args:
    llmgw service "$@"

# Lint with ruff
lint:
    ruff check .

# Format with ruff
fmt:
    ruff format .

# Run the benchmarks under tests/bench and print their tables
bench:
    python tests/bench/membw.py
    python tests/bench/cpu_speed.py
    python tests/bench/plan_accuracy.py
    python tests/bench/experts.py
    python tests/bench/plan_fleet.py
    python tests/bench/scheduler.py
    python tests/bench/placement.py
    python tests/bench/gateway.py
    python tests/bench/floods.py
    python tests/bench/routing.py
    python tests/bench/routing_sim.py
    python tests/bench/first_answer.py
    python tests/bench/mirror.py
    python tests/bench/hub_search.py
    python tests/bench/usage.py
    python tests/bench/guard.py
    python tests/bench/guard_kinds.py
    python tests/bench/knowledge.py
    python tests/bench/tools.py
    python tests/bench/providers.py

# Regenerate the golden JSON Schema of every proto message and docs/subjects.md from the endpoint tables
proto-schema:
    python -m llmgw.proto > proto/schema/llmgw.v1.json
    python -m llmgw.proto subjects > docs/subjects.md

# The web console's tests, the browser ones in a real Chromium (screenshots of each page in build/screenshots/)
console *args:
    python -m pytest tests/console "$@"
    @echo "screenshots: build/screenshots/"

# The whole fault suite (kills, outages, floods), long: its fast cases also run in `./dev test`
chaos *args:
    python -m pytest -m chaos "$@"

# The long load and upgrade suites (100,000-row lists, upgrades under load): smaller cases of
# each run in `./dev test`
long *args:
    python -m pytest -m long "$@"
