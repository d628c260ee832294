"""What a constrained request asks for: a grammar of one kind, by its text. Torch-free: the front end and the
sampling parameters carry it; the scheduler compiles it (`grammar_queue`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GrammarKind = Literal["json_schema", "regex", "ebnf", "structural_tag"]
GRAMMAR_KINDS: tuple[GrammarKind, ...] = ("json_schema", "regex", "ebnf", "structural_tag")
GRAMMAR_BACKENDS = ("xgrammar", "none")

# NOTE: OpenAI's json_object is any JSON object; SGLang compiles it as this schema too.
JSON_OBJECT_SCHEMA = '{"type": "object"}'


@dataclass(frozen=True)
class GrammarSpec:
    """One grammar, also its compile cache's key. `strict` (JSON schemas only): no properties or items beyond
    those the schema names."""

    kind: GrammarKind
    text: str
    strict: bool = True

    @property
    def label(self) -> str:
        """How an error names it: the request field that carried it."""
        return self.kind
