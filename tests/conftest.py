import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the Hugging Face Hub
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

from fixtures import TINY, make_tiny  # noqa: E402


@pytest.fixture(scope="session", params=sorted(TINY))
def tiny_name(request):
    return request.param


@pytest.fixture(scope="session")
def tiny_path(tiny_name):
    return make_tiny(tiny_name)
