"""What to fetch of a repo, without I/O: the files chosen, the ones refused and why, the room
needed, and how fast a fetch goes.

The default choice is what an engine loads: every GGUF and safetensors file, with the configs and
tokenizer files beside them. Pickled weights (`.bin`, `.pt`, `.pth`, `.ckpt`, `.pkl`) are never
fetched: loading a pickle runs whatever code it carries. A repo that has them beside safetensors
or GGUF files gets those instead; one that has only pickles is refused, saying what to fetch.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from llmgw.proto import MirroredFile, SkippedFile

__all__ = [
    "PICKLED",
    "WEIGHTS",
    "Published",
    "Rate",
    "Refused",
    "check_room",
    "choose",
    "safe_path",
    "sized",
]

WEIGHTS = (".gguf", ".safetensors")
"""Weights an engine loads without running code."""
PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
"""Weights saved with Python's pickle: loading one runs code."""
_COMPANIONS = ("*.json", "*.jinja", "tokenizer.model", "*.tiktoken", "merges.txt", "vocab.txt", "README.md", "LICENSE*")
"""Files an engine reads beside safetensors weights: configs, tokenizers, chat templates, the card."""
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class Refused(ValueError):
    """A fetch the mirror will not make; the message says why and what to do instead."""


@dataclass(frozen=True)
class Published:
    """A file as the Hub published it at one commit."""

    path: str
    size: int
    blob_id: str = ""
    """Git blob sha1 of its content (for an LFS file, of its pointer)."""
    sha256: str = ""
    """sha256 of its content, published for LFS files only."""

    def entry(self) -> MirroredFile:
        """The file as the mirror records it before fetching."""
        return MirroredFile(path=self.path, size=self.size, sha256=self.sha256, blob_id=self.blob_id)


def sized(n: float) -> str:
    """Bytes as a person reads them ('98.4 MB')."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover - the loop returns


def safe_path(path: str) -> str | None:
    """Why `path` (a file's path in a repo) cannot be a source, or None when it can: no absolute
    paths, no '.' or '..' parts, nothing a source cannot carry."""
    if path.startswith("/") or "\\" in path:
        return "it is absolute or has a backslash"
    parts = PurePosixPath(path).parts
    if any(p in (".", "..") for p in parts) or "//" in path or not parts:
        return "it climbs out of the repo ('.' or '..' parts)"
    if not all(_SEGMENT.match(p) for p in parts):
        return "its name has characters a source cannot carry (letters, digits, '.', '_', '-' only)"
    return None


def _matches(path: str, patterns: tuple[str, ...] | list[str]) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(name, p) for p in patterns)


def _pickled(path: str) -> bool:
    return path.lower().endswith(PICKLED)


def _weights(path: str) -> bool:
    return path.lower().endswith(WEIGHTS)


def choose(
    repo: str, commit: str, files: list[Published], include: list[str]
) -> tuple[list[Published], list[SkippedFile]]:
    """The files to fetch of `repo` at `commit` (and those left out, with why). `include` globs
    (matched against the path and the file name) narrow the weights; the configs and tokenizer
    files come along with safetensors. Raises Refused for a choice that would fetch nothing,
    or pickled weights."""
    safe = [f for f in files if safe_path(f.path) is None]
    where = f"{repo}@{commit[:12]}"
    unsafe = [f.path for f in files if safe_path(f.path) is not None]
    weights = [f for f in safe if _weights(f.path)]
    pickles = [f.path for f in safe if _pickled(f.path)]
    if include:
        named_unsafe = [p for p in unsafe if _matches(p, include)]
        if named_unsafe:
            raise Refused(f"{where}: {named_unsafe[0]} cannot be fetched: {safe_path(named_unsafe[0])}")
        wanted = [f for f in safe if _matches(f.path, include)]
        if not wanted:
            names = ", ".join(f.path for f in safe[:20]) or "no files"
            raise Refused(f"{where}: no file matches {' '.join(include)}; it has {names}")
        named_pickles = [f.path for f in wanted if _pickled(f.path)]
        if named_pickles:
            raise Refused(_pickle_refusal(where, named_pickles, weights))
    else:
        if not weights:
            if pickles:
                raise Refused(_pickle_refusal(where, pickles, weights))
            raise Refused(f"{where} has no GGUF or safetensors file; name the files wanted with --include")
        wanted = list(weights)
    if any(f.path.endswith(".safetensors") for f in wanted):
        wanted += [f for f in safe if _matches(f.path, _COMPANIONS) and f not in wanted]
    chosen = {f.path: f for f in wanted}
    skipped = [SkippedFile(path=p, why=f"not fetched: {safe_path(p)}") for p in unsafe]
    skipped += [
        SkippedFile(path=p, why="pickled weights are never fetched (loading one runs code); the safetensors/GGUF are")
        for p in pickles
        if p not in chosen
    ]
    return sorted(chosen.values(), key=lambda f: f.path), skipped


def _pickle_refusal(where: str, pickles: list[str], weights: list[Published]) -> str:
    head = (
        f"{where}: {', '.join(pickles[:3])} {'is' if len(pickles) == 1 else 'are'} pickled weights, "
        "and loading a pickle runs whatever code it carries, so the mirror never fetches or serves one"
    )
    if weights:
        return f"{head}; this repo has the same weights as {', '.join(w.path for w in weights[:3])}: include those"
    return f"{head}; fetch a repo with safetensors or GGUF files of these weights (search the Hub: '<name> GGUF')"


def check_room(where: str, needed: int, free: int, keep_free: int) -> None:
    """Raise Refused where `needed` more bytes would leave less than `keep_free` of `free`."""
    if needed + keep_free > free:
        raise Refused(
            f"the mirror's disk at {where} has {sized(free)} free; fetching needs {sized(needed)} and keeps "
            f"{sized(keep_free)} free (keep_free_bytes): free some space or fetch fewer files (--include)"
        )


class Rate:
    """Bytes a second over the last `window_s` seconds of samples (time is passed in)."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._samples: list[tuple[float, int]] = []

    def add(self, now: float, done: int) -> None:
        """Note that `done` bytes were fetched by `now`."""
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.pop(0)

    def per_s(self) -> float:
        """Bytes a second across the window (0 until two samples apart)."""
        if len(self._samples) < 2:
            return 0.0
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        return max(d1 - d0, 0) / (t1 - t0) if t1 > t0 else 0.0

    def eta_s(self, left: int) -> float | None:
        """Seconds to fetch `left` more bytes at this rate (None: no rate yet)."""
        rate = self.per_s()
        return left / rate if rate > 0 else None
