"""`llmgw ctl model serve`: its arguments, and the plan as a table people read."""

from llmgw.ctl.cli import parser
from llmgw.ctl.serve_commands import plan_table
from llmgw.proto.catalog import ServePlan, ServeWay


def test_serve_takes_the_way_the_cores_the_context_the_replicas_and_the_cpu_on_purpose():
    args = parser().parse_args(
        ["ctl", "model", "serve", "o/r/m.gguf", "--cpu", "--gpus", "1", "--replicas", "gpu=7,cpu=4", "--cpu-anyway"]
    )
    assert (args.source, args.cpu, args.gpus, args.replicas, args.cpu_anyway, args.plan) == (
        "o/r/m.gguf",
        True,
        1,
        "gpu=7,cpu=4",
        True,
        False,
    )


def test_the_plan_table_marks_slow_ways_with_how_long_a_reply_of_500_tokens_takes():
    ways = [
        ServeWay(
            kind="gpu",
            cards=1,
            card_class="l40s-48g",
            memory_mb=20480,
            node="g",
            nodes_fit=["g"],
            more_replicas=2,
            tokens_per_s=90.0,
        ),
        ServeWay(
            kind="cpu",
            threads=8,
            memory_mb=2048,
            node="a",
            nodes_fit=["a", "b"],
            more_replicas=6,
            tokens_per_s=12.5,
            mark="slow",
            reply_500_s=40.0,
            calibrated=True,
        ),
        ServeWay(
            kind="cpu", threads=2, memory_mb=2048, node="c", tokens_per_s=2.8, mark="very slow", reply_500_s=178.6
        ),
    ]
    text = plan_table(ServePlan(source="o/r/m.gguf", context=4096, trained_context=8192, ways=ways))
    lines = text.splitlines()
    assert lines[0] == "o/r/m.gguf: context 4096, trained for 8192, 2 slots"
    assert lines[2].split() == ["WAY", "MEMORY", "FITS", "ON", "MORE", "~TOK/S", "MARK"]
    assert "1x l40s-48g" in lines[3] and "20.0 GiB/card" in lines[3] and "~90" in lines[3]
    assert "a, b" in lines[4] and "~12 (calibrated)" in lines[4] and "slow: 500 tokens in about 40 seconds" in lines[4]
    assert "none now (c when room is free)" in lines[5] and "very slow: 500 tokens in about 3 minutes" in lines[5]


def test_a_judges_plan_table_says_how_soon_a_verdict_comes():
    way = ServeWay(
        kind="cpu",
        threads=2,
        memory_mb=300,
        node="n",
        nodes_fit=["n"],
        tokens_per_s=100.0,
        prefill_tokens_per_s=300.0,
        verdict_s=0.93,
    )
    text = plan_table(ServePlan(source="o/r/judge.gguf", context=4096, ways=[way]), judge=True)
    assert "VERDICT" in text and "0.93 s (reads ~300 tok/s)" in text
