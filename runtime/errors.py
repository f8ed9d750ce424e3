"""The runtime's error for a package it cannot use, a leaf every other runtime module may import."""
from __future__ import annotations


class PackageError(ValueError):
    """A package that cannot be used; the message says what is wrong and what to do."""
