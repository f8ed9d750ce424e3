"""A tiny compiled package for the tests of package loading (tests/runtime/test_package_schema.py,
tests/bad_inputs/test_packages.py, tests/fuzz/test_fuzz_package.py): the llama fixture with a byte-level
BPE tokenizer (tests/test_package_cli.py: with_tokenizer), compiled for cpu-opencl (or another preset: the cpu
target's catalogue, tests/bad_inputs/test_cpu.py, compiles it for cpu). Compiling needs no device; cpu needs a C
compiler."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from fixtures import make_tiny

MODEL = "llama-gqa1"


def compile_tiny_package(root: Path, device: str = "cpu-opencl", overrides: tuple[str, ...] = ()) -> Path:
    from test_package_cli import with_tokenizer

    from deploycc.package import compile_model

    model = with_tokenizer(make_tiny(MODEL), root / "model")
    return compile_model(str(model), device, overrides=overrides, out=str(root / "pkg"))


def compile_long_tiny_package(root: Path) -> Path:
    """The tiny llama with a 4096-token context on the cpu target (its weights do not depend on
    max_position_embeddings): a request or a prompt that takes seconds (4000 greedy tokens take about 20 s on
    2 cores), for the tests of what happens meanwhile (tests/bad_inputs/test_server.py, test_chat_interrupt.py)."""
    from test_package_cli import with_tokenizer

    from deploycc.package import compile_model

    model = with_tokenizer(make_tiny(MODEL), root / "model")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    return compile_model(str(model), "cpu", out=str(root / "pkg"), context_window=4096)


def copy_package(pkg: Path, dst: Path) -> Path:
    shutil.copytree(pkg, dst)
    return dst


def read_docs(pkg: Path) -> tuple[dict, dict]:
    """(manifest, bytecode) of a package, as JSON."""
    return json.loads((pkg / "manifest.json").read_text()), json.loads((pkg / "bytecode.json").read_text())
