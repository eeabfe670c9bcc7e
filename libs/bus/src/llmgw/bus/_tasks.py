"""Work done off a service's hot path: started, kept until it ends, and its failure logged,
never swallowed (a lost end of a request would hold a slot; a lost ask would leave a record)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from llmgw.proto.errors import described

__all__ = ["spawn"]


def spawn(
    tasks: set[asyncio.Task], coro: Coroutine[Any, Any, Any], log: Any, what: str, event: str = "background work failed"
) -> asyncio.Task:
    """Run `coro` in the background, kept in `tasks` until it ends (so it is not collected, and
    can be cancelled); where it fails, `log` says `event`, naming `what` it was doing."""
    task = asyncio.create_task(coro)
    tasks.add(task)

    def ended(task: asyncio.Task) -> None:
        tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error(event, what=what, error=described(exc))

    task.add_done_callback(ended)
    return task
