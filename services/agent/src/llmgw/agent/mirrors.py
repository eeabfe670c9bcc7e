"""Which mirror a node fetches a weights file from: every mirror holding a verified copy says so
(FILE_WHERE); one at the node's own site is taken first, then the others in the order they
answered (the nearest answer first), the next one when a fetch fails. A file no mirror verified
(placed on a mirror by hand) comes from whichever mirror holds it (FILE_STAT)."""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client

from llmgw.agent.cache import FetchError, WeightsCache
from llmgw.bus import BusError, call, call_all, get_logger
from llmgw.proto import FileInfo, FileRef, mirror

__all__ = ["fetch_nearest", "nearest"]

_log = get_logger("agent")


def nearest(answers: list[FileInfo | BusError], site: str) -> list[FileInfo]:
    """The verified copies among `answers` (in the order they came), those at `site` first."""
    copies = [a for a in answers if isinstance(a, FileInfo) and a.verified]
    return [a for a in copies if site and a.site == site] + [a for a in copies if not site or a.site != site]


async def _where(nc: Client, source: str, site: str, window_s: float, early: bool) -> list[FileInfo]:
    """The mirrors' verified copies of `source`, nearest first; `early`: the gathering stops at
    the first copy at `site` (or, with no site, the first copy)."""

    def enough(info: FileInfo) -> bool:
        return early and info.verified and (not site or info.site == site)

    return nearest(await call_all(nc, mirror.FILE_WHERE, FileRef(source=source), window_s=window_s, until=enough), site)


async def fetch_nearest(nc: Client, cache: WeightsCache, source: str, site: str, window_s: float) -> Path:
    """`source` in `cache`: from the nearest mirror with a verified copy, the next one when a
    fetch fails (a warning naming the mirror); from whichever mirror holds it when none verified
    it. FetchError when every copy failed, a BusError when no mirror holds it."""
    failed: dict[str, str] = {}
    for early in (True, False):  # first the nearest copy, at once; after a failure, every copy
        copies = [c for c in await _where(nc, source, site, window_s, early) if c.url not in failed]
        for info in copies:
            try:
                return await cache.fetch(info)
            except FetchError as exc:
                failed[info.url] = f"mirror {info.mirror or '?'} (site {info.site or '?'}): {exc}"
                _log.warning(
                    "fetch from a mirror failed; trying the next", source=source, mirror=info.mirror, error=str(exc)
                )
        if not failed:
            break
    if failed:
        raise FetchError(f"{source}: no mirror could give it: " + "; ".join(failed.values()))
    return await cache.fetch(await call(nc, mirror.FILE_STAT, FileRef(source=source)))
