"""A model of experts with some layers' experts on the CPU: the plan's tokens a second against
llama-bench given the same `--n-cpu-moe`, on this machine's CPU.

The model is written here with `gguf` (random weights, Q8_0: 8 layers of 8 experts, 2 used a
token). This machine has no card, so llama.cpp (a CPU build) runs every tensor on the CPU
whatever `--n-cpu-moe` says: what can be checked here is the host's side of the plan's formula
(the experts' active share read at the CPU's rate, their arithmetic, a wait a layer), which is
the plan's whole CPU way. The card's side (the dense part at the card's bandwidth) cannot be
measured here: the last rows give the plan's figure for this CPU beside a card, unmeasured.
Run with `just bench`.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import msgspec

from llmgw.ctl.calibrate import llama_bench
from llmgw.gguf import TinyLlama, read_model, write_random_llama
from llmgw.membw import measure
from llmgw.modelplan import (
    CardGroup,
    FileFacts,
    NodeFacts,
    llamacpp_memory,
    options,
    shape_from_gguf,
)

SHAPE = TinyLlama(
    embedding=1024, layers=8, heads=8, kv_heads=4, feed_forward=1536, experts=8, experts_used=2, tensor_type="Q8_0"
)
CONTEXT, THREADS, TOKENS = 2048, 2, 64


def main() -> None:
    started = time.monotonic()
    bw = measure()
    if bw is None:
        print("memory bandwidth cannot be measured here: no benchmark")
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = write_random_llama(Path(tmp) / "experts.gguf", SHAPE)
        shape = shape_from_gguf(read_model(model))
        facts = FileFacts(name=model.name, format="gguf", quant="Q8_0", shape=shape)
        here = NodeFacts(
            name="here",
            cpus=THREADS,
            memory_total_mb=1 << 20,
            memory_available_mb=1 << 20,
            membw_all_gbs=bw.all_cores_gbs,
            membw_one_gbs=bw.one_core_gbs,
        )
        plan = next(o for o in options([facts], [here], CONTEXT, 1, THREADS) if o.device == "cpu")
        rows = [("--n-cpu-moe", "plan (this CPU)", "llama-bench", "error")]
        for n in (0, 4, 8):
            measured = llama_bench(model, [THREADS], TOKENS, 3, ["-ngl", "999", "-ncmoe", str(n)])[THREADS]
            error = (plan.tokens_per_second - measured) / measured
            rows.append((str(n), f"{plan.tokens_per_second:.1f}", f"{measured:.1f}", f"{error:+.1%}"))
    print(
        f"{model.name}: {shape.weight_bytes / 1e6:.0f} MB, experts {shape.expert_bytes / 1e6:.0f} MB, "
        f"a token reads {shape.active_bytes / 1e6:.1f} MB; memory {bw.all_cores_gbs} GB/s all cores, "
        f"{bw.one_core_gbs} one core; {THREADS} threads, {TOKENS} tokens, best of llama-bench's 3"
    )
    _table(rows)
    print("\nBeside a card (the plan's figures for this CPU and one card; not measured: no card here):")
    card_rows = [("card", "card MiB", "--n-cpu-moe", "on the card MiB", "host MiB", "plan tok/s")]
    # a card that holds the dense part and half the layers' experts (beside llama.cpp's buffers)
    half = int(llamacpp_memory(shape, CONTEXT, 1, cards=1, cpu_moe=shape.layers // 2).mib / 0.95) + 1
    for cls, gbs in (("rtx4090-24g", 1008.0), ("l4-24g", 300.0)):
        for mb in (24 * 1024, half):
            g = CardGroup(cls=cls, memory_mb=mb, count=1, free=1, bandwidth_gbs=gbs)
            node = msgspec.structs.replace(here, cards=[g])
            way = next(o for o in options([facts], [node], CONTEXT, 1, THREADS) if o.device != "cpu")
            card_rows.append(
                (
                    cls,
                    str(mb),
                    str(way.cpu_moe_layers),
                    str(way.need_mb),
                    str(way.host_mb),
                    f"{way.tokens_per_second:.1f}",
                )
            )
    _table(card_rows)
    print(f"took {time.monotonic() - started:.0f}s")


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))


if __name__ == "__main__":
    main()
