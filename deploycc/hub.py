"""Resolve a model source and open its weights lazily.

A source is a local checkpoint directory (config.json + safetensors + tokenizer files) or a Hugging
Face repo id, pulled with `huggingface_hub.snapshot_download` into its normal cache (only the files
we need; `HF_HUB_OFFLINE=1` honoured). Weights are read one tensor at a time from memory-mapped
safetensors files, parsed here so that bf16 works without torch and a damaged file is reported
precisely. Nothing in a checkpoint is ever executed: JSON and safetensors only.
"""
from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np

from .errors import DeployError

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


def read_config(path: Path) -> dict:
    cfg = path / "config.json"
    if not cfg.exists():
        raise DeployError(f"{path} has no config.json; is it a Hugging Face checkpoint directory?")
    try:
        return json.loads(cfg.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DeployError(f"{cfg} is not valid JSON ({e}); re-download the checkpoint") from None


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
                header = json.loads(f.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise DeployError(f"{path} is corrupted: its header is not valid JSON; re-download it") from None
            if not isinstance(header, dict):
                raise DeployError(f"{path} is corrupted: its header is not a JSON object; re-download it")
        self.data_start = 8 + n
        self.entries: dict[str, _Entry] = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (start, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
                start, end = int(start), int(end)
            except (KeyError, TypeError, ValueError):
                raise DeployError(f"{path} is corrupted: bad header entry for {name}; re-download it") from None
            if dtype not in _ST_DTYPES:
                raise DeployError(f"{path}: tensor {name} has unsupported dtype {dtype}")
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(_ST_DTYPES[dtype]).itemsize
            if end - start != nbytes or self.data_start + end > size:
                raise DeployError(f"{path} is corrupted or truncated: tensor {name} needs bytes "
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


class Weights:
    """All tensors of a checkpoint by name, across shards; each read returns one numpy array."""

    def __init__(self, path: Path):
        self.path = path
        files = sorted(path.glob("*.safetensors"))
        index = path / "model.safetensors.index.json"
        if index.exists():
            try:
                wm = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError):
                raise DeployError(f"{index} is not a valid safetensors index; re-download the checkpoint") from None
            missing = sorted({f for f in wm.values() if not (path / f).exists()})
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
                self.where[name] = f

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def names(self) -> list[str]:
        return list(self.where)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.where[name].entries[name].shape

    def read(self, name: str) -> np.ndarray:
        return self.where[name].read(name)


# ---- the loaded model ----------------------------------------------------------------------

@dataclass
class LoadedModel:
    """A model ready to export: its architecture module, config, and lazily opened weights."""

    path: Path
    hf_config: dict
    arch: ModuleType
    config: object
    weights: Weights
    source: str = ""
    _module: object = field(default=None, repr=False)

    @property
    def architecture(self) -> str:
        return (self.hf_config.get("architectures") or [self.hf_config.get("model_type", "?")])[0]

    def build(self):
        """The nn.Module of this model (built once)."""
        if self._module is None:
            self._module = self.arch.Model(self.config)
        return self._module

    def _sources(self) -> Iterator[tuple[str, str, str | None]]:
        """(our name, checkpoint name, transform) for every parameter, in export order, each checked
        against the safetensors headers: present, and of the shape the config implies (stored layout)."""
        wmap = self.arch.weight_map(self.config)
        for name, p in self.build().named_parameters():
            hf_name, transform = wmap.get(name, (name, None))
            if hf_name not in self.weights:
                raise DeployError(f"checkpoint {self.path} is missing tensor {hf_name} (needed for {name}); "
                                  f"is it a complete {self.architecture} checkpoint?")
            want = tuple(p.shape)[::-1] if transform == "transpose" else tuple(p.shape)
            if tuple(self.weights.shape(hf_name)) != want:
                raise DeployError(f"tensor {hf_name} has shape {list(self.weights.shape(hf_name))}, but the config "
                                  f"implies {list(want)}; config.json and the weights disagree")
            yield name, hf_name, transform

    def check(self) -> None:
        """Raise DeployError unless every parameter is in the checkpoint with the right shape (headers only)."""
        for _ in self._sources():
            pass

    def params(self) -> Iterator[tuple[str, np.ndarray]]:
        """(our name, array) for every parameter, in export order, checked against the model's shapes."""
        for name, hf_name, transform in self._sources():
            arr = self.weights.read(hf_name)
            yield name, arr.T if transform == "transpose" else arr


def load_model(source: str, revision: str | None = None, **overrides) -> LoadedModel:
    from .models import lookup, supported  # deploycc.models, installed from models/

    local = Path(source).expanduser()
    if local.is_file():
        from .gguf import is_gguf, load_gguf

        if is_gguf(local):
            return load_gguf(local, source, **overrides)
    path = resolve(source, revision)
    hf = read_config(path)
    arch = lookup(hf)
    if arch is None:
        name = (hf.get("architectures") or [hf.get("model_type", "unknown")])[0]
        raise DeployError(f"unsupported architecture {name}; supported: {', '.join(supported())}")
    try:
        config = arch.Config.from_hf(hf, **overrides)
    except KeyError as e:
        raise DeployError(f"{path / 'config.json'} lacks {e.args[0]!r}, which {arch.__name__.split('.')[-1]} needs") from None
    except ValueError as e:
        raise DeployError(f"{path / 'config.json'}: {e}") from None
    model = LoadedModel(path, hf, arch, config, Weights(path), source)
    model.check()  # a missing or misshapen tensor is reported now, not halfway through a compile
    return model
