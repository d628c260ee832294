"""A launch command users paste beside their log (docs/log-formats.md §5): its program names the engine, its flags
the server arguments the log may not print. `python -m sglang.launch_server ...`, `vllm serve MODEL ...`,
`python -m vllm.entrypoints.openai.api_server ...`, after a shell prompt and environment assignments, or in inline
code inside a sentence (vllm#2140).
"""
from __future__ import annotations

# the programs, by engine; the command's flags follow
PROGRAMS = {
    "sglang": r"python3?(?:\.\d{1,2})? -m sglang\.launch_server|sglang serve",
    "vllm": r"python3?(?:\.\d{1,2})? -m vllm\.entrypoints\.openai\.api_server|vllm serve",
}
_BEFORE = r"(?:\$ )?(?:[A-Z][A-Z0-9_]{0,63}=\S{0,200} ){0,8}"  # a shell prompt, environment assignments
# NOTE: no groups: the message starts of every kind are compiled into one alternation of named groups
LAUNCH_COMMAND = _BEFORE + "(?:" + "|".join(PROGRAMS.values()) + r")(?= |`|$)"
LAUNCH_IN_CODE = "`(" + LAUNCH_COMMAND + ")"  # inside a sentence only in inline code: prose names programs too

# Short or alternative spellings, as each engine's parser reads them, and their argument names
ALIASES = {
    "sglang": {"tp": "tp_size", "dp": "dp_size", "pp": "pp_size", "ep": "ep_size", "model": "model_path",
               "tensor_parallel_size": "tp_size", "data_parallel_size": "dp_size"},
    "vllm": {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size",
             "q": "quantization"},
}
