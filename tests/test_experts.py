"""A model of experts with its experts in host memory, on real parts: a tiny model of experts
written with `gguf`, its header read for the experts' tensors, and the command line the agent
builds for a card replica with `cpu_moe_layers` run by the real llama-server.

No card here: the replica's card is made up and its CUDA_VISIBLE_DEVICES dropped, so llama-server
(a CPU build) runs every layer on the CPU; what is checked is that it takes the agent's flags,
keeps the named layers' experts on the CPU's buffers (its own log says so), and answers.
"""

import re
import subprocess
import time
from pathlib import Path

import httpx

from llmgw.agent.core import EngineSetup, launch
from llmgw.bus import find_llamacpp, free_port
from llmgw.gguf import TinyLlama, read_model, write_random_llama
from llmgw.modelplan import experts_host_bytes, shape_from_gguf
from llmgw.proto import GpuInfo, Model, Profile

ASCII = {"grammar": "root ::= [a-z]+"}
EXPERTS = TinyLlama(embedding=128, layers=4, heads=4, kv_heads=2, feed_forward=256, experts=4, experts_used=2)


def test_the_header_says_which_bytes_are_routed_experts_and_where_they_start(tmp_path):
    model = write_random_llama(tmp_path / "moe.gguf", EXPERTS)
    shape = shape_from_gguf(read_model(model))
    per_layer = 3 * 4 * 256 * 128 * 4  # gate, up, down: 4 experts of 256x128, F32
    assert (shape.expert_bytes, shape.first_expert_layer) == (4 * per_layer, 0)
    assert shape.active_bytes == shape.weight_bytes - 4 * per_layer + 4 * per_layer * 2 // 4
    assert experts_host_bytes(shape, 2) == 2 * per_layer
    dense = shape_from_gguf(read_model(write_random_llama(tmp_path / "dense.gguf", TinyLlama())))
    assert dense.expert_bytes == 0 and experts_host_bytes(dense, 2) == 0


def _run(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)


def test_llama_server_takes_the_agents_command_line_for_experts_on_the_cpu_and_answers(tmp_path):
    weights = write_random_llama(tmp_path / "moe.gguf", EXPERTS)
    card = GpuInfo(index=0, uuid="GPU-0", name="made up", cls="rtx4090-24g", memory_total_mb=24564)
    port = free_port()
    setup = EngineSetup(
        binary=find_llamacpp().server,
        weights=weights,
        port=port,
        model=Model(name="moe", source="o/r/moe.gguf", context=2048),
        profile=Profile(name="gpu", gpus=1, cpu_moe_layers=2, slots=1, cpu_cores=2),
        api_key="engine-key",
        node_cpus=2,
        cards=[card],
    )
    how = launch(setup)
    assert how.argv[how.argv.index("--n-cpu-moe") + 1] == "2" and how.argv[how.argv.index("-ngl") + 1] == "999"
    env = {k: v for k, v in how.env.items() if k != "CUDA_VISIBLE_DEVICES"}  # the card is made up
    log = tmp_path / "engine.log"
    proc = _run([*how.argv, "-v"], {"PATH": "/usr/bin:/bin", **env}, log)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
        answer = httpx.post(
            f"{url}/v1/chat/completions",
            headers={"Authorization": "Bearer engine-key"},
            # random weights pick random byte tokens: a grammar keeps the answer valid UTF-8
            json={"model": "moe", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **ASCII},
            timeout=60,
        )
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] > 0, answer.text
    finally:
        proc.kill()
        proc.wait()
    text = log.read_text(errors="replace")  # the random model writes bytes, not words
    moved = set(re.findall(r"tensor blk\.(\d+)\.ffn_\w+_exps\.weight \([^)]*\) buffer type overridden to CPU", text))
    assert moved == {"0", "1"}, text[-3000:]
