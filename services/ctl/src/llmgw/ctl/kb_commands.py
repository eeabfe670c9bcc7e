"""`llmgw ctl kb ...`: knowledge bases (the router's knowledge endpoints): a tenant's documents,
embedded by the gateway with a model the fleet serves, that chat completions are answered from.
`push` syncs a folder of one's own machine into a base over the admin API (`--api`): new and
changed files sent, files gone removed; run again after a cut, it sends only what is not there."""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from nats.aio.client import Client

from llmgw.bus import BusError, call
from llmgw.ctl.changes import BY
from llmgw.ctl.over_api import AdminApi
from llmgw.ctl.tables import table
from llmgw.ctl.tree import Noun, Verb, done, show, tenant_filter
from llmgw.proto import knowledge
from llmgw.proto.knowledge import (
    FORMATS,
    AnswerCache,
    BaseQuery,
    BaseRef,
    CacheRef,
    DocRef,
    KnowledgeBase,
    SearchAsk,
)

__all__ = ["CACHE", "KB", "local_files"]


def _tenant(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", default="default", help="its tenant (default: default)")


def _base(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("base", metavar="BASE", help="the knowledge base")
    _tenant(parser)


async def _put(nc: Client, args: argparse.Namespace) -> int:
    base = KnowledgeBase(
        name=args.base, tenant=args.tenant, embedding=args.embedding, chunk_words=args.chunk_words, top=args.top,
        alias=args.alias, model=args.model, by=BY,
    )  # fmt: skip
    kept = await call(nc, knowledge.KB_PUT, base)
    return done(args, kept, f"knowledge base {kept.name} of {kept.tenant}: embedded with {kept.embedding}")


def _put_arguments(parser: argparse.ArgumentParser) -> None:
    _base(parser)
    parser.add_argument("--embedding", required=True, metavar="MODEL", help="the embedding model (a catalog model)")
    parser.add_argument("--chunk-words", type=int, default=160, help="about how many words a chunk holds")
    parser.add_argument("--top", type=int, default=5, help="how many chunks a chat is answered from")
    parser.add_argument("--alias", default="", help="a model name that asks MODEL answered from this base")
    parser.add_argument("--model", default="", help="the chat model the alias is answered by")


async def _list(nc: Client, args: argparse.Namespace) -> int:
    listed = await call(nc, knowledge.KB_LIST, BaseQuery(tenant=args.tenant))
    rows = [(b.tenant, b.name, b.embedding, str(b.chunk_words), str(b.top)) for b in listed.bases]
    return show(args, listed, table(["TENANT", "BASE", "EMBEDDING", "WORDS", "TOP"], rows))


async def _remove(nc: Client, args: argparse.Namespace) -> int:
    gone = await call(nc, knowledge.KB_REMOVE, BaseRef(name=args.base, tenant=args.tenant, by=BY))
    return done(args, gone, f"knowledge base {args.base} of {args.tenant} removed, with its documents")


async def _tree(nc: Client, args: argparse.Namespace) -> int:
    listed = await call(nc, knowledge.DOC_LIST, BaseRef(name=args.base, tenant=args.tenant, folder=args.folder))
    rows = [
        (d.path, d.format, f"{d.size / 1024:.1f} KiB", d.state, str(d.chunks), d.reason or "-")
        for d in listed.documents
    ]
    return show(args, listed, table(["PATH", "FORMAT", "SIZE", "STATE", "CHUNKS", "WHY"], rows))


def _tree_arguments(parser: argparse.ArgumentParser) -> None:
    _base(parser)
    parser.add_argument("--folder", default="", help="only what lies under this folder")


async def _forget(nc: Client, args: argparse.Namespace) -> int:
    gone = await call(nc, knowledge.DOC_REMOVE, DocRef(base=args.base, path=args.path, tenant=args.tenant, by=BY))
    return done(args, gone, f"{len(gone.documents)} document(s) removed from {args.base}")


def _forget_arguments(parser: argparse.ArgumentParser) -> None:
    _base(parser)
    parser.add_argument("path", metavar="PATH", help="a document, or a folder ending in '/'")


async def _search(nc: Client, args: argparse.Namespace) -> int:
    ask = SearchAsk(base=args.base, query=args.query, tenant=args.tenant, top=args.top)
    found = await call(nc, knowledge.KB_SEARCH, ask)
    rows = [(f"{h.score:.3f}", f"{h.path}#{h.chunk}", h.text[:70].replace("\n", " ")) for h in found.hits]
    return show(args, found, table(["SCORE", "WHERE", "TEXT"], rows))


def _search_arguments(parser: argparse.ArgumentParser) -> None:
    _base(parser)
    parser.add_argument("query", metavar="QUESTION")
    parser.add_argument("--top", type=int, default=5, help="how many chunks")


def local_files(folder: Path) -> tuple[dict[str, Path], list[str]]:
    """The documents under `folder` a base takes (path in the base -> file), and those it does
    not (their paths), hidden files and folders left out."""
    taken: dict[str, Path] = {}
    skipped: list[str] = []
    for file in sorted(folder.rglob("*")):
        rel = file.relative_to(folder).as_posix()
        if not file.is_file() or any(part.startswith(".") for part in rel.split("/")):
            continue
        if file.suffix.lower() in FORMATS:
            taken[rel] = file
        else:
            skipped.append(rel)
    return taken, skipped


async def _push(nc: Client | AdminApi, args: argparse.Namespace) -> int:
    if not isinstance(nc, AdminApi):
        print("llmgw ctl kb push sends files over HTTP: give --api URL (your key in $LLMGW_API_KEY)", file=sys.stderr)
        return 2
    folder = Path(args.folder)
    if not folder.is_dir():
        print(f"llmgw ctl kb push: {folder} is not a folder", file=sys.stderr)
        return 2
    prefix = args.into.strip("/") + "/" if args.into.strip("/") else ""
    local, skipped = local_files(folder)
    there = await call(nc, knowledge.DOC_LIST, BaseRef(name=args.base, tenant=args.tenant, folder=prefix))
    remote = {d.path: d for d in there.documents}
    sent = same = failed = 0
    for rel, file in local.items():
        path, data = prefix + rel, file.read_bytes()
        was = remote.get(path)
        if was is not None and was.sha256 == hashlib.sha256(data).hexdigest() and was.state != "failed":
            same += 1
            continue
        try:
            await nc.put_document(args.tenant, args.base, path, data)
            sent += 1
            print(f"sent {path}", file=sys.stderr)
        except BusError as exc:
            failed += 1
            print(f"not sent {path}: {exc.message}", file=sys.stderr)
    gone = [p for p in remote if p not in {prefix + r for r in local}]
    for path in gone:
        await call(nc, knowledge.DOC_REMOVE, DocRef(base=args.base, path=path, tenant=args.tenant, by=BY))
    for rel in skipped:
        print(f"skipped {rel}: not one of {', '.join(sorted(FORMATS))}", file=sys.stderr)
    said = f"{sent} sent, {same} unchanged, {len(gone)} removed, {failed} refused, {len(skipped)} skipped"
    done(args, {"sent": sent, "unchanged": same, "removed": len(gone), "refused": failed}, f"{args.base}: {said}")
    return 1 if failed else 0


def _push_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", metavar="DIR", help="the folder to sync")
    parser.add_argument("base", metavar="BASE", help="the knowledge base")
    _tenant(parser)
    parser.add_argument("--into", default="", metavar="FOLDER", help="the base's folder it becomes (default: its top)")


_LIST = Verb(
    "list", "knowledge bases: their embedding model and chunking", "llmgw ctl kb list", "", _list, tenant_filter
)
KB = Noun(
    "kb",
    "knowledge bases: a tenant's documents, embedded by the gateway, that chats are answered from",
    (
        Verb(
            "put",
            "make a knowledge base or change it (another embedding model embeds its documents again)",
            "llmgw ctl kb put handbook --embedding minilm",
            "send documents with `llmgw ctl --api URL kb push DIR handbook`",
            _put,
            _put_arguments,
        ),
        _LIST,
        Verb(
            "tree", "a base's documents and how far each is", "llmgw ctl kb tree handbook", "", _tree, _tree_arguments
        ),
        Verb(
            "push",
            "sync a folder into a base: new and changed files sent, files gone removed (resumable)",
            "LLMGW_API_KEY=... llmgw ctl --api http://gw:8080 kb push ./docs handbook",
            "each document is embedded in the background: `llmgw ctl kb tree handbook`",
            _push,
            _push_arguments,
        ),
        Verb(
            "search",
            "the chunks nearest a question",
            "llmgw ctl kb search handbook 'travel?'",
            "",
            _search,
            _search_arguments,
        ),
        Verb(
            "forget",
            "remove a document, or a folder's ('path/')",
            "llmgw ctl kb forget handbook old.md",
            "",
            _forget,
            _forget_arguments,
        ),
        Verb("remove", "remove a base with its documents", "llmgw ctl kb remove handbook", "", _remove, _base),
    ),
    default=_LIST,
)
"""`llmgw ctl kb put|list|tree|push|search|forget|remove`."""


async def _cache_put(nc: Client, args: argparse.Namespace) -> int:
    policy = AnswerCache(
        tenant=args.tenant, model=args.model, embedding=args.embedding, threshold=args.threshold,
        ttl_s=args.ttl_s, max_temperature=args.max_temperature, by=BY,
    )  # fmt: skip
    kept = await call(nc, knowledge.CACHE_PUT, policy)
    return done(
        args, kept, f"answers of {kept.model} kept for {kept.tenant}: similar at {kept.threshold:g}, for {kept.ttl_s} s"
    )


def _cache_put_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="the chat model whose answers are kept")
    _tenant(parser)
    parser.add_argument("--embedding", required=True, metavar="MODEL", help="the embedding model questions compare by")
    parser.add_argument("--threshold", type=float, default=0.9, help="how similar a question must be (cosine)")
    parser.add_argument("--ttl-s", type=int, default=86400, help="how long an answer is kept")
    parser.add_argument("--max-temperature", type=float, default=0.5, help="hotter requests are not cached")


async def _cache_list(nc: Client, args: argparse.Namespace) -> int:
    listed = await call(nc, knowledge.CACHE_LIST, BaseQuery(tenant=args.tenant))
    rows = [
        (
            c.tenant,
            c.model,
            c.embedding,
            f"{c.threshold:g}",
            str(c.ttl_s),
            str(listed.held.get(f"{c.tenant}.{c.model}", 0)),
        )
        for c in listed.caches
    ]
    return show(args, listed, table(["TENANT", "MODEL", "EMBEDDING", "THRESHOLD", "TTL S", "ANSWERS"], rows))


def _cache_ref(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", metavar="MODEL", nargs="?", default="", help="the model (purge: every one if left out)"
    )
    _tenant(parser)


async def _cache_remove(nc: Client, args: argparse.Namespace) -> int:
    gone = await call(nc, knowledge.CACHE_REMOVE, CacheRef(tenant=args.tenant, model=args.model, by=BY))
    return done(args, gone, f"answers of {args.model} no longer kept for {args.tenant}")


async def _cache_purge(nc: Client, args: argparse.Namespace) -> int:
    gone = await call(nc, knowledge.CACHE_PURGE, CacheRef(tenant=args.tenant, model=args.model, by=BY))
    return done(args, gone, f"{sum(gone.held.values())} answer(s) forgotten")


_CACHE_LIST = Verb(
    "list", "answer caches: per tenant and model, and the answers each holds", "llmgw ctl cache list", "",
    _cache_list, tenant_filter,
)  # fmt: skip
CACHE = Noun(
    "cache",
    "answers to similar questions: a tenant's chats answered from those answered before",
    (
        Verb(
            "put",
            "keep a tenant's answers to a model, answering similar questions from them",
            "llmgw ctl cache put smollm2 --embedding minilm --threshold 0.9",
            'a hit says `llmgw-cache: hit` and its tokens saved; a request with "cache": "bypass" skips it',
            _cache_put,
            _cache_put_arguments,
        ),
        _CACHE_LIST,
        Verb(
            "purge",
            "forget the answers kept (for a model, or all)",
            "llmgw ctl cache purge smollm2",
            "",
            _cache_purge,
            _cache_ref,
        ),
        Verb(
            "remove", "stop keeping a model's answers", "llmgw ctl cache remove smollm2", "", _cache_remove, _cache_ref
        ),
    ),
    default=_CACHE_LIST,
)
"""`llmgw ctl cache put|list|purge|remove`."""
