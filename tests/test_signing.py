"""Signed packages (issue 25, item 7): keygen, compile --sign, sign, and the trust policy (--trust KEY.pub,
DEPLOYCC_TRUSTED_KEYS) of `deploycc run/chat/serve/bench/verify/perplexity` and of the package's own runtime
(`python PKG run/chat/serve/bench/verify`). Under a policy an unsigned package, one signed by another key, or one edited
after signing is refused in one line before any kernel is built or native code is mapped.

The key case: a cpu package whose kernels.so is replaced by a shared object with a constructor that writes a file,
resealed (every sha256 and manifest.sha256 made to agree). Without a policy the loader maps it and the constructor
runs (in a subprocess: the control that the reseal passes every check before the mapping); under a policy the
package is refused and the file is never written.

One compile: the tiny llama with a tokenizer for cpu, signed by the maker's key; the other packages are copies.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from bad_inputs.common import assert_one_line_error, cli, reseal, run_package
from conftest import require_cc

from fixtures import make_tiny

MODEL = "llama-gqa1"
ENV = "DEPLOYCC_TRUSTED_KEYS"
UNSIGNED = "is not signed, and the trust policy (--trust, DEPLOYCC_TRUSTED_KEYS) runs only signed packages"
CHANGED = "does not match manifest.json (the package was changed after it was signed)"


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    """The maker's key pair (made by the command line) and another's."""
    from deploycc.signing import keygen

    d = tmp_path_factory.mktemp("keys")
    r = cli("keygen", d / "maker", timeout=60)
    assert r.returncode == 0, r.stderr
    keygen(d / "other")
    return {"maker": d / "maker", "maker.pub": d / "maker.pub", "other": d / "other", "other.pub": d / "other.pub"}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from test_package_cli import with_tokenizer

    return with_tokenizer(make_tiny(MODEL), tmp_path_factory.mktemp("signing") / "model")


@pytest.fixture(scope="module")
def signed(tmp_path_factory, keys, model) -> Path:
    require_cc()
    out = tmp_path_factory.mktemp("signed") / "pkg"
    r = cli("compile", model, "--device", "cpu", "--sign", keys["maker"], "-o", out, "--json", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def copy(pkg: Path, tmp_path: Path, name: str = "pkg") -> Path:
    return shutil.copytree(pkg, tmp_path / name)


def both(pkg: Path, *args, env: dict | None = None, input: str | None = None):
    """`deploycc run PKG ARGS` and `python PKG run ARGS` at once (each is mostly interpreter start-up)."""
    run = ("run", "--prompt", "hi", "--max-tokens", "3", "--temperature", "0", *map(str, args))
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(cli, *run[:1], pkg, *run[1:], env=env, timeout=120)
        b = pool.submit(_package_env, pkg, run, env)
    return a.result(), b.result()


def _package_env(pkg: Path, args, env: dict | None):
    if env is None:
        return run_package(pkg, *args, timeout=120)
    return subprocess.run([sys.executable, str(pkg), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


# ---- keys ----------------------------------------------------------------------------------------------

def test_keygen_writes_a_private_key_only_its_owner_reads(keys):
    private, public = keys["maker"], keys["maker.pub"]
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    from deploycc.runtime.trust import key_id, read_public_key
    from deploycc.signing import load_signing_key

    _, kid = load_signing_key(private)
    assert key_id(read_public_key(public)) == kid


# ---- the signed package --------------------------------------------------------------------------------

def test_signed_package_runs_under_its_key(signed, keys):
    doc = json.loads((signed / "signature.json").read_text())
    assert doc["format"] == "deploycc-signature" and doc["algorithm"] == "ed25519"
    assert "signature.json" not in json.loads((signed / "manifest.json").read_text())["files"]
    for r in both(signed, "--trust", keys["other.pub"], "--trust", keys["maker.pub"]):
        assert r.returncode == 0, r.stderr[-2000:]
    for r in both(signed, env={ENV: f"{keys['other.pub']}:{keys['maker.pub']}"}):
        assert r.returncode == 0, r.stderr[-2000:]


def test_verify_under_trust(signed, keys):
    r = cli("verify", signed, "--trust", keys["maker.pub"], "--steps", "1", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert_one_line_error(cli("verify", signed, "--trust", keys["other.pub"], "--steps", "1", timeout=120),
                          "signed by key", "does not hold")


def test_without_a_policy_signatures_are_not_looked_at(signed, tmp_path):
    pkg = copy(signed, tmp_path)
    (pkg / "signature.json").write_text("not a signature")
    for r in both(pkg):
        assert r.returncode == 0, r.stderr[-2000:]


def test_a_signed_package_is_still_a_package_to_replace(signed):
    """compile --force replaces only what is provably a package: signature.json, unlisted, is part of one."""
    from deploycc.staging import foreign_content

    assert foreign_content(signed) is None


# ---- refused under a policy ------------------------------------------------------------------------------

def test_unsigned_package_refused(signed, keys, tmp_path):
    pkg = copy(signed, tmp_path)
    (pkg / "signature.json").unlink()
    for r in both(pkg, "--trust", keys["maker.pub"]):
        assert_one_line_error(r, UNSIGNED, "deploycc compile --sign KEY")
    for r in both(pkg, env={ENV: str(keys["maker.pub"])}):
        assert_one_line_error(r, UNSIGNED)


@pytest.mark.parametrize("command", [("chat",), ("serve", "--port", "1"), ("bench",), ("verify", "--kernels"),
                                     ("perplexity", "--text", "@")])
def test_every_command_that_loads_a_package_takes_the_policy(signed, keys, tmp_path, command):
    pkg = copy(signed, tmp_path)
    (pkg / "signature.json").unlink()
    text = tmp_path / "text.txt"
    text.write_text("hello world " * 20)
    args = [str(text) if a == "@" else a for a in command[1:]]
    assert_one_line_error(cli(command[0], pkg, *args, "--trust", keys["maker.pub"], input="", timeout=120), UNSIGNED)
    if command[0] != "perplexity":  # the package's own command line has no perplexity
        assert_one_line_error(run_package(pkg, command[0], *args, "--trust", keys["maker.pub"], input="", timeout=120),
                              UNSIGNED)


def test_other_key_refused(signed, keys):
    for r in both(signed, "--trust", keys["other.pub"]):
        line = assert_one_line_error(r, "is signed by key", "which the trust policy", "does not hold",
                                     "--trust KEY.pub")
        assert json.loads((signed / "signature.json").read_text())["key_id"] in line


def _manifest_edit(pkg: Path) -> None:
    m = json.loads((pkg / "manifest.json").read_text())
    m["model"]["source"] = "elsewhere"
    (pkg / "manifest.json").write_text(json.dumps(m, indent=1))


def _weights_edit(pkg: Path) -> None:
    f = next((pkg / "params").glob("*.safetensors"))
    data = bytearray(f.read_bytes())
    data[-1] ^= 0x40
    f.write_bytes(bytes(data))


@pytest.mark.parametrize("edit,resealed,fragment", [
    (_manifest_edit, True, CHANGED),
    (_weights_edit, True, CHANGED),
    (_weights_edit, False, "was changed after compile (sha256 mismatch)"),  # signature holds; the digest does not
], ids=["manifest resealed", "weights resealed", "weights"])
def test_edit_after_signing_refused(signed, keys, tmp_path, edit, resealed, fragment):
    pkg = copy(signed, tmp_path)
    edit(pkg)
    if resealed:
        reseal(pkg)
    for r in both(pkg, "--trust", keys["maker.pub"]):
        assert_one_line_error(r, fragment)


def test_edit_resigned_with_another_key_refused(signed, keys, tmp_path):
    """The editor signs their edit with their own key: the maker's policy does not hold it."""
    pkg = copy(signed, tmp_path)
    _manifest_edit(pkg)
    reseal(pkg)
    r = cli("sign", pkg, "--key", keys["other"], timeout=60)
    assert r.returncode == 0 and "signed" in r.stdout, r.stderr
    for r in both(pkg, "--trust", keys["maker.pub"]):
        assert_one_line_error(r, "is signed by key", "does not hold")
    for r in both(pkg, "--trust", keys["other.pub"]):  # and it is a whole package signed by that key
        assert r.returncode == 0, r.stderr[-2000:]


def test_sign_refuses_a_damaged_package(signed, keys, tmp_path):
    pkg = copy(signed, tmp_path)
    _weights_edit(pkg)
    assert_one_line_error(cli("sign", pkg, "--key", keys["other"], timeout=60), "sha256 mismatch")
    assert json.loads((pkg / "signature.json").read_text()) == json.loads((signed / "signature.json").read_text())


def test_device_compile_into_the_cache_refused_under_a_policy(model, keys, tmp_path):
    """`run MODEL --device cpu` would compile an unsigned package into the cache: refused before the compile."""
    r = cli("run", model, "--device", "cpu", "--prompt", "hi", "--trust", keys["maker.pub"],
            env={"DEPLOYCC_HOME": str(tmp_path / "home")}, timeout=120)
    assert_one_line_error(r, "compile it with deploycc compile --sign KEY")
    assert not (tmp_path / "home" / "packages").exists()


# ---- native code that runs when mapped --------------------------------------------------------------------

CONSTRUCTOR = """#include <stdio.h>
__attribute__((constructor)) static void run_at_load(void) {
    FILE *f = fopen("%s", "w");
    if (f) { fputs("code from the package ran\\n", f); fclose(f); }
}
int dcc_init(int threads) { return threads * 0; }
"""


def _hostile(signed: Path, tmp_path: Path, marker: Path) -> Path:
    """The signed package with kernels.so replaced by one whose constructor writes `marker`, resealed."""
    pkg = copy(signed, tmp_path, "hostile")
    src = tmp_path / "constructor.c"
    src.write_text(CONSTRUCTOR % marker)
    r = subprocess.run([*require_cc(), "-shared", "-fPIC", str(src), "-o", str(pkg / "kernels" / "kernels.so")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    reseal(pkg)
    return pkg


def test_resealed_native_code_never_runs_under_a_policy(signed, keys, tmp_path):
    marker = tmp_path / "written-by-kernels.so"
    pkg = _hostile(signed, tmp_path, marker)
    for r in both(pkg, "--trust", keys["maker.pub"]):
        assert_one_line_error(r, CHANGED)
    for r in both(pkg, env={ENV: str(keys["maker.pub"])}):
        assert_one_line_error(r, CHANGED)
    assert_one_line_error(cli("serve", pkg, "--trust", keys["maker.pub"], "--port", "1", timeout=120), CHANGED)
    assert_one_line_error(cli("verify", pkg, "--kernels", "--trust", keys["maker.pub"], timeout=120), CHANGED)
    assert_one_line_error(run_package(pkg, "verify", "--kernels", "--trust", keys["maker.pub"], timeout=120), CHANGED)
    (pkg / "signature.json").unlink()  # the resealed package, unsigned
    for r in both(pkg, "--trust", keys["maker.pub"]):
        assert_one_line_error(r, UNSIGNED)
    assert not marker.exists()
    # The control, in a subprocess: without a policy the reseal passes every check before the mapping, and the
    # constructor runs (then the loader finds no deploycc module in it). The seal proves a package whole, not whose.
    r = cli("run", pkg, "--prompt", "hi", "--max-tokens", "1", timeout=120)
    assert_one_line_error(r, "kernels.so")
    assert marker.read_text() == "code from the package ran\n"
