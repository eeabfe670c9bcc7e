"""A machine's releases and its upgrade's two files, shared by its supervisor (`llmgw up`,
`llmgw node join`) and its agent: a release is a folder <data>/releases/<VERSION> whose
bin/python runs it (a virtual environment with that version of llmgw installed); the supervisor
keeps <data>/up/release.json (what it runs, how far an upgrade is) and follows
<data>/up/release-ask.json, which the agent writes when asked for another release."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

import msgspec

from llmgw.bus._proc import write_whole
from llmgw.proto.release import INSTALLED, Release, ReleaseAsk

T = TypeVar("T")

__all__ = ["read_release", "read_release_ask", "release_python", "write_release", "write_release_ask"]


def _state(home: Path) -> Path:
    return home / "up" / "release.json"


def _ask(home: Path) -> Path:
    return home / "up" / "release-ask.json"


def release_python(home: Path, version: str, installed: str) -> Path:
    """The Python that runs `version` here (`installed`: the supervisor's own, for INSTALLED);
    ValueError saying what is missing where it is not installed."""
    if version == INSTALLED:
        return Path(installed)
    python = home / "releases" / version / "bin" / "python"
    if not os.access(python, os.X_OK):
        raise ValueError(
            f"release {version} is not installed here: {python} is not there; install it first "
            f"(python -m venv {python.parents[1]} && {python} -m pip install llmgw=={version})"
        )
    return python


def _read(path: Path, kind: type[T]) -> T | None:
    try:
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None  # none written yet, or not one this release reads


def read_release(home: Path) -> Release | None:
    """What the supervisor over `home` says it runs (None: none keeps it there)."""
    return _read(_state(home), Release)


def write_release(home: Path, release: Release) -> None:
    """The supervisor's word on what it runs."""
    _state(home).parent.mkdir(parents=True, exist_ok=True)
    write_whole(_state(home), msgspec.json.encode(release))


def read_release_ask(home: Path) -> ReleaseAsk | None:
    """The release the agent was asked for last (None: never)."""
    return _read(_ask(home), ReleaseAsk)


def write_release_ask(home: Path, ask: ReleaseAsk) -> None:
    """Ask the supervisor over `home` for another release."""
    write_whole(_ask(home), msgspec.json.encode(ask))
