"""An earlier release of llmgw run beside today's: its source at a commit of this repository
(`git archive`, so a clone must hold its history), put ahead of the installed packages on
PYTHONPATH, so that `python -m llmgw.ctl` and every service it starts run that release with
today's dependencies. The bandwidth kernel stays today's (built; its interface has not changed)."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

__all__ = ["BEFORE_TENANTS", "earlier"]

ROOT = Path(__file__).resolve().parents[1]

BEFORE_TENANTS = "c9c0e25"
"""The last commit before users and tenants (58fa9c3): keys and projects had no tenant then."""


def earlier(commit: str, into: Path) -> dict[str, str]:
    """The environment that runs release `commit`, unpacked under `into`."""
    made = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit], capture_output=True)
    assert made.returncode == 0, (
        f"git archive {commit}: {made.stderr.decode().strip()}; these tests need the repository's history "
        "(a whole clone, not --depth)"
    )
    with tarfile.open(fileobj=io.BytesIO(made.stdout)) as tar:
        tar.extractall(into, filter="data")
    paths = [into / "proto" / "src"]
    paths += sorted(p for p in (into / "libs").glob("*/src") if p.parent.name != "membw")
    paths += sorted((into / "services").glob("*/src"))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in paths)}
