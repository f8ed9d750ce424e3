"""Fuzz the tokenizer loader and the chat-template sandbox.

Tokenizer files: a real tiny tokenizer directory (byte-level BPE with a post-processor, normalizer and
decoder; tokenizer_config.json with a ChatML template; generation_config.json; special_tokens_map.json)
whose JSON is mutated at random paths (values replaced by odd JSON: huge and negative ints, wrong types,
other component names; keys deleted; lists emptied), or with a token id moved to around the model's
vocab_size, or whose bytes are cut or overwritten; then loaded with the model's vocab_size, used to
encode, decode, stream-decode and render its template.

Chat templates: random jinja built from a grammar of loops (nested, over ranges, strings, messages),
conditionals, `set` (namespaces, blocks), macros (recursive), filters (center, indent, replace, join,
tojson, format, wordwrap, batch, ...), str methods, string operators (* + ~ ** %), undefined names,
raise_exception, include/extends, rendered under small limits (so that a runaway case is cheap); and the
shapes of runaway work alone (repetition, doubling, nested ranges, exponential macros, amplifying
filters) under the default limits.

Cases run in a long-lived worker process (tokenizer_worker.py; the tokenizers library is native code)
with a timeout, so a crash or a hang is a test failure. Each case must end in success or a TokenizerError,
within its time limit (plus slack for the last bounded operation) and with the worker's peak RSS during
the case under 1.5 GB. The outcome counts are printed (pytest -s).
"""
from __future__ import annotations

import copy
import json
import os
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deploycc.runtime.chat_template import TemplateLimits
from fuzz.worker import Worker

WORKER = Path(__file__).with_name("tokenizer_worker.py")
CASES = {"files": int(os.environ.get("FUZZ_TOK_FILES", 800)), "templates": int(os.environ.get("FUZZ_TEMPLATES", 900)),
         "default_limits": int(os.environ.get("FUZZ_TEMPLATES_DEFAULT", 80))}
SMALL = TemplateLimits(max_output=20_000, max_seconds=0.5, max_steps=20_000, max_range=300, max_work=400_000)
RSS_LIMIT = 1_500_000_000
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CORPUS = ["What is the capital of France? Paris is the capital of France.\n",
          "Hello, world! The quick brown fox jumps over the lazy dog. Crème brûlée 🙂\n"] * 8
SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=False,
                suppress_health_check=list(HealthCheck))


# ---- the worker --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def worker():
    w = Worker(WORKER)
    yield w
    w.stop()


def check(answer: dict, case, counts: Counter, max_seconds: float) -> None:
    counts[answer["kind"] if answer["kind"] != "error" else "TokenizerError"] += 1
    assert answer["kind"] in ("ok", "error"), (answer, case)
    assert answer["seconds"] <= max_seconds, (f"took {answer['seconds']:.1f} s", case)
    assert answer["peak_rss"] is None or answer["peak_rss"] < RSS_LIMIT, (f"peak RSS {answer['peak_rss']}", case)


# ---- tokenizer files ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> tuple[Path, int]:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    path = tmp_path_factory.mktemp("fuzz-tokenizer")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<|im_start|> $A", special_tokens=[("<|im_start|>", 1)])
    tok.save(str(path / "tokenizer.json"))
    files = {"tokenizer_config.json": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": CHATML,
                                       "tokenizer_class": "PreTrainedTokenizerFast"},
             "generation_config.json": {"eos_token_id": [2, 0]},
             "special_tokens_map.json": {"unk_token": {"content": "<|endoftext|>", "lstrip": False}}}
    for name, data in files.items():
        (path / name).write_text(json.dumps(data))
    return path, tok.get_vocab_size()


ODD = st.one_of(st.integers(-3, 400), st.sampled_from([2**31, 2**32, 2**63, -2**63, 10**12, 10**30]), st.floats(),
                st.text(max_size=10), st.none(), st.booleans(), st.just([]), st.just({}),
                st.sampled_from(["BPE", "WordPiece", "Unigram", "WordLevel", "ByteLevel", "Sequence", "Metaspace",
                                 "TemplateProcessing", "BertProcessing", "Fixed", "BatchLongest", "NFKC", "Replace",
                                 "Split", "Strip", "<|im_end|>", "$A", "$B:1", "{{ x }}", "{% for %}"]),
                st.lists(st.integers(-2, 400), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))


@st.composite
def json_mutation(draw, doc):
    """`doc` with 1-3 edits at random paths: a value replaced, a key deleted or added, a list cut."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        parent, key = None, None
        node = doc
        while isinstance(node, (dict, list)) and node and (parent is None or draw(st.integers(0, 3)) > 0):
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            parent, key = node, draw(st.sampled_from(keys))
            node = node[key]
        op = draw(st.sampled_from(["replace", "replace", "delete", "add", "cut"]))
        if parent is None:
            doc = draw(ODD) if op == "replace" else doc
        elif op == "replace":
            parent[key] = draw(ODD)
        elif op == "delete" and isinstance(parent, dict):
            del parent[key]
        elif op == "add" and isinstance(node, dict):
            node[draw(st.sampled_from(["type", "vocab", "merges", "id", "ids", "special", "content", "padding",
                                       "truncation", "chat_template", "eos_token_id", "added_tokens", "x"]))] = draw(ODD)
        elif op == "cut" and isinstance(node, list):
            del node[draw(st.integers(0, len(node))):]
    return doc


def _id_slots(node, path=()):
    """Paths of the token ids in a tokenizer.json: vocabulary values, added tokens' ids, post-processor ids."""
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(v, int) and not isinstance(v, bool) and (k == "id" or "vocab" in path):
                yield (*path, k)
            else:
                yield from _id_slots(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            if isinstance(v, int) and not isinstance(v, bool) and path and path[-1] == "ids":
                yield (*path, i)
            else:
                yield from _id_slots(v, (*path, i))


@st.composite
def renumbered(draw, doc, vocab: int):
    """`doc` with one token id moved to around the model's vocabulary size (just inside or past it)."""
    doc = copy.deepcopy(doc)
    path = draw(st.sampled_from(sorted(_id_slots(doc), key=str)))
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = draw(st.sampled_from([vocab - 1, vocab, vocab + 1, vocab + 7, 2**31 - 1, 2**32 + 1]))
    return doc


@st.composite
def damaged_files(draw, base: dict[str, bytes], vocab: int):
    """The directory's files with one of them mutated as JSON (mostly) or as bytes."""
    name = draw(st.sampled_from(["tokenizer.json"] * 4 + ["tokenizer_config.json"] * 2 +
                                ["generation_config.json", "special_tokens_map.json", "chat_template.jinja"]))
    files = dict(base)
    original = files.get(name, b"")
    if name == "tokenizer.json" and draw(st.integers(0, 5)) == 0:
        files[name] = json.dumps(draw(renumbered(json.loads(original), vocab))).encode()
    elif name != "chat_template.jinja" and draw(st.integers(0, 4)) > 0:
        files[name] = json.dumps(draw(json_mutation(json.loads(original)))).encode()
    else:
        cut = draw(st.integers(0, len(original)))
        garbage = draw(st.binary(max_size=8))
        files[name] = original[:cut] + garbage + original[cut + len(garbage):] if draw(st.booleans()) else original[:cut]
    return files


def test_fuzz_tokenizer_files(tokenizer_dir, worker, tmp_path):
    path, vocab = tokenizer_dir
    base = {p.name: p.read_bytes() for p in path.iterdir()}
    counts: Counter = Counter()
    case_dir = tmp_path / "case"

    @settings(max_examples=CASES["files"], **SETTINGS)
    @given(damaged_files(base, vocab))
    def one(files):
        case_dir.mkdir(exist_ok=True)
        for p in case_dir.iterdir():
            p.unlink()
        for name, data in files.items():
            (case_dir / name).write_bytes(data)
        case = {"files": str(case_dir), "vocab_size": vocab}
        check(worker.ask(json.dumps(case), 60), {n: d[:300] for n, d in files.items() if d != base.get(n)}, counts, 20)

    one()
    print(f"\ntokenizer files: {sum(counts.values())} cases: {dict(counts)}")
    assert counts["ok"] and counts["TokenizerError"], counts  # the fuzz reached both outcomes


# ---- chat templates -------------------------------------------------------------------------------------------

NUMS = st.sampled_from(["0", "1", "2", "3", "7", "10", "100", "1000", "99999", "1000000", "400000000", "2147483648",
                        "-1", "-5", "1.5"])
STRINGS = st.sampled_from(["'a'", "'ab'", "''", "'x y z'", "'%s'", "'%d'", "'{}'", "'{:>9}'", "'%999999999s'",
                           "'{:>999999999}'", "'\\n'", "'\\t'", "'<|im_end|>'", "'🙂'", "'a\\tb'"])
NAMES = st.sampled_from(["messages", "messages[0]", "messages[0]['content']", "messages[-1].role", "m", "m.content",
                         "x", "ns.s", "ns.l", "undefined_thing", "undefined_thing.attr", "loop.index", "loop.length",
                         "bos_token", "eos_token", "add_generation_prompt", "tools", "[1, 2, 3]", "['a', 'b']",
                         "{'k': 'v'}", "none", "true", "''.__class__", "messages.append"])
BINOPS = ["*", "*", "+", "+", "~", "~", "**", "%", "-", "//", "==", "and", "or", "in"]
FILTERS = ["length", "upper", "trim", "first", "last", "list", "string", "tojson", "tojson(indent={n})", "center({n})",
           "indent({n})", "replace('a', {e})", "replace({e}, {e})", "join({e})", "join", "format({e})", "wordwrap({n})",
           "batch({n})", "slice({n})", "sort", "unique", "reverse", "sum", "default({e})", "int", "float", "round",
           "urlize", "escape", "pprint", "truncate({n})", "map('upper')", "select", "items", "dictsort", "abs",
           "count", "wordcount", "title", "striptags", "attr('x')", "selectattr('role')", "min", "max", "indent({e})"]
METHODS = [".center({n})", ".ljust({n})", ".zfill({n})", ".replace({e}, {e})", ".join({e})", ".format({e})",
           ".format({e}, {e})", ".split()", ".upper()", ".strip()", ".expandtabs({n})", ".count('a')", ".items()",
           ".get('k')", ".splitlines()", ".translate({e})"]
CALLS = ["range({n})", "range({n}, {n})", "range({n}, {n}, {n})", "lipsum({n})", "lipsum({n}, min={n}, max={n})",
         "raise_exception({e})", "strftime_now({e})", "cycler({e}, {e}).next()", "joiner({e})()", "dict(a={e})",
         "namespace(x={e})", "m2({e})", "caller()"]


def _fill(pattern: str, n: str, e: str) -> str:
    return pattern.format(n=n, e=e)


LEAF = st.one_of(NUMS, STRINGS, NAMES)
SIZES = st.sampled_from(["3", "10", "50", "100", "250", "300", "1000", "20000", "1000000"])
RUNAWAY = st.one_of(  # the shapes of work a template can multiply: each must stop at a limit
    st.builds("{{{{ {} * {} }}}}".format, STRINGS, SIZES),
    SIZES.map("{{% for i in range({}) %}}{{% set ns.s = ns.s ~ ns.s %}}{{% endfor %}}{{{{ ns.s | length }}}}".format),
    SIZES.map("{{% for i in range({}) %}}{{% set ns.l = ns.l + ns.l + [i] %}}{{% endfor %}}{{{{ ns.l | length }}}}".format),
    st.builds("{{% for i in range({}) %}}{{% for j in range({}) %}}{{% for k in range({}) %}}{{{{ k }}}}{{% endfor %}}"
              "{{% endfor %}}{{% endfor %}}".format, SIZES, SIZES, SIZES),
    st.builds("{{% for i in range({}) %}}{{{{ messages[-1]['content'] * {} }}}}{{% endfor %}}".format, SIZES, SIZES),
    st.builds("{{% set x %}}{{% for i in range({}) %}}{{{{ 'y' * {} }}}}{{% endfor %}}{{% endset %}}".format, SIZES, SIZES),
    SIZES.map("{{% macro r(n) %}}{{% if n > 0 %}}{{{{ r(n - 1) }}}}{{{{ r(n - 1) }}}}{{% endif %}}{{% endmacro %}}"
              "{{{{ r({}) }}}}".format),
    st.builds("{{{{ ({} * {}) | {} }}}}".format, STRINGS, SIZES,
              st.sampled_from(["tojson(indent=1000)", "list | tojson", "replace('a', 'aaaa')", "indent(1000)",
                               "wordwrap(1, wrapstring='xxxx')", "center(1000000)", "format(1, 2)", "urlize"])),
)
EXPR = st.recursive(LEAF, lambda inner: st.one_of(
    st.builds("({} {} {})".format, inner, st.sampled_from(BINOPS), inner),
    st.builds(lambda x, f, n, e: f"({x} | {_fill(f, n, e)})", inner, st.sampled_from(FILTERS), NUMS, inner),
    st.builds(lambda x, m, n, e: f"({x}){_fill(m, n, e)}", inner, st.sampled_from(METHODS), NUMS, inner),
    st.builds(_fill, st.sampled_from(CALLS), NUMS, inner),
    st.builds("[{}, {}]".format, inner, inner),
    st.builds("({} if {} else {})".format, inner, inner, inner),
), max_leaves=6)
SIMPLE = st.one_of(
    EXPR.map("{{{{ {} }}}}".format),
    RUNAWAY,
    st.sampled_from(["text ", "<|im_start|>", "\n", "{{ x }}", "{{ m2(1) }}"]),
    st.builds("{{% set {} = {} %}}".format, st.sampled_from(["x", "ns.s", "ns.l"]), EXPR),
    EXPR.map("{{% set ns.s = ns.s ~ {} %}}".format),
    EXPR.map("{{% set ns.l = ns.l + [{}] %}}".format),
    st.sampled_from(["{% include 'x' %}", "{% extends 'base' %}", "{% import 'x' as y %}", "{{ raise_exception('nope') }}",
                     "{% for x in messages recursive %}{{ loop(x) }}{% endfor %}", "{% macro %}", "{{ ", "{% endfor %}",
                     "{% break %}"]),
)


def _for(target: str, iterable: str, inner: str, other: str | None) -> str:
    tail = f"{{% else %}}{other}" if other is not None else ""
    control = "{% if loop.index > 3 %}{% break %}{% endif %}" if target == "i" else ""
    return f"{{% for {target} in {iterable} %}}{control}{inner}{tail}{{% endfor %}}"


BODY = st.recursive(SIMPLE, lambda inner: st.one_of(
    st.builds("".join, st.lists(inner, min_size=2, max_size=3)),
    st.builds(_for, st.sampled_from(["x", "m", "i", "a, b"]), EXPR, inner, st.none() | inner),
    st.builds("{{% for x in range({}) %}}{{% for y in range({}) %}}{}{{% endfor %}}{{% endfor %}}".format,
              SIZES, SIZES, inner),
    st.builds("{{% if {} %}}{}{{% elif {} %}}{}{{% else %}}{}{{% endif %}}".format, EXPR, inner, EXPR, inner, inner),
    inner.map("{{% set x %}}{}{{% endset %}}".format),
    st.builds("{{% filter {} %}}{}{{% endfilter %}}".format,
              st.sampled_from(["upper", "trim", "center(80)", "indent(4)"]), inner),
    inner.map("{{% generation %}}{}{{% endgeneration %}}".format),
    st.builds("{{% call m2({}) %}}{}{{% endcall %}}".format, EXPR, inner),
), max_leaves=8)
TEMPLATES = st.builds("{{% set ns = namespace(s='ab', l=[]) %}}{{% macro m2(a) %}}{}{{% endmacro %}}{}".format,
                      BODY, BODY)  # the macro may call m2 itself: recursion


def fuzz_templates(worker, tokenizer_dir, limits: TemplateLimits, examples: int, name: str, templates=TEMPLATES) -> None:
    path, _ = tokenizer_dir
    counts: Counter = Counter()
    fields = {k: getattr(limits, k) for k in ("max_output", "max_seconds", "max_steps", "max_range", "max_work")}

    @settings(max_examples=examples, **SETTINGS)
    @given(templates)
    def one(source):
        case = {"template": source, "limits": fields, "tokenizer": str(path)}
        check(worker.ask(json.dumps(case), limits.max_seconds + 30), source, counts, limits.max_seconds + 3)

    one()
    print(f"\n{name}: {sum(counts.values())} cases: {dict(counts)}")
    assert counts["ok"] and counts["TokenizerError"], counts


def test_fuzz_chat_templates(worker, tokenizer_dir):
    fuzz_templates(worker, tokenizer_dir, SMALL, CASES["templates"], "chat templates (small limits)")


def test_fuzz_runaway_templates_default_limits(worker, tokenizer_dir):
    """The shapes of runaway work, sized up to a million, stop at the default limits too (within their 5 s)."""
    fuzz_templates(worker, tokenizer_dir, TemplateLimits(), CASES["default_limits"], "runaway templates (default limits)",
                   RUNAWAY)
