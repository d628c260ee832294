"""A launch command users paste beside their log (docs/log-formats.md §5): its program names the engine, its flags
the server arguments the log may not print. `python -m sglang.launch_server ...`, `vllm serve MODEL ...`,
`python -m vllm.entrypoints.openai.api_server ...`, after a shell prompt and environment assignments, or in inline
code inside a sentence (vllm#2140).
"""
from __future__ import annotations

import dataclasses
import functools
import re
import shlex

from toolkit.diagnose.read.prefix import PASTE_QUOTE
from toolkit.diagnose.read.values import Fields, Value, value

SGLANG_LAUNCHER = "python -m sglang.launch_server"  # how a corrected command starts, by engine
VLLM_LAUNCHER = "vllm serve"
_PYTHON = r"python3?(?:\.\d{1,2})? (?:-[bBdEiIOPqsSuvx]{1,4} ){0,4}-m "  # interpreter switches (`-u`, vllm#188)
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

# -- reading ----------------------------------------------------------------------------------------------------

MAX_COMMAND_CHARS = 16384  # a command is read this far (a quoted template may run on; tokens cost per character)
_QUOTE_MARGIN = re.compile(r"\s*" + PASTE_QUOTE)  # a continuation line's markdown quote or bash's prompt (PS2)
_NUMBER = re.compile(r"-\d[\d.]*(?:e[-+]?\d+)?")  # a negative number is a value, not a flag


def _launch_command(text: str) -> dict[str, Value]:
    """`launch_engine` (the engine its program names) and each flag by its argument name (`--tp 2` -> `tp_size`
    for SGLang), up to the end of the inline code it may be in, a shell operator or a comment: `--name value`,
    `--name=value`, a bare `--name` (True); `vllm serve MODEL`'s model."""
    first, *more = text[:MAX_COMMAND_CHARS].split("\n")
    command = " ".join([first.rstrip().rstrip("\\"),
                        *(_QUOTE_MARGIN.sub("", line, count=1).rstrip().rstrip("\\") for line in more)])
    command = command.partition("`")[0]
    engine, program = next(((e, m) for e, p in PROGRAM_AT.items() if (m := p.match(command))), (None, None))
    if program is None:
        return {}
    words = _shell_words(command[program.end():])
    out: dict[str, Value] = {"launch_engine": engine}
    if (program.group(0).endswith(VLLM_LAUNCHER) and words and re.match(r"[\w./~]", words[0])  # NOTE: no `…`
            and ("/" in words[0] or len(words) == 1 or words[1].startswith("-"))):
        out["model"] = words.pop(0)
    aliases = _aliases(engine)
    for i, word in enumerate(words):
        if not word.startswith("-") or word == "-" or _NUMBER.fullmatch(word):
            continue
        name, sep, raw = word.lstrip("-").partition("=")
        name = name.replace("-", "_")
        if not name.isidentifier():
            continue
        if not sep:
            following = words[i + 1] if i + 1 < len(words) else None
            raw = following if following is not None and (not following.startswith("-")
                                                          or _NUMBER.fullmatch(following)) else "True"
        out[aliases.get(name, name)] = value(raw)
    return out


def _shell_words(text: str) -> list[str]:
    """The words of a shell command up to its first operator or comment (`--x 1 2>&1 | tee` -> `--x`, `1`)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote: a paste cut inside the command
        words = text.partition("#")[0].split()
    for i, word in enumerate(words):
        if set(word) <= SHELL_OPERATORS:
            return words[: i - 1] if i and words[i - 1] in ("1", "2") and word[0] in "<>" else words[:i]
    return words


@functools.lru_cache(maxsize=2)
def _aliases(engine: str) -> dict[str, str]:
    """{flag name: argument}: SGLang's aliases as `ServerArgs` declares them (its flags are SGLang's; argparse also
    takes `--model` for `--model-path`), vLLM's short flags."""
    if engine == "vllm":
        return VLLM_SHORT_FLAGS
    from toolkit.runtime.server_args import FLAG, ServerArgs  # torch-free: the flag declarations only

    out = {"model": "model_path"}
    for f in dataclasses.fields(ServerArgs):
        for alias in f.metadata[FLAG].aliases if FLAG in f.metadata else ():
            out[alias.lstrip("-").replace("-", "_")] = f.name
    return out


FIELDS = {"launch_command": Fields(_launch_command, {"launch_engine": str, "model": str}, open=True)}
