from __future__ import annotations


class ModelLoadError(RuntimeError):
    """A model could not be resolved or loaded; the message names the file, field or flag at fault."""
