"""The agent's pure parts: reading /proc/meminfo and llama-server's command line."""

from pathlib import Path

from llmgw.agent.core import llama_server_command, meminfo_mb, threads_for
from llmgw.proto import Model, Profile

MEMINFO = "MemTotal:       24683520 kB\nMemFree:         1000 kB\nMemAvailable:   20480000 kB\n"


def test_meminfo_gives_total_and_available_in_mib():
    assert meminfo_mb(MEMINFO) == (24105, 20000)


def test_threads_are_the_profiles_cores_else_half_the_node():
    assert threads_for(Profile(cpu_cores=3), 16) == 3
    assert threads_for(Profile(), 16) == 8 and threads_for(Profile(), 1) == 1


def test_the_command_line_is_explicit_about_context_slots_and_layers():
    model = Model(name="m", source="o/r/m.gguf", context=2048)
    cmd = llama_server_command("llama-server", Path("/c/m.gguf"), 9000, model, Profile(slots=3, args=["--flash-attn", "on"]), "KEY", 4)
    pairs = dict(zip(cmd[1::2], cmd[2::2], strict=False))
    assert pairs["-c"] == "2048" and pairs["-np"] == "3" and pairs["-ngl"] == "0"
    assert pairs["--port"] == "9000" and pairs["--api-key"] == "KEY" and pairs["--threads"] == "2"
    assert cmd[-2:] == ["--flash-attn", "on"]
