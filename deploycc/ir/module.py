"""IRModule: one namespace for graph functions, tensor programs and external functions."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .expr import Function
from .tir import TensorProgram


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


@dataclass
class IRModule:
    functions: dict[str, Function | TensorProgram | ExternFunc | PyFunc] = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)

    def __getitem__(self, name: str):
        return self.functions[name]

    def __contains__(self, name: str) -> bool:
        return name in self.functions

    def graph_functions(self) -> dict[str, Function]:
        return {k: f for k, f in self.functions.items() if isinstance(f, Function)}

    def programs(self) -> dict[str, TensorProgram]:
        return {k: f for k, f in self.functions.items() if isinstance(f, TensorProgram)}

    def with_functions(self, functions: dict) -> IRModule:
        return IRModule(dict(functions), dict(self.attrs))

    def add_program(self, prog: TensorProgram) -> str:
        """Add a tensor program, reusing an existing one with the same printed text."""
        from .printer import program_text  # printer imports module; local import avoids the cycle

        text = program_text(prog, name="_")
        cache = self.attrs.setdefault("_program_text", {})
        if text in cache:
            return cache[text]
        name, i = prog.name, 1
        while name in self.functions:
            name, i = f"{prog.name}{i}", i + 1
        if name != prog.name:
            prog = TensorProgram(name, prog.params, prog.body, prog.sym_params, prog.num_outputs, prog.attrs)
        self.functions[name] = prog
        cache[text] = name
        return name

    def __str__(self) -> str:
        from .printer import module_text

        return module_text(self)
