"""The Nix files parse (no Nix daemon reaches a cache here, so parsing is what can be checked)."""

import shutil
import subprocess
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
