"""The agent's rules, without I/O: reading the host, and the engine's command line."""

from __future__ import annotations

from pathlib import Path

from llmgw.proto import Model, Profile

__all__ = ["llama_server_command", "meminfo_mb", "threads_for"]


def meminfo_mb(text: str) -> tuple[int, int]:
    """(total, available) MiB from the text of /proc/meminfo."""
    fields = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            fields[key] = int(parts[0])
    return fields["MemTotal"] // 1024, fields.get("MemAvailable", fields.get("MemFree", 0)) // 1024


def threads_for(profile: Profile, node_cpus: int) -> int:
    """Engine threads: the cores the profile reserves, else half the node's."""
    return profile.cpu_cores or max(1, node_cpus // 2)


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
        "--threads", str(threads_for(profile, node_cpus)),
        "--api-key", api_key,
        "--alias", model.name,
        *profile.args,
    ]
