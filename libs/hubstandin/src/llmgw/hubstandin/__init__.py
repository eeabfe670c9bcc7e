"""A local stand-in for the Hugging Face Hub, for tests and benchmarks; not the Hub.

It answers the part of the Hub's HTTP API that the real `huggingface_hub` client calls to read a model
repo: `GET /api/models/{repo}[/revision/{rev}]` (`?blobs=true` adds sizes and hashes),
`GET /api/models/{repo}/tree/{rev}[/{path}]`, and `HEAD`/`GET /{repo}/resolve/{rev}/{path}`. Plain files
come from the Hub's origin with `ETag` (git blob sha1); LFS files are a 302 to a second origin (the
"CDN", another port) with `X-Linked-Etag` (sha256) and `X-Linked-Size`, served there with Range support.
Errors carry the Hub's `X-Error-Code`. No `X-Xet-*` header is ever sent, so the client uses plain HTTP.

Which files are LFS: a weight-like suffix (`.gguf`, `.safetensors`, `.bin`, `.pt`, `.pth`, `.ckpt`,
`.pkl`, `.onnx`, `.h5`, `.msgpack`, ... as in the Hub's default .gitattributes) or over 10 MiB, unless
`add_repo(lfs=...)` names them. As on the Hub, an LFS file's `blobId`/`oid` is the sha1 of its LFS pointer,
so its content is checked against `lfs.sha256`; a plain file's content against its `blobId`.
"""

import hashlib
import itertools
import threading
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import NamedTuple, Self

from llmgw.hubstandin._repo import File, Repo, hash_file, is_lfs_by_default
from llmgw.hubstandin._server import Server

__all__ = ["Asked", "HubStandIn", "is_lfs_by_default"]


class Asked(NamedTuple):
    """One request the stand-in answered: `origin` is "hub" or "cdn"; `range` the Range header, if any."""

    method: str
    path: str
    range: str | None
    origin: str


class HubStandIn:
    """A Hub stand-in on 127.0.0.1: two listening sockets (the Hub, and the CDN that LFS bytes come from).

    Use `with HubStandIn() as hub:` (or `start()`/`stop()`), pass `endpoint=hub.url` to the client, publish
    with `add_repo`, and inject faults with `cut_once`, `throttle` and `corrupt`. `requests` lists what was
    asked; `bytes_served` counts the file bytes sent.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, cdn_port: int = 0) -> None:
        """Prepare a stand-in on `host`; port 0 takes any free port (see `url` once started)."""
        self._address, self._cdn_address = (host, port), (host, cdn_port)
        self._servers: list[Server] = []
        self._repos: dict[str, Repo] = {}
        self._lock = threading.Lock()
        self._hashes: dict[tuple[Path, int, int], tuple[int, str, str]] = {}
        self._cuts: dict[tuple[str, str], int] = {}
        self._corrupt: set[tuple[str, str]] = set()
        self._rate = 0
        self._limits: list[int] = []
        self._bytes = 0
        self._seq = itertools.count()
        self.requests: list[Asked] = []

    def start(self) -> Self:
        """Listen on both origins and answer in background threads; returns the stand-in."""
        self._servers = [Server(self._address, self, cdn=False), Server(self._cdn_address, self, cdn=True)]
        for server in self._servers:
            threading.Thread(target=server.serve_forever, name="hubstandin", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening and close every open connection."""
        for server in self._servers:
            server.shutdown()
            for sock in list(server.open):
                try:
                    sock.shutdown(2)
                except OSError:
                    pass
            server.server_close()
        self._servers = []

    def __enter__(self) -> Self:
        """Start."""
        return self.start()

    def __exit__(self, *exc: object) -> None:
        """Stop."""
        self.stop()

    @property
    def url(self) -> str:
        """The Hub's origin, e.g. `http://127.0.0.1:41234`: the client's `endpoint`."""
        host, port = self._servers[0].server_address[:2]
        return f"http://{host}:{port}"

    @property
    def cdn_url(self) -> str:
        """The origin LFS files are redirected to."""
        host, port = self._servers[1].server_address[:2]
        return f"http://{host}:{port}"

    @property
    def bytes_served(self) -> int:
        """File bytes sent so far, on both origins (not headers, not JSON)."""
        return self._bytes

    def add_repo(  # noqa: PLR0913 - a repo's files and its access rules are set in one call, as the Hub's settings
        self,
        repo_id: str,
        files: Mapping[str, bytes | Path],
        *,
        branch: str = "main",
        remove: Collection[str] = (),
        gated: bool | str | None = None,
        private: bool | None = None,
        token: str | None = None,
        lfs: Collection[str] | None = None,
    ) -> str:
        """Commit `files` (path in repo -> bytes, or a Path served from disk) to `branch`; returns the commit sha.

        A new repo starts empty; an existing branch keeps its files, replaced or added by `files`, less
        `remove`; a new branch starts from `main`. Earlier commits stay fetchable by sha (a moved branch).
        `gated` (False, "auto" or "manual"; True means "manual") and `private` are kept when None; `token`
        is the one bearer token that may read a gated or private repo. `lfs`, when given, names exactly the
        LFS files of this commit; else `is_lfs_by_default` decides. Paths are taken as given (a test may
        publish a hostile name such as "../x").
        """
        if repo_id.count("/") != 1:
            raise ValueError(f"repo id {repo_id!r} must be 'owner/name'")
        repo = self._repos.get(repo_id) or Repo(repo_id)
        repo.gated = ("manual" if gated is True else gated) if gated is not None else repo.gated
        repo.private = private if private is not None else repo.private
        repo.token = token if token is not None else repo.token
        parent = repo.refs.get(branch) or repo.refs.get("main")
        tree = {p: f for p, f in (repo.commits[parent] if parent else {}).items() if p not in remove}
        for path, content in files.items():
            size, sha256, sha1 = self._hash(content)
            is_lfs = path in lfs if lfs is not None else is_lfs_by_default(path, size)
            data, on_disk = (content, None) if isinstance(content, bytes) else (None, Path(content))
            tree[path] = File(size, sha256, sha1, is_lfs, data, on_disk)
        listing = "".join(f"{p}\0{f.oid}\n" for p, f in sorted(tree.items()))
        seed = f"{repo_id}\n{parent}\n{next(self._seq)}\n{time.time_ns()}\n{listing}"
        sha = hashlib.sha1(seed.encode(), usedforsecurity=False).hexdigest()
        repo.commits[sha] = tree
        repo.times[sha] = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
        repo.refs[branch] = sha
        self._repos[repo_id] = repo
        return sha

    def _hash(self, content: bytes | Path) -> tuple[int, str, str]:
        if isinstance(content, bytes):
            return hash_file(content)
        st = Path(content).stat()
        key = (Path(content).resolve(), st.st_size, st.st_mtime_ns)
        if key not in self._hashes:
            self._hashes[key] = hash_file(Path(content))
        return self._hashes[key]

    def tag(self, repo_id: str, name: str, commit: str) -> None:
        """Point the tag (or branch) `name` of `repo_id` at `commit`, a sha `add_repo` returned."""
        repo = self._repos[repo_id]
        if commit not in repo.commits:
            raise ValueError(f"{repo_id} has no commit {commit}; pass a sha that add_repo returned")
        repo.refs[name] = commit

    def cut_once(self, repo_id: str, path: str, after_bytes: int) -> None:
        """Make the next GET of this file's bytes close the connection after `after_bytes` body bytes."""
        with self._lock:
            self._cuts[(repo_id, path)] = after_bytes

    def throttle(self, bytes_per_s: int | None) -> None:
        """Send every file body at about `bytes_per_s` (None or 0: as fast as possible)."""
        self._rate = int(bytes_per_s or 0)

    def corrupt(self, repo_id: str, path: str) -> None:
        """Serve other bytes of the same size for this file from now on, still advertising its hashes."""
        with self._lock:
            self._corrupt.add((repo_id, path))

    def popularity(self, repo_id: str, downloads: int, likes: int = 0) -> None:
        """Set what the Hub's search counts of a repo (it sorts by downloads)."""
        with self._lock:
            repo = self._repos[repo_id]
            repo.downloads, repo.likes = downloads, likes

    def rate_limit(self, searches: int, retry_after_s: int) -> None:
        """Answer the next `searches` searches 429 with `Retry-After: retry_after_s`, as the Hub does
        past its quota."""
        with self._lock:
            self._limits = [retry_after_s] * searches

    def _limited(self) -> int | None:
        """The Retry-After of a search to refuse now, else None."""
        with self._lock:
            return self._limits.pop() if self._limits else None

    def clear_faults(self) -> None:
        """Undo `cut_once`, `throttle`, `corrupt` and `rate_limit`."""
        with self._lock:
            self._cuts.clear()
            self._corrupt.clear()
            self._limits.clear()
            self._rate = 0

    def _faults_for(self, repo_id: str, path: str) -> tuple[int | None, bool, int]:
        with self._lock:
            return self._cuts.pop((repo_id, path), None), (repo_id, path) in self._corrupt, self._rate

    def _asked(self, method: str, path: str, range_: str | None, origin: str) -> None:
        with self._lock:
            self.requests.append(Asked(method, path, range_, origin))

    def _served(self, n: int) -> None:
        with self._lock:
            self._bytes += n
