"""deploycc: compile Hugging Face LLMs into self-contained packages for CUDA, OpenCL and WebGPU."""
from .errors import DeployError
from .hub import load_model
from .loaded import LoadedModel
from .session import ReferenceSession, reference_session

__version__ = "0.1.0"
__all__ = ["DeployError", "LoadedModel", "load_model", "ReferenceSession", "reference_session", "BasePyModule",
           "py_func"]


def __getattr__(name):
    # Python modules need torch; import them only when asked for.
    if name in ("BasePyModule", "py_func"):
        from . import pymodule

        return getattr(pymodule, name)
    raise AttributeError(f"module 'deploycc' has no attribute {name!r}")
