"""How a package's kernels load, per target kind (runtime/kinds.py Kind.loader): sources built by the device, or
one shared object compiled with the package.

    load_kernels(device, path, manifest, bytecode, names) -> Loaded(kernels by name, native library or None, f16 mode)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import native
from .errors import PackageError
from .kinds import KINDS, Kind


@dataclass
class Loaded:
    kernels: dict  # kernel name (manifest kernels.entries) -> the device's Kernel
    library: Any = None  # native: the package's shared object (ctypes), whose step functions the engine binds
    f16: str | None = None  # f16 variants: "native" (shader-f16), "packed" (f16 read from u32 words) or "none"
    subgroups: bool | None = None  # f16 variants' kinds: whether any kernel runs its variant with subgroup operations


def variant(entry: dict, packed: bool, subgroups: bool) -> str:
    """Which kernel file of a manifest entry a device runs (its key): with f16 read from packed words (`file_no_f16`)
    or not, with subgroup operations (`..._subgroups`, targets/wgsl.py) where the device has them and the kernel has
    such a variant."""
    key = "file_no_f16" if packed and "file_no_f16" in entry else "file"
    return f"{key}_subgroups" if subgroups and f"{key}_subgroups" in entry else key


def load_sources(kind: Kind, device, path: Path, manifest: dict, bytecode: dict, names=None) -> Loaded:
    """Kernel sources built by the device, one build per file; with f16 variants, the files that read f16 from
    packed words where the device has no f16, and those with subgroup operations where it has them. `names`: only
    those kernels (the ones the engine's functions launch), else all."""
    entries = manifest["kernels"]["entries"]
    if names is not None:
        entries = {n: e for n, e in entries.items() if n in names}
    packed = kind.f16_variants and not device.has_f16
    subgroups = kind.f16_variants and getattr(device, "has_subgroups", False)
    by_file: dict[str, list[str]] = {}
    keys = {name: variant(e, packed, subgroups) if kind.f16_variants else "file" for name, e in entries.items()}
    for name, e in entries.items():
        by_file.setdefault(e[keys[name]], []).append(name)
    out, used = {}, set()
    options = {"fast_math": bool(manifest["target"].get("fast_math"))}
    for f, names in by_file.items():
        source = (path / f).read_text()
        if kind.f16_variants and "enable f16;" in source:
            if packed:
                raise PackageError(f"this package's kernels need shader-f16, which {device.name} lacks, and it "
                                      "has no kernels without it (compiled by an older deploycc); recompile it")
            used.add("native")
        elif keys[names[0]].startswith("file_no_f16"):
            used.add("packed")
        built = device.build(source, [entries[n]["entry"] for n in names], options)
        for n in names:
            out[n] = built[entries[n]["entry"]]
            out[n].meta["source"] = source  # a CUDA graph's kernel variants are made from it (runtime/graphs.py)
            if "split" in entries[n]:  # buffers bound as several ranges (binding_ranges)
                out[n].meta["split"] = {int(i): tuple(v) for i, v in entries[n]["split"].items()}
    f16 = ("packed" if "packed" in used else "native" if used else "none") if kind.f16_variants else None
    with_subgroups = any(k.endswith("_subgroups") for k in keys.values()) if kind.f16_variants else None
    return Loaded(out, f16=f16, subgroups=with_subgroups)


def load_native(kind: Kind, device, path: Path, manifest: dict, bytecode: dict, names=None) -> Loaded:
    """One shared object compiled with the package (kernels.native), checked against the bytecode it was lowered
    from; its kernels' launch entry points on the device (all of them: `names` saves no build here)."""
    entries = manifest["kernels"]["entries"]
    nat = manifest["kernels"]["native"]
    try:
        lib = native.load(path / nat["library"], nat["cpu_flags"], manifest["target"].get("num_threads", 0),
                          tuple(f["symbol"] for f in nat["functions"].values())
                          + tuple(f"{e['entry']}__launch" for e in entries.values()))
        native.check_lowered_from(lib, path / nat["library"], bytecode, entries)
    except native.NativeError as e:
        raise PackageError(str(e)) from None
    built = device.kernels_of(lib, sorted({e["entry"] for e in entries.values()}))
    return Loaded({n: built[e["entry"]] for n, e in entries.items()}, library=lib)


LOADERS = {"sources": load_sources, "native": load_native}


def load_kernels(device, path: Path, manifest: dict, bytecode: dict, names=None) -> Loaded:
    """`names`: the kernels to build (those the engine's functions launch; None: every one)."""
    kind = KINDS[manifest["target"]["kind"]]
    return LOADERS[kind.loader](kind, device, path, manifest, bytecode, names)
