"""IRModule: one namespace for graph functions, tensor programs and external functions."""
from __future__ import annotations

from dataclasses import dataclass, field

from .callables import ExternFunc, PyFunc
from .expr import Function
from .printer import module_text, program_text
from .tir import TensorProgram

__all__ = ["ExternFunc", "IRModule", "PyFunc"]


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
        return module_text(self)
