"""The Hub searched for GGUF models: the Hub's own search (the request `HfApi.list_models` makes,
on the client's session, read into its `ModelInfo`), then each model file's header read with HTTP
range requests, several at once (tens of kilobytes a file, never the file). Calls block; the mirror
runs a search in a thread.

The request is made here rather than through `list_models` for its retries: the client waits out
every 429's Retry-After, up to five times (minutes, for a search a person is waiting on). Here a
rate-limited search is tried once more where the Hub asks for a short wait, else refused at once
saying when to try again. The token goes to the Hub only: httpx drops the Authorization header when
a resolve URL redirects to another origin (the Hub's CDN).
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import huggingface_hub
from huggingface_hub.hf_api import ModelInfo
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from llmgw.gguf import GGUFError, read_model
from llmgw.mirror.hub import Hub
from llmgw.modelplan import facts_from_gguf
from llmgw.proto.errors import BadRequest, BusError, Internal, TooMany
from llmgw.proto.hub import HubFile, HubFound, HubModel, HubSearch

__all__ = ["READERS", "READ_WITHIN_S", "WAIT_AT_MOST_S", "search"]

READERS = 8
"""Headers read at once."""
READ_WITHIN_S = 45.0
"""Headers are read while this lasts from the search's start; those left are listed unread (the
catalog waits 80 s for the whole answer)."""
WAIT_AT_MOST_S = 3.0
"""A rate-limited search waits this long at most for the Hub's Retry-After, then tries once more."""
_PART = re.compile(r"-(\d{5})-of-\d{5}\.gguf$")


def _model_files(names: list[str]) -> list[str]:
    """The GGUF files that are models: not a split model's later parts, not a vision projector."""
    out = []
    for n in sorted(names):
        part = _PART.search(n)
        if n.endswith(".gguf") and not (part and part[1] != "00001") and not n.rsplit("/", 1)[-1].startswith("mmproj"):
            out.append(n)
    return out


def _found(hub: Hub, ask: HubSearch) -> list[ModelInfo]:
    """The Hub's models for the query, most downloaded first, with their files' names."""
    params = {"search": ask.text, "filter": ["gguf"], "sort": "downloads", "limit": ask.limit, "expand": _EXPAND}
    headers = build_hf_headers(token=hub.token or False)
    for attempt in (1, 2):
        try:
            r = get_session().get(f"{hub.endpoint}/api/models", params=params, headers=headers, timeout=30)
            if r.status_code != 429:
                hf_raise_for_status(r)
                return [ModelInfo(**{"siblings": None, **item}) for item in r.json()[: ask.limit]]
        except Exception as exc:  # the client's errors, translated at this boundary
            raise _said(hub, exc) from None
        wait = _retry_after(r)
        if attempt == 2 or wait > WAIT_AT_MOST_S:
            raise TooMany(
                f"{hub.endpoint} rate-limits searches now: try again in {wait:.0f} s"
                + (" (it refused twice)" if attempt == 2 else "")
                + "; a token (HF_TOKEN where the mirror runs) gets a higher quota"
            )
        time.sleep(wait)
    raise AssertionError("unreachable")


_EXPAND = ["siblings", "downloads", "likes", "lastModified", "gated", "sha"]


def _retry_after(response) -> float:
    raw = response.headers.get("retry-after", "") if response is not None else ""
    try:
        return max(float(raw), 0.0)
    except ValueError:
        return 60.0


def _said(hub: Hub, exc: Exception) -> BusError:
    status = getattr(getattr(exc, "response", None), "status_code", 0)
    if status in (401, 403):
        return BadRequest(
            f"{hub.endpoint} refused the search ({status}): the token is wrong or expired; set HF_TOKEN where "
            "the mirror service runs (or token_file in its config), or none"
        )
    if status >= 500:
        return Internal(f"{hub.endpoint} is not answering searches now ({status}); try again later")
    if isinstance(exc, OSError) or "ConnectError" in type(exc).__name__:
        return Internal(f"cannot reach {hub.endpoint} to search it: {type(exc).__name__}")
    said = f" {status}" if status else ""
    return BadRequest(
        f"{hub.endpoint} did not answer a search as a Hugging Face Hub does ({type(exc).__name__}{said}): "
        "is hub_endpoint (or HF_ENDPOINT where the mirror runs) a Hub?"
    )


def _read(client: httpx.Client, hub: Hub, repo: str, commit: str, path: str) -> tuple[HubFile, int]:
    """One file's header, read by range requests; the file (with why, where it does not read) and
    the bytes that took."""
    source = f"{repo}@{commit}/{path}"
    url = huggingface_hub.hf_hub_url(repo, path, revision=commit, endpoint=hub.endpoint)
    read = 0

    def counted(response: httpx.Response) -> None:
        nonlocal read
        read += int(response.headers.get("content-length", 0) or 0) if response.status_code == 206 else 0

    client.event_hooks["response"] = [counted]
    try:
        header = read_model(url, client)
    except Exception as exc:  # one file's failure is that file's: the search goes on
        why = str(exc) if isinstance(exc, GGUFError) else f"{type(exc).__name__}: {exc}"
        return HubFile(path=path, source=source, error=f"its header did not read: {why}"[:300]), read
    return (
        HubFile(
            path=path,
            source=source,
            size=header.tensor_bytes,
            parts=header.split_count,
            facts=facts_from_gguf(header),
        ),
        read,
    )


def search(hub: Hub, ask: HubSearch, within_s: float = READ_WITHIN_S) -> HubFound:
    """The Hub's GGUF models for `ask.text` with each model file's header (the first `ask.files`
    files over all models, while `within_s` lasts; the rest are listed, unread, saying why). A
    BusError says what the Hub refused."""
    deadline = time.monotonic() + within_s
    models = _found(hub, ask)
    work: list[tuple[int, str, str, str]] = []
    out: list[HubModel] = []
    for info in models:
        names = [s.rfilename for s in info.siblings or []]
        commit = info.sha or ""
        out.append(
            HubModel(
                repo=info.id,
                commit=commit,
                downloads=info.downloads or 0,
                likes=info.likes or 0,
                updated=str(info.last_modified or ""),
                gated=bool(info.gated),
            )
        )
        work += [(len(out) - 1, info.id, commit, path) for path in _model_files(names)]
    taken, left = work[: ask.files], work[ask.files :]
    headers = {"user-agent": "llmgw-mirror"}
    if hub.token:
        headers["authorization"] = f"Bearer {hub.token}"
    total = 0

    def one(item: tuple[int, str, str, str]) -> tuple[int, HubFile, int]:
        i, repo, commit, path = item
        if time.monotonic() > deadline:
            why = f"not read: the search's {within_s:.0f} s ran out (the Hub answered slowly); search again"
            return i, HubFile(path=path, source=f"{repo}@{commit}/{path}", error=why), 0
        with httpx.Client(timeout=15, follow_redirects=True, headers=headers) as client:
            file, read = _read(client, hub, repo, commit, path)
        return i, file, read

    attempted = 0
    with ThreadPoolExecutor(READERS) as pool:
        for i, file, read in pool.map(one, taken):
            out[i].files.append(file)
            total += read
            attempted += not file.error.startswith("not read")
    for i, repo, commit, path in left:
        why = f"not read: a search reads {ask.files} files' headers at most (ask for more with files)"
        out[i].files.append(HubFile(path=path, source=f"{repo}@{commit}/{path}", error=why))
    return HubFound(models=out, endpoint=hub.endpoint, headers_read=attempted, bytes_read=total)
