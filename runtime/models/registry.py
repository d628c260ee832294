"""Architecture name (config.json `architectures[0]`) → model class."""
from __future__ import annotations

from toolkit.runtime.model_loader.config import SUPPORTED_ARCHITECTURES
from toolkit.runtime.models.decoder import CausalLM

# NOTE: the four families differ only in flags the config carries (attention_bias, qk_norm).
MODEL_CLASSES: dict[str, type[CausalLM]] = {name: CausalLM for name in SUPPORTED_ARCHITECTURES}
