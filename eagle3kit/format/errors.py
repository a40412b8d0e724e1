"""Errors raised by the format layer: each names the file it is about."""

from __future__ import annotations

from eagle3kit.errors import UserError


class DatasetError(UserError):
    """A dataset that cannot be used as it is: missing, damaged, locked or too new."""
