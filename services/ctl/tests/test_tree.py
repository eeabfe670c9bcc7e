"""`llmgw ctl` as a command tree: each verb its own arguments, help, example and next step; every
command of before still parses; each change comes from its verb as its own kind."""

import msgspec
import pytest

from llmgw.ctl.changes import change_of
from llmgw.ctl.cli import parser
from llmgw.proto import Scaling
from llmgw.proto.catalog import (
    RestartModel,
    ScaleModel,
    SetAliases,
    SetClass,
    SetContext,
    SetGpus,
    SetOwner,
    SetReplicas,
    SetResources,
    StartModel,
    StopModel,
)


def help_of(capsys, *words):
    with pytest.raises(SystemExit) as done:
        parser().parse_args([*words, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_a_verbs_help_shows_only_its_own_arguments_an_example_and_what_happens_next(capsys):
    said = help_of(capsys, "ctl", "model", "replicas")
    assert "--cpu-memory" in said and "--cpu-cores" in said and "PROFILE=COUNT" in said
    assert "--max-output" not in said and "--purge" not in said and "--rpm" not in said
    assert "example:\n  llmgw ctl model replicas " in said and "then:" in said


def test_a_nouns_help_lists_its_verbs(capsys):
    said = help_of(capsys, "ctl", "model")
    for verb in ("list", "get", "add", "remove", "stop", "start", "restart", "scale", "replicas", "plan"):
        assert verb in said
    assert "--cpu-memory" not in said


def change(*words):
    return change_of(parser().parse_args(["ctl", "model", *words]))


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["stop", "m"], StopModel(name="m", by="ctl")),
        (["start", "m"], StartModel(name="m", by="ctl")),
        (["restart", "m", "--in-place"], RestartModel(name="m", by="ctl", in_place=True)),
        (["scale", "m", "2"], ScaleModel(name="m", by="ctl", scaling=Scaling(min=2, max=2))),
        (["scale", "m", "0", "3"], ScaleModel(name="m", by="ctl", scaling=Scaling(min=0, max=3))),
        (
            ["replicas", "m", "gpu=7", "cpu=4", "--cpu-memory", "16", "--cpu-cores", "8"],
            SetReplicas(name="m", by="ctl", counts={"gpu": 7, "cpu": 4}, cpu_memory_mb=16384, cpu_cores=8),
        ),
        (["context", "m", "4096", "--max-output", "512"], SetContext(name="m", by="ctl", context=4096, max_output=512)),
        (["context", "m", "--max-output", "512"], SetContext(name="m", by="ctl", max_output=512)),
        (["gpus", "m", "gpu=2", "--in-place"], SetGpus(name="m", by="ctl", gpus={"gpu": 2}, in_place=True)),
        (
            ["resources", "m", "cpu", "--memory", "16", "--cores", "8", "--in-place"],
            SetResources(name="m", by="ctl", profile="cpu", memory_mb=16384, cores=8, in_place=True),
        ),
        (["resources", "m", "gpu", "--cores", "4"], SetResources(name="m", by="ctl", profile="gpu", cores=4)),
        (["class", "m", "batch"], SetClass(name="m", by="ctl", capacity_class="batch")),
        (["owner", "m", "ml-team"], SetOwner(name="m", by="ctl", owner="ml-team")),
        (
            ["alias", "m", "--add", "a", "--add", "b", "--drop", "c"],
            SetAliases(name="m", by="ctl", add_aliases=["a", "b"], remove_aliases=["c"]),
        ),
    ],
)
def test_each_change_verb_makes_its_own_kind_of_change(words, expected):
    assert change(*words) == expected


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["replicas", "m", "cpu=lots"], "'cpu=lots' is not PROFILE=COUNT"),
        (["alias", "m"], "--add ALIAS or --drop ALIAS"),
        (["scale", "m", "-1"], r"Expected `int` >= 0 - at `\$.scaling.min`"),
        (["context", "m"], "a context, --max-output, or both"),
        (["resources", "m", "cpu"], "--memory GIB, --cores N, or both"),
        (["resources", "m", "cpu", "--cores", "0"], r"Expected `int` >= 1 - at `\$.cores`"),
    ],
)
def test_a_change_that_cannot_be_made_from_its_words_says_why(words, message):
    with pytest.raises((ValueError, msgspec.ValidationError), match=message):
        change(*words)


@pytest.mark.parametrize(
    "words",
    [
        ["ctl", "--nats-url", "nats://h:1", "model", "list"],
        ["ctl", "model", "list", "--nats-url", "nats://h:1"],
        ["ctl", "model"],
        ["ctl", "models", "--json"],
        ["ctl", "model", "get", "m"],
        ["ctl", "model", "show", "m"],
        ["ctl", "model", "add", "m.yaml"],
        ["ctl", "model", "put", "m.yaml"],
        ["ctl", "model", "remove", "m", "--purge"],
        ["ctl", "model", "plan", "o/r", "--context", "100", "--threads", "2", "--json"],
        ["ctl", "replica", "list"],
        ["ctl", "replica"],
        ["ctl", "weights", "--collect"],
        ["ctl", "weights", "collect"],
        ["ctl", "key"],
        ["ctl", "key", "list"],
        ["ctl", "key", "revoke", "0123456789abcdef"],
        [
            "ctl",
            "key",
            "create",
            "ci",
            "--project",
            "builds",
            "--models",
            "a,b",
            "--admin",
            "--expires-days",
            "3",
            "--rpm",
            "60",
            "--tpm",
            "1000",
            "--concurrent",
            "2",
            "--tokens-day",
            "200000",
            "--tokens-month",
            "5000000",
        ],
        ["ctl", "project", "put", "builds", "--tokens-month", "5000000"],
        ["ctl", "project", "add", "builds"],
        ["ctl", "usage", "--by", "project", "--since-hours", "24"],
        ["plan", "m.gguf", "--context", "8192", "--json"],
        ["up", "--data-dir", "/tmp/x", "--nats-port", "-1", "--http-port", "0", "--no-demo"],
    ],
)
def test_every_command_of_before_still_parses_to_something_to_run(words):
    args = parser().parse_args(words)
    assert args.run is not None


def test_the_nats_url_may_come_before_the_noun_or_after_the_verb():
    assert parser().parse_args(["ctl", "--nats-url", "nats://a:1", "models"]).nats_url == "nats://a:1"
    assert parser().parse_args(["ctl", "models", "--nats-url", "nats://b:2"]).nats_url == "nats://b:2"
    assert parser().parse_args(["ctl", "models"]).nats_url is None  # found at connect time: `reach`


def test_ctl_reaches_the_up_running_over_its_data_directory(tmp_path, monkeypatch):
    import json
    import os

    from llmgw.ctl.tree import DEFAULT_NATS_URL, reach

    monkeypatch.delenv("LLMGW_CREDS", raising=False)
    home = tmp_path / "d"
    args = parser().parse_args(["ctl", "models", "--data-dir", str(home)])
    assert reach(args) == (DEFAULT_NATS_URL, "", home, False)  # nothing there
    (home / "up").mkdir(parents=True)
    (home / "creds").mkdir()
    (home / "creds" / "ctl.nk").write_text("x")
    (home / "up" / "up.json").write_text(
        json.dumps({"base_url": "http://127.0.0.1:8/v1", "nats_url": "nats://127.0.0.1:9", "pid": os.getpid()})
    )
    assert reach(args) == ("nats://127.0.0.1:9", str(home / "creds" / "ctl.nk"), home, True)
    monkeypatch.setenv("LLMGW_HOME", str(home))
    assert reach(parser().parse_args(["ctl", "models"])).url == "nats://127.0.0.1:9"
    given = parser().parse_args(["ctl", "--nats-url", "nats://a:1", "models", "--creds", "c.nk"])
    assert reach(given)[:2] == ("nats://a:1", "c.nk")
    dead = 2**22 + 7  # no process has this id (pid_max is lower)
    (home / "up" / "up.json").write_text(
        json.dumps({"base_url": "http://127.0.0.1:8/v1", "nats_url": "nats://127.0.0.1:9", "pid": dead})
    )
    assert reach(args).url == DEFAULT_NATS_URL and not reach(args).up


def test_a_models_room_reads_as_a_line_a_profile():
    from llmgw.ctl.model_commands import room_text
    from llmgw.proto.scheduler import ModelRoom, ProfileRoom

    room = ModelRoom(
        model="qwen",
        profiles=[
            ProfileRoom(profile="gpu", more_now=0, more_preempting=2, most=64, why="a: cards: has 0 (of 2)"),
            ProfileRoom(profile="cpu", more_now=64, more_preempting=64, most=64),
        ],
    )
    assert room_text(room).splitlines() == [
        "qwen gpu: more now: at most 0; taking lower classes' room (preemption): at most 2 (a: cards: has 0 (of 2))",
        "qwen cpu: more now: 64 or more",
    ]


def adapters(*words):
    from llmgw.ctl.adapter_commands import adapters_change

    return adapters_change(parser().parse_args(["ctl", "model", "adapters", *words]))


def test_the_adapters_verb_adds_by_file_named_for_it_or_as_asked_and_removes_by_name_or_file():
    from llmgw.proto import Adapter, SetAdapters

    source = "acme/loras@" + "a" * 40 + "/sql-v2.gguf"
    assert adapters("m", "add", source, "--scale", "0.5") == SetAdapters(
        name="m", by="ctl", add=[Adapter(name="sql-v2", source=source, scale=0.5)]
    )
    assert adapters("m", "add", source, "--as", "sql", "--in-place").add[0].name == "sql"
    assert adapters("m", "remove", "sql", source).remove == ["sql", source]
    with pytest.raises(ValueError, match="--as names one adapter"):
        adapters("m", "add", source, source, "--as", "x")
    with pytest.raises(ValueError, match="say which: `adapters m remove ADAPTER`"):
        adapters("m", "remove")
    with pytest.raises(msgspec.ValidationError, match=r"Expected `float` <= 4.0 - at `\$.add\[0\].scale`"):
        adapters("m", "add", source, "--scale", "9")
    with pytest.raises(msgspec.ValidationError, match=r"at `\$.add\[0\].source`"):
        adapters("m", "add", "not-a-source")
