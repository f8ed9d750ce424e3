"""The runtime tokenizer: round trips, streaming detokenization, chat templates, eos ids, errors.

Tokenizers are trained here with the `tokenizers` library (a byte-level BPE like GPT-2/SmolLM2, and a
SentencePiece-style BPE with byte fallback like Llama 2), so nothing depends on a downloaded model;
SmolLM2's tokenizer joins in where its checkpoint is already built.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import require_module
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from deploycc.runtime.tokenizer import StreamDecoder, Tokenizer, TokenizerError

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello, world!",
    "Crème brûlée, naïve café, façade, jalapeño, Ångström, Øresund, Zürich, señor.",
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.",
    "Emojis: 🙂 😀 🚀 👍🏽 🇫🇷 👨‍👩‍👧 ❤️ — and a hyphen - and an ellipsis …",
    "def add(a, b):\n    return a + b  # 12345 + 67890\n\n\tTabs and  double  spaces.",
] * 4
TEXTS = [
    "Hello, world! The fox is quick.",
    "Crème brûlée au café — naïve façade",
    "日本の首都は東京です。中国的首都是北京。",
    "I 😀 love 🚀 rockets 👍🏽 and 🇫🇷 flags 👨‍👩‍👧!",
    "  leading spaces, trailing space \n\nnew lines\tand tabs ",
    "Mixed: café 東京 🙂 42 ümlaut",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a tiny test model.<|im_end|>\\n' }}{% endif %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_byte_level(vocab_size: int = 420):
    tok = Backend(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def train_sentencepiece_style():
    """Llama-2-style: spaces become "▁" (one prepended), no pre-tokenizer, byte fallback for unseen characters."""
    tok = Backend(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
                                  limit_alphabet=60)  # rare characters (CJK, emoji) are left to byte fallback
    tok.train_from_iterator(CORPUS, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    tok = Backend.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return tok


def write_tiny_tokenizer(path: Path, kind: str = "bytelevel", chat_template: str | None = CHATML,
                         generation_eos=None) -> Path:
    """A tokenizer directory as transformers writes one: tokenizer.json + tokenizer_config.json (+ generation_config)."""
    path.mkdir(parents=True, exist_ok=True)
    if kind == "bytelevel":
        tok, config = train_byte_level(), {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                                           "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    else:
        tok, config = train_sentencepiece_style(), {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    tok.save(str(path / "tokenizer.json"))
    config.update(tokenizer_class="PreTrainedTokenizerFast", clean_up_tokenization_spaces=False)
    if chat_template is not None:
        config["chat_template"] = chat_template
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    if generation_eos is not None:
        (path / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos}))
    return path


@pytest.fixture(scope="module", params=["bytelevel", "sentencepiece", "smollm2"])
def tokenizer(request, tmp_path_factory):
    if request.param == "smollm2":
        return Tokenizer.from_dir(request.getfixturevalue("smollm2_path"))
    return Tokenizer.from_dir(write_tiny_tokenizer(tmp_path_factory.mktemp(request.param), request.param))


# ---- encode / decode --------------------------------------------------------------------------

@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids and all(isinstance(i, int) for i in ids)
    assert tokenizer.decode(ids) == text


@pytest.mark.parametrize("text", TEXTS)
def test_stream_decoder_equals_full_decode(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    stream = StreamDecoder(tokenizer)
    pieces = [stream.put(i) for i in ids]
    pieces.append(stream.flush())
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces), pieces


def test_streaming_is_needed(tokenizer):
    """The texts exercise both hazards: tokens holding part of a character, and (for SentencePiece) dropped spaces."""
    ids = [i for t in TEXTS for i in tokenizer.encode(t, add_special_tokens=False)]
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    naive = "".join(tokenizer.decode([i]) for i in ids)
    assert naive != tokenizer.decode(ids)


def test_stream_decoder_holds_back_partial_character(tmp_path):
    tok = Tokenizer.from_dir(write_tiny_tokenizer(tmp_path))
    ids = tok.encode("🚀", add_special_tokens=False)
    assert len(ids) > 1, "the rocket should span several byte-level tokens"
    stream = tok.stream_decoder()
    assert [stream.put(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert stream.put(ids[-1]) == "🚀"


def test_stream_decoder_skips_special_tokens(tmp_path):
    tok = Tokenizer.from_dir(write_tiny_tokenizer(tmp_path))
    ids = tok.encode("Hello<|im_end|> world", add_special_tokens=False)
    assert tok.token_to_id("<|im_end|>") in ids
    stream = tok.stream_decoder(skip_special_tokens=True)
    assert "".join(stream.put(i) for i in ids) + stream.flush() == "Hello world"


# ---- files, eos ids, errors --------------------------------------------------------------------

def test_eos_ids_from_generation_config_and_eos_token(tmp_path):
    tok = Tokenizer.from_dir(write_tiny_tokenizer(tmp_path, generation_eos=[0, 2]))
    assert tok.eos_token == "<|im_end|>" and tok.token_to_id("<|im_end|>") == 2
    assert tok.eos_token_ids == (0, 2)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}))
    assert Tokenizer.from_dir(tmp_path).eos_token_ids == (1, 2)


def test_special_tokens_map_fills_in(tmp_path):
    write_tiny_tokenizer(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del cfg["eos_token"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False}}))
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_ids == (0,)


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(TokenizerError, match="has no tokenizer.json") as e:
        Tokenizer.from_dir(tmp_path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("content", ["{not json", '{"model": {"type": "BPE", "vocab": 3}}', ""])
def test_bad_tokenizer_json(tmp_path, content):
    (tmp_path / "tokenizer.json").write_text(content)
    with pytest.raises(TokenizerError, match="could not be loaded") as e:
        Tokenizer.from_dir(tmp_path)
    assert "\n" not in str(e.value) and str(tmp_path) in str(e.value)


def test_bad_tokenizer_config(tmp_path):
    write_tiny_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{")
    with pytest.raises(TokenizerError, match="tokenizer_config.json is not valid JSON"):
        Tokenizer.from_dir(tmp_path)


# ---- chat templates ---------------------------------------------------------------------------

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 🙂"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Crème brûlée <b>&</b>?"}],
]
FANCY = (  # the helpers and filters transformers gives templates
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'tool' %}{% continue %}{% endif %}"
    "[{{ m.role | upper }}] {{ m | tojson }} {{ m.content | tojson(indent=2) }}\n"
    "{% generation %}{{ m.content | length }}{% endgeneration %}\n"
    "{% endfor %}{% if add_generation_prompt %}{{ eos_token }}{% endif %}"
)


def hf_tokenizer(path):
    transformers = require_module("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.mark.parametrize("template", [CHATML, FANCY], ids=["chatml", "fancy"])
@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=["one", "multi"])
@pytest.mark.parametrize("gen", [True, False])
def test_chat_template_matches_transformers(tmp_path, template, conversation, gen):
    path = write_tiny_tokenizer(tmp_path, chat_template=template)
    ours = Tokenizer.from_dir(path).apply_chat_template(conversation, add_generation_prompt=gen)
    theirs = hf_tokenizer(path).apply_chat_template(conversation, add_generation_prompt=gen, tokenize=False)
    assert ours == theirs


def test_named_templates_and_jinja_file(tmp_path):
    path = write_tiny_tokenizer(tmp_path, chat_template=[{"name": "tool_use", "template": "TOOLS"},
                                                         {"name": "default", "template": CHATML}])
    msgs = CONVERSATIONS[0]
    expected = ("<|im_start|>system\nYou are a tiny test model.<|im_end|>\n"
                "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    assert Tokenizer.from_dir(path).apply_chat_template(msgs) == expected
    write_tiny_tokenizer(tmp_path, chat_template=None)  # transformers >= 4.43 writes chat_template.jinja
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    assert Tokenizer.from_dir(tmp_path).apply_chat_template(msgs) == expected


def test_strftime_now(tmp_path):
    import datetime

    path = write_tiny_tokenizer(tmp_path, chat_template="{{ strftime_now('%Y') }}")
    assert Tokenizer.from_dir(path).apply_chat_template([]) == str(datetime.date.today().year)


def test_no_chat_template(tmp_path):
    tok = Tokenizer.from_dir(write_tiny_tokenizer(tmp_path, chat_template=None))
    assert tok.chat_template is None
    with pytest.raises(ValueError, match="has no chat template") as e:
        tok.apply_chat_template(CONVERSATIONS[0])
    assert "\n" not in str(e.value)


def test_template_raise_exception(tmp_path):
    tok = Tokenizer.from_dir(write_tiny_tokenizer(tmp_path))
    with pytest.raises(TokenizerError, match="chat template error: unknown role robot"):
        tok.apply_chat_template([{"role": "robot", "content": "beep"}])


@pytest.mark.parametrize("template", [
    "{{ messages.append({'role': 'x'}) }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
])
def test_template_is_sandboxed(tmp_path, template):
    tok = Tokenizer.from_dir(write_tiny_tokenizer(tmp_path, chat_template=template))
    with pytest.raises(TokenizerError, match="chat template error"):
        tok.apply_chat_template(CONVERSATIONS[0])


def test_template_syntax_error(tmp_path):
    tok = Tokenizer.from_dir(write_tiny_tokenizer(tmp_path, chat_template="{% for m in messages %}"))
    with pytest.raises(TokenizerError, match="does not parse"):
        tok.apply_chat_template(CONVERSATIONS[0])
