"""What the stand-in holds: files with the hashes the Hub publishes, commits, refs, and the JSON it answers."""

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["File", "Repo", "hash_file", "info_json", "is_lfs_by_default", "search_json", "tree_json"]

# Suffixes the Hub's default .gitattributes sends to LFS (the weight formats among them), plus .gguf;
# a file over 10 MiB is LFS whatever its name, since the Hub refuses such a file in plain git.
LFS_SUFFIXES = frozenset(
    ".bin .ckpt .gguf .h5 .joblib .model .msgpack .npy .npz .onnx .ot .parquet .pb .pickle .pkl .pt .pth"
    " .safetensors .tflite .zip .gz .tar .zst".split()
)
LFS_MIN_SIZE = 10 * 1024 * 1024
CHUNK = 1 << 20


def is_lfs_by_default(path: str, size: int) -> bool:
    """Whether the Hub would keep `path` in LFS: a weight-like suffix, or over 10 MiB."""
    return Path(path).suffix.lower() in LFS_SUFFIXES or size > LFS_MIN_SIZE


def _sha1_text(text: str) -> str:
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


def _git_blob_sha1(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content, usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class File:
    """One file of a commit: its bytes (in memory or on disk) and the hashes the Hub publishes for it.

    `oid` is the git blob sha1 git stores: of the content for a plain file, of the LFS pointer text for
    an LFS file (as on the Hub, so an LFS file's content is checked with `sha256`, never with `oid`).
    """

    size: int
    sha256: str
    content_sha1: str
    lfs: bool
    data: bytes | None = None
    path: Path | None = None

    @property
    def pointer(self) -> bytes:
        """The git-lfs pointer text that git holds in place of an LFS file."""
        return b"version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (
            self.sha256.encode(),
            self.size,
        )

    @property
    def oid(self) -> str:
        """The git blob sha1 the Hub lists as `oid`/`blobId`."""
        return _git_blob_sha1(self.pointer) if self.lfs else self.content_sha1

    def chunks(self, start: int, end: int, size: int = CHUNK) -> Iterator[bytes]:
        """The bytes in [start, end), a chunk at a time, never the whole file from disk at once."""
        if self.data is not None:
            for at in range(start, end, size):
                yield self.data[at : min(at + size, end)]
            return
        assert self.path is not None
        with self.path.open("rb") as fh:
            fh.seek(start)
            left = end - start
            while left > 0 and (chunk := fh.read(min(size, left))):
                left -= len(chunk)
                yield chunk


def hash_file(content: bytes | Path) -> tuple[int, str, str]:
    """Size, sha256 and git blob sha1 of `content`, read once a chunk at a time."""
    if isinstance(content, bytes):
        return len(content), hashlib.sha256(content).hexdigest(), _git_blob_sha1(content)
    size = content.stat().st_size
    sha256, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
    with content.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            sha256.update(chunk)
            sha1.update(chunk)
    return size, sha256.hexdigest(), sha1.hexdigest()


@dataclass
class Repo:
    """A model repo: every commit ever made (by sha), its branches and tags, and who may read it."""

    repo_id: str
    gated: bool | str = False
    private: bool = False
    token: str | None = None
    commits: dict[str, dict[str, File]] = field(default_factory=dict)
    times: dict[str, str] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    downloads: int = 0
    likes: int = 0

    def resolve(self, rev: str) -> str | None:
        """The commit a branch, tag or commit sha names, or None."""
        return self.refs.get(rev) or (rev if rev in self.commits else None)


def info_json(repo: Repo, sha: str, blobs: bool) -> dict:
    """What `GET /api/models/{repo}[/revision/{rev}]` answers; with `blobs`, sizes and hashes per file."""
    files = repo.commits[sha]
    siblings = []
    for name in sorted(files):
        sibling: dict = {"rfilename": name}
        f = files[name]
        if blobs:
            sibling |= {"size": f.size, "blobId": f.oid}
            if f.lfs:
                sibling["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": len(f.pointer)}
        siblings.append(sibling)
    return {**_summary(repo, sha), "disabled": False, "siblings": siblings}


def _tags(files: dict[str, File]) -> list[str]:
    """The tags the Hub gives a commit's files: "gguf" where one is."""
    return ["gguf"] if any(p.endswith(".gguf") for p in files) else []


def _summary(repo: Repo, sha: str) -> dict:
    """What the Hub says of every model, in its info and in its search alike."""
    return {
        "id": repo.repo_id,
        "modelId": repo.repo_id,
        "author": repo.repo_id.split("/")[0],
        "sha": sha,
        "lastModified": repo.times[sha],
        "createdAt": min(repo.times.values()),
        "private": repo.private,
        "gated": repo.gated,
        "downloads": repo.downloads,
        "likes": repo.likes,
        "tags": _tags(repo.commits[sha]),
    }


_SORTS = {"downloads": "downloads", "likes": "likes", "lastModified": "lastModified", "createdAt": "createdAt"}


def search_json(repos: list[Repo], query: dict[str, list[str]], token: str | None) -> list[dict]:
    """What `GET /api/models?search=...&filter=...&sort=...&limit=...&expand=...` answers: the
    repos whose id holds every word of `search` (case aside), with every `filter` among their tags
    ("gguf": a .gguf file at main), sorted (descending), at most `limit`; a private repo only to its
    token. Each as the Hub lists it; `siblings` (names only, as the Hub's list gives them) where
    `full` or `expand=siblings` asks."""
    words = " ".join(query.get("search", [""])).lower().replace("/", " ").split()
    filters = set(query.get("filter", []))
    expand = set(query.get("expand", [])) | set(query.get("expand[]", []))
    full = query.get("full", ["false"])[0].lower() in ("true", "1")
    found = []
    for repo in repos:
        head = repo.refs.get("main")
        if head is None or (repo.private and token != repo.token):
            continue
        files = repo.commits[head]
        if not all(w in repo.repo_id.lower() for w in words) or not filters <= set(_tags(files)):
            continue
        item = _summary(repo, head)
        if full or "siblings" in expand:
            item["siblings"] = [{"rfilename": name} for name in sorted(files)]
        found.append(item)
    key = _SORTS.get(query.get("sort", ["downloads"])[0], "downloads")
    found.sort(key=lambda item: item[key], reverse=query.get("direction", ["-1"])[0] != "1")
    limit = query.get("limit", [""])[0]
    return found[: int(limit)] if limit.isdigit() else found


def _file_entry(name: str, f: File) -> dict:
    entry: dict = {"type": "file", "oid": f.oid, "size": f.size, "path": name}
    if f.lfs:
        entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": len(f.pointer)}
    return entry


def tree_json(files: dict[str, File], base: str, recursive: bool) -> list[dict] | None:
    """What `GET /api/models/{repo}/tree/{rev}[/{base}]` answers, or None when `base` is no folder.

    A folder's `oid` is a stable sha1 of what it holds, not git's tree hash.
    """
    prefix = f"{base.strip('/')}/" if base.strip("/") else ""
    folders: dict[str, list[str]] = {}
    entries = []
    for name in sorted(n for n in files if n.startswith(prefix)):
        parts = name[len(prefix) :].split("/")
        for depth in range(1, len(parts) if recursive else min(2, len(parts))):
            folders.setdefault(prefix + "/".join(parts[:depth]), []).append(f"{name} {files[name].oid}")
        if recursive or len(parts) == 1:
            entries.append(_file_entry(name, files[name]))
    if prefix and not entries and not folders:
        return None
    return [
        {"type": "directory", "oid": _sha1_text("\n".join([p, *held])), "path": p}
        for p, held in sorted(folders.items())
    ] + entries
