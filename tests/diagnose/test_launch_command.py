"""A launch command pasted beside the log (docs/log-formats.md §5): read at a line's start or in inline code inside
a sentence, its program names the engine and its flags fill the server arguments the log does not print; the log's
own arguments win. `oom.full_precision` is what it made possible first (vllm#2140: `--dtype=float` on a 22 GB card)."""
from __future__ import annotations

import pytest

from tests.diagnose.test_fastpath import _same
from toolkit.diagnose import analyze
from toolkit.diagnose.fields import parse_fields
from toolkit.diagnose.lines import parse_lines

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
