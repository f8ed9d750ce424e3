"""deploycc: compile Hugging Face LLMs into self-contained packages for CUDA, OpenCL and WebGPU."""
from .errors import DeployError
from .hub import LoadedModel, load_model
from .session import ReferenceSession, reference_session

__version__ = "0.1.0"
__all__ = ["DeployError", "LoadedModel", "load_model", "ReferenceSession", "reference_session"]
