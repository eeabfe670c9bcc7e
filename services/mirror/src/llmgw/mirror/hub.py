"""Hugging Face through its own client (`huggingface_hub`): a revision resolved to its commit with
what the Hub published of each file, and one file downloaded (resumably) into a staging folder.

The client checks a download's size only, never its hash: the mirror verifies every file itself
(`llmgw.mirror.fetches`). `hf_hub_download` resumes a cut connection within one call, but a
partial file left by a stopped process has a name of its own that the next call ignores: so the
mirror keeps its own `<file>.incomplete` and has the client's `http_get` continue it with a Range
request. Calls block; the mirror runs them in threads. The token goes to the Hub only (never to a
CDN on another origin), and is never logged or published.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import huggingface_hub
from huggingface_hub import errors as hf_errors
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers

from llmgw.mirror.plan import Published
from llmgw.proto import MirroredFile, MirroredRepo
from llmgw.proto.errors import BadRequest, BusError, Internal, NotFound

__all__ = ["Hub", "Stopped"]

_COMMIT = re.compile(r"[0-9a-f]{40}")
_WHERE_SET = (
    "the mirror service fetches from its hub_endpoint, else HF_ENDPOINT in its own environment (set it "
    "where the mirror runs, or before `llmgw up`; not in the shell `llmgw ctl` runs in)"
)


class Stopped(Exception):
    """A download stopped because the mirror is stopping (its partial file is kept, to resume)."""


class Hub:
    """One Hub endpoint (huggingface.co, or any that speaks its API) and the token for it."""

    def __init__(self, endpoint: str, token: str = "") -> None:
        self.endpoint = endpoint.rstrip("/")
        self._token = token
        self._api = huggingface_hub.HfApi(endpoint=self.endpoint, token=token or False)

    @property
    def token(self) -> str:
        """The token for this Hub ("" for none): for its own origin only, never logged."""
        return self._token

    def resolve(self, repo: str, revision: str) -> tuple[str, list[Published]]:
        """The 40-hex commit `revision` names now, and every file published at it; a BusError
        saying what is wrong (no such repo, revision, gated, not a Hub)."""
        try:
            info = self._api.model_info(repo, revision=revision, files_metadata=True)
        except Exception as exc:  # the client's errors, translated at this boundary
            raise self._explain(exc, repo, revision) from None
        if not isinstance(info.sha, str) or not _COMMIT.fullmatch(info.sha):
            raise BadRequest(f"{self.endpoint} named no commit for {repo}@{revision}: is it a Hugging Face Hub?")
        files = [
            Published(
                path=s.rfilename,
                size=s.size or 0,
                blob_id=s.blob_id or "",
                sha256=(s.lfs.sha256 if s.lfs else "") or "",
            )
            for s in info.siblings or []
        ]
        return info.sha, files

    def check_access(self, repo: str, commit: str, path: str) -> None:
        """Raise where the mirror may read the repo's metadata but not its files (a gated repo
        whose licence the token's account has not accepted, or no token)."""
        url = huggingface_hub.hf_hub_url(repo, path, revision=commit, endpoint=self.endpoint)
        try:
            huggingface_hub.get_hf_file_metadata(url, token=self._token or False, endpoint=self.endpoint)
        except Exception as exc:
            raise self._explain(exc, repo, commit, path) from None

    def download(
        self,
        entry: MirroredRepo,
        file: MirroredFile,
        staging: Path,
        progress: Callable[[int], None],
        stop: threading.Event,
    ) -> Path:
        """Download one file of a repo at its commit into `staging` (resuming a partial one left
        there), telling `progress` the bytes it has; raises Stopped once `stop` is set."""
        repo, commit, path = entry.repo, entry.commit, file.path
        url = huggingface_hub.hf_hub_url(repo, path, revision=commit, endpoint=self.endpoint)
        dest = staging / path
        part = dest.with_name(dest.name + ".incomplete")
        part.parent.mkdir(parents=True, exist_ok=True)
        try:
            meta = huggingface_hub.get_hf_file_metadata(url, token=self._token or False, endpoint=self.endpoint)
            done = part.stat().st_size if part.exists() else 0
            if meta.size is not None and done > meta.size:  # not this file's start: begin again
                part.unlink()
                done = 0
            same_origin = urlsplit(meta.location)[:2] == urlsplit(self.endpoint)[:2]
            headers = build_hf_headers(token=(self._token or False) if same_origin else False)
            with open(part, "ab") as out:
                http_get(
                    meta.location,
                    out,
                    resume_size=done,
                    headers=headers,
                    expected_size=meta.size,
                    tqdm_class=_bar(progress, stop),
                )
        except Stopped:
            raise
        except Exception as exc:
            raise self._explain(exc, repo, commit, path) from None
        part.replace(dest)
        return dest

    def _explain(self, exc: Exception, repo: str, revision: str, path: str = "") -> BusError:
        """The client's error as one a person can act on (the token never appears)."""
        where = f"{repo}@{revision}"
        if isinstance(exc, hf_errors.GatedRepoError):
            return BadRequest(
                f"{repo} is gated: accept its licence at {self.endpoint}/{repo} with your account, then give the "
                "mirror that account's token (HF_TOKEN where the mirror service runs, or token_file in its config)"
            )
        if isinstance(exc, hf_errors.RepositoryNotFoundError):
            hint = (
                "check the name, and that the token's account may read it"
                if self._token
                else "check the name; a private repo needs a token (HF_TOKEN where the mirror service runs)"
            )
            return NotFound(f"{self.endpoint} has no repo {repo} ({hint})")
        if isinstance(exc, hf_errors.RevisionNotFoundError):
            return NotFound(f"{repo} has no revision '{revision}' (a branch, tag or commit): check it on the Hub")
        if isinstance(exc, hf_errors.EntryNotFoundError) and path:
            return NotFound(f"{where} has no file {path}")
        status = getattr(getattr(exc, "response", None), "status_code", 0)
        if status in (401, 403):
            return BadRequest(
                f"{self.endpoint} refused {where} ({status}): the token is missing, wrong, or its account may not "
                "read this repo; set HF_TOKEN where the mirror service runs, or token_file in its config"
            )
        if status == 429 or status >= 500:
            return Internal(f"{self.endpoint} is not answering {where} now ({status}); try again later")
        if isinstance(exc, hf_errors.HfHubHTTPError | ValueError | KeyError | TypeError):
            return BadRequest(
                f"{self.endpoint} did not answer as a Hugging Face Hub does ({type(exc).__name__}: "
                f"{_short(exc)}): {_WHERE_SET}"
            )
        if isinstance(exc, OSError) or "ConnectError" in type(exc).__name__:
            if not path:
                return Internal(f"cannot reach {self.endpoint} ({_short(exc)}): {_WHERE_SET}")
            return Internal(f"fetching {where}/{path} from {self.endpoint} failed: {_short(exc)}")
        return Internal(f"fetching {where} from {self.endpoint} failed: {type(exc).__name__}: {_short(exc)}")


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) < 300 else text[:297] + "..."


def _bar(progress: Callable[[int], None], stop: threading.Event) -> type:
    """A progress 'bar' for the client that draws nothing: it tells `progress` the bytes a file
    has (resumed ones included) and stops the download once `stop` is set."""

    class Bar:
        def __init__(self, *_, initial: int = 0, **__) -> None:
            self.n = initial or 0
            progress(self.n)

        def __enter__(self) -> Bar:
            return self

        def __exit__(self, *_) -> None:
            return None

        def update(self, n: int = 1) -> None:
            if stop.is_set():
                raise Stopped()
            self.n += n or 0
            progress(self.n)

        def close(self) -> None:
            return None

    return Bar
