"""A launch command users paste beside their log (docs/log-formats.md §5): its program names the engine, its flags
the server arguments the log may not print. `python -m sglang.launch_server ...`, `vllm serve MODEL ...`,
`python -m vllm.entrypoints.openai.api_server ...`, after a shell prompt and environment assignments, or in inline
code inside a sentence (vllm#2140).
"""
from __future__ import annotations

import re

SGLANG_LAUNCHER = "python -m sglang.launch_server"  # how a corrected command starts, by engine
VLLM_LAUNCHER = "vllm serve"
_PYTHON = r"python3?(?:\.\d{1,2})? -m "
PROGRAMS = {
    "sglang": _PYTHON + r"sglang\.launch_server|sglang serve",
    # vLLM's image runs the api server: its arguments follow the image in `docker run ... vllm/vllm-openai:TAG ...`
    "vllm": _PYTHON + r"vllm\.entrypoints\.openai\.api_server|" + re.escape(VLLM_LAUNCHER)
            + r"|vllm/vllm-openai(?::[\w.-]{1,64})?",
}
assert re.fullmatch(PROGRAMS["sglang"], SGLANG_LAUNCHER), "the corrected command is read as one"
PROGRAM_WORDS = ("serve", "vllm-openai")  # every program above holds one (`launch_server`, `api_server`): a quick test
_BEFORE = r"(?:[$#] )?(?:[A-Z][A-Z0-9_]{0,63}=[^\s`]{0,200} ){0,8}"  # a shell prompt (user, root), assignments
# NOTE: a command, not prose naming its program (`vllm serve is crashing ...`): nothing, or the inline code's end,
# after the program; or a flag, a line continuation, a path-like model, or one word then a flag
_THEN = r"(?=\s*(?:`|$)| +(?:-|\\|[^\s`]*/|[^\s`]+ +(?:-|\\)))"
LAUNCH_COMMAND = _BEFORE + "(?:" + "|".join(PROGRAMS.values()) + ")" + _THEN
LAUNCH_IN_CODE = "`(" + LAUNCH_COMMAND + ")"  # inside a sentence only in inline code: prose names programs too
# a container's command: `docker run [options] IMAGE python3 -m sglang.launch_server ...` (sglang#4489), vLLM's image
# with its arguments (the command then starts at the program or the image)
IN_CONTAINER = r"(?:[$#] )?(?:sudo )?(?:docker|podman) run .{0,4000}? (" + LAUNCH_COMMAND + ")"
PROGRAM_AT = {engine: re.compile(_BEFORE + "(?:" + program + ")") for engine, program in PROGRAMS.items()}

SHELL_OPERATORS = frozenset("|&;<>()")  # a token of these ends the command (a pipe, a redirection, `&&`, `&`)
# vLLM's short flags and the arguments they set (SGLang's aliases are `ServerArgs`'s own)
VLLM_SHORT_FLAGS = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size",
                    "q": "quantization"}
