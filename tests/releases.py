"""An earlier release of llmgw run beside today's: its source at a commit of this repository
(`git archive`, so a clone must hold its history), put ahead of the installed packages on
PYTHONPATH, so that `python -m llmgw.ctl` and every service it starts run that release with
today's dependencies. The bandwidth kernel stays today's (built; its interface has not changed)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

__all__ = ["BEFORE_TENANTS", "earlier", "install"]

ROOT = Path(__file__).resolve().parents[1]

BEFORE_TENANTS = "c9c0e25"
"""The last commit before users and tenants (58fa9c3): keys and projects had no tenant then."""


def earlier(commit: str, into: Path) -> dict[str, str]:
    """The environment that runs release `commit`, unpacked under `into`."""
    git = ["git", "-C", str(ROOT)]
    shallow = subprocess.run([*git, "rev-parse", "--is-shallow-repository"], capture_output=True, text=True)
    if shallow.stdout.strip() == "true":  # a clone made with --depth: its history from where it came
        subprocess.run([*git, "fetch", "--unshallow", "--quiet"], capture_output=True)
    made = subprocess.run([*git, "archive", "--format=tar", commit], capture_output=True)
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


def install(home: Path, name: str, script: str = "") -> Path:
    """An installed release `name`: a virtual environment of its own that sees this one's packages
    (today's code under another name), or a `script` standing for a broken one."""
    folder = home / "releases" / name
    python = folder / "bin" / "python"
    if script:
        python.parent.mkdir(parents=True)
        python.write_text(script)
        python.chmod(0o755)
        return python
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    [site] = folder.glob("lib/python3*/site-packages")
    ours = sysconfig.get_paths()["purelib"]  # its .pth files too: the workspace's packages
    (site / "today.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return python
