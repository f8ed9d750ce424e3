"""`deploycc verify`: run a package and a reference side by side and say whether the package is right.

Two references (`Against`):

- NUMPY (the default): deploycc's own numpy reference session of the model, quantized by the package's
  own scheme (the manifest's quantization and head_quantization; "gguf" keeps a .gguf's blocks). Both
  sides hold the same weights bit for bit, so only float32 summation order differs: the largest
  |logit difference| must stay under a tolerance per backend (DEFAULT_TOLERANCE, measured on tiny
  models and SmolLM2-135M). A package compiled from other weights misses it by orders of magnitude.
- TRANSFORMERS: the source checkpoint in float32 under transformers, an oracle that shares no model or
  kernel code with deploycc. Its weights are first rounded as the package's scheme rounds them (deploycc's
  numpy quantize + dequantize, `rounded_weights`), so a correct package of any scheme agrees with it to
  float32 rounding and the same tolerance applies. Against the unrounded float model no tolerance tells
  a lossy scheme from wrong weights: on random prompts SmolLM2-135M's correct q4f16_1 package is up to
  23 logits and 4.1 nats (KL) from it with 34% top-1 agreement, while a q4f16_2 package with one MLP
  tensor replaced by noise agrees on more top-1 tokens (46%). That distance is reported as what the
  scheme costs, not checked.

Prompts are random token ids (1, 7 and prefill_chunk + 3 tokens, at most 33) followed by greedy decode
steps; both sides follow the reference's greedy tokens (teacher forcing), so one wrong token cannot
send the two down different paths.
"""
from __future__ import annotations

import contextlib
import enum
import io
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .errors import DeployError


class Against(str, enum.Enum):
    NUMPY = "numpy"
    TRANSFORMERS = "transformers"


# Largest |logit difference| against the numpy reference of the package's own quantization, per backend.
# Measured (README, "Checking a package"): tiny fixtures <= 2e-7 on PoCL and lavapipe for every scheme,
# SmolLM2-135M <= 2e-4 on PoCL (fast-math kernels, 30 layers); one tensor of other weights: >= 2.6e-3.
DEFAULT_TOLERANCE = {"opencl": 1e-3, "webgpu": 1e-3, "cuda": 1e-3}

# A cpu package whose matmuls round the activations to 8 bits per block of 32 (integer dot products,
# deploycc/schedule/qgemv.py) is not float-equal to any reference: it is held to the relative RMS of the logit
# difference (centred, per position) instead. Measured: 8e-3 on the tiny llama (hidden 32, one block per row);
# SmolLM2-135M (q4f16_2, 8-bit head) 0.03-0.06 per decode step and 0.15-0.16 over the 33 positions of a
# prefill (the first positions' logits are the least certain), in the plain and the interleaved layout alike;
# other weights cost O(1). The kernels themselves are held to 1e-5 against the interpreter on identically
# rounded activations (tests/kernels/test_qgemv.py); this bound catches a wrong package, not rounding.
INTEGER_REL_RMS = 0.25

# Against transformers on the same (scheme-rounded) weights: SmolLM2-135M q0f32, q4f16_1, q4f16_2 <= 1.2e-4.
TRANSFORMERS_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Criterion:
    """What passes: the largest |logit difference| of every step <= `limit`."""

    limit: float
    metric: str = "max_abs_diff"

    def describe(self) -> str:
        if self.metric == "rel_rms":
            return f"relative RMS of the logit difference <= {self.limit:g}"
        return f"largest |logit difference| <= {self.limit:g}"

    def value(self, s) -> float:
        return getattr(s, self.metric)


def default_criterion(against: Against, backend: str, tolerance: float | None = None,
                      integer: bool = False) -> Criterion:
    """The test a correct package on `backend` passes; `tolerance` overrides the limit (absolute)."""
    if tolerance is not None:
        return Criterion(tolerance)
    if integer:
        return Criterion(INTEGER_REL_RMS, "rel_rms")
    if against is Against.NUMPY:
        return Criterion(DEFAULT_TOLERANCE.get(backend, 1e-3))
    return Criterion(TRANSFORMERS_TOLERANCE)


@dataclass
class Step:
    """One compared call: a prefill (every position's logits) or one decode step."""

    prompt_len: int
    step: int | str
    max_abs_diff: float
    rel_rms: float  # largest over the call's positions: std(package - reference) / std(reference)
    kl: float  # largest KL(reference || package) over the call's positions, in nats
    top1_agree: int  # positions whose argmax agrees
    positions: int
    argmax_match: bool = field(init=False)

    def __post_init__(self):
        self.argmax_match = self.top1_agree == self.positions


def compare_logits(prompt_len: int, step, got: np.ndarray, want: np.ndarray) -> Step:
    if got.shape != want.shape:
        raise DeployError(f"the package's logits are {list(got.shape)}, the reference's {list(want.shape)}; is "
                          f"--source the model this package was compiled from?")
    a, b = np.atleast_2d(got).astype(np.float64), np.atleast_2d(want).astype(np.float64)
    diff = a - b
    # centred: a shift common to a position's logits changes no probability
    rel = (diff - diff.mean(-1, keepdims=True)).std(-1) / np.maximum(b.std(-1), 1e-12)
    logp = b - b.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    logq = a - a.max(-1, keepdims=True)
    logq -= np.log(np.exp(logq).sum(-1, keepdims=True))
    kl = (np.exp(logp) * (logp - logq)).sum(-1)
    agree = int((a.argmax(-1) == b.argmax(-1)).sum())
    return Step(prompt_len, step, float(np.abs(diff).max()), float(rel.max()), float(max(kl.max(), 0.0)), agree, len(a))


def summary(steps: list[Step]) -> dict:
    return {"max_abs_diff": max(s.max_abs_diff for s in steps), "rel_rms": max(s.rel_rms for s in steps),
            "kl": max(s.kl for s in steps),
            "top1_agreement": sum(s.top1_agree for s in steps) / sum(s.positions for s in steps)}


@dataclass
class Report:
    package: str
    against: Against
    reference: str  # in words: "the numpy reference of q4f16_1"
    quantization: str
    head_quantization: str
    backend: str
    criterion: Criterion
    steps: list[Step]
    float_steps: list[Step] | None = None  # against transformers: the package against the unrounded float model

    @property
    def worst(self) -> Step:
        return max(self.steps, key=self.criterion.value)

    @property
    def failure(self) -> str | None:
        """One line naming the difference, or None when the package passes."""
        w = self.worst
        if self.criterion.value(w) <= self.criterion.limit:
            return None
        if self.criterion.metric == "rel_rms":
            return (f"relative RMS logit difference {w.rel_rms:.3e} against {self.reference} exceeds the tolerance "
                    f"{self.criterion.limit:g} of 8-bit activations (prompt of {w.prompt_len} tokens, step {w.step}, "
                    f"top-1 agreement {summary(self.steps)['top1_agreement']:.0%}); was the package compiled from "
                    f"this model (--source)?")
        return (f"largest logit difference {w.max_abs_diff:.3e} against {self.reference} exceeds the tolerance "
                f"{self.criterion.limit:g} (prompt of {w.prompt_len} tokens, step {w.step}, top-1 agreement "
                f"{summary(self.steps)['top1_agreement']:.0%}); was the package compiled from this model (--source)?")

    @property
    def passed(self) -> bool:
        return self.failure is None

    def to_dict(self) -> dict:
        w = self.worst
        out = {"package": self.package, "against": self.against.value, "reference": self.reference,
               "quantization": self.quantization, "head_quantization": self.head_quantization,
               "backend": self.backend, "metric": self.criterion.metric, "tolerance": self.criterion.limit,
               "passed": self.passed, "failure": self.failure, **summary(self.steps),
               "worst": {"prompt_len": w.prompt_len, "step": w.step}, "steps": [asdict(s) for s in self.steps]}
        if self.float_steps is not None:
            out["float_model"] = summary(self.float_steps)
        return out


# ---- the references ------------------------------------------------------------------------------

class TransformersSession:
    """A transformers float32 model behind the session contract (prefill / decode / reset). Each call
    runs the whole sequence again: prompts here are at most a few dozen tokens, and no cache of
    transformers' own can then differ from ours in how it is used."""

    def __init__(self, model):
        self.model = model
        self.ids: list[int] = []

    def _logits(self) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.model(torch.tensor([self.ids])).logits[0].float().numpy()

    def prefill(self, ids, all_logits: bool = False) -> np.ndarray:
        self.ids += [int(t) for t in ids]
        out = self._logits()
        return out[-len(ids):] if all_logits else out[-1]

    def decode(self, token_id: int) -> np.ndarray:
        self.ids.append(int(token_id))
        return self._logits()[-1]

    def reset(self) -> None:
        self.ids = []


def import_transformers():
    try:
        import torch
        import transformers
    except ImportError as e:
        raise DeployError(f"--against transformers needs torch and transformers ({e.name} is missing): "
                          f"pip install torch transformers") from None
    transformers.utils.logging.set_verbosity_error()  # stderr holds at most the one `error:` line
    transformers.utils.logging.disable_progress_bar()
    return torch, transformers


def load_transformers(source: str, loaded):
    """The source checkpoint as a transformers model: float32, local files only, no remote code."""
    torch, transformers = import_transformers()
    kwargs = dict(dtype=torch.float32, trust_remote_code=False, local_files_only=True, attn_implementation="eager")
    local = Path(source).expanduser()
    if local.is_file():  # a .gguf: transformers dequantizes it (the gguf package must be installed)
        kwargs["gguf_file"] = local.name
        where = str(local.parent)
    else:
        where = str(loaded.path)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # transformers' own progress bars
            return transformers.AutoModelForCausalLM.from_pretrained(where, **kwargs).eval()
    except (OSError, ValueError, ImportError, KeyError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DeployError(f"transformers cannot load {source}: {first}") from None


def rounded_weights(qmodel) -> dict[str, np.ndarray]:
    """Checkpoint name -> float32 values of every weight the package quantizes, as its scheme leaves them
    (deploycc's numpy quantize, then dequantize): what the package computes with, in the checkpoint's
    own layout, to load into transformers."""
    schemes = qmodel.quantized_names() if hasattr(qmodel, "quantized_names") else {}
    base = getattr(qmodel, "base", qmodel)
    out = {}
    for name, hf_name, transform in base._sources():
        if name in schemes:
            w = np.asarray(base.weights.read(hf_name), np.float32)
            w = w.T if transform == "transpose" else w
            r = schemes[name].dequantize(schemes[name].quantize(w), w.shape[-1]).reshape(w.shape)
            out[hf_name] = np.ascontiguousarray(r.T if transform == "transpose" else r)
    return out


# transformers 5 renames some checkpoints' tensors when it loads them (Gemma 3's multimodal files keep the
# language model under language_model.model., the loaded module under model.language_model.).
_RENAMES = ((r"^language_model\.model\.", "model.language_model."), (r"^language_model\.lm_head\.", "lm_head."))


def in_memory_names(hf_name: str) -> list[str]:
    """A checkpoint tensor's name, and what transformers may call it once loaded."""
    import re

    return [hf_name] + [re.sub(p, r, hf_name) for p, r in _RENAMES if re.match(p, hf_name)]


def transformers_references(source: str, loaded, quant: str, head: str) -> tuple[TransformersSession, TransformersSession]:
    """(transformers on the weights rounded by the package's schemes, transformers on the float weights).
    For a .gguf kept as stored both are the same model: transformers dequantizes the very blocks."""
    import copy

    import torch

    model = load_transformers(source, loaded)
    if quant in ("q0f32", "gguf") and head == quant:
        return TransformersSession(model), TransformersSession(model)
    if Path(source).expanduser().is_file():
        raise DeployError(f"--against transformers takes a GGUF source only as stored (quantization gguf); this "
                          f"package re-quantized it as {quant}: use --against numpy")
    from .quantization import quantize

    rounded = copy.deepcopy(model)
    state = rounded.state_dict()
    with torch.no_grad():
        for hf_name, values in rounded_weights(quantize(loaded, quant, None if head == quant else head)).items():
            name = next((n for n in in_memory_names(hf_name) if n in state), None)
            if name is None:
                raise DeployError(f"transformers' {type(model).__name__} has no tensor {hf_name}; cannot round it "
                                  f"as the package does: use --against numpy")
            state[name].copy_(torch.from_numpy(values))
    return TransformersSession(rounded), TransformersSession(model)


def _check_same_model(loaded, manifest: dict, source: str) -> None:
    cfg, kv = loaded.config, manifest["kv_cache"]
    theirs = (loaded.architecture, cfg.vocab_size, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim)
    ours = (manifest["model"]["architecture"], manifest.get("vocab_size", cfg.vocab_size), kv["layers"],
            kv["kv_heads"], kv["head_dim"])
    if theirs != ours:
        raise DeployError(f"{source} is a {theirs[0]} with vocabulary {theirs[1]}, {theirs[2]} layers, "
                          f"{theirs[3]} KV heads of {theirs[4]}; the package holds a {ours[0]} with {ours[1]}, {ours[2]}, "
                          f"{ours[3]} of {ours[4]}; is --source the model this package was compiled from?")


def run_side_by_side(engine, ref, context_window: int, prefill_chunk: int, vocab_size: int, steps: int,
                     seed: int, also=None) -> tuple[list[Step], list[Step] | None]:
    """Random prompts of 1, 7 and prefill_chunk + 3 tokens (at most 33), each followed by `steps` greedy
    decode steps on `ref`'s path; one Step per call. `also`, a second reference fed the same tokens, gets
    its own list of Steps (the package against the float model)."""
    rng = np.random.default_rng(seed)
    steps = min(steps, context_window - 1)
    lengths = list(dict.fromkeys(max(1, min(n, context_window - steps)) for n in (1, 7, min(33, prefill_chunk + 3))))
    rows, extra = [], []

    def compare(n, step, got, call):
        want = call(ref)
        rows.append(compare_logits(n, step, got, want))
        if also is not None:
            extra.append(compare_logits(n, step, got, call(also)))
        return want

    for n in lengths:
        ids = rng.integers(0, vocab_size, n).tolist()
        for session in (engine, ref, also):
            if session is not None:
                session.reset()
        want = compare(n, "prefill", engine.prefill(ids, all_logits=True), lambda r: r.prefill(ids, all_logits=True))
        token = int(want[-1].argmax())
        for i in range(steps):
            want = compare(n, i + 1, engine.decode(token), lambda r, t=token: r.decode(t))
            token = int(want.argmax())
    return rows, (extra if also is not None else None)


def verify_package(package, source: str | None = None, against: Against = Against.NUMPY, steps: int = 8,
                   tolerance: float | None = None, seed: int = 0) -> Report:
    from .hub import load_model
    from .runtime.engine import Engine

    if against is Against.TRANSFORMERS:
        import_transformers()  # before any work: a missing dependency is the first thing to say
    engine = Engine.load(package)
    m = engine.manifest
    source = source or m["model"]["source"]
    loaded = load_model(source)
    _check_same_model(loaded, m, source)
    ctx, chunk = m["bounds"]["context_window"], m["bounds"]["prefill_chunk"]
    quant = m.get("quantization", "q0f32")
    head = m.get("head_quantization", quant)
    scheme = quant if head == quant else f"{quant} (head {head})"
    also = None
    if against is Against.NUMPY:
        from .session import reference_session

        ref = reference_session(loaded, context_window=ctx, quantization=quant,
                                head_quantization=None if head == quant else head)
        reference = f"the numpy reference of {scheme}"
    else:
        ref, also = transformers_references(source, loaded, quant, head)
        exact = quant in ("q0f32", "gguf") and head == quant
        reference = "transformers (float32)" if exact else f"transformers (float32) on the weights rounded to {scheme}"
        also = None if exact else also
    vocab = engine.vocab_size or loaded.config.vocab_size
    rows, float_rows = run_side_by_side(engine, ref, ctx, chunk, vocab, steps, seed, also)
    backend = m["preset"]["backend"]
    integer = bool(m["kernels"].get("native", {}).get("integer_activations"))
    return Report(str(package), against, reference, quant, head, backend,
                  default_criterion(against, backend, tolerance, integer),
                  rows, float_rows)
