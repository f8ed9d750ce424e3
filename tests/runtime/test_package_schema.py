"""The package validator (runtime/validate.py, runtime/dryrun.py) rule by rule: a real compiled tiny package's
manifest and bytecode pass; each rule has a case that breaks it and must give one PackageError naming the
field. Then the VM's own checks at run time (runtime/vm.py), and the order of Engine.load: everything is
checked before a device is opened.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_package import compile_tiny_package, read_docs

from deploycc.runtime.package import PackageError


@pytest.fixture(scope="module")
def pkg(tmp_path_factory) -> Path:
    return compile_tiny_package(tmp_path_factory.mktemp("schema"))


@pytest.fixture(scope="module")
def texts(pkg) -> tuple[str, str]:
    m, bc = read_docs(pkg)
    return json.dumps(m), json.dumps(bc)


def check(m, bc) -> None:
    from deploycc.runtime.dryrun import check_plan
    from deploycc.runtime.validate import check_manifest
    from deploycc.runtime.validate_bytecode import check_bytecode

    check_manifest(m)
    check_bytecode(bc, m)
    check_plan(m, bc)


def fresh(texts):
    return json.loads(texts[0]), json.loads(texts[1])


def code(bc, fname="prefill"):
    return bc["functions"][fname]["instructions"]


def find(bc, fname, fn, kernel=None, nth=0):
    """The nth instruction of `fn` (launching `kernel`) in function `fname`."""
    hits = [ins for ins in code(bc, fname) if ins.get("fn") == fn and (kernel is None or ins["args"][0].get("k") == kernel)]
    return hits[nth]


def index_of(bc, fname, ins) -> int:
    return next(i for i, x in enumerate(code(bc, fname)) if x is ins)


def sep(ins) -> int:
    return next(i for i, a in enumerate(ins["args"]) if a.get("str") == "|")


def set_memory(m) -> None:
    """Make the manifest's memory summary agree again after a deliberate edit, so a deeper check is what fails."""
    from deploycc.runtime.validate import kv_bytes, nbytes

    m["memory"]["activation_bytes"] = sum(s["bytes"] for s in m["storages"])
    m["memory"]["kv_cache_bytes"] = kv_bytes(m)
    m["memory"]["weights_bytes"] = sum(nbytes(p["shape"], p["dtype"]) for p in m["params"])


def test_the_real_package_passes(texts):
    check(*fresh(texts))


# ---- manifest.json -------------------------------------------------------------------------------

def _entry(m, name="linear"):
    return m["kernels"]["entries"][name]


MANIFEST = [
    ("not an object", lambda m: m.clear() or m.update({"x": 1}), "manifest.json lacks 'format'"),
    ("missing vocab_size", lambda m: m.pop("vocab_size"), "manifest.json lacks 'vocab_size'"),
    ("format marker", lambda m: m.update(format="deploycc-pkg"), "format is 'deploycc-pkg'"),
    ("format_version bool", lambda m: m.update(format_version=True), "format_version must be an integer"),
    ("architecture int", lambda m: m["model"].update(architecture=7), "model.architecture must be a string"),
    ("hf_config list", lambda m: m["model"].update(hf_config=[]), "model.hf_config must be an object"),
    ("quantization unknown", lambda m: m.update(quantization="q3"), "quantization is 'q3'"),
    ("head_quantization null", lambda m: m.update(head_quantization=None), "head_quantization must be a string"),
    ("backend not the target's", lambda m: m["preset"].update(backend="cuda"), "preset.backend is 'cuda'"),
    ("target kind", lambda m: m["target"].update(kind="metal"), "target.kind is 'metal'"),
    ("max_grid zero", lambda m: m["target"].update(max_grid=0), "target.max_grid must be an integer"),
    ("max_grid 2**63", lambda m: m["target"].update(max_grid=2**63), "target.max_grid must be an integer"),
    ("max_grid float", lambda m: m["target"].update(max_grid=65535.0), "target.max_grid must be an integer"),
    ("fast_math string", lambda m: m["target"].update(fast_math="yes"), "target.fast_math must be true or false"),
    ("arch an option", lambda m: m["target"].update(arch="sm_90 -O0"), "target.arch is 'sm_90 -O0', not a valid name"),
    ("context_window string", lambda m: m["bounds"].update(context_window="128"), "bounds.context_window must be"),
    ("context_window huge", lambda m: m["bounds"].update(context_window=2**40), "bounds.context_window must be"),
    ("prefill_chunk past the window", lambda m: m["bounds"].update(prefill_chunk=129), "bounds.prefill_chunk must be "
                                                                                         "an integer in 1..128"),
    ("bounds a list", lambda m: m.update(bounds=[128, 128]), "bounds must be an object"),
    ("kv layers zero", lambda m: m["kv_cache"].update(layers=0), "kv_cache.layers must be"),
    ("kv heads NaN", lambda m: m["kv_cache"].update(kv_heads=float("nan")), "kv_cache.kv_heads must be"),
    ("kv head_dim negative", lambda m: m["kv_cache"].update(head_dim=-8), "kv_cache.head_dim must be"),
    ("kv dtype", lambda m: m["kv_cache"].update(dtype="bfloat16"), "kv_cache.dtype is 'bfloat16'"),
    ("kv absurd", lambda m: m["kv_cache"].update(layers=4096, kv_heads=4096, head_dim=16384),
     "more than any device has"),
    ("vocab_size zero", lambda m: m.update(vocab_size=0), "vocab_size must be an integer in 1.."),
    ("vocab_size bool", lambda m: m.update(vocab_size=True), "vocab_size must be an integer"),
    ("storages a dict", lambda m: m.update(storages={}), "storages must be a list"),
    ("storage without bytes", lambda m: m["storages"][0].pop("bytes"), "storages[0] lacks 'bytes'"),
    ("storage bytes negative", lambda m: m["storages"][1].update(bytes=-1), "storages[1].bytes must be"),
    ("storage bytes 2**63", lambda m: m["storages"][1].update(bytes=2**63), "storages[1].bytes must be"),
    ("storage bytes float", lambda m: m["storages"][1].update(bytes=4096.0), "storages[1].bytes must be"),
    ("kernel language", lambda m: m["kernels"].update(language="wgsl"), "kernels.language is 'wgsl'"),
    ("no kernels", lambda m: m["kernels"].update(entries={}), "kernels.entries is empty"),
    ("kernel file outside", lambda m: _entry(m).update(file="../../etc/passwd"), "file is '../../etc/passwd', not a "
                                                                                   "file of the package's kernels/"),
    ("kernel file unlisted", lambda m: _entry(m).update(file="kernels/other.cl"), "not a file of the package's"),
    ("kernel entry not a name", lambda m: _entry(m).update(entry="linear; x"), "entry is 'linear; x', not a valid name"),
    ("kernel entry another kernel's", lambda m: _entry(m).update(entry="linear1"), "entry is 'linear1', but the kernel "
                                                                                  "'linear' is compiled as 'linear'"),
    ("kernel threads zero", lambda m: _entry(m).update(threads=0), "threads must be an integer in 1..4096"),
    ("kernel threads past the target", lambda m: _entry(m).update(threads=5000), "threads must be an integer"),
    ("kernel multiply-adds a string", lambda m: _entry(m).update(macs_per_row="1e9"), "macs_per_row must be an integer"),
    ("kernel activation bits 4", lambda m: _entry(m).update(activation_bits=4), "activation_bits must be 8 or 16"),
    ("kernel activation bits 12", lambda m: _entry(m).update(activation_bits=12), "activation_bits must be 8 or 16"),
    ("kernel without args", lambda m: _entry(m).pop("args"), "['linear'] lacks 'args'"),
    ("kernel scalars twice", lambda m: _entry(m)["args"].update(scalars=["seq_len", "seq_len"]), "names an argument"),
    ("kernel buffer dtype", lambda m: _entry(m)["args"]["buffers"][0].update(dtype="float64"), "dtype is 'float64'"),
    ("kernel buffer written", lambda m: _entry(m)["args"]["buffers"][0].update(written=1), "written must be true or"),
    ("kernel shape unknown name", lambda m: _entry(m)["args"]["buffers"][0].update(shape=[1, "batch", 32]),
     "uses the shape variable 'batch'"),
    ("kernel shape not growing", lambda m: _entry(m)["args"]["buffers"][0].update(shape=[["%", "seq_len", 7]]),
     "not a size that grows"),
    ("kernel groups divide by 0", lambda m: _entry(m)["args"].update(groups=["//", "seq_len", 0]),
     "positive constant divisor"),
    ("split on OpenCL", lambda m: _entry(m).update(split={"0": [1024, 2]}), "is a WebGPU binding feature"),
    ("params a dict", lambda m: m.update(params={}), "params must be a list"),
    ("param twice", lambda m: m["params"].append(dict(m["params"][0])), "appears twice"),
    ("param shape negative", lambda m: m["params"][0].update(shape=[-1, 32]), "params[0].shape[0] must be"),
    ("param shape string", lambda m: m["params"][0].update(shape="101x32"), "params[0].shape must be a list"),
    ("param dtype", lambda m: m["params"][0].update(dtype="float64"), "params[0].dtype is 'float64'"),
    ("param file outside", lambda m: m["params"][0].update(file="../x.safetensors"), "not a .safetensors file listed"),
    ("param file not safetensors", lambda m: m["params"][0].update(file="tokenizer.json"), "not a .safetensors file"),
    ("memory missing", lambda m: m.pop("memory"), "manifest.json lacks 'memory'"),
    ("memory disagrees with storages", lambda m: m["storages"][0].update(bytes=100), "memory.activation_bytes is"),
    ("memory disagrees with params", lambda m: m["params"][0].update(shape=[50, 32]), "memory.weights_bytes is"),
    ("memory disagrees with the window", lambda m: (m["bounds"].update(context_window=256),
                                                    m["kv_cache"]["pool"].update(pages=16)), "memory.kv_cache_bytes"),
    ("memory bytes a string", lambda m: m["memory"].update(weights_bytes="1"), "memory.weights_bytes is '1'"),
    ("unplanned bytes a string", lambda m: m["memory"]["unplanned_activation_bytes"].update(decode="x"),
     "unplanned_activation_bytes['decode'] must be"),
]


@pytest.mark.parametrize("mutate,fragment", [c[1:] for c in MANIFEST], ids=[c[0] for c in MANIFEST])
def test_manifest_rule(texts, mutate, fragment):
    m, bc = fresh(texts)
    mutate(m)
    with pytest.raises(PackageError) as e:
        check(m, bc)
    msg = str(e.value)
    assert fragment in msg and msg.endswith("; recompile the package") and "\n" not in msg, msg


# ---- bytecode.json: structure ---------------------------------------------------------------------

def _set_arg(fname, fn, k, value, kernel=None):
    return lambda bc: find(bc, fname, fn, kernel)["args"].__setitem__(k, value)


BYTECODE = [
    ("not an object", lambda bc: bc.clear(), "bytecode.json lacks 'version'"),
    ("version", lambda bc: bc.update(version=2), "version must be an integer in 1..1"),
    ("no decode", lambda bc: bc["functions"].pop("decode"), "functions lacks 'decode'"),
    ("a function nobody calls", lambda bc: bc["functions"].update(evil=bc["functions"]["decode"]), "has 'evil'"),
    ("three inputs", lambda bc: bc["functions"]["decode"].update(num_inputs=3), "num_inputs must be an integer in 2..2"),
    ("registers too few", lambda bc: bc["functions"]["decode"].update(registers=3), "registers must be an integer"),
    ("weight not in params", lambda bc: bc["functions"]["decode"]["params"].__setitem__(2, "w.evil"),
     "params[2] is 'w.evil', which is not in manifest.json params"),
    ("constant not in params", lambda bc: bc["functions"]["decode"]["constants"][0].__setitem__(0, "nope"),
     "constants[0][0] is 'nope'"),
    ("constant on a weight register", lambda bc: bc["functions"]["decode"]["constants"][0].__setitem__(1, 2),
     "constants[0][1] must be an integer"),
    ("no instructions", lambda bc: code(bc, "decode").clear(), "instructions must have 1.."),
    ("no ret at the end", lambda bc: code(bc, "decode").pop(), "is not a ret"),
    ("ret in the middle", lambda bc: code(bc, "decode").insert(3, code(bc, "decode")[-1]), "must be the one ret"),
    ("goto", lambda bc: code(bc, "decode")[2].update(op="goto"), "op is 'goto'; expected one of call, ret"),
    ("unknown field", lambda bc: code(bc, "decode")[2].update(fn2="x"), "has the unknown field 'fn2'"),
    ("unknown builtin", lambda bc: code(bc, "decode")[2].update(fn="vm.exec"), "fn is 'vm.exec'; expected one of"),
    ("arity", lambda bc: code(bc, "decode")[2]["args"].append({"r": 0}), "has 2 operands; vm.move takes 1"),
    ("operand kind", lambda bc: code(bc, "decode")[2]["args"].__setitem__(0, {"i": 23}), "must be one operand of kind r"),
    ("operand with two keys", lambda bc: code(bc, "decode")[2]["args"][0].update(i=1), "must be one operand of kind r"),
    ("register out of range", lambda bc: code(bc, "decode")[2]["args"][0].update(r=9999), ".r must be an integer in "
                                                                                         "0..55"),
    ("register read before written", lambda bc: code(bc, "decode")[2]["args"][0].update(r=40),
     "reads register 40 before any instruction writes it"),
    ("dst on a launch", lambda bc: find(bc, "decode", "vm.launch").update(dst=50), "is set, but vm.launch has no result"),
    ("alloc without dst", lambda bc: find(bc, "decode", "vm.alloc").pop("dst"), "dst must be an integer"),
    ("dst a weight", lambda bc: find(bc, "decode", "vm.alloc").update(dst=3), "is register 3, which holds an input, a "
                                                                              "weight or a constant"),
    ("alloc storage out of range", _set_arg("decode", "vm.alloc", 0, {"i": 8}), "is storage 8, but manifest.json has 8"),
    ("alloc dtype", _set_arg("decode", "vm.alloc", 1, {"str": "float64"}), "args[1].str is 'float64'"),
    ("alloc dim not growing", _set_arg("prefill", "vm.alloc", 3, {"s": ["+", 200, ["*", -1, "seq_len"]]}),
     "not a size that grows with seq_len and total_len"),
    ("kv.view layer", _set_arg("decode", "kv.view", 2, {"i": 2}), "args[2].i must be an integer in 0..1"),
    ("kv.view which", _set_arg("decode", "kv.view", 1, {"str": "q"}), "args[1].str is 'q'"),
    ("kv.begin not affine", _set_arg("prefill", "kv.begin", 1, {"s": ["*", "seq_len", "seq_len"]}),
     "the tokens a step appends must be"),
    ("bind an unknown variable", _set_arg("prefill", "vm.match_shape", 2, {"bind": "heads"}), "bind is 'heads'"),
    ("bind twice", lambda bc: code(bc)[3]["args"].__setitem__(1, {"bind": "seq_len"}), "binds seq_len a second time"),
    ("use before bind", _set_arg("prefill", "kv.begin", 1, {"s": "total_len"}), "uses the shape variable 'total_len', "
                                                                                "which is not bound before it"),
    ("divide by zero", _set_arg("prefill", "vm.launch", 1, {"s": ["//", "seq_len", 0]}), "positive constant divisor"),
    ("unknown op", _set_arg("prefill", "vm.launch", 1, {"s": ["**", "seq_len", 2]}), "is not a symbolic expression"),
    ("float in an expression", _set_arg("prefill", "vm.launch", 1, {"s": 4.0}), "is not a symbolic expression"),
    ("constant past int32", _set_arg("prefill", "vm.launch", 1, {"s": 2**40}), "outside the int32 range"),
    ("expression too deep", _set_arg("prefill", "vm.launch", 1, {"s": json.loads("[\"+\", " * 40 + "1" + "]" * 40)}),
     "deeper than 16"),
    ("unknown kernel", _set_arg("prefill", "vm.launch", 0, {"k": "evil"}), "is 'evil', which is not in manifest.json "
                                                                           "kernels.entries"),
    ("threads", _set_arg("prefill", "vm.launch", 2, {"i": 16}), "with 16 threads, but it was compiled for 8"),
    ("no separator", lambda bc: find(bc, "prefill", "vm.launch")["args"].remove({"str": "|"}), "with one '|'"),
    ("buffer after the separator", lambda bc: find(bc, "prefill", "vm.launch")["args"].append({"r": 2}),
     "must be a buffer (r or kv) before '|' and an int (s) after it"),
    ("too few buffers", lambda bc: find(bc, "prefill", "vm.launch")["args"].pop(3), "passes 2 buffers and 1 ints"),
]


@pytest.mark.parametrize("mutate,fragment", [c[1:] for c in BYTECODE], ids=[c[0] for c in BYTECODE])
def test_bytecode_rule(texts, mutate, fragment):
    m, bc = fresh(texts)
    mutate(bc)
    with pytest.raises(PackageError) as e:
        check(m, bc)
    msg = str(e.value)
    assert fragment in msg and msg.endswith("; recompile the package") and "\n" not in msg, msg


# ---- the memory plan and the launches at the bounds (dryrun.py) --------------------------------------

def _shrink_storage(m, bc):
    m["storages"][0]["bytes"] = 28672 - 4  # enough for one token, 4 bytes short of a full chunk
    set_memory(m)


def _raise_bounds(m, bc):  # the hostile tester's segfault: bounds raised, then a longer prompt
    m["bounds"].update(context_window=1024, prefill_chunk=1024)
    m["kv_cache"]["pool"].update(pages=64)  # a page pool that holds the raised window, as the check wants
    set_memory(m)


def _kv_copy(bc, fname="prefill", nth=0):
    return find(bc, fname, "vm.launch", "kv_copy", nth)


def _remove(bc, ins, fname="prefill"):
    code(bc, fname).pop(index_of(bc, fname, ins))


def _output_to_weight(m, bc):
    ins = find(bc, "prefill", "vm.launch", "rms_norm")
    ins["args"][5] = ins["args"][4]  # y := the norm's weight


def _scalar(kernel, value, fname="prefill"):
    def mutate(m, bc):
        ins = find(bc, fname, "vm.launch", kernel)
        ins["args"][sep(ins) + 1] = {"s": value}
    return mutate


def _kv_scalar(name, value):
    def mutate(m, bc):
        ins = _kv_copy(bc)
        scalars = m["kernels"]["entries"]["kv_copy"]["args"]["scalars"]
        ins["args"][sep(ins) + 1 + scalars.index(name)] = {"s": value}
    return mutate


def _reuse_storage(m, bc):
    """The second linear reads its input after its storage went to another tensor: move an alloc of that
    storage before it."""
    first = find(bc, "prefill", "vm.launch", "linear", 1)
    x = first["args"][3]["r"]
    alloc = next(ins for ins in code(bc) if ins.get("dst") == x)
    sid = alloc["args"][0]["i"]
    later = next(ins for ins in code(bc)[index_of(bc, "prefill", first) + 1:]
                 if ins.get("fn") == "vm.alloc" and ins["args"][0]["i"] == sid)
    code(bc).remove(later)
    code(bc).insert(index_of(bc, "prefill", first), later)


PLAN = [
    ("storage smaller than its tensors", _shrink_storage, "needs 28672 bytes of storage 0 for float32 [1, 128, 56], but "
                                                         "manifest.json storages[0].bytes is 28668"),
    ("bounds raised past the plan", _raise_bounds, "passes float32 [1024, 4, 8] (cache) as buffer 1 of kv_copy, "
                                                    "which takes float32 [128, 4, 8]"),
    ("match_shape disagrees", lambda m, bc: find(bc, "decode", "vm.match_shape", nth=2)["args"].__setitem__(2, {"s": 5}),
     "expects dimension 1 to be 5, but it is 4"),
    ("kv.begin reserves twice the tokens", lambda m, bc: find(bc, "prefill", "kv.begin")["args"].__setitem__(
        1, {"s": ["*", 2, "seq_len"]}), "a step must reserve its 1 new tokens"),
    ("vm.get of a tensor", lambda m, bc: code(bc, "decode").insert(5, {"op": "call", "fn": "vm.get",
                                                                      "args": [{"r": 19}, {"i": 0}], "dst": 26}),
     "needs tuple in register 19, which holds tensor float32 [1, 1, 32] (storage)"),
    ("seq_len passed as 1000", _scalar("take", 1000), "passes int32 [1, 1] (input) as buffer 1 of take, which takes "
                                                      "int32 [1, 1000]"),
    ("seq_len past int32", _scalar("take", ["+", "seq_len", 2**31 - 1]), "passes seq_len = 2147483648 to take, outside int32"),
    ("a size past 2^62", lambda m, bc: find(bc, "prefill", "vm.alloc")["args"].__setitem__(
        3, {"s": ["*", "seq_len", 2**31 - 1, 2**31 - 1, 2**31 - 1]}), "evaluates to more than 2^62"),
    ("groups changed", lambda m, bc: find(bc, "prefill", "vm.launch", "take")["args"].__setitem__(
        1, {"s": ["*", 5, "seq_len"]}), "launches 5 work-groups of take, which needs 4"),
    ("grid past max_grid^2", lambda m, bc: m["target"].update(max_grid=1), "at most 1^2"),
    ("kernel writes a weight", _output_to_weight, "lets rms_norm write its buffer 2, which is the weight [32]"),
    ("kv append at the wrong rows", _kv_scalar("offset", "total_len"), "lets kv_copy write rows 1..1 of the KV cache; "
                                                                       "this step's rows are 0..0"),
    ("kv append of the wrong heads", _kv_scalar("h", 5), "as buffer 0 of kv_copy, which takes float32 [1, 5, 8]"),
    ("kv append removed", lambda m, bc: _remove(bc, _kv_copy(bc)), "lets attention read layer 0's keys before this "
                                                                     "step's rows were appended"),
    ("a launch removed", lambda m, bc: _remove(bc, find(bc, "prefill", "vm.launch", "take")),
     "reads float32 [1, 1, 32] (storage) as buffer 0 of rms_norm before any kernel writes it"),
    ("storage reused too early", _reuse_storage, "after storage 4 was given to another tensor"),
    ("vocab_size not the logits'", lambda m, bc: m.update(vocab_size=200), "not the logits: float32 [1, 1, 200]"),
    ("result not a tensor", lambda m, bc: code(bc, "decode")[-1]["args"].__setitem__(0, {"r": 17}),
     "returns '(1,)', not the logits"),
]


@pytest.mark.parametrize("mutate,fragment", [c[1:] for c in PLAN], ids=[c[0] for c in PLAN])
def test_plan_rule(texts, mutate, fragment):
    m, bc = fresh(texts)
    mutate(m, bc)
    with pytest.raises(PackageError) as e:
        check(m, bc)
    msg = str(e.value)
    assert fragment in msg and msg.endswith("; recompile the package") and "\n" not in msg, msg


# ---- the order of Engine.load, and the VM's checks at run time ----------------------------------------

def test_everything_is_checked_before_a_device_opens(pkg, tmp_path, monkeypatch):
    """A package broken only in its plan is refused with the device opener never called."""
    import shutil

    from bad_inputs.common import reseal

    import deploycc.runtime.engine as engine_module

    bad = tmp_path / "pkg"
    shutil.copytree(pkg, bad)
    m, bc = read_docs(bad)
    _shrink_storage(m, bc)
    (bad / "manifest.json").write_text(json.dumps(m))
    reseal(bad)
    opened = []
    monkeypatch.setattr(engine_module, "open_device", lambda kind, **o: opened.append(kind))
    with pytest.raises(PackageError, match=r"storages\[0\].bytes is 28668"):
        engine_module.Engine.load(bad)
    assert opened == []


@pytest.fixture(scope="module")
def engine(pkg):
    from conftest import require_device

    require_device("opencl")
    from deploycc.runtime.engine import Engine

    return Engine.load(pkg)


def test_vm_refuses_seq_len_past_the_chunk(engine):
    """Past the engine's chunking, the VM itself: a prefill of more tokens than the plan is for."""
    from deploycc.runtime.vm import DTensor, VMError

    n = engine.prefill_chunk + 1
    with pytest.raises(VMError, match=rf"prefill: seq_len = {n} is outside 1..{engine.prefill_chunk}"):
        engine.vm.run("prefill", DTensor(engine.ids_buf, (1, n), "int32"), engine.cache)
    assert engine.cache.length == 0  # refused at the bind, before kv.begin and any launch


def test_vm_refuses_total_len_other_than_the_cache(engine, texts):
    """total_len is the cache's length: a bytecode that binds it from anything else stops at the bind."""
    from deploycc.runtime.vm import VM, VMError

    bc = fresh(texts)[1]
    bc = {**bc, "functions": {f: s for f, s in bc["functions"].items() if f in engine.vm.functions}}  # the engine's
    code(bc, "decode")[0]["args"][2] = {"bind": "total_len"}  # from the input's shape: 1, while the cache holds 0
    vm = VM(bc, engine.device, engine.vm.kernels, engine.vm.storages, engine.cache,
            bounds={"seq_len": engine.prefill_chunk, "total_len": engine.context_window})
    engine.reset()
    with pytest.raises(VMError, match="decode: total_len = 1, but the KV cache holds 0 tokens"):
        vm.run("decode", _ids(engine, 1), engine.cache)


def _ids(engine, n):
    from deploycc.runtime.vm import DTensor

    return DTensor(engine.ids_buf, (1, n), "int32")


def test_vm_refuses_a_grid_past_its_limit(engine, texts):
    from deploycc.runtime.vm import VM, VMError

    bc = fresh(texts)[1]
    bc = {**bc, "functions": {f: s for f, s in bc["functions"].items() if f in engine.vm.functions}}  # the engine's
    vm = VM(bc, engine.device, engine.vm.kernels, engine.vm.storages, engine.cache, max_grid=1)
    for name, fn in vm.functions.items():
        fn.preset.update(engine.vm.functions[name].preset)
    engine.reset()
    with pytest.raises(VMError, match=r"take1: 4 work-groups exceed the grid limit of 1\^2"):
        vm.run("decode", _ids(engine, 1), engine.cache)
    engine.reset()


@pytest.mark.parametrize("ids", [[5, 101], [-1], [2**31 - 1]])
def test_engine_refuses_token_ids_outside_the_vocabulary(engine, ids):
    from deploycc.runtime.vm import VMError

    engine.reset()
    with pytest.raises(VMError, match="is outside the vocabulary of 101"):
        engine.prefill(ids)
    assert engine.cache.length == 0
    assert engine.prefill([5, 100]).shape == (101,)
    engine.reset()
