"""Lowering to the VM: bytecode, kernels, storages (see lower.py)."""
from .lower import FORMAT_VERSION, Lowered, disassemble, lower_vm, sym_json

__all__ = ["FORMAT_VERSION", "Lowered", "disassemble", "lower_vm", "sym_json"]
