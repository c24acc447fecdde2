"""Errors the model registry raises."""


class ModelError(ValueError):
    """Unknown architecture, bad ``nhead`` or an unusable weights file."""

    user_facing = True
