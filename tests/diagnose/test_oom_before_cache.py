"""`oom.before_cache`: a CUDA OOM whose own accounting (torch's) shows the process holding nearly the whole device
before anything in the log sized a KV cache or served: the weights and the profiling forward do not fit the device,
so more GPUs or a quantized model (a shorter context where the weights fit), never a lower memory fraction."""
from __future__ import annotations

from pathlib import Path

from toolkit.diagnose import analyze
from toolkit.diagnose.read.fields import parse_fields

REAL = Path(__file__).parent / "real_logs"
COMMAND = ("python -u -m vllm.entrypoints.openai.api_server --model m --dtype half --gpu-memory-utilization 0.8  "
           "--max-model-len 4096")
OLD_TORCH = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB (GPU 0; {total} GiB total "
             "capacity; {held} GiB already allocated; 46.44 MiB free; {held} GiB reserved in total by PyTorch)")
NEW_TORCH = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 350.00 MiB. GPU 0 has a total capacity of "
             "23.68 GiB of which 212.81 MiB is free. Including non-PyTorch memory, this process has 23.45 GiB memory "
             "in use. Of the allocated memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTorch "
             "but unallocated.")


def ids(lines: list[str]) -> list[str]:
    return [f.id for f in analyze(lines=lines).findings if f.id.startswith("oom.")]


def test_torchs_accounting_is_read_in_both_of_its_formats() -> None:
    old = parse_fields("oom", OLD_TORCH.format(total="10.73", held="9.86"))
    assert (old["device_total_gb"], old["process_gb"], old["device_free_gb"]) == (10.73, 9.86, 0.045)
    new = parse_fields("oom", NEW_TORCH)
    assert (new["device_total_gb"], new["process_gb"], new["device_free_gb"]) == (23.68, 23.45, 0.208)


def test_the_whole_device_held_before_a_kv_cache_is_the_model_not_the_fraction() -> None:
    d = analyze(lines=[COMMAND, "", OLD_TORCH.format(total="10.73", held="9.86")])
    (f,) = [f for f in d.findings if f.id.startswith("oom.")]
    assert f.id == "oom.before_cache" and f.severity == "critical"
    assert f.flag == "--tensor-parallel-size" and "--quantization" in (f.suggested or "")
    assert "--max-model-len" in (f.suggested or "") and "--gpu-memory-utilization" not in (f.suggested or "")


def test_after_a_kv_cache_or_with_memory_to_spare_it_stays_a_run_time_oom() -> None:
    served = ("INFO 02-05 04:53:21 llm_engine.py:706] Avg prompt throughput: 1137.2 tokens/s, Avg generation "
              "throughput: 193.7 tokens/s, Running: 5 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 4.2%, "
              "CPU KV cache usage: 0.0%")
    for lines in ([COMMAND, served, OLD_TORCH.format(total="10.73", held="9.86")],
                  [COMMAND, OLD_TORCH.format(total="44.56", held="27.93")],  # 16 GiB held by another process
                  [OLD_TORCH.format(total="10.73", held="9.86")]):  # no start seen: an excerpt of a run-time OOM
        assert "oom.before_cache" not in ids(lines) and "oom.other" in ids(lines)


def test_the_real_excerpt_of_a_7b_model_in_half_precision_on_an_11_gb_card() -> None:
    """vllm-project/vllm#188: Mistral-7B (~14.5 GB in fp16) on an RTX 2080 Ti, the command with `python -u`."""
    d = analyze([REAL / "vllm/vllm-188-v0-mistral-fp16-on-11gb-oom.log"])
    assert d.config.vllm and [f.id for f in d.findings if f.id.startswith("oom.")] == ["oom.before_cache"]
