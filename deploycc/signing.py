"""Ed25519 key pairs and package signatures: the maker's side (runtime/trust.py holds the format and the check).

    deploycc keygen NAME            NAME (private key, PKCS#8 PEM, mode 0600) and NAME.pub (public key, PEM)
    deploycc compile ... --sign NAME   the new package's signature.json, written before the package is put in place
    deploycc sign PKG --key NAME    signature.json for a package already compiled, once it checks whole

The private key is stored unencrypted, like an ssh key without a passphrase: its file's mode is what protects it.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import DeployError
from .runtime.package import SEAL, read_manifest, seal_text, verify
from .runtime.trust import SIGNATURE, crypto, key_id, signature_document, signed_message


def keygen(out: Path) -> tuple[Path, Path, str]:
    """(private key path, public key path, key id) of a new key pair at `out` and `out`.pub. An existing file is
    never overwritten: a lost private key cannot be recovered."""
    ed25519, serialization = crypto()
    private, public = out, out.with_name(out.name + ".pub")
    for p in (private, public):
        if p.exists() or p.is_symlink():
            raise DeployError(f"{p} exists; keygen never overwrites a key: choose another name, or remove it first")
    key = ed25519.Ed25519PrivateKey.generate()
    _write_new(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()), 0o600)
    pub = key.public_key()
    try:
        _write_new(public, pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
                   0o644)
    except BaseException:
        private.unlink()  # no private key without its public half
        raise
    return private, public, key_id(pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create `path` (never through a symbolic link, never over a file) with exactly `mode`, whatever the umask."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        raise DeployError(f"cannot create {path} ({e.strerror}); choose a name in a directory you can write") from None
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
    finally:
        os.close(fd)


def load_signing_key(path: Path):
    """(Ed25519 private key, its key id) from a PEM file: checked before any model work by compile --sign."""
    ed25519, serialization = crypto()
    try:
        data = path.expanduser().read_bytes()
    except OSError as e:
        raise DeployError(f"cannot read the signing key {path} ({e.strerror}); make one with deploycc keygen NAME") \
            from None
    if b"PUBLIC KEY" in data and b"PRIVATE KEY" not in data:
        raise DeployError(f"{path} is a public key; signing takes the private key (the file without .pub)")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:  # encrypted
        raise DeployError(f"{path} is encrypted; deploycc reads unencrypted PEM keys (protect the file with mode "
                          f"0600, as keygen writes it)") from None
    except ValueError:
        raise DeployError(f"{path} is not a PEM private key; make one with deploycc keygen NAME") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise DeployError(f"{path} is not an Ed25519 key; deploycc signs with Ed25519 (deploycc keygen NAME makes one)")
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return key, key_id(raw)


def signature_of(signer, manifest_bytes: bytes) -> bytes:
    """signature.json's bytes for a package whose manifest.json is `manifest_bytes`; signer: load_signing_key's."""
    key, kid = signer
    return signature_document(kid, key.sign(signed_message(manifest_bytes)))


def sign_package(pkg: Path, key_path: Path) -> str:
    """Sign a compiled package in place (its signature.json replaced): only once its seal, every file's sha256 and
    its schema check, so a package damaged or edited after compile is never signed. Returns the key id."""
    signer = load_signing_key(key_path)
    raw = (pkg / "manifest.json").read_bytes() if (pkg / "manifest.json").is_file() else b""
    verify(pkg, read_manifest(pkg))  # the seal against the manifest read there, then every file against it
    if (pkg / SEAL).read_text(encoding="utf-8") != seal_text(raw):
        raise DeployError(f"manifest.json in {pkg} changed while it was being signed; sign it again")
    fd, tmp = tempfile.mkstemp(prefix=f".{SIGNATURE}.", dir=pkg)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(signature_of(signer, raw))
        os.chmod(tmp, 0o644)
        os.replace(tmp, pkg / SIGNATURE)  # whole or not at all
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return signer[1]
