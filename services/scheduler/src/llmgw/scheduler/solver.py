"""The HiGHS solvers the scheduler's passes use, its banner kept off the scheduler's stdout (its
log). HiGHS prints a two-line banner on fd 1, from C, when a process makes its first solver,
before any option can turn that off: the first one is made with fd 1 on /dev/null."""

from __future__ import annotations

import ctypes
import os
import sys
import threading

from llmgw.scheduler.core import highs

__all__ = ["quiet_highs"]

_first = threading.Lock()
_made = False
"""Whether this process made its first solver (the one that prints the banner)."""


def quiet_highs():
    """A HiGHS solver that prints nothing, the first one a process makes included."""
    global _made
    if _made:
        return highs()
    with _first:
        if _made:
            return highs()
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                h = highs()
                ctypes.CDLL(None).fflush(None)  # the banner out of C's buffer, into /dev/null
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        _made = True
        return h
