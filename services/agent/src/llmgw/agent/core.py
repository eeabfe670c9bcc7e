"""The agent's rules, without I/O: the engine's command line."""

from __future__ import annotations

from pathlib import Path

from llmgw.modelplan import cpu_threads
from llmgw.proto import Model, Profile

__all__ = ["llama_server_command"]


def llama_server_command(
    binary: str, model_file: Path, port: int, model: Model, profile: Profile, api_key: str, node_cpus: int
) -> list[str]:
    """llama-server's arguments for a CPU replica; always explicit -c, -np and -ngl."""
    return [
        binary,
        "--model", str(model_file),
        "--host", "127.0.0.1",
        "--port", str(port),
        "-c", str(model.context),
        "-np", str(profile.slots),
        "-ngl", "0",
        "--threads", str(cpu_threads(profile.cpu_cores, node_cpus)),
        "--api-key", api_key,
        "--alias", model.name,
        *profile.args,
    ]
