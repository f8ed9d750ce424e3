"""Tiny random-weight Hugging Face checkpoints of every supported architecture, made with
transformers into a cache outside the repo ($DEPLOYCC_HOME/test-fixtures, default ~/.cache/deploycc).

The shapes are chosen to catch indexing mistakes: GQA ratios 1, 2, 3 and 4 (and 5), hidden sizes that
differ from heads * head_dim (explicit head_dim), odd vocabularies, tied and untied heads,
rope scaling (linear, Llama 3, YaRN, LongRoPE), partial rotary, sliding windows shorter than the
prompts, QK-norm, soft-capping, 2-4 layers.

Magnitudes are those of a trained model, not of transformers' initialisation (std 0.02 everywhere: attention
nearly uniform, logits of a tenth of a unit, so that a model without its soft-cap or window still matched
transformers at 1e-4). After the initialisation, `sharpen` makes every linear map preserve variance, gives the
norms before each linear two outlier channels (LLM.int8's "outlier features": inputs of 10 and 20 times the
others; residual activations up to about 150), and scales q and k layer by layer until the attention
scores of each row have a standard deviation of SCORE_STD (peaked attention), then the final norm until the
logits have one of LOGIT_STD.
"""
from __future__ import annotations

import math
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

TINY = {
    # name: (architecture, config kwargs)
    "llama-gqa1": ("llama", dict(vocab_size=101, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)),
    "llama-gqa3-llama3rope": ("llama", dict(vocab_size=97, hidden_size=48, intermediate_size=72, num_hidden_layers=3,
                                            num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False,
                                            rope_theta=500000.0,
                                            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                          "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 32})),
    "llama-gqa4-headdim-tied": ("llama", dict(vocab_size=89, hidden_size=40, intermediate_size=46, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                                          tie_word_embeddings=True)),
    "mistral-gqa2": ("mistral", dict(vocab_size=83, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, sliding_window=None)),
    "qwen2-gqa5-tied": ("qwen2", dict(vocab_size=103, hidden_size=40, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=5, num_key_value_heads=1, tie_word_embeddings=True,
                                      rope_theta=1000000.0)),
    "gpt2-odd": ("gpt2", dict(vocab_size=107, n_embd=36, n_layer=3, n_head=3, n_positions=64)),
    # Sliding windows (5 and 6) are shorter than the test prompts, so keys leave the window in prefill and decode.
    "mistral-gqa4-window": ("mistral", dict(vocab_size=79, hidden_size=48, intermediate_size=40, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=1, sliding_window=5)),
    "llama32-gqa2-tied": ("llama", dict(vocab_size=97, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                        rope_theta=500000.0,
                                        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 16})),
    "qwen25-gqa3": ("qwen2", dict(vocab_size=91, hidden_size=48, intermediate_size=88, num_hidden_layers=2,
                                  num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False,
                                  rope_theta=1000000.0, use_sliding_window=False, sliding_window=32768,
                                  max_window_layers=1)),
    "qwen3-gqa2-headdim-window": ("qwen3", dict(vocab_size=101, hidden_size=32, intermediate_size=48,
                                                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                                head_dim=12, tie_word_embeddings=True, rope_theta=1000000.0,
                                                use_sliding_window=True, sliding_window=6, max_window_layers=1)),
    "gemma2-gqa2-softcap": ("gemma2", dict(vocab_size=97, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                                           query_pre_attn_scalar=10, sliding_window=5,
                                           attn_logit_softcapping=2.0, final_logit_softcapping=3.0)),
    "gemma3-gqa4-local-global": ("gemma3", dict(vocab_size=89, hidden_size=24, intermediate_size=40,
                                                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                                                head_dim=16, query_pre_attn_scalar=16, sliding_window=6,
                                                layer_types=["sliding_attention", "sliding_attention",
                                                             "full_attention"],
                                                rope_parameters={
                                                    "sliding_attention": {"rope_type": "default",
                                                                          "rope_theta": 10000.0},
                                                    "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                       "rope_theta": 1000000.0}})),
    "phi3-longrope-partial-window": ("phi3", dict(vocab_size=83, hidden_size=32, intermediate_size=56,
                                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                  partial_rotary_factor=0.5, sliding_window=6, pad_token_id=0,
                                                  eos_token_id=1,
                                                  original_max_position_embeddings=128,
                                                  rope_scaling={"type": "longrope", "short_factor": [1.0, 1.7],
                                                                "long_factor": [3.0, 5.0], "attention_factor": 1.2})),
    "smollm3-nope-yarn": ("smollm3", dict(vocab_size=103, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                          pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                          rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                        "original_max_position_embeddings": 32})),
}


# Not in TINY (every architecture test runs over TINY): hidden and intermediate sizes of several blocks of 32,
# so the cpu target's integer kernels take their multi-block paths (two blocks per 512-bit step, odd tails).
WIDE = {
    "llama-wide": ("llama", dict(vocab_size=131, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                                 num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False)),
    # Every matmul dimension a multiple of 32 and the vocabulary of 16 (a tied head in the interleaved layout):
    # the cpu target's integer kernels run every linear, as for real models (tests/runtime/test_batch.py).
    "qwen3-x32": ("qwen3", dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                                rope_theta=1000000.0)),
}


# Not in TINY either: a second shape of each new architecture, for the logits test alone
# (tests/models/test_tiny_logits.py; the kernel and package tests run the TINY shape of each).
SHAPES = {
    "qwen3-gqa1-untied": ("qwen3", dict(vocab_size=67, hidden_size=48, intermediate_size=40, num_hidden_layers=2,
                                        num_attention_heads=3, num_key_value_heads=3, head_dim=16,
                                        tie_word_embeddings=False)),
    "gemma2-gqa4-window3": ("gemma2", dict(vocab_size=71, hidden_size=40, intermediate_size=24, num_hidden_layers=4,
                                           num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                                           query_pre_attn_scalar=32, sliding_window=3, attn_logit_softcapping=5.0,
                                           final_logit_softcapping=8.0, tie_word_embeddings=False)),
    "gemma3-gqa1-pattern2": ("gemma3", dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                            num_attention_heads=2, num_key_value_heads=2, head_dim=24,
                                            query_pre_attn_scalar=20, sliding_window=4, sliding_window_pattern=2,
                                            attn_logit_softcapping=4.0)),
    "phi3-mini-gqa1-window": ("phi3", dict(vocab_size=73, hidden_size=48, intermediate_size=32, num_hidden_layers=2,
                                           num_attention_heads=6, num_key_value_heads=6, sliding_window=4,
                                           pad_token_id=0, eos_token_id=1, tie_word_embeddings=True)),
    "smollm3-gqa3-interval2": ("smollm3", dict(vocab_size=79, hidden_size=48, intermediate_size=40,
                                               num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2,
                                               no_rope_layer_interval=2, use_sliding_window=True, sliding_window=5,
                                               pad_token_id=0, bos_token_id=1, eos_token_id=2)),
}


# Real families' vocabularies, for their real tokenizer files and chat templates (tests/npm_tokenizers.py): the
# embedding is most of such a checkpoint, so the rest stays as small as TINY's
REAL_VOCAB = {
    # 1024 positions: a prompt with tools is 254 tokens of Qwen3's template
    "qwen3-vocab-1k": ("qwen3", dict(vocab_size=151936, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True,
                                     bos_token_id=151643, eos_token_id=151645, max_position_embeddings=1024)),
}


# In the cache directory's name: a change of what make_tiny writes for a name and seed bumps it, so that no
# checkpoint of an earlier version is reused (2: sharpen; 3: no outliers in Gemma's post-norms).
VERSION = 3


def fixture_home() -> Path:
    return Path(os.environ.get("DEPLOYCC_HOME", Path.home() / ".cache" / "deploycc")) / f"test-fixtures-v{VERSION}"


def make_tiny(name: str, seed: int = 0) -> Path:
    """Write (once) the checkpoint `name` of TINY and return its directory."""
    out = fixture_home() / name
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return out
    import torch
    import transformers as tf

    arch, kwargs = {**TINY, **WIDE, **SHAPES, **REAL_VOCAB}[name]
    cfg_cls, model_cls = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM),
        "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM),
        "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM),
        "smollm3": (tf.SmolLM3Config, tf.SmolLM3ForCausalLM),
        "gpt2": (tf.GPT2Config, tf.GPT2LMHeadModel),
    }[arch]
    torch.manual_seed(seed)
    extra = {} if arch == "gpt2" else {"max_position_embeddings": 128}
    cfg = cfg_cls(**{**extra, **kwargs})
    model = model_cls(cfg).eval()
    # Random init of norms is all-ones and biases zeros; perturb them so that they are tested.
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    sharpen(model, plus_one=arch in ("gemma2", "gemma3"), seed=seed)
    # Parallel test workers may race to write the same fixture: write privately, then rename.
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    model.save_pretrained(tmp)
    try:
        tmp.rename(out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_hf(path: Path):
    import transformers as tf

    return tf.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


SCORE_STD = 3.0  # attention scores: each row's standard deviation (softmax far from uniform)
LOGIT_STD = 3.0  # logits: each position's standard deviation over the vocabulary
OUTLIERS = (10.0, 20.0)  # factors of the outlier channels of the norms before each linear


def sharpen(model, plus_one: bool, seed: int) -> None:
    """Give a freshly initialised transformers model the magnitudes of a trained one (module docstring), in place.
    plus_one: the norms multiply by 1 + w (Gemma), so w becomes f * (1 + w) - 1 where the scale is f."""
    import torch
    from transformers.pytorch_utils import Conv1D

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        done = set()  # a tied head shares the embedding's weight: scaled once, as an embedding
        for m in model.modules():
            w = getattr(m, "weight", None)
            if w is None or id(w) in done:
                continue
            done.add(id(w))
            if isinstance(m, torch.nn.Embedding):
                w.mul_(1 / w.std())
            elif isinstance(m, (torch.nn.Linear, Conv1D)):  # Conv1D (GPT-2) stores [in, out]
                w.mul_(1 / (w.std() * math.sqrt(w.shape[1 if isinstance(m, torch.nn.Linear) else 0])))
        channels = torch.randperm(model.config.hidden_size, generator=gen)[: len(OUTLIERS)].tolist()
        for layer in _layers(model):
            # Gemma's post-norms scale a block's output instead: outliers there made residual channels of large
            # terms that cancel, whose float32 rounding the next norm's outlier multiplied into 1e-3 of a logit.
            post_norms = hasattr(layer, "pre_feedforward_layernorm")
            for name, m in layer.named_children():
                if ("norm" in name or name.startswith("ln_")) and not (post_norms and name.startswith("post_")):
                    for c, f in zip(channels, OUTLIERS):
                        _scale_norm(m.weight, f, plus_one, c)
        ids = torch.randint(0, model.config.vocab_size, (1, 32), generator=gen)
        # Layer by layer: a layer's scores depend on the layers before it only.
        for i, layer in enumerate(_layers(model)):
            with _attention_scores(model) as stds:
                model(ids)
            _scale_qk(layer.attn if hasattr(layer, "attn") else layer.self_attn, math.sqrt(SCORE_STD / stds[i]),
                      plus_one)
        with _attention_scores(model):  # the final soft-cap off
            logits = model(ids).logits
        f = LOGIT_STD / float(logits.std(-1).pow(2).mean().sqrt())
        norm = model.transformer.ln_f if hasattr(model, "transformer") else model.model.norm
        _scale_norm(norm.weight, f, plus_one)
        if getattr(norm, "bias", None) is not None:
            norm.bias.mul_(f)


def _layers(model):
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


@contextmanager
def _attention_scores(model):
    """Within: the model's soft-caps are off, and each softmax (eager attention's, one a layer) appends to the
    list yielded the standard deviation of its input's rows, over the positions the mask leaves."""
    import torch

    softmax, stds = torch.nn.functional.softmax, []
    capped = [a for a in model.modules() if getattr(a, "attn_logit_softcapping", None) is not None]
    final = getattr(model.config, "final_logit_softcapping", None)
    attn = model.config._attn_implementation

    def record(x, *args, **kwargs):
        s = x.detach().double()
        valid = s > -1e30  # masked: the dtype's minimum added
        n = valid.sum(-1)
        mean = torch.where(valid, s, 0).sum(-1) / n
        var = torch.where(valid, (s - mean[..., None]) ** 2, 0).sum(-1) / n
        stds.append(float(var[n > 1].mean().sqrt()))
        return softmax(x, *args, **kwargs)

    caps = [a.attn_logit_softcapping for a in capped]
    for a in capped:
        a.attn_logit_softcapping = None
    model.config.final_logit_softcapping = None
    model.set_attn_implementation("eager")
    try:
        with mock.patch.object(torch.nn.functional, "softmax", record):
            yield stds
    finally:
        for a, cap in zip(capped, caps):
            a.attn_logit_softcapping = cap
        model.config.final_logit_softcapping = final
        model.set_attn_implementation(attn)


def _scale_norm(w, f: float, plus_one: bool, index=slice(None)) -> None:
    if plus_one:
        w[index] = f * (1 + w[index]) - 1
    else:
        w[index] *= f


def _scale_qk(attn, f: float, plus_one: bool) -> None:
    """Scale one layer's queries and keys by f each (its scores by f squared)."""
    if hasattr(attn, "q_norm"):  # QK-norm undoes a scale of the projections
        _scale_norm(attn.q_norm.weight, f, plus_one)
        _scale_norm(attn.k_norm.weight, f, plus_one)
        return
    if hasattr(attn, "q_proj"):
        parts = [(attn.q_proj, slice(None)), (attn.k_proj, slice(None))]
    elif hasattr(attn, "qkv_proj"):  # Phi-3: q and k are the first rows
        cfg = attn.config
        parts = [(attn.qkv_proj, slice(0, (cfg.num_attention_heads + cfg.num_key_value_heads) * attn.head_dim))]
    else:  # GPT-2's c_attn: Conv1D [in, 3 * hidden], q and k the first two thirds of the columns
        attn.c_attn.weight[:, : 2 * attn.embed_dim] *= f
        attn.c_attn.bias[: 2 * attn.embed_dim] *= f
        return
    for linear, rows in parts:
        linear.weight[rows] *= f
        if linear.bias is not None:
            linear.bias[rows] *= f
