"""Tokenizers and chat templates from a Hugging Face folder or a GGUF file's metadata, never from a hub."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from toolkit.runtime.model_loader.embedded import resolve_model_path
from toolkit.runtime.model_loader.errors import ModelLoadError
from toolkit.runtime.model_loader.fast_tokenizer import FastTokenizer

logger = logging.getLogger(__name__)
TOKENIZER_INPUT_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "tokenizer.model",
    "vocab.json", "merges.txt", "chat_template.jinja", "config.json",
)
PIPELINE_PARTS = ("normalizer", "pre_tokenizer", "post_processor", "decoder")


def tokenizer_cache_dir() -> Path:
    root = os.environ.get("TOOLKIT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "toolkit")
    return Path(root) / "tokenizers"


def _cache_key(ident: str) -> str:
    return hashlib.sha256(f"{ident}|transformers {version('transformers')}".encode()).hexdigest()[:16]


def _gguf_cache_key(gguf_path: Path) -> str:
    stat = gguf_path.stat()
    return _cache_key(f"{gguf_path.resolve()}|{stat.st_size}|{int(stat.st_mtime)}")


def _folder_cache_key(folder: Path) -> str:
    stats = [f"{path.name}:{path.stat().st_size}:{path.stat().st_mtime_ns}"
             for path in sorted(folder.iterdir()) if path.name in TOKENIZER_INPUT_FILES]
    return _cache_key("|".join([str(folder.resolve()), *stats]))


def _save_to_cache(tokenizer, cached: Path) -> None:
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    try:
        tokenizer.save_pretrained(str(tmp))
        os.replace(tmp, cached)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        logger.warning("could not cache the converted tokenizer at %s: %s", cached, exc)


def _load_gguf_tokenizer(gguf_path: Path):
    from transformers import AutoTokenizer

    # NOTE: converting the GGUF vocabulary takes seconds; the converted tokenizer is cached on disk.
    cached = tokenizer_cache_dir() / _gguf_cache_key(gguf_path)
    if (cached / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(str(cached), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True
    )
    _save_to_cache(tokenizer, cached)
    return tokenizer


def _load_folder_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    if not any((folder / name).exists() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise ModelLoadError(
            f"{folder}: no tokenizer files (tokenizer.json, tokenizer.model or vocab.json); "
            "pass --tokenizer-path to a folder that has them"
        )
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


@lru_cache(maxsize=8)
def _load_tokenizer_cached(path: str):
    resolved = Path(path)
    if resolved.is_file():
        if resolved.suffix != ".gguf":
            raise ModelLoadError(f"{resolved}: a tokenizer path must be a folder or a .gguf file")
        return _load_gguf_tokenizer(resolved)
    return _load_folder_tokenizer(resolved)


def load_tokenizer(path: str | Path | None = None):
    """A `transformers` fast tokenizer for a model folder or GGUF file (the embedded model when None)."""
    return _load_tokenizer_cached(str(resolve_model_path(path)))


def _pipeline_state(tokenizer: Tokenizer) -> list[Any]:
    parts = [getattr(tokenizer, name) for name in PIPELINE_PARTS]
    states = [None if part is None else json.loads(part.__getstate__()) for part in parts]
    return [type(tokenizer.model).__name__, *states]


def _runs_tokenizer_json_as_written(folder: Path, reference) -> bool:
    """transformers' generic backend runs tokenizer.json as written; model-specific tokenizer classes rebuild the
    pipeline in Python (and its Mistral regex fix patches it), so for those the folder is not what transformers runs."""
    from transformers import TokenizersBackend

    written = folder / "tokenizer.json"
    if type(reference) is not TokenizersBackend or not written.is_file():
        return False
    return _pipeline_state(Tokenizer.from_file(str(written))) == _pipeline_state(reference.backend_tokenizer)


def _converted_folder(cached: Path, tokenizer) -> Path:
    if not (cached / "tokenizer.json").is_file():
        _save_to_cache(tokenizer, cached)
    if not (cached / "tokenizer.json").is_file():
        raise ModelLoadError(
            f"could not write the converted tokenizer to {cached}; set TOOLKIT_CACHE_DIR to a writable folder"
        )
    return cached


def prepare_tokenizer_folder(path: str | Path | None = None) -> Path:
    """A folder whose tokenizer.json is exactly what transformers runs for this model folder or GGUF file (the
    embedded model when None): the folder itself, or transformers' conversion of it saved under
    tokenizer_cache_dir(). Imports transformers; run it where torch is loaded anyway (the scheduler process)."""
    resolved = resolve_model_path(path)
    if resolved.is_file():
        cached = tokenizer_cache_dir() / _gguf_cache_key(resolved)
        if (cached / "tokenizer.json").is_file():
            return cached
        return _converted_folder(cached, load_tokenizer(resolved))
    reference = load_tokenizer(resolved)
    if _runs_tokenizer_json_as_written(resolved, reference):
        return resolved
    return _converted_folder(tokenizer_cache_dir() / _folder_cache_key(resolved), reference)


def load_fast_tokenizer(folder: str | Path) -> FastTokenizer:
    """The torch-free tokenizer of a folder made by prepare_tokenizer_folder."""
    return FastTokenizer.from_folder(Path(folder))
