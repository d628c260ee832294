"""Rules judge signals, not one paste's words (issue 49): no rule module holds a model's name, a Ray actor's class
name the corpus shows, or a string (of `MIN_CHARS` or more, not a message's words) that one excerpt alone holds.
A key fitted to one paste (an actor's name, a helper function's name, a model's parameter count against a GPU the
log does not size) passes its own excerpt and fails the next log."""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest

from toolkit.diagnose.config import ServerConfig
from toolkit.diagnose.read.errors import SIGNS
from toolkit.diagnose.read.fields import FIELDS
from toolkit.diagnose.read.messages import KINDS
from toolkit.diagnose.vocabulary import ENGINES, IDEAS, KNOBS
from toolkit.runtime.server_args import flag_fields

RULES = Path(__file__).parents[2] / "diagnose" / "rules"
CORPUS = Path(__file__).parent / "real_logs"
MIN_CHARS = 10
MODEL_NAME = re.compile(r"(?i)\b(?:llama|qwen|mistral|mixtral|deepseek|gemma|phi-?\d|glm|kimi|gpt-oss|smollm|"
                        r"internlm|baichuan|yi-\d)[\w.-]*")
ACTOR = re.compile(r"\(([A-Za-z_][\w.]{2,63}) pid=\d")
WORD = re.compile(r"[a-z]+")  # a plain word (`retractions`): a message's, no key


def printed_key(s: str) -> bool:
    """An argument's or field's name as the engine prints it in its settings (`block_size=16`, `'block_size': 16`):
    the rule reads it from the parsed arguments, which every log of that engine prints the same way."""
    return any(re.search(re.escape(s) + r"(?:=|['\"]: )", text) for text in excerpts())


def rule_literals(module: Path) -> set[str]:
    """The plain string constants of a module: not docstrings, not the words of an f-string message."""
    tree = ast.parse(module.read_text())
    skipped = {id(node.body[0].value) for node in ast.walk(tree)
               if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
               and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    skipped |= {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in skipped} - arguments_read(tree)


@lru_cache(maxsize=1)
def excerpts() -> tuple[str, ...]:
    """The excerpts quoted from threads (not the whole logs recorded here: their engines' own words are in them),
    without their header block: the corpus's own words about the excerpt, not the log's."""
    return tuple(_quoted(log.read_text(errors="replace")) for log in sorted(CORPUS.glob("*/*.log"))
                 if log.parent.name != "recorded")


def _quoted(text: str) -> str:
    lines = text.splitlines(keepends=True)
    header = next((i for i, line in enumerate(lines) if not line.startswith("# ")), len(lines))
    return "".join(lines[header:])


@lru_cache(maxsize=1)
def vocabulary() -> frozenset[str]:
    """diagnose's own names (ideas, event kinds, field and config names, the signs an error record is read for):
    keys of its tables, not a log's words."""
    fields = {key for declared in FIELDS.values() for key in declared.keys}
    arguments = {knob.arg for engine in ENGINES for knob in KNOBS[engine]}
    return (frozenset(IDEAS) | frozenset(KINDS) | frozenset(fields) | frozenset(ServerConfig.__dataclass_fields__)
            | frozenset(arguments) | frozenset(field[0].name for field in flag_fields()) | frozenset(SIGNS))


def arguments_read(tree: ast.AST) -> set[str]:
    """The engine arguments a rule reads by name from the parsed settings (`config.arg("block_size")`)."""
    return {call.args[0].value for call in ast.walk(tree)
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "arg"
            and call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)}


@lru_cache(maxsize=1)
def actors() -> frozenset[str]:
    return frozenset(name for text in excerpts() for name in ACTOR.findall(text))


@pytest.mark.parametrize("module", sorted(RULES.glob("*.py")), ids=lambda p: p.stem)
def test_a_rule_holds_no_model_name_actor_name_or_one_excerpts_string(module: Path) -> None:
    literals = rule_literals(module)
    assert not [s for s in literals if MODEL_NAME.search(s)], "a model's name"
    assert not literals & actors(), "a Ray actor's class name"
    single = [s for s in literals - vocabulary() if len(s) >= MIN_CHARS and not WORD.fullmatch(s)
              and sum(s in t for t in excerpts()) == 1 and not printed_key(s)]
    assert not single, f"strings only one excerpt holds: {single}"


def test_the_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The test can fail: a module keyed on a model's name, an actor and one excerpt's words is caught."""
    text = next(t for t in excerpts() if len(t) > 200)
    line = next(x for x in text.splitlines()[5:] if len(x.strip()) > 40).strip()[:40]
    module = tmp_path / "fitted.py"
    module.write_text(f"NAME = 'Qwen2.5-72B'\nACTOR = {sorted(actors())[0]!r}\nKEY = {line!r}\n")
    literals = rule_literals(module)
    assert any(MODEL_NAME.search(s) for s in literals) and literals & actors()
    assert any(sum(s in t for t in excerpts()) >= 1 for s in literals if s == line)
