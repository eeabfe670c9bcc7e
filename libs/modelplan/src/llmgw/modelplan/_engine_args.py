"""What a profile may add to its engine's command line and environment: one rule for the catalog
(which refuses such a model) and the agent (which refuses to start it).

The engine's command line is the agent's to build. A profile's `args` may carry only the flags an
operator legitimately tunes (`ENGINE_FLAGS`: sampling defaults, batches, cache types, attention,
RoPE, templates by name, loading) and its `env` only a few tuning variables (`ENGINE_ENV`).
Refused, each with which argument, why and what to do instead:

- what the agent sets itself (the model, where it listens, its key, context, slots, layers and
  cards, threads, workers, the served name, adapters): a field says it, and no opt-in lifts this;
- paths to read or write (`--log-file`, `--slot-save-path`, `--control-vector`...), downloads past the
  mirror, flags that let callers run code or change the engine over HTTP;
- loader and interpreter variables (`LD_*`, `PYTHON*`, `PATH`, `HOME`) and llama.cpp's
  `LLAMA_ARG_*` (arguments by another door);
- anything else not on the lists.

A node that needs more opts in: its agent's `engine_args_allowed` names the extra flags and
variables, which only that agent honours; the catalog's `engine_args_allowed` lets a model
carrying them in, and such a model names those nodes in its profile's `node_selector`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["ENGINE_ENV", "ENGINE_FLAGS", "check_engine_args"]

_LLAMACPP = frozenset(
    # sampling defaults (a request's own values win)
    "--temp --temperature --top-k --top-p --min-p --top-nsigma --top-n-sigma --typical --typical-p "
    "--xtc-probability --xtc-threshold --repeat-last-n --repeat-penalty --presence-penalty "
    "--frequency-penalty --dry-multiplier --dry-base --dry-allowed-length --dry-penalty-last-n "
    "--dry-sequence-breaker --dynatemp-range --dynatemp-exp --mirostat --mirostat-lr --mirostat-ent "
    "--samplers --sampling-seq --sampler-seq -s --seed -n --predict --n-predict "
    # batches, KV cache, attention, threads for prompts
    "-b --batch-size -ub --ubatch-size -ctk --cache-type-k -ctv --cache-type-v -fa --flash-attn "
    "-tb --threads-batch --swa-full --keep --context-shift --no-context-shift -cb --cont-batching "
    "-nocb --no-cont-batching --cache-reuse -dt --defrag-thold -sps --slot-prompt-similarity "
    "--warmup --no-warmup --poll --poll-batch --numa -to --timeout --threads-http "
    # loading (older builds: --mlock, --no-mmap; newer: --load-mode)
    "--mlock --no-mmap --mmap -lm --load-mode --repack --no-repack -nr "
    # RoPE and YaRN
    "--rope-scaling --rope-scale --rope-freq-base --rope-freq-scale --yarn-orig-ctx --yarn-ext-factor "
    "--yarn-attn-factor --yarn-beta-slow --yarn-beta-fast "
    # chat templates (by name) and reasoning
    "--jinja --no-jinja --chat-template --chat-template-kwargs --reasoning-format --reasoning-budget "
    "-rea --reasoning".split()
)
_VLLM = frozenset(
    "--dtype -q --quantization --kv-cache-dtype --calculate-kv-scales --swap-space --enforce-eager "
    "--enable-prefix-caching --enable-chunked-prefill --no-enable-chunked-prefill "
    "--max-num-batched-tokens --block-size --seed --tokenizer-mode --max-logprobs "
    "--disable-custom-all-reduce --enable-expert-parallel --disable-sliding-window --disable-log-stats "
    "--tool-call-parser --enable-auto-tool-choice --reasoning-parser --chat-template-content-format "
    "--override-generation-config".split()
)
ENGINE_FLAGS: dict[str, frozenset[str]] = {"llamacpp": _LLAMACPP, "vllm": _VLLM}
"""The flags a profile's `args` may carry, per engine (`--flag value` or `--flag=value`)."""

ENGINE_ENV = frozenset(
    {
        "OMP_PROC_BIND",  # OpenMP thread placement and waiting (ggml's CPU threads); the rest of
        "OMP_PLACES",  # OMP_* is left out: OMP_TOOL_LIBRARIES loads a library
        "OMP_WAIT_POLICY",
        "GGML_CUDA_NO_PINNED",  # no pinned host memory; other GGML_* load backends from paths
        "NCCL_P2P_DISABLE",  # boards where peer-to-peer hangs tensor parallel
        "NCCL_IB_DISABLE",
        "NCCL_DEBUG",  # a log level (NCCL_DEBUG_FILE, a path, is left out)
        "VLLM_ATTENTION_BACKEND",  # a kernel's name; most VLLM_* name paths or plugins
        "VLLM_LOGGING_LEVEL",
        "PYTORCH_CUDA_ALLOC_CONF",  # allocator options (expandable_segments...)
        "TOKENIZERS_PARALLELISM",
    }
)
"""The environment variables a profile's `env` may set, for either engine."""

_CARDS = ("the agent puts the layers on the cards it chose", "set the profile's gpus (and tensor_parallel)")
_KEY = ("the agent gives the engine the key the router calls it with", "drop it")
_AGENT_SETS: dict[str, tuple[str, str]] = {
    **dict.fromkeys(
        ("-m", "--model"), ("the agent gives the engine the model's weights from its cache", "set the model's source")
    ),
    **dict.fromkeys(
        ("--host", "--port"), ("the agent chooses where the engine listens", "set the agent's address and ports")
    ),
    **dict.fromkeys(("--api-key", "--api-key-file", "LLAMA_API_KEY", "VLLM_API_KEY"), _KEY),
    **dict.fromkeys(
        ("-c", "--ctx-size", "--max-model-len"), ("the agent sets the model's context", "set the model's context")
    ),
    **dict.fromkeys(
        ("-np", "--parallel", "--max-num-seqs"), ("the agent sets the profile's slots", "set the profile's slots")
    ),
    **dict.fromkeys(("-ngl", "--gpu-layers", "--n-gpu-layers", "-sm", "--split-mode", "-ts", "--tensor-split"), _CARDS),
    **dict.fromkeys(("-mg", "--main-gpu", "-dev", "--device", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"), _CARDS),
    **dict.fromkeys(
        ("-tp", "--tensor-parallel-size", "-pp", "--pipeline-parallel-size"),
        _CARDS[:1] + ("set the profile's tensor_parallel and gpus",),
    ),
    "--gpu-memory-utilization": (
        "placement counts vLLM's pool as 0.9 of each card",
        "set the profile's gpus or min_card_mb",
    ),
    "--rpc": ("the agent connects the replica's RPC workers", "set the profile's nodes"),
    **dict.fromkeys(
        ("--n-cpu-moe", "-ncmoe"),
        ("the agent places the experts' tensors as placement reserved them", "set the profile's cpu_moe_layers"),
    ),
    **dict.fromkeys(
        ("-t", "--threads"), ("the agent sets the threads from the profile's cores", "set the profile's cpu_cores")
    ),
    **dict.fromkeys(
        ("-a", "--alias", "--served-model-name"),
        ("the router asks the engine for the model by its name", "add an alias to the model"),
    ),
    **dict.fromkeys(
        ("--kv-events-config", "--prefix-caching-hash-algo", "PYTHONHASHSEED"),
        ("the agent sets up the KV events the router follows", "set the profile's kv_events"),
    ),
    **dict.fromkeys(
        ("--lora", "--lora-scaled", "--lora-init-without-apply"),
        ("the agent loads the model's adapters from its cache", "attach them with `llmgw ctl model adapters`"),
    ),
}
"""What the agent sets itself: never from a profile, whatever a node opts into."""

_FILE = (
    "it names a file or folder on the node for the engine to read or write (the engine reads only "
    "the weights the agent fetched, and the agent keeps its output in its logs)"
)
_FETCH = "the engine would fetch files itself, past the mirror"
_CODE = "it lets the engine's callers or its files run code or change the engine"
_WHY: dict[str, str] = {
    **dict.fromkeys(
        "--log-file --log-prompts-dir --slot-save-path --control-vector "
        "--control-vector-scaled -mm --mmproj -md --model-draft --spec-draft-model --chat-template-file "
        "--grammar-file -jf --json-schema-file --path --media-path --models-dir --models-preset "
        "--ssl-key-file --ssl-cert-file -lcs --lookup-cache-static -lcd --lookup-cache-dynamic "
        "--ui-config-file --webui-config-file --mcp-servers-config --video-ffmpeg-dir "
        "--tokenizer --download-dir --chat-template --generation-config --config --lora-modules "
        "--speculative-config".split(),
        _FILE,
    ),
    **dict.fromkeys(
        "-mu --model-url -mmu --mmproj-url -hf -hfr --hf-repo -hff --hf-file -hft --hf-token -dr "
        "--docker-repo -hfd -hfrd --hf-repo-draft --spec-draft-hf".split(),
        _FETCH,
    ),
    **dict.fromkeys("--trust-remote-code --tool-parser-plugin --tools --agent -ag --props".split(), _CODE),
}
"""Why well-known flags are refused (a node may opt into them)."""

_TEMPLATE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
_VALUES: dict[tuple[str, str], tuple[re.Pattern[str], str]] = {
    ("llamacpp", "--chat-template"): (
        _TEMPLATE_NAME,
        "a built-in template's name such as chatml or llama3 (a template of one's own belongs in the model's GGUF)",
    ),
}
"""Allowed flags whose value must match (unless a node opts into the flag)."""

_NUMBER = re.compile(r"-\.?[0-9]")
_INSTEAD = (
    "drop it, or let chosen nodes allow it (engine_args_allowed in their agents' and in the catalog's "
    "config) and pin the profile to them with a node_selector"
)


def _parse(args: Sequence[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """Each flag of `args` with its value (after '=' or the token after it; None: none seen), and
    the tokens that follow no flag. A token starting with '-' is a flag unless it is a number."""
    flags: list[tuple[str, str | None]] = []
    strays: list[str] = []
    for token in args:
        if token.startswith("-") and not _NUMBER.match(token):
            name, eq, value = token.partition("=")
            if name.startswith("--"):  # both engines read --a_b as --a-b
                name = name.replace("_", "-")
            flags.append((name, value if eq else None))
        elif flags and flags[-1][1] is None:
            flags[-1] = (flags[-1][0], token)
        else:
            strays.append(token)
    return flags, strays


def _flag_refusal(engine: str, name: str, value: str | None, extra: frozenset[str]) -> str | None:
    if name in _AGENT_SETS:
        why, instead = _AGENT_SETS[name]
        return f"argument '{name}' is refused: {why}; {instead} (no node's opt-in lifts this)"
    if name in extra:
        return None
    if name in ENGINE_FLAGS[engine]:
        pattern, wanted = _VALUES.get((engine, name), (None, ""))
        if pattern is None or pattern.fullmatch(value or ""):
            return None
        return f"argument '{name}' is refused: its value must be {wanted}; give a name, or {_INSTEAD}"
    why = _WHY.get(name, f"it is not among the flags operators tune for {engine} here (llmgw.modelplan.ENGINE_FLAGS)")
    return f"argument '{name}' is refused: {why}; {_INSTEAD}"


def _env_why(name: str) -> str:
    if name.startswith("LD_"):
        return "it is the dynamic loader's: it makes the engine load code of the setter's choosing"
    if name.startswith("PYTHON"):
        return "it is Python's: it says where the engine loads code from and how it runs"
    if name in ("PATH", "HOME", "TMPDIR") or name.startswith("XDG_"):
        return "it says where the engine finds programs and writes files"
    if name.startswith("LLAMA_ARG_"):
        return "llama.cpp reads it as an argument, past this check; give the flag in args"
    return "it is not among the environment variables operators tune here (llmgw.modelplan.ENGINE_ENV)"


def _env_refusal(name: str, extra: frozenset[str]) -> str | None:
    if name in _AGENT_SETS:
        why, instead = _AGENT_SETS[name]
        return f"environment variable '{name}' is refused: {why}; {instead} (no node's opt-in lifts this)"
    if name in ENGINE_ENV or name in extra:
        return None
    return f"environment variable '{name}' is refused: {_env_why(name)}; {_INSTEAD}"


def check_engine_args(
    engine: str, args: Sequence[str], env: Mapping[str, str], extra_allowed: Iterable[str] = ()
) -> list[str]:
    """What is refused of a profile's `args` and `env` for `engine`, one sentence each (which
    argument, why, what to do instead), in order and once each; empty when all may pass.

    `extra_allowed`: flag and variable names a node (or the catalog, for such nodes) opts into
    besides the lists; nothing the agent sets itself is lifted by it.
    """
    if engine not in ENGINE_FLAGS:
        return [f"engine '{engine}' is not one of {', '.join(ENGINE_FLAGS)}"]
    extra = frozenset(n.replace("_", "-") if n.startswith("--") else n for n in extra_allowed)
    flags, strays = _parse(args)
    said = [f"argument '{s}' follows no flag: give each value after its flag" for s in strays]
    said += [_flag_refusal(engine, name, value, extra) for name, value in flags]
    said += [_env_refusal(name, extra) for name in env]
    return list(dict.fromkeys(s for s in said if s))
