"""Engine: a loaded package on a device, with the reference session's contract.

    eng = Engine.load("dist/pkg", device=None)   # device defaults to the package's backend
    eng.prefill(ids, all_logits=False); eng.decode(token_id); eng.reset()
    for piece in eng.generate(prompt_or_messages, max_tokens=64, temperature=0.0, top_p=1.0, seed=0): ...
"""
from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import numpy as np

from .devices import DeviceError, open_device
from .kinds import KINDS
from .kvcache import KV_META, ContextWindowFull, KVCache, PagedKVCache
from .loaders import load_kernels
from .package import PackageError, load_params, read_manifest, verify
from .safetensors_io import SafetensorsError
from .validate import PAGED_FUNCTIONS
from .vm import NP, VM, DTensor, VMError

GRAPH_FUNCTIONS = ("decode", "step", "step_one")  # run as CUDA graphs where the device captures them (runtime/graphs.py)


class Engine:
    def __init__(self, path: Path, manifest: dict, bytecode: dict, device, params: dict, native_steps: bool = True,
                 paged: bool = False, every_kernel: bool = False):
        """paged: run batched steps over the package's page pool (runtime/batch.py) instead of prefill and decode
        of one sequence. The decode and batched steps run as CUDA graphs where the device captures them
        (runtime/graphs.py; DEPLOYCC_CUDA_GRAPHS=0 turns them off). Only the kernels this engine's functions launch
        are built, unless every_kernel (verify --kernels runs each program's kernels alone)."""
        self.path = path
        self.manifest = manifest
        self.device = device
        b = manifest["bounds"]
        self.context_window = b["context_window"]
        self.prefill_chunk = b["prefill_chunk"]
        self.vocab_size = manifest.get("vocab_size")
        self.kind = KINDS[manifest["target"]["kind"]]
        requires = manifest["kernels"].get("requires")  # packages before deploycc stated them have none
        if requires is not None and self.kind.adapter_limits:
            device.check_limits(requires)
        # the functions this engine runs (paged: the batched steps over the page pool; else prefill and decode), and
        # of the package's kernels those they launch: a WebGPU device compiles a pipeline for each it builds
        functions = {f: spec for f, spec in bytecode["functions"].items() if (f in PAGED_FUNCTIONS) == paged}
        launched = {ins["args"][0]["k"] for spec in functions.values() for ins in spec["instructions"]
                    if ins.get("fn") == "vm.launch"}
        t0 = time.perf_counter()
        loaded = load_kernels(device, path, manifest, bytecode, None if every_kernel else launched)
        kernels, self.lib = loaded.kernels, loaded.library
        self.f16 = loaded.f16  # f16 variants (WebGPU): "native" (shader-f16), "packed" (from u32 words) or "none"
        self.subgroups = loaded.subgroups  # WebGPU: whether kernels with subgroup operations run (file_..._subgroups)
        self.build_seconds = time.perf_counter() - t0
        storages = [device.alloc(max(int(s["bytes"]), 4)) for s in manifest["storages"]]
        kv = manifest["kv_cache"]
        self.paged = paged
        if paged:
            if "pool" not in kv:
                raise PackageError("this package has no batched step (it was compiled before deploycc had one); "
                                   "recompile it to serve batches")
            pool = kv["pool"]
            self.cache = PagedKVCache(device, kv["layers"], kv["kv_heads"], kv["head_dim"], kv["dtype"], pool["pages"],
                                      pool["page_size"], pool["sequences"], self.prefill_chunk, self.context_window)
            bounds = {"seq_len": self.prefill_chunk, "batch": pool["sequences"], "pages_len": self.cache.widest}
        else:
            self.cache = KVCache(device, kv["layers"], self.context_window, kv["kv_heads"], kv["head_dim"],
                                 kv["dtype"], kv.get("rows"), self.prefill_chunk)
            bounds = {"seq_len": self.prefill_chunk, "total_len": self.context_window}
        max_grid = manifest["target"].get("max_grid", 65535)
        self.vm = VM({**bytecode, "functions": functions}, device, kernels, storages, self.cache, max_grid, bounds=bounds)
        weights = {name: DTensor(device.upload(np.ascontiguousarray(a)), a.shape, str(a.dtype))
                   for name, a in params.items()}
        self.weights_bytes = sum(int(a.nbytes) for a in params.values())
        if hasattr(device, "weight_ids"):  # bench --roofline: the bytes of weights each launch reads
            device.weight_ids = {id(t.buf) for t in weights.values()}
        for fname, spec in functions.items():
            fn = self.vm.functions[fname]
            for r, name in enumerate(spec["params"][spec["num_inputs"]:], start=spec["num_inputs"]):
                fn.preset[r] = weights[name]
            for key, r in spec["constants"]:
                fn.preset[r] = weights[key]
        self.ids_buf = device.alloc(self.prefill_chunk * 4)
        self.native_steps = False
        if self.kind.native and native_steps:
            self._bind_native(weights, storages)
        self.graphs = {}  # function -> StepGraphs: its steps run as CUDA graphs (runtime/graphs.py)
        if os.environ.get("DEPLOYCC_CUDA_GRAPHS", "1") != "0":
            for fname in GRAPH_FUNCTIONS:
                if (fname in PAGED_FUNCTIONS) == paged and fname in bytecode["functions"] and \
                        self.vm.use_graphs(fname, bytecode["functions"][fname]):
                    self.graphs[fname] = self.vm.functions[fname].graphs
        self._tokenizer = None
        self.stats = {"prefill_tokens": 0, "prefill_seconds": 0.0, "decode_tokens": 0, "decode_seconds": 0.0,
                      "step_tokens": 0, "step_seconds": 0.0}

    @property
    def variants(self) -> dict:
        """Which kernel variants run, for reports (WebGPU: f16 and subgroups; CUDA: the functions run as graphs, and
        their graphs' counts); empty for the other kinds."""
        out = {"f16": self.f16, "subgroups": self.subgroups} if self.f16 else {}
        if self.graphs:
            out["cuda_graphs"] = {f: g.stats() for f, g in self.graphs.items()}
        return out

    # ---- loading ----------------------------------------------------------------------------
    @classmethod
    def load(cls, path, device: str | None = None, check_hashes: bool = True, native_steps: bool = True,
             paged: bool | str = False, trust=None, every_kernel: bool = False) -> Engine:
        """paged: True for the batched step over the page pool, "auto" for it where the package has one. trust: a
        TrustPolicy (runtime/trust.py): the package must be signed by one of its keys; the signature and then every
        file's sha256 are checked before anything is built or mapped (check_hashes cannot turn that off)."""
        path = Path(path)
        manifest = read_manifest(path, trust)
        if paged == "auto":
            paged = "pool" in manifest["kv_cache"]
        # the whole package, before any device is opened; under a policy the hashes are what the signature covers
        bytecode = verify(path, manifest, check_hashes or trust is not None)
        try:
            params = load_params(path, manifest)
        except SafetensorsError as e:
            raise PackageError(str(e)) from None
        kind = device or manifest["preset"]["backend"]
        if kind != manifest["target"]["kind"]:
            raise PackageError(f"this package has {manifest['target']['kind']} kernels; it cannot run on {kind}")
        try:
            dev = open_device(kind)
        except DeviceError as e:
            msg = str(e)
            hint = "" if "install" in msg or not KINDS[kind].install else f"; install it: {KINDS[kind].install}"
            raise DeviceError(f"no {kind} runtime on this machine ({msg}){hint}") from None
        return cls(path, manifest, bytecode, dev, params, native_steps, paged, every_kernel)

    def _bind_native(self, weights: dict, storages: list) -> None:
        """One context per engine with every pointer the step functions use (the module keeps none):
        each prefill/decode is then one native call with the shape heap's values."""
        import ctypes

        nat = self.manifest["kernels"]["native"]
        ptr = self.device.pointer
        ws = [ptr(weights[n].buf) for n in nat["weights"]]
        kv = [ptr(b) for pair in zip(self.cache.k, self.cache.v) for b in pair]
        sts = [ptr(b) for b in storages]
        meta = [ptr(self.cache.buffers[name]) for name in KV_META] if self.paged else []

        class Ctx(ctypes.Structure):
            _fields_ = [("w", ctypes.c_void_p), ("st", ctypes.c_void_p), ("kv", ctypes.c_void_p),
                        ("input", ctypes.c_void_p), ("h", ctypes.c_void_p), ("meta", ctypes.c_void_p)]

        tables = [(ctypes.c_void_p * max(1, len(x)))(*x) for x in (ws, sts, kv, meta)]
        self._native_keep = [tables]  # the C side holds addresses into these: they live as long as the engine
        for fname, info in nat["functions"].items():
            if (fname in PAGED_FUNCTIONS) != self.paged:  # the other cache's functions
                continue
            heap = (ctypes.c_int * max(1, len(info["heap"])))()
            ctx = Ctx(*(ctypes.addressof(t) for t in tables[:3]), ptr(self.ids_buf), ctypes.addressof(heap),
                      ctypes.addressof(tables[3]))
            fn = getattr(self.lib, info["symbol"])
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = None
            self._native_keep.append((ctx, heap))
            self.vm.functions[fname].use_native(info, functools.partial(fn, ctypes.addressof(ctx)), heap)
        self.native_steps = True

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from .tokenizer import Tokenizer

            self._tokenizer = Tokenizer.from_dir(self.path, vocab_size=self.vocab_size)
        return self._tokenizer

    # ---- the session contract ---------------------------------------------------------------
    def _need(self, paged: bool) -> None:
        if paged != self.paged:
            raise VMError(f"this engine was loaded {'with' if self.paged else 'without'} paged=True: "
                          f"{'batched steps need' if paged else 'prefill and decode need'} the other")

    def _step(self, fn: str, ids: np.ndarray) -> DTensor:
        if ids.size and not 0 <= int(ids.min()) <= int(ids.max()) < self.vocab_size:  # kernels index tables with them
            bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
            raise VMError(f"token id {bad} is outside the vocabulary of {self.vocab_size}; use the package's tokenizer")
        self.device.write(self.ids_buf, ids)
        return self.vm.run(fn, DTensor(self.ids_buf, (1, ids.shape[1]), "int32"), self.cache)

    def prefill(self, ids, all_logits: bool = False) -> np.ndarray:
        self._need(paged=False)
        ids = np.asarray(ids, dtype=np.int32).reshape(1, -1)
        n = ids.shape[1]
        if n == 0:
            raise ValueError("prefill needs at least one token")
        if self.cache.length + n > self.context_window:
            raise ContextWindowFull(f"{self.cache.length} cached + {n} new tokens exceed the context window of "
                                    f"{self.context_window}; reset or compile with a larger --context-window")
        t0 = time.perf_counter()
        outs = []
        for start in range(0, n, self.prefill_chunk):
            chunk = ids[:, start:start + self.prefill_chunk]
            res = self._step("prefill_all" if all_logits else "prefill", chunk)
            last = start + self.prefill_chunk >= n
            if all_logits or last:
                logits = self._download(res)[0]
                outs.append(logits)
        self.stats["prefill_tokens"] += n
        self.stats["prefill_seconds"] += time.perf_counter() - t0
        out = np.concatenate(outs)
        return out if all_logits else out[-1]

    def decode(self, token_id: int) -> np.ndarray:
        self._need(paged=False)
        t0 = time.perf_counter()
        res = self._step("decode", np.array([[int(token_id)]], np.int32))
        logits = self._download(res)[0, -1]
        self.stats["decode_tokens"] += 1
        self.stats["decode_seconds"] += time.perf_counter() - t0
        return logits

    def step(self, ids, tables: list[list[int]], starts: list[int], counts: list[int], all_logits: bool = False
             ) -> np.ndarray:
        """A batched step over the page pool (an engine loaded with paged=True; runtime/batch.py schedules it):
        sequence b, whose pages are tables[b], appends counts[b] of `ids` at positions starts[b] on; returns the
        logits [len(counts), vocab] of each sequence's last token of the step, or with `all_logits` those of every
        token [len(ids), vocab] (the package's step_all)."""
        self._need(paged=True)
        if all_logits and "step_all" not in self.vm.functions:
            raise VMError("this package has no step_all function (compiled before deploycc had it): it cannot give a "
                          "prompt's log probabilities; compile it again")
        ids = np.asarray(ids, dtype=np.int32).reshape(1, -1)
        self.cache.plan(tables, starts, counts)
        t0 = time.perf_counter()
        logits = self._download(self._step(self.step_function(ids.shape[1], all_logits), ids))[0]
        self.stats["step_tokens"] += ids.shape[1]
        self.stats["step_seconds"] += time.perf_counter() - t0
        return logits

    def step_function(self, tokens: int, all_logits: bool = False) -> str:
        """The function a batched step of `tokens` tokens runs: step_one for one token (one sequence decoding; the
        CUDA presets' packages have it: the decode GEMVs with the norms and the gated product folded in), else step
        (or step_all for every token's logits). DEPLOYCC_STEP_ONE=0 runs step for one token too (a lease's A/B of
        the two on one package)."""
        if all_logits:
            return "step_all"
        one = tokens == 1 and "step_one" in self.vm.functions and os.environ.get("DEPLOYCC_STEP_ONE", "1") != "0"
        return "step_one" if one else "step"

    def _download(self, t: DTensor) -> np.ndarray:
        return self.device.download(t.buf, t.shape, NP[t.dtype])

    def reset(self) -> None:
        self.cache.reset()

    def truncate(self, n: int) -> None:
        """Keep the first n cached positions (runtime/generate.py: PrefixCache reuses them)."""
        self.cache.truncate(n)

    def generate(self, prompt_or_messages, max_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, repetition_penalty: float = 1.0, seed: int = 0, stop=(), chat: bool = True,
                 stats: dict | None = None, grammar=None):
        """Stream a reply (runtime/generate.py). `grammar`: a runtime/grammar.py Grammar (Grammar.json_schema(schema),
        Grammar.json_object(), Grammar.text(lark_or_gbnf)) every token must fit."""
        from .generate import generate

        return generate(self, self.tokenizer, prompt_or_messages, max_tokens=max_tokens, temperature=temperature,
                        top_p=top_p, top_k=top_k, repetition_penalty=repetition_penalty, seed=seed, stop=stop,
                        chat=chat, stats=stats, grammar=grammar)
