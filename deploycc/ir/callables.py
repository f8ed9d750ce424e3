"""The module functions that are neither graph functions nor tensor programs: a library function the runtime
implements, and a Python function that runs only where Python does."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ExternFunc:
    """A library function called with call_dps_library (implemented by the runtime)."""

    name: str


@dataclass(frozen=True, eq=False)
class PyFunc:
    """A Python function of the module (`@py_func` in a deploycc.pymodule.BasePyModule subclass).

    `source` is its text (dedented, decorators removed), printed with the rest of the module; `fn` is
    the callable. It takes and returns torch tensors and runs only where Python does: graph functions
    reach it with `call_py_func`, which the VM refuses to lower (deploycc.vm.lower).
    """

    name: str
    source: str
    fn: Callable
