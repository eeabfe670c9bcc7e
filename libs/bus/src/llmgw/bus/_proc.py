"""Helpers for the processes services start: free ports, children that die with their parent."""

from __future__ import annotations

import ctypes
import signal
import socket

__all__ = ["die_with_parent", "free_port"]

_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def die_with_parent() -> None:
    """For `preexec_fn`: the child gets SIGTERM when its parent dies, so nothing is orphaned."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
