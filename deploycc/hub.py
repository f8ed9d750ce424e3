"""Resolve a model source and open its weights lazily.

A source is a local checkpoint directory (config.json + safetensors + tokenizer files) or a Hugging
Face repo id, pulled with `huggingface_hub.snapshot_download` into its normal cache (only the files
we need; `HF_HUB_OFFLINE=1` honoured). Weights are read one tensor at a time from memory-mapped
safetensors files, parsed here so that bf16 works without torch and a damaged file is reported
precisely. Nothing in a checkpoint is ever executed: JSON and safetensors only.
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DeployError
from .gguf import is_gguf, load_gguf
from .loaded import LoadedModel, check_config
from .runtime.safetensors_io import DuplicateKey, is_int, shown, unique_keys

ALLOW_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                  "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                  "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve(source: str, revision: str | None = None, progress: bool = False) -> Path:
    """A local directory for `source`: the directory itself, or a snapshot of a Hub repo."""
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise DeployError(f"{source} is a file, not a checkpoint directory or a .gguf file")
        return path
    if not _REPO_ID.match(source) or source.startswith((".", "/", "~")):
        raise DeployError(f"model path {source} does not exist; give a checkpoint directory or a Hugging Face repo id "
                          f"such as HuggingFaceTB/SmolLM2-135M-Instruct")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
    except ImportError:  # pragma: no cover - a core dependency
        raise DeployError("huggingface-hub is not installed; pip install huggingface-hub") from None
    try:
        local = snapshot_download(source, revision=revision, allow_patterns=ALLOW_PATTERNS,
                                  tqdm_class=None if progress else _quiet_tqdm())
    except RepositoryNotFoundError:
        raise DeployError(f"Hugging Face repo {source} was not found (check the id, or log in for a gated repo)") from None
    except RevisionNotFoundError:
        raise DeployError(f"revision {revision} of {source} was not found") from None
    except LocalEntryNotFoundError:
        offline = os.environ.get("HF_HUB_OFFLINE", "0")
        raise DeployError(f"{source} is not in the local Hugging Face cache and the Hub cannot be reached "
                          f"(HF_HUB_OFFLINE={offline}); download it first or give a local directory") from None
    except Exception as e:  # network errors come in many types; keep the message to one line
        raise DeployError(f"could not download {source}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return Path(local)


def _quiet_tqdm() -> type:
    """A tqdm that shows nothing (progress bars come from the CLI when asked). A real tqdm subclass,
    disabled, rather than a stand-in: snapshot_download calls much of tqdm's API on it (total, n,
    refresh, set_postfix_str, format_dict, locks), and that set grows between releases."""
    from tqdm import tqdm

    class Quiet(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)
            super().__init__(*args, **{**kwargs, "disable": True})

    return Quiet


MAX_JSON_BYTES = 64 << 20  # config.json and the shard index are kilobytes; never parse a huge file


def read_json(file: Path, what: str) -> object:
    """A small JSON file, or a DeployError that names it (bad UTF-8, bad JSON, too large or deep)."""
    if not file.is_file():
        raise DeployError(f"{file} is not a file; re-download the checkpoint")
    if file.stat().st_size > MAX_JSON_BYTES:
        raise DeployError(f"{file} is {file.stat().st_size} bytes, too large for {what}; re-download the checkpoint")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # JSONDecodeError is a ValueError
        reason = str(e).splitlines()[0] if isinstance(e, ValueError) and str(e) else type(e).__name__
        raise DeployError(f"{file} is not valid JSON ({reason}); re-download the checkpoint") from None


def read_config(path: Path) -> dict:
    cfg = path / "config.json"
    if not cfg.exists():
        raise DeployError(f"{path} has no config.json; is it a Hugging Face checkpoint directory?")
    data = read_json(cfg, "a model config")
    if not isinstance(data, dict):
        raise DeployError(f"{cfg} holds a JSON {_json_kind(data)}, not an object of model settings; "
                          f"re-download the checkpoint or fix the file")
    return data


def _json_kind(v) -> str:
    return {list: "list", str: "string", type(None): "null", bool: "boolean", int: "number", float: "number"}.get(
        type(v), type(v).__name__)


# ---- safetensors, read lazily ----------------------------------------------------------------

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I32": np.int32, "I64": np.int64,
              "U8": np.uint8, "I8": np.int8, "F64": np.float64, "BOOL": np.bool_}


@dataclass
class _Entry:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


def _header_entry(path: Path, name: str, info) -> tuple[str, tuple[int, ...], int, int]:
    """(dtype, shape, start, end) of one header entry, each of the type and range the format allows."""
    bad = f"{path} is corrupted: bad header entry for {shown(name)}"
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise DeployError(f"{bad}; re-download it (an entry needs dtype, shape and data_offsets)")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _ST_DTYPES:
        raise DeployError(f"{path}: tensor {shown(name)} has unsupported dtype {str(dtype)[:40]!r} "
                          f"(supported: {', '.join(_ST_DTYPES)}); convert the checkpoint to one of them")
    if not isinstance(shape, list) or len(shape) > 8 or not all(is_int(d) and d >= 0 for d in shape):
        raise DeployError(f"{bad}; re-download it (shape must be a list of at most 8 sizes >= 0)")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(is_int(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise DeployError(f"{bad}; re-download it (data_offsets must be [start, end] with 0 <= start <= end)")
    return dtype, tuple(shape), offsets[0], offsets[1]


class SafetensorsFile:
    """One .safetensors file: header parsed eagerly (and checked), data memory-mapped on demand."""

    def __init__(self, path: Path):
        self.path = path
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise DeployError(f"{path} is corrupted: too short for a safetensors header; re-download it")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100_000_000:
                raise DeployError(f"{path} is corrupted: header length {n} exceeds the file; re-download it")
            try:
                header = json.loads(f.read(n), object_pairs_hook=unique_keys)
            except DuplicateKey as e:
                raise DeployError(f"{path} is corrupted: its header names tensor {shown(e.args[0])} twice; "
                                  f"re-download it") from None
            except (ValueError, UnicodeDecodeError, RecursionError):
                raise DeployError(f"{path} is corrupted: its header is not valid JSON; re-download it") from None
            if not isinstance(header, dict):
                raise DeployError(f"{path} is corrupted: its header is not a JSON object; re-download it")
        self.data_start = 8 + n
        self.entries: dict[str, _Entry] = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype, shape, start, end = _header_entry(path, name, info)
            nbytes = math.prod(shape) * np.dtype(_ST_DTYPES[dtype]).itemsize
            if end - start != nbytes or self.data_start + end > size:
                raise DeployError(f"{path} is corrupted or truncated: tensor {shown(name)} needs bytes "
                                  f"{start}..{end} of data but the file holds {size - self.data_start}; re-download it")
            self.entries[name] = _Entry(path, dtype, shape, start, end)

    def read(self, name: str) -> np.ndarray:
        e = self.entries[name]
        # A read into a fresh array rather than a view of a memory map: once the caller drops it the
        # memory is gone, so streaming conversion holds one tensor at a time (mapped file pages would
        # stay resident and count towards peak RSS).
        raw = np.fromfile(self.path, dtype=_ST_DTYPES[e.dtype], count=int(np.prod(e.shape, dtype=np.int64)),
                          offset=self.data_start + e.start).reshape(e.shape)
        if e.dtype == "BF16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return raw


def _weight_map(index: Path) -> dict[str, str]:
    """model.safetensors.index.json's tensor -> shard map; shards are plain file names beside it."""
    data = read_json(index, "a safetensors index")
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise DeployError(f"{index} is not a valid safetensors index; re-download the checkpoint")
    for shard in set(wm.values()):
        if Path(shard).name != shard or shard in (".", "..") or not shard.endswith(".safetensors"):
            raise DeployError(f"{index} names shard {shard[:100]!r}, which is not a .safetensors file beside it; "
                              f"re-download the checkpoint")
    return wm


class Weights:
    """All tensors of a checkpoint by name, across shards; each read returns one numpy array."""

    def __init__(self, path: Path):
        self.path = path
        files = sorted(f for f in path.glob("*.safetensors") if f.is_file())
        index = path / "model.safetensors.index.json"
        if index.exists():
            wm = _weight_map(index)
            missing = sorted({f for f in wm.values() if not (path / f).is_file()})
            if missing:
                raise DeployError(f"{path} is missing shard {missing[0]} named in model.safetensors.index.json")
            files = [path / f for f in sorted(set(wm.values()))]
        if not files:
            raise DeployError(f"{path} has no .safetensors weights (pickled .bin checkpoints are not loaded, "
                              f"since loading them can run code; convert them to safetensors)")
        self.files = [SafetensorsFile(f) for f in files]
        self.where: dict[str, SafetensorsFile] = {}
        for f in self.files:
            for name in f.entries:
                if name in self.where:
                    raise DeployError(f"tensor {shown(name)} is in both {self.where[name].path.name} and {f.path.name}; "
                                      f"remove the stray shard or re-download the checkpoint")
                self.where[name] = f

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def names(self) -> list[str]:
        return list(self.where)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.where[name].entries[name].shape

    def read(self, name: str) -> np.ndarray:
        return self.where[name].read(name)


def load_model(source: str, revision: str | None = None, **overrides) -> LoadedModel:
    from .models import lookup, supported  # deploycc.models, installed from models/

    local = Path(source).expanduser()
    if local.is_file():
        if is_gguf(local):
            return load_gguf(local, source, **overrides)
    path = resolve(source, revision)
    hf = read_config(path)
    arch = lookup(hf)
    if arch is None:
        from .models import name

        raise DeployError(f"unsupported architecture {name(hf)}; supported: {', '.join(supported())}")
    where = str(path / "config.json")
    try:
        config = arch.Config.from_hf(hf, **overrides)
    except KeyError as e:
        raise DeployError(f"{where} lacks {e.args[0]!r}, which {arch.__name__.split('.')[-1]} needs") from None
    except ValueError as e:
        raise DeployError(f"{where}: {e}; fix config.json") from None
    weights = Weights(path)
    check_config(where, arch, config, weights, fix="fix config.json to match the weights")
    model = LoadedModel(path, hf, arch, config, weights, source)
    model.check()  # a missing or misshapen tensor is reported now, not halfway through a compile
    return model
