"""The project's configuration error, in a leaf module so that every layer can raise it."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad configuration value: the message names the key and what is allowed."""
