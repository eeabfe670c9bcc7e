"""What a profile may add to its engine's command line and environment: the flags operators tune
pass; paths, loader variables, where it listens, its key and what the agent sets itself are
refused with which argument, why and what to do instead; a node's opt-in widens the list."""

import pytest

from llmgw.modelplan import ENGINE_ENV, ENGINE_FLAGS, check_engine_args


@pytest.mark.parametrize(
    ("engine", "args", "env"),
    [
        ("llamacpp", ["--flash-attn", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-b", "4096", "-ub", "1024"], {}),
        ("llamacpp", ["--temp", "0.7", "--top-k=40", "--min_p", "0.05", "--seed", "-1", "--mirostat", "2"], {}),
        ("llamacpp", ["--jinja", "--chat-template", "chatml", "--reasoning-format", "deepseek", "--no-mmap"], {}),
        ("llamacpp", ["--rope-scaling", "yarn", "--rope-scale", "4", "--yarn-orig-ctx", "32768", "-tb", "8"], {}),
        ("llamacpp", ["--mlock"], {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}),
        ("vllm", ["--dtype", "bfloat16", "--quantization", "fp8", "--kv-cache-dtype", "fp8", "--enforce-eager"], {}),
        ("vllm", ["--swap-space=8", "--enable-prefix-caching", "--tool-call-parser", "hermes"], {}),
        ("vllm", ["--enable-auto-tool-choice", "--max-num-batched-tokens", "8192"], {"NCCL_P2P_DISABLE": "1"}),
        ("vllm", [], {"VLLM_ATTENTION_BACKEND": "FLASHINFER", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
        ("llamacpp", [], {}),
    ],
)
def test_the_flags_and_variables_operators_tune_pass(engine, args, env):
    assert check_engine_args(engine, args, env) == []


@pytest.mark.parametrize(
    ("engine", "args", "said"),
    [
        ("llamacpp", ["--log-file", "/tmp/x"], "argument '--log-file' is refused: it names a file"),
        ("llamacpp", ["--log_file=/tmp/x"], "argument '--log-file' is refused"),
        ("llamacpp", ["--slot-save-path", "/var/tmp"], "argument '--slot-save-path' is refused: it names a file"),
        ("llamacpp", ["--control-vector", "/home/x/a.gguf"], "argument '--control-vector' is refused: it names a file"),
        ("llamacpp", ["--lora", "/home/x/a.gguf"], "attach them with `llmgw ctl model adapters`"),
        ("llamacpp", ["-m", "/other.gguf"], "argument '-m' is refused: the agent gives the engine the model's"),
        ("vllm", ["--model", "/other"], "argument '--model' is refused"),
        ("llamacpp", ["--host", "0.0.0.0"], "argument '--host' is refused: the agent chooses where"),
        ("llamacpp", ["--port", "80"], "set the agent's address and ports"),
        ("llamacpp", ["--api-key", "k"], "argument '--api-key' is refused: the agent gives the engine the key"),
        ("llamacpp", ["--api-key-file", "/k"], "argument '--api-key-file' is refused"),
        ("llamacpp", ["-c", "8192"], "set the model's context"),
        ("llamacpp", ["-np", "8"], "set the profile's slots"),
        ("llamacpp", ["-ngl", "99"], "set the profile's gpus"),
        ("llamacpp", ["--tensor-split", "1,1"], "set the profile's gpus"),
        ("llamacpp", ["--rpc", "10.0.0.9:50052"], "set the profile's nodes"),
        ("llamacpp", ["-t", "64"], "set the profile's cpu_cores"),
        ("llamacpp", ["--hf-repo", "evil/model"], "past the mirror"),
        ("llamacpp", ["--chat-template", "{{ x }}"], "a built-in template's name"),
        ("llamacpp", ["--chat-template-file", "/etc/passwd"], "it names a file"),
        ("llamacpp", ["--tools", "all"], "argument '--tools' is refused"),
        ("llamacpp", ["--no-such-flag"], "not among the flags operators tune for llamacpp"),
        ("llamacpp", ["/tmp/model.gguf"], "'/tmp/model.gguf' follows no flag"),
        ("llamacpp", ["--"], "argument '--' is refused"),
        ("vllm", ["--trust-remote-code"], "run code"),
        ("vllm", ["--chat-template", "/etc/passwd"], "argument '--chat-template' is refused: it names a file"),
        ("vllm", ["--max-num-seqs", "512"], "set the profile's slots"),
        ("vllm", ["--gpu-memory-utilization", "0.99"], "placement counts"),
        ("vllm", ["--served-model-name", "other"], "add an alias to the model"),
        ("vllm", ["-tp", "8"], "set the profile's tensor_parallel"),
    ],
)
def test_an_argument_outside_the_list_is_refused_saying_which_why_and_what_instead(engine, args, said):
    refusals = check_engine_args(engine, args, {})
    assert len(refusals) == 1 and said in refusals[0], refusals


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("LD_PRELOAD", "the dynamic loader's"),
        ("LD_LIBRARY_PATH", "the dynamic loader's"),
        ("PYTHONPATH", "Python's"),
        ("PYTHONSTARTUP", "Python's"),
        ("PATH", "where the engine finds programs"),
        ("HOME", "where the engine finds programs"),
        ("LLAMA_ARG_LOG_FILE", "llama.cpp reads it as an argument"),
        ("LLAMA_API_KEY", "the agent gives the engine the key"),
        ("CUDA_VISIBLE_DEVICES", "set the profile's gpus"),
        ("OMP_TOOL_LIBRARIES", "not among the environment variables operators tune"),
        ("GGML_BACKEND_PATH", "not among the environment variables operators tune"),
    ],
)
def test_an_environment_variable_outside_the_list_is_refused_saying_why(name, said):
    refusals = check_engine_args("llamacpp", [], {name: "x"})
    assert (
        len(refusals) == 1
        and refusals[0].startswith(f"environment variable '{name}' is refused")
        and said in refusals[0]
    )


def test_every_refusal_is_given_once_in_order():
    refusals = check_engine_args("llamacpp", ["--log-file", "a", "--temp", "1", "--log-file", "b"], {"LD_PRELOAD": "x"})
    assert [r.split("'")[1] for r in refusals] == ["--log-file", "LD_PRELOAD"]


def test_a_refused_flag_cannot_hide_as_the_value_of_an_allowed_one():
    assert check_engine_args("llamacpp", ["--temp", "--log-file", "/tmp/x"], {})[0].startswith("argument '--log-file'")


def test_a_nodes_opt_in_lets_its_flags_and_variables_through():
    args, env = ["--control-vector", "/srv/cv/a.gguf", "--metrics"], {"GGML_CUDA_ENABLE_UNIFIED_MEMORY": "1"}
    assert len(check_engine_args("llamacpp", args, env)) == 3
    allowed = ["--control-vector", "--metrics", "GGML_CUDA_ENABLE_UNIFIED_MEMORY"]
    assert check_engine_args("llamacpp", args, env, allowed) == []


def test_an_opt_in_of_a_template_flag_lifts_its_name_rule():
    assert check_engine_args("llamacpp", ["--chat-template", "{{ x }}"], {}, ["--chat-template"]) == []


def test_no_opt_in_lets_through_what_the_agent_sets_itself():
    refusals = check_engine_args(
        "llamacpp",
        ["--port", "80", "-ngl", "99"],
        {"CUDA_VISIBLE_DEVICES": "0"},
        ["--port", "-ngl", "CUDA_VISIBLE_DEVICES"],
    )
    assert len(refusals) == 3 and all("no node's opt-in" in r for r in refusals)


def test_an_unknown_engine_is_refused():
    assert check_engine_args("tgi", [], {}) == ["engine 'tgi' is not one of llamacpp, vllm"]


def test_the_lists_hold_no_path_loader_or_listening_names():
    for flags in ENGINE_FLAGS.values():
        assert not {"--log-file", "--slot-save-path", "--host", "--port", "--api-key", "-m", "--model"} & flags
    assert not [n for n in ENGINE_ENV if n.startswith(("LD_", "PYTHON", "LLAMA_ARG_")) or n in ("PATH", "HOME")]
