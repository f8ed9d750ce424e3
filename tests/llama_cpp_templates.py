"""Real chat templates of model families whose files the tests cannot fetch from the Hugging Face Hub: llama.cpp keeps
them for its own tool-call tests in models/templates/ (Llama 3.1, Mistral Nemo, Mistral Small 3.2, Hermes 3, ...),
and PyPI's llama-cpp-python sdist carries llama.cpp. The sdist (the version benchmarks/build_llama_cpp.py builds,
pinned by sha256, about 75 MB) is fetched once into $DEPLOYCC_HOME/llama.cpp/sdist, where the benchmark finds it too;
the templates are read from it."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from functools import cache
from pathlib import Path

from conftest import missing

VERSION = "0.3.36"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"


def _sdist() -> Path:
    home = Path(os.environ.get("DEPLOYCC_HOME") or Path.home() / ".cache" / "deploycc")
    sdist = home / "llama.cpp" / "sdist" / f"llama_cpp_python-{VERSION}.tar.gz"
    if not sdist.exists():
        sdist.parent.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
                            f"llama-cpp-python=={VERSION}", "-d", str(sdist.parent)], capture_output=True, text=True)
        if r.returncode or not sdist.exists():
            missing(f"llama-cpp-python=={VERSION}'s sdist could not be fetched from PyPI: {r.stderr.strip()[-300:]}")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    assert digest == SHA256, f"{sdist} is not the sdist pinned by sha256 ({digest})"
    return sdist


@cache
def _templates() -> dict[str, str]:
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/models/templates/"
    with tarfile.open(_sdist()) as tf:
        return {m.name[len(prefix):]: tf.extractfile(m).read().decode("utf-8") for m in tf.getmembers()
                if m.name.startswith(prefix) and m.name.endswith(".jinja") and m.isfile()}


def template(name: str) -> str:
    """llama.cpp's models/templates/NAME.jinja."""
    return _templates()[f"{name}.jinja"]
