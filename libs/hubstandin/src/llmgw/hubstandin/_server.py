"""The HTTP side of the stand-in: the Hub's API and resolve URLs on one origin, LFS bytes on a second (the "CDN")."""

import json
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, quote, unquote

from llmgw.hubstandin._repo import File, Repo, info_json, search_json, tree_json

if TYPE_CHECKING:
    from llmgw.hubstandin import HubStandIn

__all__ = ["Handler", "Server"]

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")
_FLIP = bytes(255 - b for b in range(256))


class Server(ThreadingHTTPServer):
    """One listening socket of the stand-in; `cdn` tells the LFS-bytes origin from the Hub's."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], hub: "HubStandIn", cdn: bool) -> None:
        """Bind `address` (port 0: any free one) for `hub`."""
        self.hub, self.cdn, self.open = hub, cdn, set()
        super().__init__(address, Handler)


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str, commit: str | None = None, wait: int | None = None):
        super().__init__(message)
        self.status, self.code, self.commit, self.wait = status, code, commit, wait


class Handler(BaseHTTPRequestHandler):
    """Answers one connection (HTTP/1.1, kept alive, every response with a Content-Length)."""

    protocol_version = "HTTP/1.1"
    server: Server

    def setup(self) -> None:
        """Note the connection, so that stopping the stand-in can close it."""
        super().setup()
        self.server.open.add(self.connection)

    def finish(self) -> None:
        """Forget the connection."""
        self.server.open.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: object) -> None:
        """Say nothing: `hub.requests` records what was asked."""

    def do_GET(self) -> None:
        """Answer a GET."""
        self._answer(head=False)

    def do_HEAD(self) -> None:
        """Answer a HEAD."""
        self._answer(head=True)

    def _answer(self, head: bool) -> None:
        hub = self.server.hub
        raw, _, query = self.path.partition("?")
        hub._asked(self.command, self.path, self.headers.get("Range"), "cdn" if self.server.cdn else "hub")
        parts = [unquote(p) for p in raw.split("/")[1:]]
        try:
            if self.server.cdn and len(parts) >= 4:
                repo = hub._repos.get(f"{parts[0]}/{parts[1]}")
                files = repo.commits.get(parts[2], {}) if repo else {}
                f = files.get("/".join(parts[3:]))
                if f is None:
                    raise _Refused(404, "EntryNotFound", "No such blob")
                self._send_file(f"{parts[0]}/{parts[1]}", "/".join(parts[3:]), f, head, {})
            elif not self.server.cdn and parts[:2] == ["api", "models"] and len(parts) == 2:
                self._search(parse_qs(query))
            elif not self.server.cdn and parts[:2] == ["api", "models"] and len(parts) >= 4:
                self._api(f"{parts[2]}/{parts[3]}", parts[4:], parse_qs(query))
            elif not self.server.cdn and len(parts) >= 5 and parts[2] == "resolve":
                self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), head)
            else:
                raise _Refused(404, "", f"The stand-in has no page at {raw}")
        except _Refused as e:
            self._send(e.status, json.dumps({"error": str(e)}).encode(), head, self._error_headers(e))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    @staticmethod
    def _error_headers(e: _Refused) -> dict[str, str]:
        headers = {"X-Error-Message": str(e), "Content-Type": "application/json"}
        if e.code:
            headers["X-Error-Code"] = e.code
        if e.commit:
            headers["X-Repo-Commit"] = e.commit
        if e.wait is not None:
            headers["Retry-After"] = str(e.wait)
        return headers

    def _repo(self, repo_id: str, files: bool) -> Repo:
        """The repo, as the Hub shows it to this caller: a private one without its token is not there."""
        repo = self.server.hub._repos.get(repo_id)
        auth = self.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
        if repo is None or (repo.private and token != repo.token):
            raise _Refused(404 if token else 401, "RepoNotFound", "Repository not found")
        if files and repo.gated and token != repo.token:
            raise _Refused(
                403 if token else 401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to"
                " access it. Please log in."
                if not token
                else f"Access to model {repo_id} is restricted and you are not in the authorized list."
                f" Visit https://huggingface.co/{repo_id} to ask for access.",
            )
        return repo

    @staticmethod
    def _commit(repo: Repo, rev: str) -> str:
        sha = repo.resolve(rev)
        if sha is None:
            raise _Refused(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return sha

    def _api(self, repo_id: str, rest: list[str], query: dict[str, list[str]]) -> None:
        repo = self._repo(repo_id, files=False)
        if rest[:1] == ["tree"] and len(rest) >= 2:
            sha = self._commit(repo, rest[1])
            recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
            body = tree_json(repo.commits[sha], "/".join(rest[2:]), recursive)
            if body is None:
                raise _Refused(404, "EntryNotFound", f"{'/'.join(rest[2:])} does not exist on {rest[1]}", sha)
        elif rest == [] or (rest[:1] == ["revision"] and len(rest) == 2):
            sha = self._commit(repo, rest[1] if rest else "main")
            body = info_json(repo, sha, query.get("blobs", ["false"])[0].lower() in ("true", "1"))
        else:
            raise _Refused(404, "", f"The stand-in has no API {'/'.join(rest)}")
        self._send(200, json.dumps(body).encode(), False, {"Content-Type": "application/json"})

    def _search(self, query: dict[str, list[str]]) -> None:
        """The Hub's model search; a 429 with Retry-After while the stand-in is told to rate-limit."""
        hub = self.server.hub
        if (wait := hub._limited()) is not None:
            raise _Refused(429, "", "You have exceeded our hourly quotas for action: api. Retry later.", wait=wait)
        auth = self.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
        body = search_json(list(hub._repos.values()), query, token)
        self._send(200, json.dumps(body).encode(), False, {"Content-Type": "application/json"})

    def _resolve(self, repo_id: str, rev: str, path: str, head: bool) -> None:
        repo = self._repo(repo_id, files=True)
        sha = self._commit(repo, rev)
        f = repo.commits[sha].get(path)
        if f is None:
            raise _Refused(404, "EntryNotFound", "Entry not found", sha)
        if not f.lfs:
            self._send_file(repo_id, path, f, head, {"X-Repo-Commit": sha, "ETag": f'"{f.oid}"'})
            return
        location = f"{self.server.hub.cdn_url}/{repo_id}/{sha}/{quote(path)}"
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{f.oid}"',
            "X-Linked-Etag": f'"{f.sha256}"',
            "X-Linked-Size": str(f.size),
            "Location": location,
        }
        self._send(302, b"", head, headers)

    def _send(self, status: int, body: bytes, head: bool, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _send_file(self, repo_id: str, path: str, f: File, head: bool, headers: dict[str, str]) -> None:
        start, end, status = 0, f.size, 200
        if wanted := self.headers.get("Range"):
            m = _RANGE.match(wanted.strip())
            if m and m[1]:
                start, end, status = int(m[1]), min(int(m[2]) + 1 if m[2] else f.size, f.size), 206
            elif m and m[2]:
                start, status = max(0, f.size - int(m[2])), 206
            if not m or start >= end:
                self._send(416, b"", head, {"Content-Range": f"bytes */{f.size}"})
                return
            headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{f.size}"}
        self.send_response(status)
        plain = {
            "Content-Length": str(end - start),
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        for name, value in {**plain, **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        if not head:
            self._stream(repo_id, path, f, start, end)

    def _stream(self, repo_id: str, path: str, f: File, start: int, end: int) -> None:
        hub = self.server.hub
        cut, flip, rate = hub._faults_for(repo_id, path)
        if cut is None and not flip and not rate and f.path is not None:
            with f.path.open("rb") as fh:
                hub._served(self.connection.sendfile(fh, start, end - start))
            return
        sent = 0
        for chunk in f.chunks(start, end, max(1, min(1 << 16, rate // 20)) if rate else 1 << 20):
            chunk = chunk.translate(_FLIP) if flip else chunk
            if cut is not None and sent + len(chunk) >= cut:
                self.wfile.write(chunk[: cut - sent])
                hub._served(cut - sent)
                self.close_connection = True
                return
            self.wfile.write(chunk)
            sent += len(chunk)
            hub._served(len(chunk))
            if rate := hub._rate:
                time.sleep(len(chunk) / rate)
