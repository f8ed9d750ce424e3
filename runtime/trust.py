"""Signed packages and the trust policy: who made a package, checked before any of its code runs.

The seal (manifest.sha256) and the sha256 of every file in manifest.json prove that a package is whole, not who
made it: anyone can edit a package and reseal it. A `cpu` package carries native code (kernels/kernels.so, mapped
with ctypes: its constructors run at load), and every package's kernels are built and run on the device, so a
package is trusted like a wheel. A signature says whose it is: Ed25519 (RFC 8032, through the `cryptography`
package) over the exact bytes of manifest.json, which hold the sha256 of every other file, kernels.so included.
The loader checks the signature against those bytes, then every file against its sha256, so any edit after
signing is refused.

    signature.json   {"format": "deploycc-signature", "version": 1, "algorithm": "ed25519",
                      "key_id": "<16 hex digits>", "signature": "<base64 of 64 bytes>"}

It is written after the manifest (so the manifest cannot list it) and signs DOMAIN + manifest.json's bytes: the
prefix keeps a package signature from being read as a signature of anything else made with the same key.
Keys are PEM files: PKCS#8 for the private key, SubjectPublicKeyInfo for the public one (`openssl pkey` reads
both). A key id is the first 16 hex digits of the sha256 of the raw 32-byte public key.

A trust policy is a set of public keys (`--trust KEY.pub`, repeatable, and DEPLOYCC_TRUSTED_KEYS, a path list):
with one, only a package signed by one of its keys loads; without one, signatures are not looked at. The
`cryptography` package is imported only when a policy is given or a package is signed, so a runtime without it
runs unsigned packages as before. Standard library otherwise (the runtime ships in packages).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import PackageError

SIGNATURE = "signature.json"
FORMAT = "deploycc-signature"
VERSION = 1
DOMAIN = b"deploycc package signature v1\n"
ENV = "DEPLOYCC_TRUSTED_KEYS"
POLICY = f"the trust policy (--trust, {ENV})"


class TrustError(PackageError):
    """A package the trust policy refuses, or a key or policy that cannot be used (one line: what, and what to do)."""


@dataclass(frozen=True)
class TrustPolicy:
    keys: dict  # key id -> raw 32-byte Ed25519 public key

    def describe(self) -> str:
        return ", ".join(sorted(self.keys))


def key_id(raw_public: bytes) -> str:
    return hashlib.sha256(raw_public).hexdigest()[:16]


def signed_message(manifest_bytes: bytes) -> bytes:
    return DOMAIN + manifest_bytes


def crypto():
    """cryptography's Ed25519 and serialization modules, or a one-line TrustError naming the fix."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise TrustError(f"signed packages need the Python package 'cryptography', which {sys.executable} lacks; "
                         f"pip install cryptography (or run without --trust and {ENV})") from None
    return ed25519, serialization


# ---- the policy --------------------------------------------------------------------------------------

def key_paths(trust=(), env: str | None = None) -> list[tuple[str, str]]:
    """(where it was named, path) of every trusted key: --trust paths, then env's (os.pathsep-separated; empty
    entries skipped, so an empty variable is no policy)."""
    named = [("--trust", str(p)) for p in trust]
    return named + [(ENV, p) for p in (env or "").split(os.pathsep) if p.strip()]


def make_policy(trust=(), env: str | None = None) -> TrustPolicy | None:
    """The policy of --trust paths and DEPLOYCC_TRUSTED_KEYS' value `env`; None when neither names a key. Every key
    is read now, before any package: a key that cannot be read is an error, never a smaller policy."""
    paths = key_paths(trust, env)
    if not paths:
        return None
    keys = {}
    for where, p in paths:
        raw = read_public_key(Path(p).expanduser(), where)
        keys[key_id(raw)] = raw
    return TrustPolicy(keys)


def read_public_key(path: Path, where: str = "--trust") -> bytes:
    """The raw 32 bytes of an Ed25519 public key in a PEM file."""
    ed25519, serialization = crypto()
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TrustError(f"{where} {path}: cannot read it ({e.strerror or e}); give the public key file "
                         f"(KEY.pub) that deploycc keygen wrote") from None
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        hint = " (that is a private key: give its .pub)" if b"PRIVATE KEY" in data else ""
        raise TrustError(f"{where} {path} is not a PEM public key{hint}; give the public key file (KEY.pub) that "
                         f"deploycc keygen wrote") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise TrustError(f"{where} {path} is not an Ed25519 key; deploycc signs with Ed25519 (deploycc keygen makes "
                         f"a key pair)")
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


# ---- checking a package ---------------------------------------------------------------------------------

def check_signature(path: Path, manifest_bytes: bytes, policy: TrustPolicy) -> str:
    """The id of the trusted key that signed `manifest_bytes` (manifest.json of the package at `path`), or a
    TrustError: unsigned, a signature that does not match, or a key the policy does not hold."""
    doc = read_signature(path)
    if doc is None:
        raise TrustError(f"{path} is not signed, and {POLICY} runs only signed packages; ask its maker for a signed "
                         f"package (deploycc compile --sign KEY, or deploycc sign PKG --key KEY)")
    kid = doc["key_id"]
    raw = policy.keys.get(kid)
    if raw is None:
        raise TrustError(f"{path} is signed by key {kid}, which {POLICY} does not hold (it trusts "
                         f"{policy.describe()}); if you trust its maker, add their public key with --trust KEY.pub")
    ed25519, _ = crypto()
    from cryptography.exceptions import InvalidSignature

    try:
        ed25519.Ed25519PublicKey.from_public_bytes(raw).verify(doc["signature"], signed_message(manifest_bytes))
    except InvalidSignature:
        raise TrustError(f"{path}: the signature of key {kid} does not match manifest.json (the package was changed "
                         f"after it was signed); get the package again from its maker") from None
    return kid


def read_signature(path: Path) -> dict | None:
    """signature.json of a package, with its signature decoded; None when there is none. A file that is not a
    signature document is a TrustError (never 'unsigned': that would hide damage)."""
    f = path / SIGNATURE
    try:
        raw = f.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TrustError(f"{f} is unreadable ({e.strerror or e}); get the package again from its maker") from None
    bad = f"{f} is not a deploycc signature"
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise TrustError(f"{bad} (not JSON); get the package again from its maker") from None
    if type(doc) is not dict or doc.get("format") != FORMAT or doc.get("algorithm") != "ed25519":
        raise TrustError(f"{bad} (format {FORMAT}, algorithm ed25519); get the package again from its maker")
    if doc.get("version") != VERSION:
        raise TrustError(f"{f} is a signature of version {doc.get('version')!r}, this runtime reads {VERSION}; "
                         f"upgrade deploycc or get the package again")
    kid, sig = doc.get("key_id"), doc.get("signature")
    if type(kid) is not str or len(kid) != 16 or any(c not in "0123456789abcdef" for c in kid):
        raise TrustError(f"{bad}: key_id must be 16 hex digits; get the package again from its maker")
    try:
        signature = base64.b64decode(sig, validate=True) if type(sig) is str else b""
    except (binascii.Error, ValueError):
        signature = b""
    if len(signature) != 64:
        raise TrustError(f"{bad}: signature must be 64 bytes in base64; get the package again from its maker")
    return {**doc, "signature": signature}


def signature_document(kid: str, signature: bytes) -> bytes:
    """The bytes of signature.json (deploycc/signing.py writes them)."""
    doc = {"format": FORMAT, "version": VERSION, "algorithm": "ed25519", "key_id": kid,
           "signature": base64.b64encode(signature).decode()}
    return (json.dumps(doc, indent=1) + "\n").encode()
