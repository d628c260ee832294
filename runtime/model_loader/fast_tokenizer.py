"""A torch-free tokenizer for the HTTP front end: a Hugging Face tokenizer folder read with `tokenizers` and
`jinja2` alone, giving the ids, text and chat prompts that transformers' fast tokenizer gives for that folder."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, NoReturn, overload

import jinja2
import jinja2.nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer

from toolkit.runtime.model_loader.errors import ModelLoadError

ChatTemplate = str | dict[str, str]
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
EXTRA_TOKEN_KEYS = ("extra_special_tokens", "additional_special_tokens")
CLEAN_UP_REPLACEMENTS = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
    (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
)


class ChatTemplateError(ValueError):
    """The chat template is missing, malformed or rejected the messages: the request's fault, not the server's."""


# ---- tokenizer_config.json, special_tokens_map.json and the chat template files ----

@dataclass(frozen=True)
class TokenizerConfig:
    special_tokens: dict[str, AddedToken]  # bos_token, eos_token, ... and model-specific names such as image_token
    extra_special_tokens: list[AddedToken]
    added_tokens: dict[int, AddedToken]  # the config's added_tokens_decoder
    clean_up_tokenization_spaces: bool
    clean_up_bpe: bool
    split_special_tokens: bool
    chat_template: ChatTemplate | None


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _token(value: str | dict[str, Any]) -> AddedToken:
    if isinstance(value, str):
        return AddedToken(value, special=True)
    return AddedToken(**{key: item for key, item in value.items() if key != "__type"})


def _is_token(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, dict) and value.get("__type") == "AddedToken")


def _extra_tokens(config: dict[str, Any]) -> list[Any] | dict[str, Any]:
    return config.get("extra_special_tokens") or config.get("additional_special_tokens") or []


def _legacy_special(value: Any) -> Any:
    return {**value, "__type": "AddedToken", "special": True} if isinstance(value, dict) else value


def _merged_config(folder: Path) -> dict[str, Any]:
    config = _read_json(folder / "tokenizer_config.json")
    if "added_tokens_decoder" in config:
        return config
    # NOTE: transformers reads special_tokens_map.json only for configs without added_tokens_decoder (older ones)
    legacy = _read_json(folder / "special_tokens_map.json")
    named = {key: _legacy_special(value) for key, value in legacy.items() if key not in EXTRA_TOKEN_KEYS}
    return {**config, **named, "extra_special_tokens": _extra_tokens(config) or _extra_tokens(legacy)}


def _special_tokens(config: dict[str, Any]) -> dict[str, AddedToken]:
    named = {key: _token(config[key]) for key in NAMED_SPECIAL_TOKENS if config.get(key) is not None}
    named |= {key: _token(value) for key, value in config.items()
              if key.endswith("_token") and key not in NAMED_SPECIAL_TOKENS and _is_token(value)}
    extra = _extra_tokens(config)
    if isinstance(extra, dict):
        named |= {key: _token(value) for key, value in extra.items()}
    return named


def _extra_special_tokens(config: dict[str, Any]) -> list[AddedToken]:
    extra = _extra_tokens(config)
    return [] if isinstance(extra, dict) else [_token(value) for value in extra]


def _chat_template(folder: Path, config: dict[str, Any]) -> ChatTemplate | None:
    files = {"default": folder / "chat_template.jinja"} if (folder / "chat_template.jinja").is_file() else {}
    files |= {path.stem: path for path in sorted((folder / "additional_chat_templates").glob("*.jinja"))}
    if files:
        templates = {name: path.read_text(encoding="utf-8") for name, path in files.items()}
        return templates["default"] if list(templates) == ["default"] else templates
    template = config.get("chat_template")
    if isinstance(template, list):
        return {entry["name"]: entry["template"] for entry in template}
    return template


def read_tokenizer_config(folder: Path) -> TokenizerConfig:
    config = _merged_config(folder)
    return TokenizerConfig(
        special_tokens=_special_tokens(config),
        extra_special_tokens=_extra_special_tokens(config),
        added_tokens={int(index): _token(fields) for index, fields in config.get("added_tokens_decoder", {}).items()},
        clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
        clean_up_bpe=bool(config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)),
        split_special_tokens=bool(config.get("split_special_tokens", False)),
        chat_template=_chat_template(folder, config),
    )


def _register_special_tokens(backend: Tokenizer, config: TokenizerConfig) -> None:
    """Adds the config's added and special tokens that tokenizer.json lacks, as transformers does on load."""
    present = backend.get_added_tokens_decoder().values()
    reprs = {repr(token) for token in present}
    tokens = [token for _, token in sorted(config.added_tokens.items()) if repr(token) not in reprs]
    known = {token.content for token in present} | {token.content for token in tokens}
    for token in [*config.special_tokens.values(), *config.extra_special_tokens]:
        if token.content not in known:
            tokens.append(token)
            known.add(token.content)
    named = {token.content for token in config.special_tokens.values()}
    for token in tokens:
        if token.content in named and not token.special:
            token.special = True
    if tokens:
        backend.add_tokens(tokens)


# ---- chat templates, rendered in transformers' sandbox ----

class _GenerationTag(Extension):
    """`{% generation %}` marks assistant text for training masks; a prompt renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: jinja2.runtime.Macro) -> str:
        return caller()


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # NOTE: unlike jinja's own tojson, no HTML escaping: prompts are not HTML
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment


@lru_cache(maxsize=8)
def _compiled(template: str) -> jinja2.Template:
    return _environment().from_string(template)


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool,
                variables: Mapping[str, str], tools: list[dict[str, Any]] | None = None) -> str:
    """The prompt text a chat template makes of the messages; keys whose value is None are dropped first."""
    chat = [{key: value for key, value in message.items() if value is not None} for message in messages]
    try:
        return _compiled(template).render(
            **variables, messages=chat, tools=tools, documents=None, add_generation_prompt=add_generation_prompt
        )
    except Exception as exc:  # NOTE: a template is foreign code; anything it raises means it rejected the messages
        raise ChatTemplateError(f"{type(exc).__name__}: {exc}") from exc


def _pick_template(template: ChatTemplate | None) -> str:
    if isinstance(template, dict):
        if "default" not in template:
            raise ChatTemplateError(f"the tokenizer has chat templates {sorted(template)} but no 'default' one")
        return template["default"]
    if template is None:
        raise ChatTemplateError("the tokenizer has no chat template; start the server with --chat-template")
    return template


# ---- the tokenizer ----

class FastTokenizer:
    """The part of a transformers fast tokenizer the server uses: encode, decode, chat templates, BOS/EOS ids."""

    def __init__(self, backend: Tokenizer, config: TokenizerConfig) -> None:
        backend.no_truncation()
        backend.no_padding()
        _register_special_tokens(backend, config)
        backend.encode_special_tokens = config.split_special_tokens
        self.backend = backend
        self.config = config
        self.chat_template: ChatTemplate | None = config.chat_template  # --chat-template replaces it
        # NOTE: transformers skips the clean-up for BPE models: it would delete real spaces before punctuation
        is_bpe = type(backend.model).__name__ == "BPE"
        self.cleans_up_spaces = config.clean_up_tokenization_spaces and (not is_bpe or config.clean_up_bpe)

    @classmethod
    def from_folder(cls, folder: Path) -> FastTokenizer:
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{folder}: no tokenizer.json (prepare the folder with prepare_tokenizer_folder)")
        return cls(Tokenizer.from_file(str(path)), read_tokenizer_config(folder))

    @property
    def bos_token_id(self) -> int | None:
        return self._token_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._token_id("eos_token")

    def _token_id(self, name: str) -> int | None:
        # NOTE: every named special token is in the vocabulary once _register_special_tokens has run
        token = self.config.special_tokens.get(name)
        return None if token is None else self.backend.token_to_id(token.content)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        text = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return self._clean_up(text) if self.cleans_up_spaces else text

    @staticmethod
    def _clean_up(text: str) -> str:
        for spaced, joined in CLEAN_UP_REPLACEMENTS:
            text = text.replace(spaced, joined)
        return text

    @property
    def default_chat_template(self) -> str | None:
        """The template chats render with (None when there is none)."""
        template = self.chat_template
        return template.get("default") if isinstance(template, dict) else template

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The named special tokens as text: the variables (bos_token, eos_token, ...) a chat template sees."""
        return {name: token.content for name, token in self.config.special_tokens.items()}

    @overload
    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = ...,
                            tokenize: Literal[True] = ..., tools: list[dict[str, Any]] | None = ...) -> list[int]: ...

    @overload
    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = ...,
                            *, tokenize: Literal[False], tools: list[dict[str, Any]] | None = ...) -> str: ...

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False,
                            tokenize: bool = True, tools: list[dict[str, Any]] | None = None) -> list[int] | str:
        """The chat prompt's ids (or text); raises ChatTemplateError when the template rejects the messages."""
        text = render_chat(_pick_template(self.chat_template), messages, add_generation_prompt,
                           self.special_tokens_map, tools)
        return self.encode(text, add_special_tokens=False) if tokenize else text
