"""Grammar engines by name (`--grammar-backend`): `xgrammar` compiles a `GrammarSpec` against the model's vocabulary
and makes one matcher per request; `none` serves no constrained request (the front end refuses them)."""
from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from typing import Any

import torch

from toolkit.runtime.constrained.spec import GrammarSpec


class GrammarError(ValueError):
    """The grammar is invalid (or cannot be compiled): the request's fault; the message names the problem."""


class RequestGrammar(ABC):
    """One request's position in its grammar."""

    @abstractmethod
    def accept(self, token: int) -> bool:
        """Advance by a generated token; False when the grammar does not allow it."""

    @abstractmethod
    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into `bitmask[row]`."""

    @property
    @abstractmethod
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted."""


class GrammarBackend(ABC):
    @abstractmethod
    def compile(self, spec: GrammarSpec) -> Any:
        """The compiled grammar; raises GrammarError for an invalid one. Runs on a worker thread."""

    @abstractmethod
    def matcher(self, compiled: Any) -> RequestGrammar:
        """A fresh request position at the grammar's start."""

    @abstractmethod
    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        """A host bitmask for `rows` rows, one bit per vocabulary token."""

    @abstractmethod
    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """Set the logits of disallowed tokens to -inf in `rows`, in place (`bitmask` on the logits' device)."""


class _XGrammarMatcher(RequestGrammar):
    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    def accept(self, token: int) -> bool:
        return self._matcher.accept_token(token)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    @property
    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()


class XGrammarBackend(GrammarBackend):
    """xgrammar (SGLang's and vLLM's default engine), on the tokenizer the model was loaded with; the stop tokens are
    the model's EOS ids."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        import xgrammar

        self._xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=sorted(eos_token_ids) or None)
        # NOTE: xgrammar's own cache is off: `GrammarQueue` caches by key (and remembers failures).
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.vocab_size = vocab_size

    def compile(self, spec: GrammarSpec) -> Any:
        try:
            return self._compile(spec)
        except GrammarError:
            raise
        except (RuntimeError, ValueError, TypeError) as exc:
            raise GrammarError(f"invalid {spec.label}: {_first_line(exc)}") from None

    def _compile(self, spec: GrammarSpec) -> Any:
        compiler = self._compiler
        if spec.kind == "json_schema":
            _check_json(spec.text, spec.label)
            return compiler.compile_json_schema(spec.text, strict_mode=spec.strict)
        if spec.kind == "regex":
            return compiler.compile_regex(spec.text)
        if spec.kind == "ebnf":
            return compiler.compile_grammar(spec.text)
        _check_json(spec.text, spec.label)
        return compiler.compile_structural_tag(spec.text)

    def matcher(self, compiled: Any) -> RequestGrammar:
        return _XGrammarMatcher(self._xgr.GrammarMatcher(compiled))

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return self._xgr.allocate_token_bitmask(rows, self.vocab_size)

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        self._xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size, indices=rows)


def _check_json(text: str, label: str) -> None:
    """xgrammar reads JSON itself, but its message for a malformed document is a parser's internals."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GrammarError(f"invalid {label}: not valid JSON ({exc})") from None
    if not isinstance(value, (dict, bool)):
        raise GrammarError(f"invalid {label}: must be a JSON object, got {type(value).__name__}")


_SOURCE_PREFIX = re.compile(r"^\[[\d:]+\] \S+\.cc:\d+: ")  # `[01:56:51] /project/cpp/x.cc:94: ` of xgrammar's errors


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return _SOURCE_PREFIX.sub("", text.splitlines()[0])[:500]


def grammar_backend(name: str, tokenizer: Any, vocab_size: int, eos_token_ids: frozenset[int]) -> GrammarBackend | None:
    """The backend `--grammar-backend` names; None for `none`."""
    if name == "none":
        return None
    if name == "xgrammar":
        return XGrammarBackend(tokenizer, vocab_size, eos_token_ids)
    raise ValueError(f"--grammar-backend {name!r}: expected one of xgrammar, none")
