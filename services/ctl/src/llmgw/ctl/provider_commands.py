"""`llmgw ctl provider ...`: outside OpenAI-compatible providers (the router's `provider.*`
endpoints, an admin's): their base URL, their keys (sealed where the router keeps them, never
shown back) with the limits each is held to, and the models they answer."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from nats.aio.client import Client

from llmgw.bus import call
from llmgw.ctl.changes import BY
from llmgw.ctl.tables import table
from llmgw.ctl.tree import Noun, Verb, done, show
from llmgw.proto import Empty, providers
from llmgw.proto.providers import Provider, ProviderKey, ProviderRef

__all__ = ["PROVIDER"]

_KEY_HELP = (
    "NAME=SECRET[,rpm=N][,tpm=N]: the secret as env:VAR or file:PATH (kept out of the shell's history) or as "
    "it is; '(hidden)' keeps the key already kept (repeat)"
)


def _secret(given: str) -> str:
    if given.startswith("env:"):
        value = os.environ.get(given[4:], "")
        if not value:
            raise SystemExit(f"--key: ${given[4:]} is empty or not set")
        return value
    if given.startswith("file:"):
        return Path(given[5:]).read_text().strip()
    return given


def _key(given: str) -> ProviderKey:
    name, sep, rest = given.partition("=")
    secret, *limits = rest.split(",")
    if not sep or not name or not secret:
        raise SystemExit(f"--key {name}: give it as NAME=SECRET[,rpm=N][,tpm=N]")
    numbers = {"rpm": 0, "tpm": 0}
    for limit in limits:
        what, _, n = limit.partition("=")
        if what not in numbers or not n.isdigit():
            raise SystemExit(f"--key {name}: {limit!r} is not rpm=N or tpm=N")
        numbers[what] = int(n)
    return ProviderKey(
        name=name, key=_secret(secret), requests_per_minute=numbers["rpm"], tokens_per_minute=numbers["tpm"]
    )


def _models(given: list[str]) -> dict[str, str]:
    out = {}
    for item in given:
        ours, _, theirs = item.partition("=")
        out[ours] = theirs or ours
    return out


async def _put(nc: Client, args: argparse.Namespace) -> int:
    provider = Provider(
        name=args.name, base_url=args.base_url, keys=[_key(k) for k in args.key], models=_models(args.model),
        use=args.use, context=args.context, timeout_s=args.timeout, by=BY,
    )  # fmt: skip
    kept = await call(nc, providers.PROVIDER_PUT, provider)
    models = ", ".join(f"{a}→{b}" for a, b in kept.models.items()) or "no model yet"
    return done(args, kept, f"provider {kept.name}: {len(kept.keys)} keys, {models} ({kept.use})")


def _put_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("--base-url", required=True, help="its OpenAI API (https://api.openai.com/v1)")
    parser.add_argument("--key", action="append", required=True, metavar="NAME=SECRET", help=_KEY_HELP)
    parser.add_argument(
        "--model", action="append", default=[], metavar="OURS[=THEIRS]", help="a model it answers (repeat)"
    )
    parser.add_argument(
        "--use", choices=["fallback", "only"], default="fallback", help="while own replicas are not ready, or always"
    )
    parser.add_argument("--context", type=int, default=8192, help="its models' context, where the catalog lacks them")
    timeout_help = "seconds a stream's first byte may take (a whole answer: the router's upstream timeout)"
    parser.add_argument("--timeout", type=float, default=60.0, help=timeout_help)


async def _list(nc: Client, args: argparse.Namespace) -> int:
    listed = await call(nc, providers.PROVIDER_LIST, Empty())
    now, rows = time.time(), []
    for p in listed.providers:
        for k in p.keys:
            state = listed.keys.get(f"{p.name}.{k.name}")
            cooling = f"{state.cooling_until - now:.0f} s ({state.why})" if state and state.cooling_until else "-"
            used = f"{state.requests} req, {state.tokens} tok" if state else "-"
            limits = f"{k.requests_per_minute or '-'} rpm, {k.tokens_per_minute or '-'} tpm"
            models = ", ".join(p.models)
            rows.append((p.name, p.base_url, models, p.use, k.name, limits, used, cooling))
    head = ["PROVIDER", "URL", "MODELS", "USE", "KEY", "LIMITS", "THIS MINUTE", "COOLING"]
    return show(args, listed, table(head, rows))


async def _remove(nc: Client, args: argparse.Namespace) -> int:
    gone = await call(nc, providers.PROVIDER_REMOVE, ProviderRef(name=args.name, by=BY))
    return done(args, gone, f"provider {args.name} removed: its models are answered by their own replicas only")


def _named(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME")


_LIST = Verb("list", "outside providers and how each key is", "llmgw ctl provider list", "", _list)
PROVIDER = Noun(
    "provider",
    "outside OpenAI-compatible providers answering some models, over several keys",
    (
        Verb(
            "put",
            "add a provider or change it (its keys sealed; each key's limits)",
            "llmgw ctl provider put openai --base-url https://api.openai.com/v1 --key a=env:OPENAI_KEY_A,rpm=500 "
            "--model gpt-mini=gpt-4o-mini",
            "llmgw ctl provider list",
            _put,
            _put_arguments,
        ),
        _LIST,
        Verb("remove", "remove a provider", "llmgw ctl provider remove openai", "", _remove, _named),
    ),
    default=_LIST,
)
