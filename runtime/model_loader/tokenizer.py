"""Tokenizers and chat templates from a Hugging Face folder or a GGUF file's metadata, never from a hub."""
from __future__ import annotations

import hashlib
import logging
import os
from functools import lru_cache
from pathlib import Path

from toolkit.runtime.model_loader.embedded import resolve_model_path
from toolkit.runtime.model_loader.errors import ModelLoadError

logger = logging.getLogger(__name__)


def tokenizer_cache_dir() -> Path:
    root = os.environ.get("TOOLKIT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "toolkit")
    return Path(root) / "tokenizers"


def _gguf_cache_key(gguf_path: Path) -> str:
    stat = gguf_path.stat()
    ident = f"{gguf_path.resolve()}|{stat.st_size}|{int(stat.st_mtime)}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _load_gguf_tokenizer(gguf_path: Path):
    from transformers import AutoTokenizer

    # NOTE: converting the GGUF vocabulary takes seconds; the converted tokenizer is cached on disk.
    cached = tokenizer_cache_dir() / _gguf_cache_key(gguf_path)
    if (cached / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(str(cached), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True
    )
    try:
        tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
        tokenizer.save_pretrained(str(tmp))
        os.replace(tmp, cached)
    except OSError as exc:
        logger.warning("could not cache the GGUF tokenizer at %s: %s", cached, exc)
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
