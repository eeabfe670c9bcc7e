"""The rules of the house (../shared/DESIGN.md) as checks: formatting and lint, the import
contract between packages, and rooms of a size a newcomer can read."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("agent", "catalog", "ctl", "mirror", "router", "scheduler")
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")

IMPURE = (
    "nats",
    "aiohttp",
    "httpx",
    "litestar",
    "asyncio",
    "zmq",
    "uvicorn",
    "socket",
    "subprocess",
    "ctypes",
    "llmgw.bus",
)
"""What a pure module never imports (llmgw.bus is the NATS shell's: errors are in llmgw.proto.errors)."""

MAX_LINES = 400
"""The longest source file (services, libs, proto)."""


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

PURE_MARK = re.compile(r"\b(?i:without|no)\s+I/O\b|\b[Pp]ure\b[^.\n]{0,24}[:(]")
"""How a module says it decides without I/O, in its docstring ("The catalog's rules, without
I/O: ...", "Pure: no I/O."); a package that says so says it of every module under it."""


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


PURE = tuple(sorted(name for name, path in MODULES.items() if PURE_MARK.search(_docstring(path))))
"""The modules (and packages) that say they are pure: no network, no event loop, no clock read."""


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


ROUTER_ROOMS = {
    "console": 6,
    "admin": 5,
    "http": 4,
    "request": 3,
    "notify": 3,
    "routing": 2,
    "accounts": 2,
    "guard": 2,
    "knowledge": 2,
    "providers": 2,
    "tools": 3,
    "usage": 1,
}
"""The router's rooms, top down: a request goes down them, and a room imports only rooms below it
(or beside it, where their level is the same only for none: routing and accounts never meet)."""


@pytest.mark.parametrize(
    "name",
    sorted(
        n for n in MODULES if n.split(".")[2:3] and n.split(".")[2] in ROUTER_ROOMS and n.startswith("llmgw.router.")
    ),
)
def test_a_router_room_imports_only_rooms_below_it(name):
    mine = ROUTER_ROOMS[name.split(".")[2]]
    up = sorted(
        i
        for i in _imports(MODULES[name])
        if i.startswith("llmgw.router.")
        and i.split(".")[2] in ROUTER_ROOMS
        and i.split(".")[2] != name.split(".")[2]
        and ROUTER_ROOMS[i.split(".")[2]] >= mine
    )
    assert not up, f"{name} imports {up}, a room at its level or above: pass what it needs down instead"


def test_libs_and_proto_never_import_a_service():
    wrong = {
        name: sorted(i for i in _imports(path) if any(_within(i, f"llmgw.{s}") for s in SERVICES))
        for name, path in MODULES.items()
        if name.split(".")[1] not in SERVICES
    }
    assert not {k: v for k, v in wrong.items() if v}


def test_every_service_and_the_contracts_have_a_pure_core():
    cores = ["llmgw.proto", "llmgw.modelplan", "llmgw.router.request.core"]
    cores += [f"llmgw.{s}.core" for s in SERVICES if s not in ("ctl", "router")]
    assert [c for c in cores if c not in PURE] == [], "say so in its docstring: 'without I/O'"


def test_no_source_file_is_longer_than_a_newcomer_reads():
    long = {str(p.relative_to(ROOT)): n for p in MODULES.values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by what they do (at most {MAX_LINES} lines): {long}"


def _declared_all(path: Path) -> list[str] | None:
    """The names a module's `__all__` lists (None: it has none)."""
    for node in ast.parse(path.read_text()).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
            return [ast.literal_eval(e) for e in node.value.elts]
    return None


def test_every_module_declares_all_and_has_what_it_lists():
    missing, absent = [], {}
    for name, path in MODULES.items():
        if path.name.startswith("__") or not path.stat().st_size:
            continue
        listed = _declared_all(path)
        if listed is None:
            missing.append(name)
            continue
        tree = ast.parse(path.read_text())
        defined = {
            n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        }
        defined |= {
            t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
        }
        defined |= {
            n.target.id for n in ast.walk(tree) if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }
        defined |= {
            a.asname or a.name.split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.Import | ast.ImportFrom)
            for a in n.names
        }
        if wrong := [n for n in listed if n not in defined]:
            absent[name] = wrong
    assert not missing, f"declare __all__ in {sorted(missing)}"
    assert not absent, f"__all__ lists names these modules do not have: {absent}"


def test_the_tree_is_formatted():
    assert RUFF, "ruff is in the dev group: run ./dev to install it"
    done = subprocess.run([RUFF, "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"run `just fmt`:\n{done.stdout}{done.stderr}"


def test_the_lint_is_clean():
    assert RUFF, "ruff is in the dev group: run ./dev to install it"
    done = subprocess.run([RUFF, "check", "--output-format", "concise", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"run `just lint`:\n{done.stdout}{done.stderr}"
