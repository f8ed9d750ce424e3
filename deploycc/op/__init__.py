"""High-level ops, registered by name into `deploycc.ir.op.OPS` when this package is imported."""
from . import attention, elementwise, linalg, manipulation, norm  # noqa: F401  (registration)
from ._common import OpError

__all__ = ["OpError"]
