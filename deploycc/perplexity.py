"""Perplexity of a package (or any session) on a text: the llama-perplexity of this tool.

The sliding-window computation lives in runtime/perplexity.py (numpy only, shipped in packages and
used by benchmarks/compare.py for every tool); this module adds text input and one-line errors.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .errors import DeployError
from .runtime.perplexity import Perplexity, PerplexityError, nll_of_targets, windows
from .runtime.perplexity import perplexity as _perplexity

__all__ = ["Perplexity", "nll_of_targets", "windows", "perplexity", "package_perplexity", "read_text_file"]


def read_text_file(path: str | Path) -> str:
    """The file as UTF-8 text; a binary file (bytes that are not UTF-8, or NUL bytes) is a one-line DeployError."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DeployError(f"{path} is not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start}); give a text "
                          f"file") from None
    if "\0" in text:
        raise DeployError(f"{path} is not text (it holds NUL bytes, at offset {data.index(0)}); give a text file")
    return text


def perplexity(session, ids: Sequence[int], window: int = 512, stride: int = 512) -> Perplexity:
    """runtime.perplexity.perplexity with its argument errors as one-line DeployErrors."""
    try:
        return _perplexity(session, ids, window, stride)
    except PerplexityError as e:
        raise DeployError(str(e)) from None


def package_perplexity(package, text: str, window: int = 512, stride: int = 512, device: str | None = None,
                       trust=None) -> Perplexity:
    """Tokenise `text` with the package's tokenizer (special tokens as the tokenizer adds them, as
    the recipe does) and measure perplexity with the package's engine."""
    from .runtime.engine import Engine

    engine = Engine.load(package, device=device, trust=trust)  # trust: runtime/trust.py TrustPolicy
    return perplexity(engine, engine.tokenizer.encode(text), window, stride)
