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

Integer packages (the cpu target's default): their linears multiply activations rounded to 8 bits per block
of 32, and the package records which (manifest kernels.native.activations); both references round the same
activations the same way (the numpy one runs the graph's round_activations, transformers gets forward
pre-hooks on those linears). No absolute bound holds for them end to end, however: an activation whose scaled
value lies within float32 summation error of a rounding boundary rounds either way, and a code that flips
moves what follows. Measured on SmolLM2-135M, one prompt token: the reference against itself with its rounding
inputs moved by one unit in the last place differs by 0.25 in a logit (relative RMS 0.014), the correct
package by 0.18 (0.013). So verify measures that noise for the model at hand, with references whose rounding
inputs are moved by up to NOISE_ULPS ulp (NOISE_SEEDS: flips are few discrete events, so one draw of the spread
can be a third of another's; a tiny package with half its linears at 16 bits measured 2.7x one draw), and
holds the package to NOISE_FACTOR times the largest spread plus FLOAT_FLOOR, in the 90th percentile over all
compared positions of the relative RMS logit difference (a flip that moves a few positions of a small model
does not decide it; a wrong package moves most positions). SmolLM2-135M q4f16_2 + 8-bit head with 16-bit
activations (the default, deploycc/calibrate.py): the package 3.4e-4, the bound 1.1e-3, with layer 0's k_proj
rows reversed 0.74 (top-1 agreement 42%). With 8-bit activations, 65 positions: the package 0.057, the
reference's own spread 0.10, so the bound is 0.20; k_proj reversed 0.71 (top-1 agreement 35%, the correct
one 92%). The tiny fixtures measure below 1e-6 and every mutation of tests/test_verify_mutations.py at least
0.018 there.

Prompts are random token ids (1, 7 and prefill_chunk + 3 tokens, at most 33, and for a model with sliding
windows the longest ring + 3, past every window) followed by greedy decode steps; both sides follow the
reference's greedy tokens (teacher forcing), so one wrong token cannot send the two down different paths.
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

# A cpu package with integer kernels compiled before packages recorded which activations they round
# (manifest kernels.native.activations) is compared with an unrounded reference, and held to this relative RMS
# of the logit difference (SmolLM2-135M measured 0.15-0.16): recompile it to be checked tightly.
INTEGER_REL_RMS = 0.25

# A package that records its rounded activations: relative RMS <= NOISE_FACTOR x the reference's own spread
# under one-ulp moves of its rounding inputs (measured per model and prompt set, see the module docstring)
# + FLOAT_FLOOR (float32 summation order alone: the tiny fixtures measure <= 1e-6).
NOISE_FACTOR = 2.0
FLOAT_FLOOR = 1e-4
NOISE_ULPS = 4.0
# A float16 KV cache rounds the key and value projections' outputs, which the package's GEMVs and tiles and the
# reference's matmuls sum in other orders: measured on the llama-wide fixture (h100, the CUDA emulation), those
# outputs differ by a median of 2-4 float32 ulps, 11-18 at the 90th percentile and 58-195 at the 99th (cancellation),
# where a norm's (what most rounded activations are) differ by 0-2. So the cache's inputs move by up to this many.
KV_NOISE_ULPS = 64.0
NOISE_SEEDS = (1, 2, 3)  # references with moved rounding inputs; the bound takes the largest spread
QUANTILE = "p90_rel_rms"  # the 90th percentile over every compared position (prefill positions and decode steps)

# Against transformers on the same (scheme-rounded) weights: SmolLM2-135M q0f32, q4f16_1, q4f16_2 <= 1.2e-4.
TRANSFORMERS_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Criterion:
    """What passes: the largest |logit difference| (or relative RMS) of every step <= `limit`."""

    limit: float
    metric: str = "max_abs_diff"
    noise: float | None = None  # the reference's own spread the limit was derived from

    def describe(self) -> str:
        if self.noise is not None:
            return (f"90th percentile of the positions' relative RMS logit difference <= {self.limit:.3g} "
                    f"({NOISE_FACTOR:g} x the reference's own {self.noise:.3g} when its rounding inputs move by up to "
                    f"{NOISE_ULPS:g} ulp ({KV_NOISE_ULPS:g} a float16 cache's), + {FLOAT_FLOOR:g})")
        if self.metric == "rel_rms":
            return f"relative RMS of the logit difference <= {self.limit:g}"
        return f"largest |logit difference| <= {self.limit:g}"

    def value(self, s) -> float:
        return getattr(s, self.metric)


def default_criterion(against: Against, backend: str, tolerance: float | None = None,
                      integer: bool = False, noise: float | None = None) -> Criterion:
    """The test a correct package on `backend` passes; `tolerance` overrides the limit (absolute). `noise`: the
    reference's own relative RMS spread when its rounded activations move by an ulp (packages with a record)."""
    if tolerance is not None:
        return Criterion(tolerance)
    if noise is not None:
        return Criterion(NOISE_FACTOR * noise + FLOAT_FLOOR, QUANTILE, noise)
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
    rel_positions: list[float] = field(default_factory=list)  # each position's relative RMS
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
    return Step(prompt_len, step, float(np.abs(diff).max()), float(rel.max()), float(max(kl.max(), 0.0)), agree, len(a),
                [float(r) for r in rel])


def summary(steps: list[Step]) -> dict:
    return {"max_abs_diff": max(s.max_abs_diff for s in steps), "rel_rms": max(s.rel_rms for s in steps),
            QUANTILE: float(np.quantile([r for s in steps for r in s.rel_positions], 0.9)),
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
    kv_cache: str = "float32"  # the package's KV cache (float16: the references round theirs alike)

    @property
    def worst(self) -> Step:
        return max(self.steps, key=lambda s: s.rel_rms if self.criterion.metric == QUANTILE else self.criterion.value(s))

    @property
    def measured(self) -> float:
        """The figure the criterion holds to its limit."""
        return summary(self.steps)[self.criterion.metric]

    @property
    def failure(self) -> str | None:
        """One line naming the difference, or None when the package passes."""
        w = self.worst
        if self.measured <= self.criterion.limit:
            return None
        agreement = f"top-1 agreement {summary(self.steps)['top1_agreement']:.0%}"
        if self.criterion.metric == QUANTILE:
            return (f"the 90th percentile of the positions' relative RMS logit difference, {self.measured:.3e}, against "
                    f"{self.reference} exceeds "
                    f"{self.criterion.limit:.3g} ({NOISE_FACTOR:g} x the reference's own {self.criterion.noise:.3g} "
                    f"when its rounding inputs move, + {FLOAT_FLOOR:g}; worst: prompt of {w.prompt_len} tokens, step "
                    f"{w.step}, {w.rel_rms:.3e}; {agreement}); was the package compiled from this model (--source)?")
        if self.criterion.metric == "rel_rms":
            return (f"relative RMS logit difference {w.rel_rms:.3e} against {self.reference} exceeds the tolerance "
                    f"{self.criterion.limit:.3g} of 8-bit activations (prompt of {w.prompt_len} tokens, step {w.step}, "
                    f"{agreement}); was the package compiled from this model (--source)?")
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
               "backend": self.backend, "kv_cache": self.kv_cache, "metric": self.criterion.metric,
               "tolerance": self.criterion.limit,
               "noise": self.criterion.noise,
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


def jittered_rounding(seed: int):
    """round_activations with each input moved by up to NOISE_ULPS units in the last place (relative, seeded): the
    reference's own spread under float32 summation-order changes (the module docstring)."""
    from .op.linalg import round_activations_np

    rng = np.random.default_rng(seed)

    def rounded(x, bits, weight=""):
        return round_activations_np(moved(x, rng, NOISE_ULPS), bits)
    return rounded


def moved(x, rng, ulps: float) -> np.ndarray:
    """x (float32) with each element moved by up to `ulps` float32 ulps, relative, drawn from rng."""
    x = np.asarray(x, np.float32)
    return (x.astype(np.float64) * (1 + rng.uniform(-ulps, ulps, x.shape) * 2.0 ** -24)).astype(np.float32)


def jittered_append(seed: int):
    """kv.append with each key and value moved by up to KV_NOISE_ULPS float32 ulps (relative, seeded) before a float16
    cache rounds it: the other rounding a package with a half cache does (a key near a tie between two halves
    rounds to either, and every later position reads it)."""
    from .op.attention import _append_ref

    rng = np.random.default_rng(seed + 1000)

    def append(cache, k, v, *slot, **attrs):
        return _append_ref(cache, moved(k, rng, KV_NOISE_ULPS), moved(v, rng, KV_NOISE_ULPS), *slot, **attrs)
    return append


def round_inputs(model, loaded, rounded: dict[str, int], jitter: int | None = None) -> None:
    """Forward pre-hooks on the transformers modules that the package's rounded linears stand for (our module
    names, a package's record), rounding their input as round_activations does (moved first, with `jitter`)."""
    import torch

    from .op.linalg import round_activations_np

    names = dict(model.named_modules())
    head = model.get_output_embeddings()
    hooked: dict[str, int] = {}
    for ours, bits in rounded.items():
        hf, _ = loaded.checkpoint_name(f"{ours}.weight")
        found = next((n for n in [ours] + [h.removesuffix(".weight") for h in in_memory_names(hf)] if n in names), None)
        if found is not None and isinstance(names[found], torch.nn.Embedding):  # the tied output head
            found = next((n for n, m in names.items() if m is head), None) \
                if head is not None and head.weight is names[found].weight else None
        if found is None or not isinstance(names[found], torch.nn.Linear) or hooked.get(found, bits) != bits:
            raise DeployError(f"no linear of transformers' {type(model).__name__} stands for {ours}; cannot round its "
                              f"input as the package does: use --against numpy")
        hooked[found] = bits
    round_x = jittered_rounding(jitter) if jitter is not None else round_activations_np
    for name, bits in hooked.items():
        def hook(module, args, bits=bits):
            x = args[0].detach().float().numpy()
            return (torch.from_numpy(round_x(x, bits)),) + tuple(args[1:])
        names[name].register_forward_pre_hook(hook)


def half_cache(model, jitter: int | None = None) -> None:
    """Attention in `model` on its keys and values rounded to float16 (moved first by up to KV_NOISE_ULPS, seeded by
    `jitter`): what a package with a float16 KV cache attends to. Each call runs the whole sequence, so the keys
    given to attention are the cached ones (after their rotary embedding); the model's own eager attention does the
    rest (transformers' AttentionInterface)."""
    import sys

    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    rng = None if jitter is None else np.random.default_rng(jitter + 1000)

    def rounded(x):
        if rng is not None:  # as jittered_append moves the numpy reference's
            x = torch.from_numpy(moved(x.detach().numpy(), rng, KV_NOISE_ULPS))
        return x.half().float()

    def attention(module, query, key, value, *args, **kwargs):
        eager = sys.modules[type(module).__module__].eager_attention_forward
        return eager(module, query, rounded(key), rounded(value), *args, **kwargs)
    name = f"deploycc_half_kv_{jitter}"
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["eager"])  # eager's additive masks, not sdpa's
    model.set_attn_implementation(name)


def transformers_references(source: str, loaded, quant: str, head: str, rounded: dict[str, int],
                            kv_cache: str = "float32"
                            ) -> tuple[TransformersSession, TransformersSession, TransformersSession | None]:
    """(transformers on the weights rounded by the package's schemes with its activations (and a float16 cache's
    keys and values) rounded, the same with the rounding inputs moved, one per NOISE_SEEDS (None where the package
    rounds neither), transformers on the float weights). For a .gguf kept as stored the weights are the same:
    transformers dequantizes the very blocks."""
    import copy

    import torch

    model = load_transformers(source, loaded)
    exact = quant in ("q0f32", "gguf") and head == quant
    if not exact and Path(source).expanduser().is_file():
        raise DeployError(f"--against transformers takes a GGUF source only as stored (quantization gguf); this "
                          f"package re-quantized it as {quant}: use --against numpy")
    weights = copy.deepcopy(model)
    if not exact:
        from .quantization import quantize

        state = weights.state_dict()
        with torch.no_grad():
            for hf_name, values in rounded_weights(quantize(loaded, quant, None if head == quant else head)).items():
                name = next((n for n in in_memory_names(hf_name) if n in state), None)
                if name is None:
                    raise DeployError(f"transformers' {type(model).__name__} has no tensor {hf_name}; cannot round it "
                                      f"as the package does: use --against numpy")
                state[name].copy_(torch.from_numpy(values))
    noise = None
    half = kv_cache == "float16"
    if rounded or half:
        noise = [copy.deepcopy(weights) for _ in NOISE_SEEDS]
    if rounded:
        round_inputs(weights, loaded, rounded)
        for seed, moved in zip(NOISE_SEEDS, noise):
            round_inputs(moved, loaded, rounded, jitter=seed)
    if half:
        half_cache(weights)
        for seed, moved in zip(NOISE_SEEDS, noise):
            half_cache(moved, jitter=seed)
    return (TransformersSession(weights), noise and [TransformersSession(n) for n in noise],
            TransformersSession(model))


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
                     seed: int, noise=None, also=None, window: int = 0
                     ) -> tuple[list[Step], list[list[Step]] | None, list[Step] | None]:
    """Random prompts of 1, 7 and prefill_chunk + 3 tokens (at most 33), and for a model with sliding windows one
    of `window` + 3 tokens (the longest sliding-window ring: past every window, so the rings wrap and the masks
    cut), each followed by `steps` greedy decode steps on `ref`'s path; one Step per call. `noise`, references
    with their rounding inputs moved (see the module docstring), and `also`, the float model, are fed the same
    tokens: their own Steps are each `noise` against `ref` (a list per reference) and the package against `also`."""
    rng = np.random.default_rng(seed)
    steps = min(steps, context_window - 1)
    wanted = (1, 7, min(33, prefill_chunk + 3)) + ((window + 3,) if window else ())
    lengths = list(dict.fromkeys(max(1, min(n, context_window - steps)) for n in wanted))
    rows, extra = [], []
    spread = [[] for _ in noise or ()]

    def compare(n, step, got, call):
        want = call(ref)
        rows.append(compare_logits(n, step, got, want))
        for moved, own in zip(noise or (), spread):
            own.append(compare_logits(n, step, call(moved), want))
        if also is not None:
            extra.append(compare_logits(n, step, got, call(also)))
        return want

    for n in lengths:
        ids = rng.integers(0, vocab_size, n).tolist()
        for session in (engine, ref, *(noise or ()), also):
            if session is not None:
                session.reset()
        want = compare(n, "prefill", engine.prefill(ids, all_logits=True), lambda r: r.prefill(ids, all_logits=True))
        token = int(want[-1].argmax())
        for i in range(steps):
            want = compare(n, i + 1, engine.decode(token), lambda r, t=token: r.decode(t))
            token = int(want.argmax())
    return rows, (spread if noise else None), (extra if also is not None else None)


def verify_package(package, source: str | None = None, against: Against = Against.NUMPY, steps: int = 8,
                   tolerance: float | None = None, seed: int = 0, trust=None) -> Report:
    from .hub import load_model
    from .runtime.engine import Engine

    if against is Against.TRANSFORMERS:
        import_transformers()  # before any work: a missing dependency is the first thing to say
    engine = Engine.load(package, trust=trust)  # trust: runtime/trust.py TrustPolicy, None for none
    m = engine.manifest
    source = source or m["model"]["source"]
    loaded = load_model(source)
    _check_same_model(loaded, m, source)
    ctx, chunk = m["bounds"]["context_window"], m["bounds"]["prefill_chunk"]
    quant = m.get("quantization", "q0f32")
    head = m.get("head_quantization", quant)
    scheme = quant if head == quant else f"{quant} (head {head})"
    native = m["kernels"].get("native", {})
    # the weights whose linears round their input (integer kernels), as the package records them; a package of
    # an older deploycc has integer kernels but no record, and is held to a looser bound
    rounded = native.get("activations") or m["kernels"].get("activations")  # cpu packages; cuda's (dp4a)
    integer = bool(native.get("integer_activations")) and rounded is None
    if rounded:
        bits = sorted(set(rounded.values()))
        scheme += f", activations rounded to {'/'.join(map(str, bits))} bits"
    half_kv = m["kv_cache"]["dtype"] == "float16"
    if half_kv:  # the reference's cache rounds alike (a package before this had float32 caches only)
        scheme += ", a float16 KV cache"
    also = noise = None
    if against is Against.NUMPY:
        from .session import reference_session

        def numpy_reference(ops=None):
            return reference_session(loaded, context_window=ctx, quantization=quant, ops=ops,
                                     head_quantization=None if head == quant else head, activations=rounded or None,
                                     kv_cache=m["kv_cache"]["dtype"])  # a float16 cache rounds alike
        ref = numpy_reference()
        # what the package rounds (its activations, its cache's keys and values) is moved in the noise references
        moves = [{**({"round_activations": jittered_rounding(s)} if rounded else {}),
                  **({"kv.append": jittered_append(s)} if half_kv else {})} for s in NOISE_SEEDS]
        noise = [numpy_reference(ops) for ops in moves] if rounded or half_kv else None
        reference = f"the numpy reference of {scheme}"
    else:
        ref, noise, also = transformers_references(source, loaded, quant, head, rounded or {}, m["kv_cache"]["dtype"])
        exact = quant in ("q0f32", "gguf") and head == quant and not rounded
        reference = ("transformers (float32)" + (", a float16 KV cache" if half_kv else "") if exact
                     else f"transformers (float32) on the weights rounded to {scheme}")
        also = None if exact and not half_kv else also
    vocab = engine.vocab_size or loaded.config.vocab_size
    window = max(m["kv_cache"].get("rows") or [0])  # the longest sliding-window ring (0: no sliding window)
    rows, spread, float_rows = run_side_by_side(engine, ref, ctx, chunk, vocab, steps, seed, noise, also, window)
    backend = m["preset"]["backend"]
    own = max(summary(s)[QUANTILE] for s in spread) if spread else None
    return Report(str(package), against, reference, quant, head, backend,
                  default_criterion(against, backend, tolerance, integer, own),
                  rows, float_rows, m["kv_cache"]["dtype"])
