"""Per-request sampling and stopping parameters, validated with messages that name the field."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from toolkit.runtime.constrained.spec import GRAMMAR_KINDS, GrammarSpec
from toolkit.runtime.server import limits

DEFAULT_MAX_NEW_TOKENS = 128
_GREEDY_EPS = 1e-6


class SamplingParamsError(ValueError):
    """An invalid sampling parameter; `.param` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class SamplingParams:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    seed: int | None = None
    n: int = 1
    # Constrained decoding (SGLang's names; at most one): the output must match this JSON schema (a JSON string),
    # regular expression, EBNF grammar or xgrammar structural tag (a JSON string). `json_schema_strict` False
    # (OpenAI's `strict: false`) lets objects carry properties the schema does not name where JSON Schema allows.
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    json_schema_strict: bool = True
    # token id (a decimal string, as JSON keys are) -> bias added to its logit, in [-100, 100]
    logit_bias: dict[str, float] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SamplingParams:
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SamplingParamsError(unknown[0], f"unknown sampling parameter {unknown[0]!r}")
        if isinstance(data.get("stop"), str):
            data["stop"] = [data["stop"]]
        if isinstance(data.get("json_schema"), (dict, bool)):
            data["json_schema"] = json.dumps(data["json_schema"])
        if isinstance(data.get("logit_bias"), dict):
            data["logit_bias"] = {str(token): bias for token, bias in data["logit_bias"].items()}
        for name in ("stop", "stop_token_ids"):
            if data.get(name) is None:
                data.pop(name, None)
        params = cls(**data)
        params.verify()
        return params

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.frequency_penalty != 0 or self.presence_penalty != 0 or self.repetition_penalty != 1

    @property
    def grammar(self) -> GrammarSpec | None:
        """The constraint on the output, or None."""
        for kind in GRAMMAR_KINDS:
            text = getattr(self, kind)
            if text is not None:
                return GrammarSpec(kind, text, self.json_schema_strict if kind == "json_schema" else True)
        return None

    @property
    def logit_bias_items(self) -> list[tuple[int, float]]:
        return [(int(token), float(bias)) for token, bias in (self.logit_bias or {}).items()]

    @property
    def stop_str_max_len(self) -> int:
        return max((len(s) for s in self.stop), default=0)

    def verify(self) -> None:
        """Check every field against its type and the limits of `toolkit.runtime.server.limits`."""
        _expect_int("max_new_tokens", self.max_new_tokens, minimum=0)
        _expect_number("temperature", self.temperature, 0.0, limits.TEMPERATURE_MAX)
        _expect_number("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _expect_int("top_k", self.top_k, minimum=-1, maximum=limits.TOP_K_MAX)
        if self.top_k == 0:
            raise SamplingParamsError("top_k", "top_k must be -1 (disabled) or at least 1, got 0")
        _expect_number("min_p", self.min_p, 0.0, 1.0)
        _expect_number("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _expect_number("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _expect_number("repetition_penalty", self.repetition_penalty, 0.0, 2.0, low_open=True)
        _expect_int("n", self.n, minimum=1, maximum=limits.MAX_N)
        if self.seed is not None:
            _expect_int("seed", self.seed, minimum=limits.SEED_MIN, maximum=limits.SEED_MAX)
        self._verify_stops()
        self._verify_grammar()
        self._verify_logit_bias()
        for name in ("ignore_eos", "skip_special_tokens", "json_schema_strict"):
            if not isinstance(getattr(self, name), bool):
                raise SamplingParamsError(name, f"{name} must be a boolean")

    def _verify_stops(self) -> None:
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise SamplingParamsError("stop", "stop must be a non-empty string or a list of non-empty strings")
        if len(self.stop) > limits.MAX_STOP_STRINGS:
            raise SamplingParamsError("stop", f"at most {limits.MAX_STOP_STRINGS} stop strings are allowed, "
                                              f"got {len(self.stop)}")
        if self.stop_str_max_len > limits.MAX_STOP_CHARS:
            raise SamplingParamsError("stop", f"a stop string may have at most {limits.MAX_STOP_CHARS} characters")
        if not all(is_valid_text(s) for s in self.stop):
            raise SamplingParamsError("stop", "stop strings must be valid Unicode (no lone surrogates)")
        if not isinstance(self.stop_token_ids, list) or not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise SamplingParamsError("stop_token_ids", "stop_token_ids must be a list of non-negative integers")
        if len(self.stop_token_ids) > limits.MAX_STOP_TOKEN_IDS:
            raise SamplingParamsError("stop_token_ids", f"at most {limits.MAX_STOP_TOKEN_IDS} stop token ids are "
                                                        f"allowed, got {len(self.stop_token_ids)}")


    def _verify_grammar(self) -> None:
        given = [kind for kind in GRAMMAR_KINDS if getattr(self, kind) is not None]
        if len(given) > 1:
            raise SamplingParamsError(given[1], f"only one of {', '.join(GRAMMAR_KINDS)} may be given, got "
                                                f"{' and '.join(given)}")
        for kind in given:
            text = getattr(self, kind)
            if not isinstance(text, str) or not text:
                raise SamplingParamsError(kind, f"{kind} must be a non-empty string")
            if len(text) > limits.MAX_GRAMMAR_CHARS:
                raise SamplingParamsError(kind, f"{kind} has {len(text)} characters; at most "
                                                f"{limits.MAX_GRAMMAR_CHARS} are allowed")
            if not is_valid_text(text):
                raise SamplingParamsError(kind, f"{kind} must be valid Unicode (no lone surrogates)")
            if kind in ("regex", "ebnf") and _nesting(text) > limits.MAX_GRAMMAR_NESTING:
                raise SamplingParamsError(kind, f"{kind} nests parentheses deeper than {limits.MAX_GRAMMAR_NESTING} "
                                                "levels")

    def _verify_logit_bias(self) -> None:
        bias = self.logit_bias
        if bias is None:
            return
        if not isinstance(bias, dict):
            raise SamplingParamsError("logit_bias", "logit_bias must be an object mapping token ids to biases")
        if len(bias) > limits.MAX_LOGIT_BIAS:
            raise SamplingParamsError("logit_bias", f"at most {limits.MAX_LOGIT_BIAS} entries are allowed, got "
                                                    f"{len(bias)}")
        for token, value in bias.items():
            if not isinstance(token, str) or not token.isascii() or not token.isdigit() or len(token) > 12:
                raise SamplingParamsError("logit_bias", f"logit_bias keys must be token ids, got {shown(token)}")
            _expect_number("logit_bias", value, -limits.LOGIT_BIAS_MAX, limits.LOGIT_BIAS_MAX)


def _nesting(text: str) -> int:
    """How deep the parentheses of a regex or grammar go (escaped ones count too: a bound, not a parse)."""
    depth = deepest = 0
    for char in text:
        if char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth = max(depth - 1, 0)
    return deepest


def is_valid_text(text: str) -> bool:
    """False for strings no UTF-8 encoder takes (lone surrogates such as "\\ud800", which JSON can carry)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(value: Any, width: int = 40) -> str:
    """A value for an error message: never longer than `width` characters, whatever the client sent."""
    text = repr(value) if not _is_int(value) or value.bit_length() < 128 else f"an integer of {value.bit_length()} bits"
    return text if len(text) <= width else f"{text[: width - 3]}..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _expect_int(name: str, value: Any, minimum: int | None, maximum: int | None = None) -> None:
    if not _is_int(value):
        raise SamplingParamsError(name, f"{name} must be an integer, got {shown(value)}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = f"[{minimum if minimum is not None else '-inf'}, {maximum if maximum is not None else 'inf'}]"
        raise SamplingParamsError(name, f"{name} must be in {bounds}, got {shown(value)}")


def _expect_number(name: str, value: Any, low: float, high: float | None, low_open: bool = False) -> None:
    # NOTE: ints are compared as they are: float() of a 400-digit integer raises OverflowError.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise SamplingParamsError(name, f"{name} must be a number, got {shown(value)}")
    too_low = value <= low if low_open else value < low
    if too_low or (high is not None and value > high):
        bounds = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}]"
        raise SamplingParamsError(name, f"{name} must be in {bounds}, got {shown(value)}")
