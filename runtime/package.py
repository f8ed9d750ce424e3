"""Loading and verifying a package: schema, format version, sha256 of every file, bytecode that
refers only to known kernels and builtins, params that match their index; under a trust policy, first the
signature (runtime/trust.py). Nothing here executes code from a package, but the engine then runs its kernels,
and a `cpu` package's kernels.so is native code mapped with ctypes (its constructors run at load): the checks
here prove a package whole, only a signature proves whose it is."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .errors import PackageError

# 2: manifest.sha256 seals the manifest (format 1 packages had no seal; recompile them)
FORMAT_VERSION = 2
SEAL = "manifest.sha256"
REQUIRED = ("format", "format_version", "model", "quantization", "preset", "target", "bounds", "kv_cache",
            "storages", "kernels", "params", "files")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def seal_text(manifest_bytes: bytes) -> str:
    """The content of manifest.sha256: sha256sum's format, so `sha256sum -c manifest.sha256` checks it too."""
    return f"{hashlib.sha256(manifest_bytes).hexdigest()}  manifest.json\n"


def read_manifest(path: Path, trust=None) -> dict:
    """The manifest, once its format marker, its version and its seal (manifest.sha256) are right. The format
    is checked before the seal so that a package of a newer format says so instead of 'changed'. With a trust
    policy (runtime/trust.py: TrustPolicy), the signature of the very bytes read is checked before they are
    parsed."""
    mf = path / "manifest.json"
    if not path.is_dir():
        raise PackageError(f"{path} is not a package directory (compile one with deploycc compile)")
    if not mf.is_file():
        raise PackageError(f"{path} has no manifest.json; it is not a deploycc package (or an interrupted compile)")
    try:
        raw = mf.read_bytes()
    except OSError as e:
        raise PackageError(f"{mf} is unreadable ({_first_line(e)}); recompile the package") from None
    if trust is not None:
        from .trust import check_signature

        check_signature(path, raw, trust)
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError) as e:  # ValueError: bad JSON or UTF-8
        raise PackageError(f"{mf} is not valid JSON ({_first_line(e)}); recompile the package") from None
    if not isinstance(manifest, dict) or manifest.get("format") != "deploycc-package":
        raise PackageError(f"{mf} is not a deploycc package manifest")
    version = manifest.get("format_version")
    if type(version) is not int or version > FORMAT_VERSION:
        raise PackageError(f"package format {version!r} is newer than this runtime supports ({FORMAT_VERSION}); "
                           f"upgrade deploycc or recompile the package with this version")
    if version < FORMAT_VERSION:
        raise PackageError(f"package format {version} is older than this runtime supports ({FORMAT_VERSION}); "
                           f"recompile the package with this version of deploycc")
    try:
        seal = (path / SEAL).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PackageError(f"{path} has no {SEAL}; the package is incomplete — recompile it") from None
    except (OSError, ValueError) as e:
        raise PackageError(f"{path / SEAL} is unreadable ({_first_line(e)}); recompile the package") from None
    if seal != seal_text(raw):
        raise PackageError(f"manifest.json in {path} was changed after compile (it does not match {SEAL}); "
                           f"recompile the package")
    missing = [k for k in REQUIRED if k not in manifest]
    if missing:
        raise PackageError(f"{mf} lacks {missing[0]!r}; recompile the package")
    return manifest


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def verify(path: Path, manifest: dict, check_hashes: bool = True) -> dict:
    """Check every listed file; return the bytecode."""
    files = manifest["files"]
    if not isinstance(files, dict) or "bytecode.json" not in files:
        raise PackageError(f"manifest.json of {path}: 'files' must map every file of the package to its sha256; "
                           f"recompile the package")
    for rel, digest in files.items():
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            raise PackageError(f"manifest.json of {path}: the sha256 of {rel!r} is not 64 hex digits; recompile the package")
        if (not rel or "\\" in rel or "\x00" in rel or ".." in Path(rel).parts or Path(rel).is_absolute()
                or rel in ("manifest.json", SEAL)):
            raise PackageError(f"manifest lists a file outside the package: {rel!r}")
        f = path / rel
        if path.resolve() not in f.resolve().parents:  # a symbolic link out of the package
            raise PackageError(f"manifest lists a file outside the package: {rel!r}")
        if not f.is_file():
            raise PackageError(f"{path} is missing {rel}; the package is incomplete — recompile it")
        if check_hashes and sha256_of(f) != digest:
            raise PackageError(f"{rel} in {path} was changed after compile (sha256 mismatch); recompile the package")
    bytecode = _read_bytecode(path)
    check_package(path, manifest, bytecode)
    return bytecode


def load_manifest(path: Path, trust=None) -> dict:
    """read_manifest, then every field the runtime reads checked (runtime/validate.py): for callers that use the
    manifest before Engine.load."""
    from .validate import check_manifest

    manifest = read_manifest(path, trust)
    check_manifest(manifest)
    return manifest


def _read_bytecode(path: Path):
    try:
        return json.loads((path / "bytecode.json").read_bytes())
    except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or UTF-8
        raise PackageError(f"{path / 'bytecode.json'} is unreadable ({_first_line(e)}); recompile the package") from None


def check_package(path: Path, manifest: dict, bytecode) -> None:
    """Everything but the hashes, before any device is opened: the manifest's schema, the bytecode's structure
    and references (validate.py), the memory plan and every launch at the bounds (dryrun.py), and kernel
    sources that are text."""
    from .dryrun import check_plan
    from .kinds import KINDS
    from .validate import check_manifest, check_native_bytecode
    from .validate_bytecode import check_bytecode

    check_manifest(manifest)
    check_bytecode(bytecode, manifest)
    if KINDS[manifest["target"]["kind"]].native:
        check_native_bytecode(manifest, bytecode)
    check_plan(manifest, bytecode)
    for f in sorted({e["file"] for e in manifest["kernels"]["entries"].values()}):
        try:
            (path / f).read_bytes().decode("utf-8")
        except OSError as e:
            raise PackageError(f"{path / f} is unreadable ({_first_line(e)}); recompile the package") from None
        except UnicodeDecodeError:
            raise PackageError(f"{path / f} is not UTF-8 text, so it holds no kernel source; recompile the package") \
                from None


SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "int32": "I32", "uint32": "U32", "int8": "I8", "uint8": "U8"}


def load_params(path: Path, manifest: dict) -> dict:
    """name -> numpy array (memory-mapped), checked against the params index (which check_manifest passed):
    each tensor's header entry must say the manifest's dtype and shape before a byte of it is read."""
    import numpy as np

    from .safetensors_io import SafetensorsReader

    readers: dict[str, SafetensorsReader] = {}
    out = {}
    for p in manifest["params"]:
        f = p["file"]
        if f not in readers:
            readers[f] = SafetensorsReader(path / f)
            if type(readers[f].header) is not dict:
                raise PackageError(f"{f}: the safetensors header is not an object; recompile the package")
        info = readers[f].header.get(p["name"])
        if not _header_agrees(info, p):
            raise PackageError(f"{f}: tensor {p['name']} is {_describe(info)}, the manifest says {p['shape']} "
                               f"{p['dtype']}; recompile the package")
        out[p["name"]] = np.asarray(readers[f].read(p["name"]))
    return out


def _header_agrees(info, p: dict) -> bool:
    if type(info) is not dict:
        return False
    shape, offsets = info.get("shape"), info.get("data_offsets")
    return (info.get("dtype") == SAFETENSORS_DTYPES[p["dtype"]] and type(shape) is list
            and all(type(d) is int for d in shape) and shape == p["shape"] and type(offsets) is list
            and len(offsets) == 2 and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1])


def _describe(info) -> str:
    if type(info) is not dict:
        return "missing" if info is None else "a malformed header entry"
    return f"{str(info.get('shape'))[:40]} {str(info.get('dtype'))[:10]}"
