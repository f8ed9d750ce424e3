"""Rotary frequencies and attention factors (models/_rope.py) against transformers' own
ROPE_INIT_FUNCTIONS, for every scaling type deploycc reads, over all of head_dim and a partial part;
and the transformers 4 spellings of the new architectures' configs (what the Hub's config.json files
hold) read as their transformers 5 spellings.

Tolerance: inverse frequencies within 1e-6 relative (float32 pow may differ by an ulp), attention
factors within 1e-9.
"""
import numpy as np
import pytest
import transformers as tf
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from deploycc.models import gemma3, gemma3_mm, phi3, qwen2
from deploycc.models._rope import rope_of

CASES = {
    "default": (tf.LlamaConfig, dict(rope_theta=10000.0), {}),
    "linear": (tf.LlamaConfig, dict(rope_scaling={"rope_type": "linear", "factor": 4.0}), {}),
    "llama3": (tf.LlamaConfig, dict(rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}), {}),
    "yarn": (tf.Qwen3Config, dict(rope_theta=1000000.0, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}), {}),
    "yarn-mscale": (tf.LlamaConfig, dict(rope_scaling={
        "rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
        "mscale_all_dim": 0.707, "beta_fast": 16, "beta_slow": 2}), {}),
    "yarn-attention-factor": (tf.LlamaConfig, dict(rope_scaling={
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048, "attention_factor": 1.3}), {}),
    "longrope-partial": (tf.Phi3Config, dict(partial_rotary_factor=0.75, original_max_position_embeddings=4096,
                                             max_position_embeddings=131072, rope_scaling={
        "type": "longrope", "short_factor": [1.0 + i / 10 for i in range(12)],
        "long_factor": [2.0 + i for i in range(12)]}), {}),
}


@pytest.mark.parametrize("context", [4096, 16384])
@pytest.mark.parametrize("case", sorted(CASES))
def test_frequencies_match_transformers(case, context):
    cls, kwargs, _ = CASES[case]
    cfg = cls(hidden_size=256, num_attention_heads=8, num_key_value_heads=8, vocab_size=64, head_dim=32,
              **{"max_position_embeddings": 131072, **kwargs})
    hf = cfg.to_dict()
    head_dim = 32
    rope = rope_of(hf, head_dim, hf["max_position_embeddings"])
    freq, factor = rope.frequencies(context)
    kind = cfg.rope_parameters.get("rope_type", "default")
    # transformers picks LongRoPE's factors per sequence length: the context window plays that part here
    want, want_factor = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu", seq_len=context) if kind != "default" else \
        (1.0 / (hf["rope_parameters"]["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim)), 1.0)
    want = np.asarray(want, np.float32)
    assert freq.dtype == np.float32 and freq.shape == want.shape
    np.testing.assert_allclose(freq, want, rtol=1e-6)
    assert factor == pytest.approx(float(want_factor), rel=1e-9)
    if case == "longrope-partial":  # the short factors up to the original length, the long ones beyond
        assert rope.dim == 24
        short, long = rope.frequencies(4096)[0], rope.frequencies(4097)[0]
        np.testing.assert_allclose(short / long, np.asarray(CASES[case][1]["rope_scaling"]["long_factor"]) /
                                   np.asarray(CASES[case][1]["rope_scaling"]["short_factor"]), rtol=1e-6)


def test_gemma3_transformers4_config_reads_as_transformers5():
    """The Hub's Gemma 3 config.json (transformers 4: rope_local_base_freq, rope_scaling, sliding_window_pattern)
    gives the rotations and windows of transformers 5's nested rope_parameters and layer_types."""
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=7, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=16, sliding_window=512, max_position_embeddings=32768,
                  architectures=["Gemma3ForCausalLM"], model_type="gemma3_text")
    old = gemma3.Config.from_hf(dict(common, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                                     rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window_pattern=6))
    new_hf = tf.Gemma3TextConfig(**{k: v for k, v in common.items() if k not in ("architectures", "model_type")},
                                 rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                                  "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                     "rope_theta": 1000000.0}}).to_dict()
    new = gemma3.Config.from_hf(new_hf)
    for cfg in (old, new):
        assert [cfg.window(i) for i in range(7)] == [512] * 5 + [0, 512]
        assert cfg.rope.theta == 1e6 and cfg.rope.scaling["factor"] == 8.0
        assert cfg.local_rope.theta == 1e4 and cfg.local_rope.scaling is None
        assert cfg.norms_plus_one and cfg.qk_norm and cfg.tie_word_embeddings


def test_phi35_transformers4_config():
    """Phi-3.5-mini's config.json: rope_scaling {"type": "longrope"} beside a top-level
    original_max_position_embeddings, and a sliding_window on every layer."""
    hf = dict(vocab_size=64, hidden_size=96, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=4, max_position_embeddings=131072, original_max_position_embeddings=4096,
              sliding_window=262144, rope_theta=10000.0,
              rope_scaling={"type": "longrope", "short_factor": [1.0] * 12, "long_factor": [2.0] * 12})
    cfg = phi3.Config.from_hf(hf)
    assert cfg.rope.scaling["rope_type"] == "longrope" and cfg.rope.scaling["original_max_position_embeddings"] == 4096
    freq, factor = cfg.rope.frequencies(cfg.context_window)
    assert cfg.context_window == 4096 and factor == pytest.approx((1 + np.log(32) / np.log(4096)) ** 0.5)
    assert cfg.window(0) == cfg.window(1) == 262144


def test_qwen25_window_only_when_used():
    """Qwen2.5's config.json names sliding_window 32768 with use_sliding_window false: global attention,
    as transformers reads it; with use_sliding_window, layers from max_window_layers on slide."""
    hf = dict(vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, sliding_window=32768, max_window_layers=2, use_sliding_window=False)
    assert [qwen2.Config.from_hf(hf).window(i) for i in range(4)] == [0, 0, 0, 0]
    assert [qwen2.Config.from_hf(dict(hf, use_sliding_window=True)).window(i) for i in range(4)] == [0, 0, 32768, 32768]


def test_gemma3_multimodal_text_config_defaults():
    """The Hub's Gemma 3 4B config.json gives text_config sparsely; what it omits are Gemma3TextConfig's defaults
    (gemma3_mm.TEXT_DEFAULTS), so deploycc reads the language model transformers builds."""
    sparse = {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
              "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}
    ours = gemma3_mm.Config.from_hf({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                                     "text_config": sparse})
    theirs = tf.Gemma3Config(text_config=dict(sparse)).text_config
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "query_pre_attn_scalar",
                "sliding_window"):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert [ours.window(i) > 0 for i in range(34)] == [t == "sliding_attention" for t in theirs.layer_types]
    params = theirs.rope_parameters
    assert ours.rope.theta == params["full_attention"]["rope_theta"] and ours.rope.scaling["factor"] == 8.0
    assert ours.local_rope.theta == params["sliding_attention"]["rope_theta"] and ours.local_rope.scaling is None
    assert ours.tie_word_embeddings
