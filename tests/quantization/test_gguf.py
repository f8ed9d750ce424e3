"""GGUF import: metadata -> config, tensor names and the Q/K un-permutation, the rebuilt tokenizer,
errors; the SmolLM2 Q4_1 file against the checkpoint transformers dequantized from it."""
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import require_cxx, require_device, require_module

import deploycc
from deploycc.errors import DeployError
from deploycc.session import reference_session

gguf = require_module("gguf")
Q = gguf.GGMLQuantizationType

IDS = [3, 1, 4, 1, 5, 9, 2, 6]
CFG = dict(vocab_size=0, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, head_dim=16, rms_norm_eps=float(np.float32(1e-5)), rope_theta=10000.0,
           max_position_embeddings=256)


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def _vocab():
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + _bytes_to_unicode()
    merges = ["Ġ t", "h e", "Ġt he", "l l", "he ll", "hell o", "1 2"]
    for m in merges:
        tokens.append(m.replace(" ", ""))
    types = [3, 3, 3] + [1] * (len(tokens) - 3)
    return tokens, types, merges


def _permute(w, n_head):  # convert_hf_to_gguf's permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


D_SCALE = {"Q2_K": 5e-3, "Q3_K": 2e-3, "Q4_K": 2e-4, "Q5_K": 1e-4, "Q6_K": 2e-4, "IQ4_XS": 1e-4, "IQ4_NL": 2e-3}  # weights ~0.3


def random_blocks(qtype, rows: int, cols: int, rng) -> np.ndarray:
    """Random blocks of a format gguf cannot quantize to (K-quants, IQ4_NL, IQ4_XS): random bytes, with small finite f16
    values in its f16 fields (quantization/gguf_blocks.py LAYOUTS)."""
    from deploycc.quantization.gguf_blocks import LAYOUTS

    block, bb, fields = LAYOUTS[qtype]
    nb = cols // block
    raw = rng.integers(0, 256, (rows, nb, bb), dtype=np.uint8)
    for _, at, _, kind in fields:
        if kind == "f16":
            d = (rng.standard_normal((rows, nb, 1)) * D_SCALE[qtype]).astype(np.float16)
            raw[:, :, at:at + 2] = d.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, -1)


def _spm_vocab():
    """A SentencePiece-style vocabulary: <unk> <s> </s>, 256 byte tokens, scored pieces, no merges."""
    pieces = ["\u2581", "h", "e", "l", "o", "w", "r", "d", "1", "2", "\u2581h", "\u2581he", "ll", "llo", "\u2581hello",
              "\u2581w", "or", "\u2581wor", "\u2581world", "12", "\u2581t", "\u2581the", "t"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    return tokens, types, scores


def write_tiny(dirpath: Path, qtypes=None, arch="llama", tied=False, seed=0, pre="smollm", spm=False,
               vocab_multiple=1, **cfg) -> tuple[Path, Path]:
    """A random tiny Llama as a GGUF (tensors stored in `qtypes[gguf name]` or F32) and as an HF
    checkpoint whose weights are exactly what the GGUF holds (dequantized, un-permuted). `vocab_multiple`: reserved
    control tokens appended until the vocabulary is a multiple of it (real ones are multiples of 16 or more)."""
    from safetensors.numpy import save_file

    qtypes = qtypes or {}
    if spm:
        tokens, types, scores = _spm_vocab()
    else:
        tokens, types, merges = _vocab()
    while len(tokens) % vocab_multiple:
        tokens.append(f"<|reserved_{len(tokens)}|>")
        types.append(3)
        if spm:
            scores.append(0.0)
    c = dict(CFG, vocab_size=len(tokens), **cfg)
    rng = np.random.default_rng(seed)
    h, i, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    tensors = {"token_embd.weight": (rng.standard_normal((len(tokens), h)), "model.embed_tokens.weight"),
               "output_norm.weight": (1 + 0.1 * rng.standard_normal(h), "model.norm.weight")}
    if not tied:
        tensors["output.weight"] = (rng.standard_normal((len(tokens), h)) * 0.2, "lm_head.weight")
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes = {"attn_q": ((nh * hd, h), "self_attn.q_proj"), "attn_k": ((nkv * hd, h), "self_attn.k_proj"),
                  "attn_v": ((nkv * hd, h), "self_attn.v_proj"), "attn_output": ((h, nh * hd), "self_attn.o_proj"),
                  "ffn_gate": ((i, h), "mlp.gate_proj"), "ffn_up": ((i, h), "mlp.up_proj"),
                  "ffn_down": ((h, i), "mlp.down_proj")}
        for g, (shape, hf) in shapes.items():
            tensors[f"blk.{n}.{g}.weight"] = (rng.standard_normal(shape) * 0.2, p + hf + ".weight")
        tensors[f"blk.{n}.attn_norm.weight"] = (1 + 0.1 * rng.standard_normal(h), p + "input_layernorm.weight")
        tensors[f"blk.{n}.ffn_norm.weight"] = (1 + 0.1 * rng.standard_normal(h), p + "post_attention_layernorm.weight")

    path = dirpath / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(h)
    w.add_feed_forward_length(i)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_dimension_count(hd)
    if spm:
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_pad_token_id(2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")
    state = {}
    for name, (arr, hf) in tensors.items():
        arr = arr.astype(np.float32)
        stored = arr
        if name.endswith("attn_q.weight"):
            stored = _permute(arr, nh)
        elif name.endswith("attn_k.weight"):
            stored = _permute(arr, nkv)
        qt = qtypes.get(name, Q.F32) if arr.ndim == 2 else Q.F32
        if qt == Q.F32:
            w.add_tensor(name, stored)
            state[hf] = arr
        elif qt == Q.F16:
            w.add_tensor(name, stored.astype(np.float16))
            state[hf] = arr.astype(np.float16).astype(np.float32)
        else:
            data = (random_blocks(qt.name, *stored.shape, rng) if qt.name in D_SCALE
                    else gguf.quants.quantize(stored, qt))
            w.add_tensor(name, data, raw_dtype=qt)
            back = gguf.quants.dequantize(data, qt).reshape(arr.shape)
            heads = nh if name.endswith("attn_q.weight") else nkv if name.endswith("attn_k.weight") else 0
            if heads:  # the inverse of _permute
                back = back.reshape(heads, hd // 2, 2, -1).swapaxes(1, 2).reshape(arr.shape)
            state[hf] = back
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    hfdir = dirpath / "hf"
    hfdir.mkdir(exist_ok=True)
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in state.items()}, str(hfdir / "model.safetensors"))
    (hfdir / "config.json").write_text(json.dumps(dict(c, architectures=["LlamaForCausalLM"], model_type="llama",
                                                       tie_word_embeddings=tied)))
    return path, hfdir


def logits(session):
    out = [session.prefill(IDS, all_logits=True)]
    out += [session.decode(t)[None] for t in (7, 8)]
    return np.concatenate(out)


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPLOYCC_HOME", str(tmp_path / "home"))


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_f32_matches_checkpoint(tmp_path, tied):
    path, hfdir = write_tiny(tmp_path, tied=tied)
    model = deploycc.load_model(str(path))
    ref = deploycc.load_model(str(hfdir))
    assert model.config == ref.config
    a, b = dict(model.params()), dict(ref.params())
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)  # Q/K permutation undone exactly
    np.testing.assert_allclose(logits(reference_session(model)), logits(reference_session(ref)), atol=1e-5, rtol=0)


def test_tiny_dequantized_types_match_checkpoint(tmp_path):
    types = {"token_embd.weight": Q.Q8_0, "output.weight": Q.F16, "blk.0.attn_q.weight": Q.Q4_0,
             "blk.0.attn_k.weight": Q.Q4_1, "blk.1.attn_q.weight": Q.Q8_0, "blk.1.ffn_up.weight": Q.Q4_1,
             "blk.1.ffn_down.weight": Q.Q4_0}
    path, hfdir = write_tiny(tmp_path, types)
    model, ref = deploycc.load_model(str(path)), deploycc.load_model(str(hfdir))
    a, b = dict(model.params()), dict(ref.params())
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    np.testing.assert_allclose(logits(reference_session(model)), logits(reference_session(ref)), atol=1e-5, rtol=0)


def test_tiny_tokenizer(tmp_path):
    from tokenizers import Tokenizer

    path, _ = write_tiny(tmp_path)
    model = deploycc.load_model(str(path))
    assert model.path.parent.name == "gguf-tokenizers" and model.path.parent.parent == tmp_path / "home"
    tok = Tokenizer.from_file(str(model.path / "tokenizer.json"))
    vocab = tok.get_vocab()
    ids = tok.encode("hello the 123<|im_end|>").ids
    assert ids[0] == vocab["hello"] and vocab["Ġthe"] in ids and ids[-1] == 2
    assert vocab["12"] not in ids  # smollm splits digits one by one before BPE
    cfg = json.loads((model.path / "tokenizer_config.json").read_text())
    assert cfg["bos_token"] == "<|im_start|>" and cfg["eos_token"] == "<|im_end|>" and "chat_template" in cfg
    assert deploycc.load_model(str(path)).path == model.path  # cached by header hash


def test_plain_gpt2_pretokenizer(tmp_path):
    from tokenizers import Tokenizer

    path, _ = write_tiny(tmp_path, pre="gpt2")
    tok = Tokenizer.from_file(str(deploycc.load_model(str(path)).path / "tokenizer.json"))
    assert tok.get_vocab()["12"] in tok.encode("123").ids


def test_unsupported_architecture(tmp_path):
    path, _ = write_tiny(tmp_path, arch="falcon")
    with pytest.raises(DeployError, match="architecture 'falcon' is not supported") as e:
        deploycc.load_model(str(path))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("keep", [0.5, 0.999, 20])
def test_truncated_gguf(tmp_path, keep):
    path, _ = write_tiny(tmp_path)
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep) if keep < 1 else keep])
    with pytest.raises(DeployError) as e:
        deploycc.load_model(str(cut))
    assert "\n" not in str(e.value) and "cut.gguf" in str(e.value)


# ---- SmolLM2-135M-Instruct (Q4_1 layers, Q8_0 embedding) ----------------------------------------

@pytest.fixture(scope="module")
def smollm2_gguf(smollm2_path):
    home = Path(smollm2_path).parents[1]
    return home / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_smollm2_gguf_logits_match_checkpoint(smollm2_gguf, smollm2_path):
    model = deploycc.load_model(str(smollm2_gguf))
    ref = deploycc.load_model(smollm2_path)
    assert model.config == ref.config
    ids = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 2]
    got = reference_session(model).prefill(ids, all_logits=True)
    want = reference_session(ref).prefill(ids, all_logits=True)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_smollm2_gguf_tokenizer_matches_checkpoint(smollm2_gguf, smollm2_path):
    from transformers import AutoTokenizer

    ours = AutoTokenizer.from_pretrained(str(deploycc.load_model(str(smollm2_gguf)).path))
    theirs = AutoTokenizer.from_pretrained(smollm2_path)
    for text in ["Hello, world!", "In 2024 there were 365 days; π≈3.14159.", "  spaces\tand\nnewlines  ",
                 "<|im_start|>user\nhi<|im_end|>", "naïve café Ünïcödé 日本語"]:
        assert ours.encode(text) == theirs.encode(text), text
    msgs = [{"role": "user", "content": "What is 12*12?"}]
    a = ours.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    b = theirs.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    ids = [list(np.ravel(x["input_ids"] if hasattr(x, "keys") else x)) for x in (a, b)]
    assert ids[0] == ids[1] and len(ids[0]) > 10
    assert ours.eos_token == theirs.eos_token and ours.bos_token == theirs.bos_token


# ---- block formats kept as stored ---------------------------------------------------------------

BLOCK_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]


# (bit-exact dequantization of every format against gguf-py: test_gguf_formats.py)


MIXED = {"token_embd.weight": Q.Q8_0, "output.weight": Q.Q4_0, "blk.0.attn_q.weight": Q.Q4_0,
         "blk.0.attn_k.weight": Q.Q4_1, "blk.0.attn_v.weight": Q.Q8_0, "blk.0.attn_output.weight": Q.Q4_1,
         "blk.0.ffn_gate.weight": Q.Q4_1, "blk.0.ffn_up.weight": Q.Q8_0, "blk.0.ffn_down.weight": Q.Q4_0,
         "blk.1.attn_q.weight": Q.Q8_0, "blk.1.attn_k.weight": Q.Q4_0, "blk.1.attn_v.weight": Q.F16,
         "blk.1.ffn_up.weight": Q.Q4_1, "blk.1.ffn_down.weight": Q.Q4_1}


@pytest.mark.parametrize("stage", ["exported", "fused"])
@pytest.mark.parametrize("tied", [False, True])
def test_kept_blocks_logits_equal_dequantized(tmp_path, tied, stage):
    from deploycc.quantization import quantize

    path, hfdir = write_tiny(tmp_path, MIXED, tied=tied)
    model = deploycc.load_model(str(path))
    kept = quantize(model, "gguf")
    names = kept.quantized_names()
    assert len(names) == sum(1 for k, v in MIXED.items() if not (tied and k == "output.weight"))
    assert names["model.layers.1.self_attn.v_proj.weight"].name == "q0f16"  # F16 kept as halves
    dtypes = {n: a.dtype for n, a in kept.params()}
    assert dtypes["model.layers.0.self_attn.q_proj.q_weight"] == np.uint32
    assert "model.layers.0.self_attn.q_proj.weight" not in dtypes
    assert dtypes["model.layers.1.self_attn.v_proj.q_weight"] == np.float16
    got = logits(reference_session(model, quantization="gguf"))
    want = logits(reference_session(deploycc.load_model(str(hfdir))))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kquants", [False, True])
def test_kept_blocks_fuse_into_consumers(tmp_path, kquants):
    from deploycc import presets
    from deploycc.export import export
    from deploycc.pipeline import kernel_report
    from deploycc.quantization import quantize

    if kquants:
        path, _ = write_tiny(tmp_path, K_MIXED, hidden_size=256, intermediate_size=256, head_dim=64)
    else:
        path, _ = write_tiny(tmp_path, MIXED)
    report = kernel_report(export(quantize(deploycc.load_model(str(path)), "gguf"), 64),
                           presets.load("cpu-opencl").target)
    assert not [k for k in report["kernels"] if k["program"].startswith("dequantize")]
    fused = [k["program"] for k in report["kernels"]]
    assert any("dequantize_gguf_q4" in p for p in fused) and any("dequantize_gguf_q8" in p for p in fused)
    if kquants:
        assert any("dequantize_gguf_q6" in p for p in fused) and "take_gguf_q6_k" in fused
    else:
        assert "take_gguf_q8_0" in fused  # the Q8_0 embedding is read packed by the lookup


def test_gguf_quantization_needs_a_gguf(tmp_path):
    from deploycc.quantization import quantize

    _, hfdir = write_tiny(tmp_path)
    with pytest.raises(DeployError, match="not loaded from a .gguf"):
        quantize(deploycc.load_model(str(hfdir)), "gguf")


def test_smollm2_gguf_kept_blocks(smollm2_gguf, smollm2_path):
    from deploycc.quantization import quantize

    model = deploycc.load_model(str(smollm2_gguf))
    kept = quantize(model, "gguf")
    schemes = {s.qtype for s in kept.quantized_names().values()}
    assert schemes == {"Q4_1", "Q8_0"}
    ids = [1, 9690, 198, 2683, 359, 253, 5356, 2]
    got = reference_session(model, quantization="gguf").prefill(ids, all_logits=True)
    want = reference_session(deploycc.load_model(smollm2_path)).prefill(ids, all_logits=True)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("preset", ["cpu-opencl", "cpu-webgpu"])
@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_block_dequantize_kernel_on_device(preset, qtype):
    from deploycc import presets
    from deploycc.kernel_runner import KernelRunner
    from deploycc.quantization import BLOCK_SCHEMES
    from deploycc.quantization.gguf_blocks import LAYOUTS
    from deploycc.schedule import schedule_program

    target = presets.load(preset).target
    device = require_device(target.kind, f16=target.kind == "webgpu")
    scheme = BLOCK_SCHEMES[qtype]
    cols = 512 if LAYOUTS.get(qtype, (32,))[0] == 256 else 64
    rng = np.random.default_rng(2)
    w = rng.standard_normal((6, cols)).astype(np.float32)
    raw = random_blocks(qtype, 6, cols, rng) if qtype in D_SCALE else gguf.quants.quantize(w, Q[qtype])
    want = gguf.quants.dequantize(raw, Q[qtype]).reshape(6, cols)
    arrays = [*scheme.from_blocks(raw).values(), np.zeros((6, cols), np.float32)]
    KernelRunner(device, target)(schedule_program(scheme.program(6, cols), target), arrays, [])
    np.testing.assert_allclose(arrays[-1], want, atol=1e-6, rtol=1e-6)


K_MIXED = {"token_embd.weight": Q.Q6_K, "output.weight": Q.Q6_K, "blk.0.attn_q.weight": Q.Q4_K,
           "blk.0.attn_k.weight": Q.Q4_K, "blk.0.attn_v.weight": Q.Q6_K, "blk.0.attn_output.weight": Q.Q4_K,
           "blk.0.ffn_gate.weight": Q.Q4_K, "blk.0.ffn_up.weight": Q.Q4_K, "blk.0.ffn_down.weight": Q.Q6_K,
           "blk.1.attn_q.weight": Q.Q4_K, "blk.1.ffn_up.weight": Q.Q4_0, "blk.1.ffn_down.weight": Q.Q8_0}


@pytest.mark.parametrize("stage", ["exported", "fused"])
def test_k_quants_kept_logits_equal_dequantized(tmp_path, stage):
    """A Q4_K_M-like mix (Q4_K layers, Q6_K embedding/head/some layers) on a model whose input
    dimensions are whole 256-value super-blocks."""
    from deploycc.quantization import quantize

    path, hfdir = write_tiny(tmp_path, K_MIXED, hidden_size=256, intermediate_size=256, head_dim=64)
    model = deploycc.load_model(str(path))
    kept = quantize(model, "gguf")
    assert {s.qtype for s in kept.quantized_names().values()} == {"Q4_K", "Q6_K", "Q4_0", "Q8_0"}
    got = logits(reference_session(model, stage=stage, quantization="gguf"))
    want = logits(reference_session(deploycc.load_model(str(hfdir)), stage=stage))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_llama3_pretokenizer_groups_digits(tmp_path):
    from tokenizers import Tokenizer

    path, _ = write_tiny(tmp_path, pre="llama-bpe")
    tok = Tokenizer.from_file(str(deploycc.load_model(str(path)).path / "tokenizer.json"))
    pieces = tok.pre_tokenizer.pre_tokenize_str("hello 12345 world")
    assert [p for p, _ in pieces] == ["hello", "Ġ", "123", "45", "Ġworld"]


def test_unknown_pretokenizer(tmp_path):
    path, _ = write_tiny(tmp_path, pre="no-such-pre")
    with pytest.raises(DeployError, match="pre-tokenizer 'no-such-pre' is not known"):
        deploycc.load_model(str(path))


def test_compile_gguf_package(tmp_path):
    """`compile_model` on a .gguf (dequantized, then quantized by the chosen scheme) writes the rebuilt
    tokenizer into the package, and the package's logits match the reference session."""
    from deploycc.package import compile_model
    from deploycc.runtime.engine import Engine

    require_device("opencl")
    path, _ = write_tiny(tmp_path, MIXED)
    out = compile_model(str(path), "cpu-opencl", quantization="q4f16_2", out=str(tmp_path / "pkg"))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (out / name).exists(), name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["architecture"] == "LlamaForCausalLM"
    engine = Engine.load(out)
    ref = reference_session(deploycc.load_model(str(path)), quantization="q4f16_2")
    np.testing.assert_allclose(logits(engine), logits(ref), atol=1e-4, rtol=0)


def test_sentencepiece_vocabulary_matches_transformers(tmp_path):
    """A SentencePiece-style ('llama') vocabulary: byte fallback, merges derived from scores, BOS
    added; ids equal those of transformers' own GGUF tokenizer loader."""
    transformers = require_module("transformers")
    path, _ = write_tiny(tmp_path, spm=True)
    ours = transformers.AutoTokenizer.from_pretrained(str(deploycc.load_model(str(path)).path))
    try:
        theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    except Exception as e:  # pragma: no cover - depends on the transformers version
        pytest.skip(f"transformers cannot read this GGUF tokenizer: {e}")
    for text in ["hello world", "hello the world 12", " hello  wor", "héllo wörld 2024!", "hello</s>"]:
        assert ours.encode(text) == theirs.encode(text), text
        decoded = [t.decode(t.encode(text), skip_special_tokens=True) for t in (ours, theirs)]
        assert decoded[0] == decoded[1], text
    ids = ours.encode("hello world")
    assert ids[0] == 1 and ours.convert_ids_to_tokens(ids[1:]) == ["\u2581hello", "\u2581wor", "l", "d"]
    assert ours.convert_ids_to_tokens(ours.encode("é")[2:]) == ["<0xC3>", "<0xA9>"]  # byte fallback


def compiled_mixed(tmp_path, preset: str, kquants: bool, overrides: tuple[str, ...] = ()) -> tuple[Path, Path, dict]:
    """(the .gguf, its package for `preset` with `overrides`, the manifest) of the K-quant mix or the other, kept as
    stored."""
    from deploycc.package import compile_model

    if kquants:  # K-quant super-blocks are 256 wide
        path, _ = write_tiny(tmp_path, K_MIXED, hidden_size=256, intermediate_size=256, head_dim=64)
    else:
        path, _ = write_tiny(tmp_path, MIXED)
    out = compile_model(str(path), preset, out=str(tmp_path / "pkg"), overrides=overrides)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["quantization"] == "gguf"
    return path, out, manifest


@pytest.mark.parametrize("preset", ["cpu-opencl", "cpu-webgpu"])
@pytest.mark.parametrize("kquants", [False, True])
def test_compile_gguf_keeps_blocks(tmp_path, preset, kquants):
    """A .gguf compiles with its quantized blocks kept by default (quantization "gguf"): the params
    hold the packed words, and the package's logits equal the kept-blocks reference."""
    from deploycc.runtime.engine import Engine

    require_device(preset.split("-")[1])
    path, out, manifest = compiled_mixed(tmp_path, preset, kquants)
    assert any(p["dtype"] == "uint32" for p in manifest["params"])
    engine = Engine.load(out)
    ref = reference_session(deploycc.load_model(str(path)), quantization="gguf")
    # atol 1e-4 + rtol 1e-4, as for every kernel (the K-quant model's logits reach |5|)
    np.testing.assert_allclose(logits(engine), logits(ref), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("preset,kquants", [("h100", True), ("rtx4090", False)])
def test_gguf_blocks_on_the_cuda_tensor_cores(tmp_path, monkeypatch, preset, kquants):
    """A GGUF of mixed formats compiled for a CUDA preset keeps its blocks, and its prefill linears multiply the
    blocks' codes on the tensor cores (schedule/mma.py codes_rule: Q4_K's and Q4_1's minimums, Q6_K's scales a 16,
    Q4_0's and Q8_0's scales a 32; the other mix's F16 weight as a half in three exact parts) under the CUDA emulation
    (shuffled thread order): 40 tokens' logits (past the few-row GEMV's 32 rows) and two decode steps within
    atol 1e-4 + rtol 1e-4 of the kept-blocks reference, as every kernel. With a float32 KV cache: a float16 one's
    keys near a tie between two halves round either way on the two sides (moved later positions by 1.3e-3)."""
    from deploycc.runtime.engine import Engine

    require_cxx()
    monkeypatch.setenv("DEPLOYCC_CUDA_EMULATE", "shuffle")
    path, out, manifest = compiled_mixed(tmp_path, preset, kquants, ("kv_cache=float32",))
    source = "".join((out / f).read_text() for f in {e["file"] for e in manifest["kernels"]["entries"].values()})
    assert "wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16" in source
    assert ("Bs_r" in source) == (not kquants)  # blk.1.attn_v is F16 in the other mix
    engine = Engine.load(out)
    ref = reference_session(deploycc.load_model(str(path)), quantization="gguf")
    ids = IDS * 5

    def run(session):
        return np.concatenate([session.prefill(ids, all_logits=True), *(session.decode(t)[None] for t in (7, 8))])
    np.testing.assert_allclose(run(engine), run(ref), atol=1e-4, rtol=1e-4)


@pytest.mark.model
def test_smollm2_gguf_package(smollm2_gguf, tmp_path):
    """SmolLM2's Q4_1/Q8_0 GGUF compiled as-is for cpu-opencl: logits on natural text within 5e-4 of
    the kept-blocks reference (fast-math kernels, 30 layers; observed ~1e-4), and it names Paris."""
    from deploycc.package import compile_model
    from deploycc.runtime.engine import Engine

    out = compile_model(str(smollm2_gguf), "cpu-opencl", out=str(tmp_path / "pkg"), context_window=256)
    engine = Engine.load(out)
    ids = engine.tokenizer.encode("The quick brown fox jumps over the lazy dog. In 2024, Paris hosted the Games.",
                                  add_special_tokens=False)
    ref = reference_session(deploycc.load_model(str(smollm2_gguf)), context_window=256, quantization="gguf")
    assert np.abs(engine.prefill(ids, all_logits=True) - ref.prefill(ids, all_logits=True)).max() <= 5e-4
    assert "Paris" in "".join(engine.generate("What is the capital of France?", max_tokens=12))


@pytest.mark.parametrize("interleave", [False, True])
def test_kept_blocks_move_into_group_schemes_exactly(tmp_path, interleave):
    """For the cpu target's integer kernels (groups=True) Q4_0/Q4_1/Q8_0 tensors become q4f16_1/q4f16_2/
    q8f16_0 (interleaved where asked and the shape allows): every weight dequantizes bit for bit to the
    value of the blocks kept as stored; F16 tensors stay halves."""
    from deploycc.quantization import quantize

    path, _ = write_tiny(tmp_path, MIXED)
    model = deploycc.load_model(str(path))
    kept, moved = quantize(model, "gguf"), quantize(model, "gguf", interleave=interleave, groups=True)
    a, b = kept.quantized_names(), moved.quantized_names()
    assert a.keys() == b.keys()
    assert {s.name for s in b.values()} >= ({"q4f16_1x16", "q4f16_2x16", "q8f16_0"} if interleave
                                            else {"q4f16_1", "q4f16_2", "q8f16_0"})
    pa, pb = dict(kept.params()), dict(moved.params())
    assert pa.keys() == pb.keys()
    for name, scheme in b.items():
        prefix = name[: -len(".weight")]
        if scheme.name == "q0f16":  # an F16 tensor: the same halves either way
            np.testing.assert_array_equal(pa[f"{prefix}.q_weight"], pb[f"{prefix}.q_weight"])
            continue
        cols = pa[f"{prefix}.q_scale"].shape[1] * 32
        want = a[name].dequantize({k: pa[f"{prefix}.{k}"] for k in a[name].param_shapes(1, cols)}, cols)
        got = scheme.dequantize({k: pb[f"{prefix}.{k}"] for k in scheme.param_shapes(16, cols)}, cols)
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_compile_gguf_for_the_cpu_target(tmp_path):
    """A .gguf compiled as stored for `cpu` runs the integer kernels on its blocks' exact values: the
    package's logits against the reference session of the kept blocks within 3% of the largest logit (8-bit
    activations; tests/kernels/test_qgemv.py holds each kernel to 1e-5 on identically rounded ones)."""
    from conftest import require_cc

    from deploycc.package import compile_model
    from deploycc.runtime import native
    from deploycc.runtime.engine import Engine

    require_cc()
    path, _ = write_tiny(tmp_path, MIXED)
    out = compile_model(str(path), "cpu", out=str(tmp_path / "pkg"))
    m = json.loads((out / "manifest.json").read_text())
    assert m["quantization"] == "gguf" and m["kernels"]["native"]["integer_activations"]
    assert m["kernels"]["native"]["activations"]
    # the interleaved layout where the CPU has AVX2 or AVX-512, whatever bits calibration chose
    wide = native.weight_interleave("native")
    assert m["kernels"]["native"]["weight_layout"] == ("interleaved16" if wide else "plain")
    got, want = logits(Engine.load(out)), logits(reference_session(deploycc.load_model(str(path)), quantization="gguf"))
    np.testing.assert_allclose(got, want, atol=3e-2 * float(np.abs(want).max()), rtol=0)


def test_k_quants_stay_kept_when_the_rest_moves(tmp_path):
    """A Q4_K_M-like mix for the cpu target (groups=True): Q4_K/Q6_K tensors stay in their own blocks (the
    integer kernels do not read them), Q4_0/Q8_0 move into group schemes; the module computes the same
    logits as with every tensor kept (1e-5: the same values, other programs)."""
    from deploycc.quantization import quantize
    from deploycc.session import ReferenceSession

    path, _ = write_tiny(tmp_path, K_MIXED, hidden_size=256, intermediate_size=256, head_dim=64)
    model = deploycc.load_model(str(path))
    moved = quantize(model, "gguf", interleave=True, groups=True)
    names = {getattr(s, "qtype", s.name) for s in moved.quantized_names().values()}
    assert names == {"Q4_K", "Q6_K", "q4f16_1x16", "q8f16_0x16"}, names
    got = logits(ReferenceSession(moved))
    want = logits(reference_session(model, quantization="gguf"))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
