"""The browser bundle of a WebGPU package (presets with `runtime: {web: true}`, e.g. chrome-webgpu).

Beside the usual package files, `index.html` (a chat page) and `web/`: deploycc.js (the runtime: the VM,
WebGPU, loading with the Cache API, sampling), and two npm libraries vendored at compile time, pinned by
version and by the registry's sha512 integrity, kept in $DEPLOYCC_HOME/npm:

- @huggingface/tokenizers (tokenizer.json in JavaScript, 37 KB minified; what transformers.js uses), rather
  than a byte-level BPE of our own: it covers every normalizer, pre-tokenizer and model the Python runtime's
  `tokenizers` does, and the Oniguruma regex quirks that a port would get wrong;
- @huggingface/jinja (chat templates; transformers.js's engine for them, 115 KB).

`python -m http.server` in the package directory serves it: nothing runs on the server.
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import tarfile
import urllib.request
from pathlib import Path

from ..errors import DeployError

HERE = Path(__file__).resolve().parent
SOURCES = ("deploycc.js", "errors.js", "text.js", "webgpu.js")  # copied into web/; index.html goes to the package root
# bundle name: (npm package, version, file in the tarball, license file, sha512 integrity of the tarball)
VENDOR = {
    "tokenizers.mjs": ("@huggingface/tokenizers", "0.2.0", "package/dist/tokenizers.min.mjs", "package/LICENSE",
                       "LidMHe1FpcSYH4vcSjXooda34pC0M8m1gmDOv7SQi6Iv+ib1zX7J3sHBCC9/3FPCkn2k1b55FneVqMRxrr99pg=="),
    "jinja.mjs": ("@huggingface/jinja", "0.5.11", "package/dist/index.js", "package/LICENSE",
                  "YzEzwM5oQf4r0vs7ifWQ+yuVR1YkAHrjERQ+a8WRsStHHp4NRBg+NesjiFc+X2AFUpRvvrIeHDS1xFy9jY/IjQ=="),
}
MAX_TARBALL = 8 << 20


def registry() -> str:
    return (os.environ.get("DEPLOYCC_NPM_REGISTRY") or os.environ.get("npm_config_registry")
            or "https://registry.npmjs.org/").rstrip("/") + "/"


def _cache_dir() -> Path:
    return Path(os.environ.get("DEPLOYCC_HOME") or Path.home() / ".cache" / "deploycc").expanduser() / "npm"


def _tarball(package: str, version: str, integrity: str) -> bytes:
    """The npm tarball, from the cache or the registry, checked against its pinned sha512."""
    leaf = package.split("/")[-1]
    path = _cache_dir() / f"{package.replace('/', '__')}-{version}.tgz"

    def ok(data: bytes) -> bool:
        return base64.b64encode(hashlib.sha512(data).digest()).decode() == integrity

    if path.is_file():
        data = path.read_bytes()
        if ok(data):
            return data
    url = f"{registry()}{package}/-/{leaf}-{version}.tgz"
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            data = r.read(MAX_TARBALL + 1)
    except OSError as e:
        raise DeployError(f"the web bundle needs {package}@{version} from the npm registry, which could not be reached "
                          f"({url}: {e}); connect, or set DEPLOYCC_NPM_REGISTRY to a mirror") from None
    if len(data) > MAX_TARBALL or not ok(data):
        raise DeployError(f"{url} does not match the sha512 deploycc pins for {package}@{version}; "
                          f"check DEPLOYCC_NPM_REGISTRY (a mirror serving other bytes)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return data


def _member(data: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
        f = tf.extractfile(name)
        if f is None:
            raise DeployError(f"the npm tarball lacks {name}")
        return f.read()


def write_bundle(out: Path) -> None:
    """index.html and web/ into the package directory `out` (before its manifest hashes every file)."""
    web = out / "web"
    web.mkdir()
    shutil.copy2(HERE / "index.html", out / "index.html")
    for name in SOURCES:
        shutil.copy2(HERE / name, web / name)
    notices = []
    for name, (package, version, member, license_file, integrity) in VENDOR.items():
        data = _tarball(package, version, integrity)
        (web / name).write_bytes(_member(data, member))
        notices.append(f"web/{name}: {package}@{version} from the npm registry\n\n"
                       + _member(data, license_file).decode("utf-8", "replace"))
    (web / "THIRD_PARTY_LICENSES.txt").write_text(("\n" + "=" * 78 + "\n").join(notices))
