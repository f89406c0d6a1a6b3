"""Exception types shared across the SDK. Each part raises a specific subclass with an actionable message.

Example:
    >>> from duetaspan.errors import CheckpointError
    >>> raise CheckpointError("model.safetensors: missing key 'text_emb.weight'")
    Traceback (most recent call last):
    ...
    duetaspan.errors.CheckpointError: model.safetensors: missing key 'text_emb.weight'
"""

from __future__ import annotations


class DuetaspanError(Exception):
    """Base class of every error the SDK raises on purpose."""


class ConfigError(DuetaspanError, ValueError):
    """A configuration file, preset or option is invalid; the message names the field."""


class CheckpointError(DuetaspanError):
    """A weights, config or tokenizer file is missing, truncated or does not match the model."""


class AudioFormatError(DuetaspanError, ValueError):
    """Audio that cannot be used: empty, too short, unsupported encoding or size."""
