"""The loader fuzzers themselves, run by test_fuzz_loaders.py in a subprocess: `python loader_worker.py LOADER`.

A subprocess because the bounds are process-wide: after the imports and a warm-up case its address space
is limited (RLIMIT_AS) to what it holds plus HEADROOM, so a case that allocates more fails with
MemoryError, which the fuzzer reports as a bug like any other exception that is not the project's own
error; every case also runs under a wall-clock alarm. It prints one line `FUZZ {json}` with the number of
cases (loaded, refused) per strategy and exits non-zero with hypothesis's falsifying example otherwise.

Loaders: `safetensors` (runtime/safetensors_io.py and deploycc/hub.py's reader, then load_model on a
checkpoint holding the file), `gguf` (deploycc/gguf.py: byte mutations of a valid tiny GGUF and structured
ones of its fields, then every tensor read and the compile limits), `config` (random JSON in the keys of
tiny llama / qwen2 / gpt2 configs beside their real tensors: load_model and the compile limits).
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import struct
import sys
import tempfile
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

HEADROOM = 200 << 20  # bytes of address space a case may add to what the warmed-up worker holds
CASE_SECONDS = 10
COUNTS: Counter = Counter()  # outcome of each loader call, by strategy
INPUTS: Counter = Counter()  # inputs generated, by hypothesis test
WORK = Path(tempfile.mkdtemp(prefix="deploycc-fuzz-"))


def fuzz(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, print_blob=False,
                    suppress_health_check=list(HealthCheck))


class CaseTimeout(BaseException):  # not an Exception: no `except Exception` in the code under test may hide it
    pass


def _alarm(*_):
    raise CaseTimeout(f"a case ran longer than {CASE_SECONDS} s")


def run_case(strategy: str, fn, allowed: tuple[type, ...]) -> None:
    """fn() under the alarm: it may return or raise one of `allowed` with a one-line message; nothing else."""
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    try:
        fn()
        COUNTS[f"{strategy}:loaded"] += 1
    except allowed as e:
        msg = str(e)
        assert msg and "\n" not in msg, f"not a one-line message: {msg!r}"
        COUNTS[f"{strategy}:refused"] += 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def warm_up_hypothesis() -> None:
    """Build hypothesis's one-time tables (the Unicode intervals behind text(), about 300 MB at their peak)
    before the limit: they are the fuzzer's memory, not a case's."""
    import warnings

    from hypothesis.errors import NonInteractiveExampleWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonInteractiveExampleWarning)
        st.text(min_size=1).example()


def limit_memory() -> None:
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + HEADROOM, vm + HEADROOM))


# ---- (a) safetensors headers ------------------------------------------------------------------------------

ST_DTYPES = ["F32", "F16", "BF16", "I32", "I64", "U8", "I8", "U32", "F64", "BOOL", "F8_E4M3", "", "f32", "F32 "]
INTERESTING = [0, 1, 2, 3, 4, 7, 8, -1, -8, 2**31 - 1, 2**31, 2**32, 2**53, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30]
ints = st.one_of(st.sampled_from(INTERESTING), st.integers(-16, 64), st.integers())
json_scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                           max_leaves=12)
entry = st.fixed_dictionaries({}, optional={
    "dtype": st.one_of(st.sampled_from(ST_DTYPES), json_values),
    "shape": st.one_of(st.lists(ints, max_size=5), st.lists(st.integers(0, 6), max_size=4), json_values),
    "data_offsets": st.one_of(st.lists(ints, min_size=2, max_size=2), st.tuples(st.integers(0, 64), st.integers(0, 128)).map(list),
                              json_values)})
header = st.dictionaries(st.one_of(st.sampled_from(["w", "model.embed_tokens.weight", "__metadata__", "x"]), st.text(max_size=6)),
                         st.one_of(entry, json_values), max_size=4)


def valid_safetensors() -> bytes:
    import numpy as np
    from safetensors.numpy import save

    return save({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.float16), "c": np.zeros(3, np.int8)})


def load_safetensors(data: bytes) -> None:
    """The file through both readers, every tensor read, and load_model on a checkpoint holding it."""
    import deploycc
    from deploycc.errors import DeployError
    from deploycc.hub import SafetensorsFile
    from deploycc.runtime.safetensors_io import SafetensorsError, SafetensorsReader

    path = WORK / "st" / "model.safetensors"
    path.write_bytes(data)

    def runtime():
        r = SafetensorsReader(path)
        for name, (dtype, shape, _, _) in r.entries.items():
            arr = r.read(name)
            assert arr.shape == shape and arr.dtype == dtype

    def hub():
        f = SafetensorsFile(path)
        for name, e in f.entries.items():
            assert f.read(name).shape == e.shape

    run_case("runtime", runtime, (SafetensorsError,))
    run_case("hub", hub, (DeployError,))
    def load():
        model = deploycc.load_model(str(path.parent))
        for _ in model.params():  # every tensor read through the (mutated) header
            pass

    run_case("load_model", load, (DeployError,))


def prefixed(raw: bytes, length: int | None, data: bytes) -> bytes:
    return struct.pack("<Q", len(raw) if length is None else length % 2**64) + raw + data


@fuzz(200)
@given(st.binary(max_size=300))
def st_raw_bytes(data):
    INPUTS["st_raw_bytes"] += 1
    load_safetensors(data)


@fuzz(200)
@given(st.binary(max_size=200), st.one_of(st.none(), ints), st.binary(max_size=64))
def st_random_header_bytes(raw, length, data):
    INPUTS["st_random_header_bytes"] += 1
    load_safetensors(prefixed(raw, length, data))


@fuzz(400)
@given(header, st.one_of(st.none(), st.sampled_from([0, 1, 2**40, 2**64 - 1])), st.binary(max_size=96))
def st_json_header(h, length, data):
    INPUTS["st_json_header"] += 1
    load_safetensors(prefixed(json.dumps(h).encode(), length, data))


@fuzz(300)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
       st.one_of(st.none(), st.integers(0, 400)))
def st_mutated_valid(flips, cut):
    INPUTS["st_mutated_valid"] += 1
    data = bytearray(valid_safetensors())
    for pos, byte in flips:
        data[pos % len(data)] = byte
    load_safetensors(bytes(data[:cut] if cut is not None else data))


@fuzz(300)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4), st.booleans())
def st_mutated_checkpoint(flips, truncate):
    """The tiny Llama's own weights file, its header (and the first data bytes) mutated: load_model then
    sometimes succeeds, and every tensor it checks is read through the mutated header."""
    INPUTS["st_mutated_checkpoint"] += 1
    data = bytearray(BASE["checkpoint"])
    span = struct.unpack_from("<Q", data)[0] + 8 + 64
    for pos, byte in flips:
        data[pos % span] = byte
    load_safetensors(bytes(data[:len(data) - flips[0][0] % 4096 - 1] if truncate else data))


def setup_safetensors():
    from bad_inputs.checkpoints import copy_tiny

    (WORK / "st").mkdir()
    src = copy_tiny(WORK / "src")
    shutil.copy(src / "config.json", WORK / "st" / "config.json")
    BASE["checkpoint"] = (src / "model.safetensors").read_bytes()
    load_safetensors(BASE["checkpoint"])
    assert COUNTS["load_model:loaded"] == 1, "the unmutated checkpoint must load"
    load_safetensors(valid_safetensors())


# ---- (b) GGUF ---------------------------------------------------------------------------------------------------

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


def enc_str(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def enc_value(vtype: int, value) -> bytes:
    if vtype in SCALARS:
        return struct.pack(SCALARS[vtype], value)
    if vtype == STRING:
        return enc_str(value if isinstance(value, bytes) else value.encode())
    itype, items = value
    return struct.pack("<IQ", itype, len(items)) + b"".join(enc_value(itype, x) for x in items)


class GGUFModel:
    """A GGUF file as fields that mutate independently: kvs [key bytes, vtype, value bytes] and tensors
    [name bytes, dims, qtype, offset], serialized with the data blob of the valid tiny file."""

    def __init__(self, path: Path):
        from gguf import GGUFReader

        r = GGUFReader(str(path))
        self.kvs = []
        for f in r.fields.values():
            if f.name.startswith("GGUF."):
                continue
            types = [int(t) for t in f.types]
            value = (types[1], f.contents()) if types[0] == ARRAY else f.contents()
            self.kvs.append([f.name.encode(), types[0], enc_value(types[0], value)])
        self.tensors = [[t.name.encode(), [int(d) for d in t.shape], int(t.tensor_type), int(t.data_offset - r.data_offset)]
                        for t in r.tensors]
        self.blob = bytes(r.data[r.data_offset:])
        self.counts: list[int | None] = [None, None]
        self.version = 3

    def copy(self) -> GGUFModel:
        new = object.__new__(GGUFModel)
        new.kvs = [list(kv) for kv in self.kvs]
        new.tensors = [[t[0], list(t[1]), t[2], t[3]] for t in self.tensors]
        new.blob, new.counts, new.version = self.blob, list(self.counts), self.version
        return new

    def bytes(self) -> bytes:
        n_t = len(self.tensors) if self.counts[0] is None else self.counts[0]
        n_kv = len(self.kvs) if self.counts[1] is None else self.counts[1]
        out = b"GGUF" + struct.pack("<IQQ", self.version, n_t % 2**64, n_kv % 2**64)
        for key, vtype, value in self.kvs:
            out += enc_str(key) + struct.pack("<I", vtype % 2**32) + value
        for name, dims, qtype, offset in self.tensors:
            out += enc_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d % 2**64) for d in dims)
            out += struct.pack("<IQ", qtype % 2**32, offset % 2**64)
        return out + bytes(-len(out) % 32) + self.blob


BASE: dict = {}
LOADED_KEYS = [b"llama.block_count", b"llama.embedding_length", b"llama.feed_forward_length", b"llama.attention.head_count",
               b"llama.attention.head_count_kv", b"llama.context_length", b"llama.rope.dimension_count",
               b"llama.rope.freq_base", b"llama.attention.layer_norm_rms_epsilon", b"tokenizer.ggml.tokens",
               b"tokenizer.ggml.token_type", b"tokenizer.ggml.merges", b"tokenizer.ggml.bos_token_id",
               b"tokenizer.ggml.model", b"tokenizer.ggml.pre", b"general.architecture", b"general.alignment",
               b"llama.rope.scaling.type", b"tokenizer.chat_template"]
U64 = st.one_of(st.sampled_from([0, 1, 2, 3, 31, 32, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1]), st.integers(0, 2**64 - 1))
BAD_UTF8 = st.sampled_from([b"\xff", b"\xc3(", b"\xe2\x82", b"\xed\xa0\x80", b"a\x80b", b"\xf8\x88\x80\x80\x80"])


def typed_value():
    """(vtype, value bytes) of a random well-formed metadata value of a random type."""
    bounds = {0: (0, 255), 1: (-128, 127), 2: (0, 2**16 - 1), 3: (-2**15, 2**15 - 1), 4: (0, 2**32 - 1),
              5: (-2**31, 2**31 - 1), 10: (0, 2**64 - 1), 11: (-2**63, 2**63 - 1)}
    ints_ = [st.integers(*b).map(lambda v, t=t: (t, enc_value(t, v))) for t, b in bounds.items()]
    floats = [st.floats(width=32).map(lambda v: (6, enc_value(6, v))), st.floats().map(lambda v: (12, enc_value(12, v))),
              st.booleans().map(lambda v: (7, enc_value(7, v)))]
    strings = [st.text(max_size=12).map(lambda v: (STRING, enc_value(STRING, v)))]
    arrays = [st.lists(st.integers(0, 2**32 - 1), max_size=12).map(lambda v: (ARRAY, enc_value(ARRAY, (4, v)))),
              st.lists(st.text(max_size=4), max_size=12).map(lambda v: (ARRAY, enc_value(ARRAY, (STRING, v)))),
              st.lists(st.floats(width=32), max_size=12).map(lambda v: (ARRAY, enc_value(ARRAY, (6, v))))]
    return st.one_of(*ints_, *floats, *strings, *arrays)


def mutation():
    """A structured change of one field of the tiny GGUF: counts, types, lengths, UTF-8, values, tensors."""
    k = st.integers(0, 10**6)
    return st.one_of(
        st.tuples(st.just("count"), st.integers(0, 1), U64),
        st.tuples(st.just("version"), st.sampled_from([0, 1, 2, 4, 2**31, 2**32 - 1])),
        st.tuples(st.just("kv_type"), k, st.integers(0, 2**32 - 1)),
        st.tuples(st.just("kv_value"), k, typed_value()),
        st.tuples(st.just("kv_named"), st.sampled_from(LOADED_KEYS), typed_value()),
        st.tuples(st.just("kv_length"), k, U64),  # the first 8 bytes of a value: a string's or an array's type+length
        # an array that declares more (or fewer) elements than it holds, of any element type
        st.tuples(st.just("array_length"), k, U64, st.sampled_from(sorted(SCALARS) + [STRING, ARRAY, 13, 2**32 - 1])),
        st.tuples(st.just("kv_utf8"), k, BAD_UTF8, st.booleans()),
        st.tuples(st.just("kv_drop"), k),
        st.tuples(st.just("kv_dup"), k),
        st.tuples(st.just("tensor_dims"), k, st.lists(U64, max_size=6)),
        st.tuples(st.just("tensor_type"), k, st.one_of(st.integers(0, 45), st.integers(0, 2**32 - 1))),
        st.tuples(st.just("tensor_offset"), k, U64),
        st.tuples(st.just("tensor_utf8"), k, BAD_UTF8),
        st.tuples(st.just("tensor_drop"), k),
        st.tuples(st.just("tensor_dup"), k),
    )


def apply(m: GGUFModel, mut) -> None:
    kind, *args = mut
    kvs, ts = m.kvs, m.tensors
    if kind == "count":
        m.counts[args[0]] = args[1]
    elif kind == "version":
        m.version = args[0]
    elif kind == "kv_named":  # set (or add) a key the loader reads
        for kv in kvs:
            if kv[0] == args[0]:
                kv[1], kv[2] = args[1]
                break
        else:
            kvs.append([args[0], *args[1]])
    elif kind.startswith("kv_") or kind == "array_length":
        if not kvs:
            return
        arrays = [kv for kv in kvs if kv[1] == ARRAY] or kvs  # lengths of arrays: where a reader trusts a count most
        kv = (arrays if kind == "array_length" else kvs)[args[0] % len(arrays if kind == "array_length" else kvs)]
        if kind == "kv_type":
            kv[1] = args[1]
        elif kind == "kv_value":
            kv[1], kv[2] = args[1]
        elif kind == "kv_length":
            kv[2] = struct.pack("<Q", args[1]) + kv[2][8:]
        elif kind == "array_length":
            itype = args[2]
            items = enc_value(ARRAY, (itype, [0] * 3 if itype in SCALARS else ["ab"] * 3)) if itype in SCALARS or \
                itype == STRING else struct.pack("<IQ", itype, 3) + bytes(12)
            kv[1], kv[2] = ARRAY, items[:4] + struct.pack("<Q", args[1]) + items[12:]
        elif kind == "kv_utf8":
            if args[2] or kv[1] != STRING:
                kv[0] = kv[0][:3] + args[1] + kv[0][3:]
            else:
                kv[2] = enc_str(args[1] + kv[2][8:])
        elif kind == "kv_drop":
            kvs.remove(kv)
        elif kind == "kv_dup":
            kvs.append(list(kv))
    else:
        t = ts[args[0] % len(ts)] if ts else None
        if t is None:
            return
        if kind == "tensor_dims":
            t[1] = args[1]
        elif kind == "tensor_type":
            t[2] = args[1]
        elif kind == "tensor_offset":
            t[3] = args[1]
        elif kind == "tensor_utf8":
            t[0] = args[1] + t[0]
        elif kind == "tensor_drop":
            ts.remove(t)
        elif kind == "tensor_dup":
            ts.append([t[0], list(t[1]), t[2], t[3]])


def load_gguf(data: bytes) -> None:
    import deploycc
    from deploycc import presets
    from deploycc.errors import DeployError
    from deploycc.limits import check_compile

    path = WORK / "g.gguf"
    path.write_bytes(data)

    def load():
        model = deploycc.load_model(str(path))
        for name, arr in model.params():
            assert arr.shape == tuple(model.weights.shape(model.arch.weight_map(model.config).get(name, (name,))[0]))
        check_compile(model, presets.load("cpu-opencl"), None)

    run_case("gguf", load, (DeployError,))


@fuzz(350)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8),
       st.one_of(st.none(), st.integers(0, 40000)))
def gguf_bytes(flips, cut):
    INPUTS["gguf_bytes"] += 1
    data = bytearray(BASE["gguf"])
    for pos, byte in flips:
        data[pos % len(data)] = byte
    load_gguf(bytes(data[:cut] if cut is not None else data))


@fuzz(250)
@given(st.integers(0, 2**20), st.binary(min_size=1, max_size=64))
def gguf_header_bytes(pos, junk):
    """Random bytes spliced into the header region (where every count and length lives)."""
    INPUTS["gguf_header_bytes"] += 1
    data = BASE["gguf"]
    header_end = BASE["header_end"]
    at = pos % header_end
    load_gguf(data[:at] + junk + data[at + len(junk):])


# Always run: the counts and types that once hung the reader, ate memory or escaped as tracebacks.
GGUF_EXAMPLES = [
    [("kv_named", b"llama.block_count", (4, struct.pack("<I", 2**31)))],
    [("kv_named", b"llama.block_count", (10, struct.pack("<Q", 2**64 - 1)))],
    [("kv_named", b"llama.block_count", (STRING, enc_str(b"2")))],
    [("kv_named", b"llama.embedding_length", (6, struct.pack("<f", 16.0)))],
    [("array_length", 0, 2**40, 0)], [("array_length", 0, 2**64 - 1, STRING)], [("array_length", 0, 2**33, 4)],
    [("kv_utf8", 1, b"\xff\xfe", False)], [("tensor_utf8", 0, b"\xc3(")],
    [("count", 0, 2**63)], [("count", 1, 2**64 - 1)], [("tensor_dims", 0, [2**32, 2**32])], [("tensor_offset", 0, 2**63)],
    [("kv_named", b"tokenizer.ggml.bos_token_id", (4, struct.pack("<I", 10**6)))],
    [("kv_named", b"tokenizer.ggml.token_type", (ARRAY, enc_value(ARRAY, (4, [1, 2]))))],
]


def gguf_with_examples(test):
    for muts in GGUF_EXAMPLES:
        test = example(muts)(test)
    return test


@fuzz(600)
@gguf_with_examples
@given(st.lists(mutation(), min_size=1, max_size=3))
def gguf_structured(muts):
    INPUTS["gguf_structured"] += 1
    m = BASE["model"].copy()
    for mut in muts:
        apply(m, mut)
    load_gguf(m.bytes())


def setup_gguf():
    from bad_inputs.checkpoints import tiny_gguf

    os.environ["DEPLOYCC_HOME"] = str(WORK / "home")  # the GGUF tokenizers of the cases are cached there

    path = tiny_gguf(WORK / "base.gguf")
    BASE["gguf"] = path.read_bytes()
    BASE["model"] = GGUFModel(path)
    assert BASE["model"].bytes() == BASE["gguf"], "the serializer must reproduce the valid file"
    from gguf import GGUFReader

    BASE["header_end"] = int(GGUFReader(str(path)).data_offset)
    load_gguf(BASE["gguf"])
    assert COUNTS.pop("gguf:loaded") == 1, "the unmutated file must load"


# ---- (c) config.json ---------------------------------------------------------------------------------------------

EXTRA_KEYS = {"llama": ["head_dim", "rope_scaling", "rope_parameters", "attention_bias", "mlp_bias", "architectures",
                        "model_type", "num_key_value_heads"],
              "gpt2": ["n_inner", "activation_function", "architectures", "model_type", "layer_norm_epsilon"]}
CHECKPOINTS = {"llama": "llama-gqa1", "qwen2": "qwen2-gqa5-tied", "gpt2": "gpt2-odd"}


def is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def config_value(true_value):
    """Sizes near the true one (off by one, doubled: the shapes then disagree) and far above it (10**9 layers
    must never be built), values of the wrong type or range, any JSON, and rope scaling dicts."""
    sizes = st.nothing()
    if is_count(true_value):
        sizes = st.sampled_from([true_value + d for d in (-2, -1, 1, 2)] + [true_value * 2, true_value // 2]) | \
            st.integers(true_value + 1, 2**31)
    return st.one_of(sizes, st.sampled_from([0, -1, 1, 2**31, 2**63, 1e9, 2.5, "2", None, True, [], {}]), json_values,
                     st.fixed_dictionaries({"rope_type": st.sampled_from(["linear", "llama3", "yarn", "default", 3]),
                                            "factor": json_scalars}, optional={
                         "low_freq_factor": json_scalars, "high_freq_factor": json_scalars,
                         "original_max_position_embeddings": json_scalars}))


DROP = "<drop>"  # a key's value that removes it


@st.composite
def config_case(draw):
    """(family, changes): keys of the family's tiny config set to new values (or DROP), or (family, a JSON
    value) to replace the whole file."""
    family = draw(st.sampled_from(sorted(CHECKPOINTS)))
    if draw(st.integers(0, 19)) == 0:  # now and then, not an object at all
        return family, draw(json_values)
    cfg = BASE[family]
    keys = sorted(cfg) + EXTRA_KEYS["gpt2" if family == "gpt2" else "llama"]
    sizes = sorted(k for k, v in cfg.items() if is_count(v))  # half the time a size: where a config can do most harm
    changes = {}
    for key in draw(st.lists(st.sampled_from(sizes) | st.sampled_from(keys), min_size=1, max_size=3, unique=True)):
        changes[key] = DROP if draw(st.integers(0, 9)) == 0 else draw(config_value(cfg.get(key)))
    return family, changes


# Always run, whatever hypothesis draws: the sizes that once made a model of 10**9 modules or a 10**12 cache.
CONFIG_EXAMPLES = [("llama", {"num_hidden_layers": 10**9}), ("gpt2", {"n_layer": 10**9}), ("qwen2", {"hidden_size": 10**9}),
                   ("llama", {"vocab_size": 2**31 - 1}), ("llama", {"head_dim": 2**31 - 1}), ("gpt2", {"n_positions": 10**12}),
                   ("llama", {"max_position_embeddings": 2**24, "num_hidden_layers": 10**6}), ("qwen2", []),
                   ("llama", {"num_attention_heads": 2**31 - 1, "num_key_value_heads": 1}), ("gpt2", {"n_inner": 10**9})]


def config_values_with_examples(test):
    for family, changes in CONFIG_EXAMPLES:
        test = example((family, changes))(test)
    return test


@fuzz(1000)
@config_values_with_examples
@given(config_case())
def config_values(case):
    INPUTS["config_values"] += 1
    import deploycc
    from deploycc import presets
    from deploycc.errors import DeployError
    from deploycc.limits import check_compile

    family, changes = case
    if isinstance(changes, dict):
        cfg = {**BASE[family], **changes}
        cfg = {k: v for k, v in cfg.items() if v != DROP}
    else:
        cfg = changes
    path = WORK / family
    (path / "config.json").write_text(json.dumps(cfg))

    def load():
        model = deploycc.load_model(str(path))
        check_compile(model, presets.load("cpu-opencl"), None)

    run_case(f"config-{family}", load, (DeployError,))


def setup_config():
    from bad_inputs.checkpoints import copy_tiny

    for family, name in CHECKPOINTS.items():
        src = copy_tiny(WORK / "src", name)
        (WORK / family).mkdir()
        os.symlink(src / "model.safetensors", WORK / family / "model.safetensors")
        BASE[family] = json.loads((src / "config.json").read_text())
        shutil.copy(src / "config.json", WORK / family / "config.json")
        config_values.hypothesis.inner_test((family, {}))  # the unmutated config loads
    assert all(COUNTS.pop(f"config-{f}:loaded") == 1 for f in CHECKPOINTS), COUNTS


def setup_selfcheck():
    import numpy  # noqa: F401  (imported before the limit, as the loaders' modules are)


def selfcheck():
    """A case that allocates 300 MB must fail under the limit: proof that the bound is real."""
    import numpy as np

    run_case("selfcheck", lambda: np.ones(300 << 20, np.uint8), (ValueError,))


LOADERS = {"safetensors": (setup_safetensors, [st_raw_bytes, st_random_header_bytes, st_json_header, st_mutated_valid,
                                         st_mutated_checkpoint]),
           "gguf": (setup_gguf, [gguf_bytes, gguf_header_bytes, gguf_structured]),
           "config": (setup_config, [config_values]),
           "selfcheck": (setup_selfcheck, [selfcheck])}


def main(loader: str) -> None:
    setup, tests = LOADERS[loader]
    signal.signal(signal.SIGALRM, _alarm)
    try:
        setup()  # imports everything and runs one valid case: the memory limit then counts only what a case adds
        COUNTS.clear()
        INPUTS.clear()
        warm_up_hypothesis()
        limit_memory()
        for test in tests:
            test()
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    print("FUZZ " + json.dumps({"inputs": sum(INPUTS.values()), "by_test": dict(INPUTS),
                                "outcomes": dict(sorted(COUNTS.items()))}))


if __name__ == "__main__":
    main(sys.argv[1])
