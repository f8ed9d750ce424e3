"""Catalogue: bad input of signed packages and trust policies (runtime/trust.py, deploycc/signing.py). Every case
is one line `error: ...`, exit 1, no traceback: a trusted key that cannot be used (missing, a private key, not PEM,
not Ed25519; named by --trust or DEPLOYCC_TRUSTED_KEYS), a signature.json that is not a signature, a runtime
without the `cryptography` package, and the signing side (compile --sign, sign, keygen) given a wrong key or path.

No compile: the policy is read before the package, and the signature is checked before the manifest is parsed,
so a directory with a stub manifest and the package's entry point (__main__.py and a copy of the runtime) reaches
every check through both `deploycc run` and `python PKG run`. tests/test_signing.py has the compiled packages.
"""
from __future__ import annotations

import base64
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bad_inputs.common import ROOT, assert_one_line_error, cli, tree_digest
from fixtures import make_tiny

SIG = {"format": "deploycc-signature", "version": 1, "algorithm": "ed25519", "key_id": "0123456789abcdef",
       "signature": base64.b64encode(bytes(64)).decode()}


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    """A good pair, and the wrong kinds of key file: EC keys, an encrypted Ed25519 key, text."""
    from cryptography.hazmat.primitives import serialization as s
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    from deploycc.signing import keygen

    d = tmp_path_factory.mktemp("keys")
    keygen(d / "good")
    ec_key = ec.generate_private_key(ec.SECP256R1())
    (d / "ec").write_bytes(ec_key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()))
    (d / "ec.pub").write_bytes(ec_key.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo))
    (d / "encrypted").write_bytes(ed25519.Ed25519PrivateKey.generate().private_bytes(
        s.Encoding.PEM, s.PrivateFormat.PKCS8, s.BestAvailableEncryption(b"secret")))
    (d / "text").write_text("ssh-ed25519 AAAA not a PEM key\n")
    return {p.name: p for p in d.iterdir()}


@pytest.fixture(scope="module")
def stub(tmp_path_factory) -> Path:
    """A directory with the package's entry point and a copy of the runtime, a stub manifest, no signature."""
    from deploycc.package import MAIN

    pkg = tmp_path_factory.mktemp("stub") / "pkg"
    shutil.copytree(ROOT / "runtime", pkg / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "__main__.py").write_text(MAIN)
    (pkg / "manifest.json").write_text("{}")
    return pkg


def both(pkg: Path, *args, env: dict | None = None):
    """`deploycc run PKG ...` and `python PKG run ...` (with `env` added to the environment), at once."""
    import os
    import subprocess
    import sys

    run = ("--prompt", "hi", *map(str, args))
    full = {**os.environ, **(env or {})}
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(cli, "run", pkg, *run, env=env, timeout=120)
        b = pool.submit(subprocess.run, [sys.executable, str(pkg), "run", *run], capture_output=True, text=True,
                        timeout=120, env=full)
    return a.result(), b.result()


def signature(doc) -> callable:
    def write(pkg: Path) -> None:
        f = pkg / "signature.json"
        if doc is IsADirectoryError:
            f.mkdir()
        else:
            f.write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    return write


# (id, signature.json writer or None, --trust key names (None: good.pub), environment, fragments)
CASES = [
    ("trusted key missing", None, ["missing.pub"], {}, ("--trust", "missing.pub: cannot read it", "deploycc keygen")),
    ("trusted key is the private key", None, ["good"], {}, ("is not a PEM public key", "that is a private key")),
    ("trusted key not PEM", None, ["text"], {}, ("is not a PEM public key", "KEY.pub")),
    ("trusted key not Ed25519", None, ["ec.pub"], {}, ("is not an Ed25519 key",)),
    ("environment names a missing key", None, [], {"DEPLOYCC_TRUSTED_KEYS": "@missing.pub"},
     ("DEPLOYCC_TRUSTED_KEYS", "missing.pub: cannot read it")),
    ("signature not JSON", signature(b"{"), None, {}, ("signature.json is not a deploycc signature (not JSON)",)),
    ("signature of another format", signature({**SIG, "format": "x"}), None, {},
     ("is not a deploycc signature (format deploycc-signature, algorithm ed25519)",)),
    ("signature of a later version", signature({**SIG, "version": 2}), None, {},
     ("a signature of version 2", "upgrade deploycc")),
    ("signature key id not hex", signature({**SIG, "key_id": "../../etc/passwd"}), None, {},
     ("key_id must be 16 hex digits",)),
    ("signature too short", signature({**SIG, "signature": "AAAA"}), None, {}, ("signature must be 64 bytes",)),
    ("signature not base64", signature({**SIG, "signature": "!" * 88}), None, {}, ("signature must be 64 bytes",)),
    ("signature a directory", signature(IsADirectoryError), None, {}, ("signature.json is unreadable",)),
]


@pytest.mark.parametrize("write,trust,env,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_policy_or_signature(stub, keys, tmp_path, write, trust, env, fragments):
    pkg = shutil.copytree(stub, tmp_path / "pkg")
    if write:
        write(pkg)
    names = ["good.pub"] if trust is None else trust
    args = [a for n in names for a in ("--trust", keys.get(n, tmp_path / n))]
    env = {k: v.replace("@", f"{tmp_path}/") for k, v in env.items()}
    for r in both(pkg, *args, env=env):
        assert_one_line_error(r, *fragments)


def test_runtime_without_cryptography(stub, keys, tmp_path):
    """A Python without `cryptography`: a policy is one line naming it; without a policy it is not needed."""
    fake = tmp_path / "site" / "cryptography"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('cryptography is not installed here')\n")
    env = {"PYTHONPATH": str(tmp_path / "site")}
    for r in both(stub, "--trust", keys["good.pub"], env=env):
        assert_one_line_error(r, "need the Python package 'cryptography'", "pip install cryptography")
    for r in both(stub, env=env):  # the stub manifest fails next, as it would anywhere
        assert_one_line_error(r, "is not a deploycc package manifest")


# ---- the signing side -----------------------------------------------------------------------------------

@pytest.mark.parametrize("key,fragments", [
    ("missing", ("cannot read the signing key", "deploycc keygen NAME")),
    ("good.pub", ("is a public key", "the file without .pub")),
    ("encrypted", ("is encrypted", "unencrypted PEM")),
    ("ec", ("is not an Ed25519 key",)),
    ("text", ("is not a PEM private key",)),
], ids=["missing", "public key", "encrypted", "not Ed25519", "not PEM"])
def test_compile_with_a_bad_signing_key(keys, tmp_path, key, fragments):
    """Refused before any model work: nothing is written."""
    before = tree_digest(tmp_path)
    r = cli("compile", make_tiny("llama-gqa1"), "--device", "cpu-opencl", "--sign", keys.get(key, tmp_path / key),
            "-o", tmp_path / "out", timeout=120)
    assert_one_line_error(r, *fragments)
    assert tree_digest(tmp_path) == before


def test_keygen_never_overwrites(keys, tmp_path):
    private = tmp_path / "k"
    private.write_text("a key the user has\n")
    assert_one_line_error(cli("keygen", private, timeout=60), "exists; keygen never overwrites a key")
    assert private.read_text() == "a key the user has\n" and not (tmp_path / "k.pub").exists()
    (tmp_path / "j.pub").write_text("a public key the user has\n")
    assert_one_line_error(cli("keygen", tmp_path / "j", timeout=60), "j.pub exists")
    assert not (tmp_path / "j").exists()
    assert_one_line_error(cli("keygen", tmp_path / "no" / "such" / "k", timeout=60), "cannot create")


def test_sign_what_is_not_a_package(keys, stub, tmp_path):
    assert_one_line_error(cli("sign", tmp_path, "--key", keys["good"], timeout=60), "has no manifest.json")
    assert_one_line_error(cli("sign", stub, "--key", keys["good"], timeout=60), "is not a deploycc package manifest")
    assert_one_line_error(cli("sign", stub, "--key", tmp_path / "missing", timeout=60), "cannot read the signing key")
    assert not (stub / "signature.json").exists()
