"""The rules of the house (../shared/DESIGN.md) as checks: formatting and lint, the import
contract between packages, and rooms of a size a newcomer can read."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("agent", "catalog", "ctl", "mirror", "router", "scheduler")
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")

PURE = (
    "llmgw.proto",
    "llmgw.modelplan",
    "llmgw.agent.core",
    "llmgw.catalog.core",
    "llmgw.catalog.declared",
    "llmgw.ctl.access_table",
    "llmgw.ctl.changes",
    "llmgw.ctl.keeper",
    "llmgw.ctl.sentences",
    "llmgw.ctl.tables",
    "llmgw.mirror.checks",
    "llmgw.mirror.core",
    "llmgw.mirror.plan",
    "llmgw.router.balance",
    "llmgw.router.core",
    "llmgw.router.counters",
    "llmgw.router.errors",
    "llmgw.router.kvevents",
    "llmgw.router.limits",
    "llmgw.router.outcome",
    "llmgw.router.prepare",
    "llmgw.router.rollup",
    "llmgw.router.seats",
    "llmgw.scheduler.core",
    "llmgw.scheduler.placement",
)
"""Modules (and packages) that decide without I/O: no network, no event loop, no clock they read."""

IMPURE = ("nats", "aiohttp", "httpx", "litestar", "asyncio", "zmq", "uvicorn", "socket", "subprocess", "llmgw.bus")
"""What a pure module never imports (llmgw.bus is the NATS shell's: errors are in llmgw.proto.errors)."""

MAX_LINES = 400
"""The longest file under services/."""


def _modules() -> dict[str, Path]:
    """Every module of the workspace's packages, by dotted name."""
    out = {}
    for src in [ROOT / "proto" / "src", *(ROOT / "libs").glob("*/src"), *(ROOT / "services").glob("*/src")]:
        for path in src.rglob("*.py"):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(path: Path) -> set[str]:
    """The modules `path` imports, absolute, top to bottom (TYPE_CHECKING blocks included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


MODULES = _modules()


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.split(".")[1:2] and n.split(".")[1] in SERVICES))
def test_a_service_never_imports_another_service(name):
    mine = name.split(".")[1]
    others = [f"llmgw.{s}" for s in SERVICES if s != mine]
    wrong = sorted(i for i in _imports(MODULES[name]) for o in others if _within(i, o))
    if mine == "ctl":  # `llmgw service NAME` and `llmgw up` start services by their entry points only
        wrong = []
    assert not wrong, f"{name} imports {wrong}: talk over NATS with llmgw.proto messages, or move it to libs/"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if any(_within(n, p) for p in PURE)))
def test_a_pure_module_never_imports_io(name):
    wrong = sorted(i for i in _imports(MODULES[name]) if any(_within(i, bad) for bad in IMPURE))
    assert not wrong, f"{name} is a pure core but imports {wrong}: move the I/O to its service shell"


CLOCKS = {("time", "time"), ("time", "monotonic"), ("time", "perf_counter"), ("time", "sleep"), ("datetime", "now")}
"""What a pure module never calls: time is passed in."""


@pytest.mark.parametrize("name", sorted(n for n in MODULES if any(_within(n, p) for p in PURE)))
def test_a_pure_module_never_reads_the_clock(name):
    read = sorted(
        f"{node.func.value.id}.{node.func.attr} (line {node.lineno})"
        for node in ast.walk(ast.parse(MODULES[name].read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and (node.func.value.id, node.func.attr) in CLOCKS
    )
    assert not read, f"{name} is a pure core but reads the clock: {read}; take `now` as an argument"


def test_libs_and_proto_never_import_a_service():
    wrong = {
        name: sorted(i for i in _imports(path) if any(_within(i, f"llmgw.{s}") for s in SERVICES))
        for name, path in MODULES.items()
        if name.split(".")[1] not in SERVICES
    }
    assert not {k: v for k, v in wrong.items() if v}


def test_every_pure_module_named_here_exists():
    assert all(any(_within(n, p) for n in MODULES) for p in PURE)


def test_no_file_under_services_is_longer_than_a_newcomer_reads():
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "services").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these by what they do (at most {MAX_LINES} lines): {long}"


def test_every_module_declares_all():
    missing = sorted(
        name
        for name, path in MODULES.items()
        if not path.name.startswith("__") and "__all__" not in path.read_text() and path.stat().st_size
    )
    assert not missing


def test_the_tree_is_formatted():
    assert RUFF, "ruff is in the dev group: run ./dev to install it"
    done = subprocess.run([RUFF, "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"run `just fmt`:\n{done.stdout}{done.stderr}"


def test_the_lint_is_clean():
    assert RUFF, "ruff is in the dev group: run ./dev to install it"
    done = subprocess.run([RUFF, "check", "--output-format", "concise", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"run `just lint`:\n{done.stdout}{done.stderr}"
