"""Helpers for the processes services start and the host they run on: free ports, children that
die with their parent, files deleted under a root, the host's memory, the collector paused."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

__all__ = ["collector_paused", "delete_under", "die_with_parent", "free_port", "meminfo_mb", "write_private"]

_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def die_with_parent() -> None:
    """For `preexec_fn`: the child gets SIGTERM when its parent dies, so nothing is orphaned."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def delete_under(root: Path, relative: str) -> bool:
    """Delete `root/relative` and the '.<name>.*' files beside it; prune the folders it leaves empty.

    Whether the file was there. `relative` must stay under `root` (a ValueError says so).
    """
    root = root.resolve()
    path = (root / relative).resolve()
    if root not in path.parents:
        raise ValueError(f"'{relative}' is not under {root}")
    existed = path.is_file()
    path.unlink(missing_ok=True)
    for side in path.parent.glob(f".{path.name}.*") if path.parent.is_dir() else ():
        side.unlink(missing_ok=True)
    folder = path.parent
    while folder != root and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent
    return existed


def meminfo_mb(text: str) -> tuple[int, int]:
    """(total, available) MiB from the text of /proc/meminfo."""
    fields = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            fields[key] = int(parts[0])
    return fields["MemTotal"] // 1024, fields.get("MemAvailable", fields.get("MemFree", 0)) // 1024


def write_whole(path: Path, data: bytes) -> None:
    """Write `data` to `path` by a rename, so a reader never sees half of it."""
    part = path.with_suffix(".part")
    part.write_bytes(data)
    part.replace(path)


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner alone (0600), its folder made if missing: a
    secret's file (credentials, engine secrets)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(path, 0o600)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block with Python's cycle collector off, then let it take its youngest generation
    if that is due (what the block's first allocation after would have set off).

    For a large computation that makes no reference cycles: its objects are freed by their
    counts, and a collection while it runs finds nothing. It would walk what the block holds,
    move it to the oldest generation, and once that grew by a quarter walk every object the
    process tracks (the scheduler's pass at 10,000 nodes: one such walk a pass). Were there a
    cycle after all, it waits for the next collection; nothing is lost. The collector's own
    state is kept: left off if it was off."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
            if gc.get_count()[0] > gc.get_threshold()[0]:
                gc.collect(0)
