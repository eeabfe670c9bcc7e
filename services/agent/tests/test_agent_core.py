"""The agent's pure parts: llama-server's command line."""

from pathlib import Path

from llmgw.agent.core import llama_server_command
from llmgw.proto import Model, Profile


def test_the_command_line_is_explicit_about_context_slots_and_layers():
    model = Model(name="m", source="o/r/m.gguf", context=2048)
    cmd = llama_server_command("llama-server", Path("/c/m.gguf"), 9000, model, Profile(slots=3, args=["--flash-attn", "on"]), "KEY", 4)
    pairs = dict(zip(cmd[1::2], cmd[2::2], strict=False))
    assert pairs["-c"] == "2048" and pairs["-np"] == "3" and pairs["-ngl"] == "0"
    assert pairs["--port"] == "9000" and pairs["--api-key"] == "KEY" and pairs["--threads"] == "2"
    assert cmd[-2:] == ["--flash-attn", "on"]
