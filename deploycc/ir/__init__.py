"""The cross-level IR: symbolic integers, annotations, graph functions and tensor programs."""
from . import annotation, sym, tir
from .annotation import Object, Shape, Tensor
from .builder import BlockBuilder
from .expr import (
                   Binding,
                   BindingBlock,
                   Call,
                   CallDPSLibrary,
                   CallFunc,
                   CallTIR,
                   Constant,
                   Function,
                   If,
                   MatchCast,
                   SeqExpr,
                   ShapeExpr,
                   Tuple,
                   TupleGetItem,
                   Var,
)
from .module import ExternFunc, IRModule
from .tir import TensorProgram

__all__ = ["annotation", "sym", "tir", "Object", "Shape", "Tensor", "BlockBuilder", "Binding", "BindingBlock",
           "Call", "CallDPSLibrary", "CallFunc", "CallTIR", "Constant", "Function", "If", "MatchCast", "SeqExpr",
           "ShapeExpr", "Tuple", "TupleGetItem", "Var", "ExternFunc", "IRModule", "TensorProgram"]
