"""A launch command pasted beside the log (docs/log-formats.md §5): read at a line's start or in inline code inside
a sentence, its program names the engine and its flags fill the server arguments the log does not print; the log's
own arguments win. `oom.full_precision` is what it made possible first (vllm#2140: `--dtype=float` on a 22 GB card)."""
from __future__ import annotations

import pytest

from tests.machine_speed import scaled
from tests.diagnose.test_fastpath import _same
from toolkit.diagnose import analyze
from toolkit.diagnose.read.fields import parse_fields
from toolkit.diagnose.read.lines import parse_lines

# https://github.com/vllm-project/vllm/issues/2140 (a comment): the command in inline code, the error as a quote
VLLM_2140 = ["I used 2080Ti which has 22GB memory for run vllm as a server for qwen2-7b-instruct: `python -m "
             "vllm.entrypoints.openai.api_server --model /home/jovyan/qwen/Qwen2-7B-Instruct  --served-model-name "
             "Qwen2-7B-Instruct --max-model-len=512 --dtype=float --enforce-eager`, and I had t",
             "> torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 518.00 MiB. GPU 0 has a total "
             "capacty of 21.67 GiB of which 4.06 MiB is free."]
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


@pytest.mark.parametrize("line,engine,fields", [
    ("python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B --tp 2 --mem-fraction-static 0.8",
     "sglang", {"model_path": "meta-llama/Llama-3.1-8B", "tp_size": 2, "mem_fraction_static": 0.8}),
    ("$ CUDA_VISIBLE_DEVICES=0,1 python3 -m sglang.launch_server --model m --enable-torch-compile --port 30000",
     "sglang", {"model_path": "m", "enable_torch_compile": True, "port": 30000}),
    ("vllm serve Qwen/Qwen3-8B -tp 4 --gpu-memory-utilization=0.95 --speculative-config '{\"method\": \"ngram\"}'",
     "vllm", {"model": "Qwen/Qwen3-8B", "tensor_parallel_size": 4, "gpu_memory_utilization": 0.95,
              "speculative_config": '{"method": "ngram"}'}),
    ("the command was `vllm serve m --max-num-seqs 512 --dtype float` and it crashed", "vllm",
     {"model": "m", "max_num_seqs": 512, "dtype": "float"}),
    ("python -m vllm.entrypoints.openai.api_server --model m --quantization awq --max-model-len 4096 --seed -1",
     "vllm", {"model": "m", "quantization": "awq", "max_model_len": 4096, "seed": -1}),
    ("vllm serve m --chat-template 'unclosed quote --max-num-seqs 8", "vllm", {"model": "m", "max_num_seqs": 8}),
    # the interpreter's own switches before `-m` (unbuffered output, vllm#188)
    ("python -u -m vllm.entrypoints.openai.api_server --model m --dtype half --gpu-memory-utilization 0.8  "
     "--max-model-len 4096", "vllm", {"dtype": "half", "gpu_memory_utilization": 0.8, "max_model_len": 4096}),
    ("python3 -u -B -m sglang.launch_server --model-path m --tp 2", "sglang", {"model_path": "m", "tp_size": 2}),
])
def test_a_launch_command_is_read_with_its_flags(line: str, engine: str, fields: dict) -> None:
    (event,) = parse_lines([line])
    assert event.kind == "launch_command"
    got = parse_fields("launch_command", event.text)
    assert got["launch_engine"] == engine and {k: got.get(k) for k in fields} == fields


@pytest.mark.parametrize("line", [
    "I ran python -m sglang.launch_server with two GPUs",  # prose naming the program, no inline code
    "see `vllm served` in the docs",  # not the program
    "[2025-01-01 00:00:00 TP0] the user ran `vllm serve m --dtype float`",  # a line with time: the engine's own text
])
def test_prose_and_the_engines_own_lines_are_no_launch_command(line: str) -> None:
    assert [e.kind for e in parse_lines([line])] == []


def test_the_launch_command_names_the_engine_and_fills_the_arguments() -> None:
    d = analyze(lines=VLLM_2140)
    assert d.config.vllm and d.config.dtype == "float" and d.config.context_len == 512
    assert d.config.arg("enforce_eager") is True


def test_the_logs_own_arguments_win_over_the_launch_command() -> None:
    lines = ["python -m sglang.launch_server --model-path m --mem-fraction-static 0.7 --chunked-prefill-size 1024",
             "[2025-01-01 00:00:00] server_args=ServerArgs(model_path='m', mem_fraction_static=0.88, tp_size=1)"]
    cfg = analyze(lines=lines).config
    assert cfg.engine == "sglang" and cfg.mem_fraction_static == 0.88 and cfg.chunked_prefill_size == 1024


def test_another_engines_launch_command_adds_no_arguments() -> None:
    lines = ["vllm serve m --max-num-seqs 7",
             "[2025-01-01 00:00:00] server_args=ServerArgs(model_path='m', mem_fraction_static=0.88, tp_size=1)"]
    cfg = analyze(lines=lines).config
    assert cfg.engine == "sglang" and cfg.arg("max_num_seqs") is None


@pytest.mark.parametrize("dtype,rule", [("float", "oom.full_precision"), ("float32", "oom.full_precision"),
                                        ("auto", "oom.other"), ("bfloat16", "oom.other"), ("half", "oom.other")])
@pytest.mark.parametrize("program,flag", [("vllm serve m", "--dtype"),
                                          ("python -m sglang.launch_server --model-path m", "--dtype")])
def test_an_oom_in_float32_advises_the_checkpoints_half_precision(dtype: str, rule: str, program: str,
                                                                  flag: str) -> None:
    """float32 weights take twice the checkpoint's half precision: `--dtype auto`, not a lower memory fraction
    (vllm#2140); any half-precision dtype keeps `oom.other`'s advice."""
    d = analyze(lines=[f"{program} --dtype {dtype}", OOM])
    (f,) = [f for f in d.findings if f.id.startswith("oom.")]
    assert f.id == rule
    if rule == "oom.full_precision":
        assert (f.flag, f.suggested, f.current, f.severity) == (flag, "auto", dtype, "critical")


def test_the_real_paste_gets_the_dtype_advice_in_vllms_words() -> None:
    d = analyze(lines=VLLM_2140)
    (f,) = d.findings
    assert (f.id, f.flag, f.suggested, f.engine) == ("oom.full_precision", "--dtype", "auto", "vllm")


def test_a_launch_command_over_several_shell_lines_is_one_command() -> None:
    """A line ending in `\\` continues on the next: the command's flags on every line are read; the first line
    without it ends the command."""
    lines = ["python -m sglang.launch_server \\", "  --model-path m \\", "--tp 8 --mem-fraction-static 0.85",
             "  --chunked-prefill-size 99"]
    (event,) = [e for e in parse_lines(lines) if e.kind == "launch_command"]
    got = parse_fields("launch_command", event.text)
    assert (got["model_path"], got["tp_size"], got["mem_fraction_static"]) == ("m", 8, 0.85)
    assert "chunked_prefill_size" not in got


def test_a_launch_command_among_many_lines_reads_the_same_in_both_paths(tmp_path, monkeypatch) -> None:
    """The range workers send the lines after a command that may continue (`opens_record`), as after a traceback."""
    plain = "[2025-11-26 21:03:11 TP0] Cache flushed successfully! {}"
    command = ["$ python -m sglang.launch_server \\", "    --model-path m --tp 2 \\", "    --max-running-requests 64"]
    lines = [plain.format(i) for i in range(3000)] + command + [plain.format(i) for i in range(3000, 6000)]
    data = ("\n".join(lines) + "\n").encode()
    _same(tmp_path, monkeypatch, data, chunk=1 << 20, processes=True)
    _same(tmp_path, monkeypatch, data, chunk=64 * 1024, processes=True)
    cfg = analyze(lines=lines).config
    assert (cfg.tp_size, cfg.max_running_requests) == (2, 64)


@pytest.mark.parametrize("line,fields,absent", [
    ("vllm serve m --enforce-eager \\", {"enforce_eager": True}, ()),  # a continuation the paste ends on
    ("vllm serve m --enforce-eager > log.txt 2>&1", {"enforce_eager": True}, ()),
    ("vllm serve m --enforce-eager 2>&1 | tee x --max-num-seqs 9", {"enforce_eager": True}, ("max_num_seqs",)),
    ("python -m sglang.launch_server --model-path m --enable-torch-compile &", {"enable_torch_compile": True}, ()),
    ("vllm serve m --dtype float && curl localhost:8000 --data x", {"dtype": "float"}, ("data",)),
    ("vllm serve m --dtype half  # tried --dtype float before", {"dtype": "half"}, ()),
    ("vllm serve m --seed -1e-3 --max-num-seqs 4", {"seed": -0.001, "max_num_seqs": 4}, ()),
    ("python -m sglang.launch_server --tensor-parallel-size 4 --model x", {"tp_size": 4, "model_path": "x"}, ()),
])
def test_shell_syntax_ends_a_command_and_is_no_value(line: str, fields: dict, absent: tuple) -> None:
    """A pipe, a redirection, `&&`, `&` or a comment ends the command; a trailing `\\` is no value; ServerArgs'
    aliases name SGLang's arguments."""
    (event,) = parse_lines([line])
    got = parse_fields("launch_command", event.text)
    assert {k: got.get(k) for k in fields} == fields and not set(absent) & set(got)


def test_a_command_over_lines_with_a_prompt_or_quote_on_each_reads_every_flag() -> None:
    """bash's PS2 (`> `) or a markdown quote before each continuation line."""
    lines = ["$ python -m sglang.launch_server \\", "> --model-path m \\", "> --enable-torch-compile \\", "> --tp 2"]
    (event,) = parse_lines(lines)
    got = parse_fields("launch_command", event.text)
    assert (got["model_path"], got["enable_torch_compile"], got["tp_size"]) == ("m", True, 2)


def test_a_trailing_continuation_never_takes_the_logs_own_line() -> None:
    """The user trimmed the command after a `\\`: the log's first line is its own (its `server_args` read)."""
    lines = ["python -m sglang.launch_server --model-path m --tp 2 \\",
             "[2025-01-01 00:00:00] server_args=ServerArgs(model_path='m', mem_fraction_static=0.88, tp_size=2)"]
    d = analyze(lines=lines)
    assert d.stats.kinds["server_args"] == 1 and d.config.mem_fraction_static == 0.88


@pytest.mark.parametrize("line", [
    "vllm serve is crashing for me with this error:",
    "sglang serve fails when I pass --dtype float as well",
    "I ran `vllm serve` and then `curl` it",  # the program alone in inline code is a command
])
def test_prose_that_begins_with_a_program_is_no_command(line: str) -> None:
    kinds = [e.kind for e in parse_lines([line])]
    assert kinds == (["launch_command"] if "`vllm serve`" in line else [])


def test_the_logs_own_numbers_win_over_the_launch_commands_for_vllm() -> None:
    """vLLM's engine config prints `max_seq_len`, its scheduler the step budget: they, not the pasted flags, are
    the server's."""
    lines = ["vllm serve m --max-model-len 512 --max-num-batched-tokens 2048 --max-num-seqs 8",
             "INFO 01-01 00:00:00 [llm_engine.py:223] Initializing an LLM engine (v0.6.1.post2) with config: "
             "model='m', dtype=torch.bfloat16, max_seq_len=32768, seed=0",
             "INFO 01-01 00:00:01 [arg_utils.py:1] Chunked prefill is enabled with max_num_batched_tokens=8192."]
    cfg = analyze(lines=lines).config
    assert (cfg.context_len, cfg.chunked_prefill_size, cfg.max_running_requests) == (32768, 8192, 8)


def test_the_last_command_of_the_logs_engine_is_read() -> None:
    """An SGLang log with the user's SGLang command, then a vLLM one they also tried: SGLang's flags."""
    lines = ["python -m sglang.launch_server --model-path m --chunked-prefill-size 4096",
             "I also tried `vllm serve m --max-num-seqs 4`",
             "[2025-01-01 00:00:00] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=60.0 GB, "
             "mem usage=15.0 GB."]
    cfg = analyze(lines=lines).config
    assert cfg.engine == "sglang" and cfg.chunked_prefill_size == 4096


def test_float32_under_auto_asks_for_half_precision_by_name() -> None:
    """An engine that keeps a float32 checkpoint in float32 under `auto` (ours): `auto` would change nothing."""
    lines = ["[2025-01-01 00:00:00] server_args=ServerArgs(model_path='m', dtype='auto', tp_size=1)",
             "[2025-01-01 00:00:01] Load weight end. type=LlamaForCausalLM, dtype=torch.float32, avail mem=6.0 GB, "
             "mem usage=15.0 GB.", OOM]
    (f,) = [f for f in analyze(lines=lines).findings if f.id.startswith("oom.")]
    assert (f.id, f.suggested, f.current) == ("oom.full_precision", "bfloat16", "auto")


def test_a_huge_line_is_read_in_bounded_time() -> None:
    """A 1 MB quoted template in a command and a 1 MB line of inline-code spans: each read in well under a second."""
    import time

    for line in ["vllm serve m --chat-template '" + "x y " * 250000 + "' --dtype float", "`A=1" * 250000 + " serve"]:
        start = time.perf_counter()
        list(parse_lines([line]))
        [parse_fields("launch_command", e.text) for e in parse_lines([line])]
        assert time.perf_counter() - start < scaled(1.0)


@pytest.mark.parametrize("line,engine,fields", [
    # https://github.com/sgl-project/sglang/issues/4489: the program after the image of `docker run`
    ("docker run --gpus all -d --name q -p 30000:30000 -v /data:/data --ipc=host lmsysorg/sglang:latest  python3 -m "
     "sglang.launch_server --model-path /data/q --tp 2 --mem-fraction-static 0.8",
     "sglang", {"model_path": "/data/q", "tp_size": 2, "mem_fraction_static": 0.8}),
    # vLLM's image runs its api server: the arguments follow the image
    ("$ sudo docker run --runtime nvidia --gpus all -p 8000:8000 vllm/vllm-openai:v0.8.5 --model Qwen/Q "
     "--max-num-seqs 64", "vllm", {"model": "Qwen/Q", "max_num_seqs": 64}),
    # https://github.com/vllm-project/recipes/pull/12: a root prompt, `# `
    ("# vllm serve /tmp/model/Q --served-model-name Q -dp=8 --enable-expert-parallel", "vllm",
     {"model": "/tmp/model/Q", "data_parallel_size": 8, "enable_expert_parallel": True}),
])
def test_a_command_in_a_container_or_after_a_root_prompt_is_read(line: str, engine: str, fields: dict) -> None:
    (event,) = parse_lines([line])
    got = parse_fields("launch_command", event.text)
    assert got["launch_engine"] == engine and {k: got.get(k) for k in fields} == fields


@pytest.mark.parametrize("line", [
    "docker run --gpus all -d myimage python3 train.py --epochs 3",  # another program in the container
    "docker run -it vllm/vllm-openai-alt:latest bash",  # another image
])
def test_other_containers_are_no_launch_command(line: str) -> None:
    assert [e.kind for e in parse_lines([line])] == []
