"""llama.cpp's own C++ tools (llama-bench, llama-quantize) and SmolLM2-135M-Instruct GGUF files, for benchmarks.

    .venv/bin/python benchmarks/build_llama_cpp.py [--native] [--types Q4_0,Q4_K_M,...] [--bench] [--json]

llama.cpp is the peer deploycc is benchmarked against. Only PyPI and Debian are reachable, so its source
comes from PyPI's llama-cpp-python sdist (pinned below), which carries llama.cpp in vendor/llama.cpp.
Everything lives under $DEPLOYCC_HOME/llama.cpp/ (default ~/.cache/deploycc/llama.cpp/):

    sdist/llama_cpp_python-<ver>.tar.gz     `pip download --no-deps --no-binary :all:`
    src/llama.cpp/                          vendor/llama.cpp of that sdist (with convert_hf_to_gguf.py, gguf-py)
    build-avx2/bin/llama-{bench,quantize}   the default build: AVX2+FMA+F16C(+BMI2), no AVX512, no AMX,
                                            whatever the machine, so a comparison is AVX2 against AVX2
    build-native/bin/...                    with --native: -march=native (AMX turned off where the CPU has it:
                                            llama.cpp's AMX path segfaults on those machines)
    gguf/SmolLM2-135M-Instruct-{TYPE}.gguf  F16 from the HF checkpoint at $DEPLOYCC_HOME/models/SmolLM2-135M-Instruct
                                            (convert_hf_to_gguf.py, gguf-py from the sdist), the rest llama-quantize'd
    gguf/{SHAPE}-{TYPE}.gguf                with --models: random-weight checkpoints with the shapes of real models
                                            (SHAPES: Qwen2.5-0.5B, Llama-3.2-1B; SmolLM2's tokenizer, the vocabulary
                                            padded to the model's), made by transformers under models/{SHAPE}
    logs/                                   the output of every cmake / convert / quantize step

Each step is skipped when its output exists, so a second run costs a second. The build (targets
llama-bench and llama-quantize only, -j2, static libraries) takes 10-15 minutes on 2 cores. Progress
goes to stderr; --json prints {"llama_bench", "llama_quantize", "gguf": {TYPE: path}, ...} on stdout.

From another benchmark script:

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from build_llama_cpp import ensure
    paths = ensure()            # or ensure(native=True)
    paths["llama_bench"], paths["gguf"]["Q4_K_M"]

Types that need an importance matrix in this llama.cpp (none of the defaults do: IQ4_NL, Q3_K_M and
Q2_K quantize without one) are skipped with a message. Note that SmolLM2-135M's hidden size (576) is not
a multiple of 256, so llama-quantize gives the tensors with 576-wide rows of a K-quant file a fallback
type (it says which in logs/quantize-TYPE.log); count a file's tensor types with gguf-py's GGUFReader.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
MODEL_NAME = "SmolLM2-135M-Instruct"
TARGETS = ("llama-bench", "llama-quantize")
# Quantized types made by default; the last three are tried and skipped with a message when this
# llama.cpp's llama-quantize refuses them without an imatrix.
REQUIRED_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K_M", "Q5_K_M")
OPTIONAL_TYPES = ("IQ4_NL", "Q3_K_M", "Q2_K")
DEFAULT_TYPES = REQUIRED_TYPES + OPTIONAL_TYPES

# Options common to both builds. Only llama-bench and llama-quantize are built, but the tests, examples,
# server and app directories would still be configured (and the server pulls in the web UI), so turn
# them off; OpenSSL is only for common's HTTPS downloads, which the tools here never do.
COMMON_CMAKE = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",          # self-contained binaries, no RPATH to keep valid
    "-DGGML_OPENMP=ON",
    "-DLLAMA_CURL=OFF",                 # deprecated (ignored) in this llama.cpp, kept for older ones
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_COMMON=ON",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
]
AVX2_CMAKE = [
    "-DGGML_NATIVE=OFF",
    "-DGGML_SSE42=ON",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",                   # ggml's default with GGML_NATIVE=OFF; every AVX2 x86 CPU has it
    "-DGGML_AVX_VNNI=OFF",
    "-DGGML_AVX512=OFF",
    "-DGGML_AVX512_VBMI=OFF",
    "-DGGML_AVX512_VNNI=OFF",
    "-DGGML_AVX512_BF16=OFF",
]
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

# module name -> PyPI name, for what convert_hf_to_gguf.py may import that the interpreter lacks
PIP_NAMES = {"yaml": "pyyaml", "google": "protobuf", "sentencepiece": "sentencepiece", "tqdm": "tqdm",
             "requests": "requests", "safetensors": "safetensors", "numpy": "numpy", "torch": "torch",
             "transformers": "transformers", "jinja2": "jinja2", "tokenizers": "tokenizers"}


# --------------------------------------------------------------------------------------------- paths

def deploycc_home() -> Path:
    return Path(os.environ.get("DEPLOYCC_HOME") or Path.home() / ".cache" / "deploycc").expanduser()


def root_dir() -> Path:
    return deploycc_home() / "llama.cpp"


def src_dir() -> Path:
    return root_dir() / "src" / "llama.cpp"


def build_dir(native: bool) -> Path:
    return root_dir() / ("build-native" if native else "build-avx2")


def bin_path(native: bool, target: str) -> Path:
    return build_dir(native) / "bin" / target


def checkpoint_dir(model: str = MODEL_NAME) -> Path:
    return deploycc_home() / "models" / model


def gguf_path(qtype: str, model: str = MODEL_NAME) -> Path:
    return root_dir() / "gguf" / f"{model}-{qtype}.gguf"


# Random-weight checkpoints with the shapes (and so the bytes and the arithmetic per token) of real models that
# cannot be downloaded here; the rope scaling and the tokenizer are not theirs (SmolLM2's tokenizer, its
# vocabulary padded to the model's size by convert_hf_to_gguf.py), which changes neither speed.
SHAPES = {
    "Qwen2.5-0.5B-shaped": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "hidden_act": "silu"},
    "Llama-3.2-1B-shaped": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True, "hidden_act": "silu"},
    # SmolLM2-135M's own shape, for machines the real file cannot reach (benchmarks/gpu_check.sh on a lent GPU)
    "SmolLM2-135M-shaped": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "vocab_size": 49152, "max_position_embeddings": 8192, "rope_theta": 100000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True, "hidden_act": "silu"},
}
SHAPED_TYPES = ("Q4_0", "Q4_K_M")


def make_shaped(model: str) -> Path:
    """The random-weight checkpoint of SHAPES[model] (seed 0, transformers' own initialization, bfloat16
    safetensors) with SmolLM2's tokenizer files, under $DEPLOYCC_HOME/models/."""
    out = checkpoint_dir(model)
    if (out / "config.json").exists() and list(out.glob("*.safetensors")):
        log(f"{model}: {out} (exists)")
        return out
    tok = checkpoint_dir()
    if not (tok / "tokenizer.json").exists():
        raise RuntimeError(f"{tok} has no tokenizer.json (make it with scripts/fetch_smollm2.py)")
    t0 = time.time()
    log(f"{model}: random weights by transformers (seed 0) -> {out}")
    params = random_checkpoint(SHAPES[model], out, tok)
    log(f"{model}: {params / 1e6:.0f}M parameters, {time.time() - t0:.0f}s")
    return out


def random_checkpoint(spec: dict, out: Path, tok: Path) -> int:
    """A checkpoint of the config `spec` (with its "architectures"), random by transformers (seed 0, bfloat16
    safetensors), with the tokenizer files in `tok`, written to `out` whole or not at all; its parameter count."""
    import torch
    import transformers

    cfg = transformers.AutoConfig.for_model(**{k: v for k, v in spec.items() if k != "architectures"})
    cfg.architectures = spec["architectures"]
    cfg.bos_token_id, cfg.eos_token_id = 1, 2
    torch.manual_seed(0)
    net = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    net.save_pretrained(tmp, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tok / f).exists():
            shutil.copy(tok / f, tmp / f)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return sum(p.numel() for p in net.parameters())


# ------------------------------------------------------------------------------------------- helpers

def log(msg: str) -> None:
    print(f"[build_llama_cpp] {msg}", file=sys.stderr, flush=True)


def _run_logged(cmd: list[str], logfile: Path, *, cwd: Path | None = None, env: dict | None = None,
                check: bool = True) -> subprocess.CompletedProcess:
    """Run cmd with stdout+stderr to logfile; on failure (when check) raise with the log's tail."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed (exit {proc.returncode}); last lines of {logfile}:\n"
                           + _tail(logfile))
    return proc


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


@contextlib.contextmanager
def _lock():
    """One ensure() at a time per $DEPLOYCC_HOME (two benchmark scripts may call it at once)."""
    root_dir().mkdir(parents=True, exist_ok=True)
    with open(root_dir() / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# --------------------------------------------------------------------------------------------- steps

def fetch_source() -> Path:
    """The sdist from PyPI, and its vendor/llama.cpp extracted to src/llama.cpp."""
    src = src_dir()
    marker = src / ".deploycc-extracted"
    if marker.exists():
        log(f"source: {src} (exists, llama-cpp-python {marker.read_text().strip()})")
        return src
    sdist_dir = root_dir() / "sdist"
    sdist = sdist_dir / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    if sdist.exists():
        log(f"sdist: {sdist} (exists)")
    else:
        log(f"sdist: pip download llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} (about 75 MB, ~1 minute)")
        t0 = time.time()
        _run_logged([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                     f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(sdist_dir)],
                    root_dir() / "logs" / "pip-download.log")
        if not sdist.exists():
            found = sorted(sdist_dir.glob("llama_cpp_python-*.tar.gz"))
            raise RuntimeError(f"pip download left no {sdist.name} in {sdist_dir} (found {found})")
        log(f"sdist: {sdist} ({sdist.stat().st_size / 1e6:.1f} MB, {time.time() - t0:.0f}s)")

    log(f"source: extracting vendor/llama.cpp to {src}")
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
    tmp = Path(tempfile.mkdtemp(prefix="llama.cpp.", dir=src.parent if src.parent.exists()
                                else _mkdir(src.parent)))
    try:
        with tarfile.open(sdist) as tf:
            members = []
            for m in tf.getmembers():
                if m.name.startswith(prefix) and len(m.name) > len(prefix):
                    m.name = m.name[len(prefix):]
                    members.append(m)
            if not members:
                raise RuntimeError(f"{sdist} has no {prefix}")
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tf.extractall(tmp, members=members, **kwargs)
        for need in ("CMakeLists.txt", "convert_hf_to_gguf.py", "gguf-py/gguf/__init__.py",
                     "tools/llama-bench", "tools/quantize"):
            if not (tmp / need).exists():
                raise RuntimeError(f"{sdist}'s vendor/llama.cpp has no {need}")
        (tmp / ".deploycc-extracted").write_text(LLAMA_CPP_PYTHON_VERSION + "\n")
        if src.exists():
            shutil.rmtree(src)
        tmp.rename(src)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return src


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def _check_cmake_options(src: Path, args: list[str]) -> None:
    """Every -DGGML_*/-DLLAMA_* we pass must be an option (or known deprecated name) in this llama.cpp."""
    text = ""
    for f in list(src.glob("CMakeLists.txt")) + list((src / "ggml").glob("CMakeLists.txt")):
        text += f.read_text(errors="replace")
    missing = []
    for a in args:
        m = re.match(r"-D((?:GGML|LLAMA)_[A-Z0-9_]+)=", a)
        if m and not re.search(rf"(option\(\s*{m.group(1)}\b|llama_option_depr\(\s*\w+\s+{m.group(1)}\b)", text):
            missing.append(m.group(1))
    if missing:
        raise RuntimeError(f"this llama.cpp's CMake files have no option(s) {missing}; update build_llama_cpp.py")


def configure_args(native: bool) -> list[str]:
    args = list(COMMON_CMAKE)
    if native:
        args.append("-DGGML_NATIVE=ON")
        if "amx_tile" in cpu_flags():
            args += [f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}", f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}"]
    else:
        args += AVX2_CMAKE
    return args


def build(native: bool = False, src: Path | None = None) -> dict:
    """Configure (when the arguments changed) and build llama-bench and llama-quantize."""
    src = src or fetch_source()
    bdir = build_dir(native)
    args = configure_args(native)
    _check_cmake_options(src, args)
    stamp = bdir / ".deploycc-configure"
    stamp_text = json.dumps({"llama_cpp_python": LLAMA_CPP_PYTHON_VERSION, "args": args}, indent=1)
    bins = {t: bin_path(native, t) for t in TARGETS}
    name = bdir.name
    configured = stamp.exists() and stamp.read_text() == stamp_text and (bdir / "CMakeCache.txt").exists()
    if configured and all(b.exists() for b in bins.values()):
        log(f"{name}: llama-bench, llama-quantize exist ({bdir / 'bin'})")
        return {"build_dir": str(bdir), "build_seconds": 0.0}
    t0 = time.time()
    if not configured:
        if bdir.exists():
            shutil.rmtree(bdir)     # a changed configuration: start clean rather than half-reconfigured
        log(f"{name}: cmake configure ({' '.join(a for a in args if 'NATIVE' in a or 'AVX2' in a or 'FLAGS' in a)})")
        _run_logged(["cmake", "-S", str(src), "-B", str(bdir), *args], root_dir() / "logs" / f"{name}-configure.log")
        stamp.write_text(stamp_text)
    log(f"{name}: cmake --build --target {' '.join(TARGETS)} -j2 (10-15 minutes on 2 cores; "
        f"log: {root_dir() / 'logs' / (name + '-build.log')})")
    _run_logged(["cmake", "--build", str(bdir), "--config", "Release", "--target", *TARGETS, "-j2"],
                root_dir() / "logs" / f"{name}-build.log")
    for b in bins.values():
        if not b.exists():
            raise RuntimeError(f"the build finished but {b} is missing")
    secs = time.time() - t0
    log(f"{name}: built in {secs / 60:.1f} min")
    if not native:
        check_avx2_only(bdir)
    return {"build_dir": str(bdir), "build_seconds": secs}


def check_avx2_only(bdir: Path) -> None:
    """The AVX2 build's ggml-cpu sources were compiled with -mavx2 and with no AVX512/AMX/-march=native."""
    cc = bdir / "compile_commands.json"
    if not cc.exists():
        log("check: no compile_commands.json, skipping the flag check")
        return
    cmds = [e.get("command") or " ".join(e.get("arguments", [])) for e in json.loads(cc.read_text())
            if "ggml-cpu" in e.get("file", "")]
    bad = sorted({f for c in cmds for f in c.split()
                  if f.startswith(("-mavx512", "-mamx", "-march=native", "-mavxvnni"))})
    if not cmds or not all("-mavx2" in c.split() for c in cmds) or bad:
        raise RuntimeError(f"{bdir} is not an AVX2-only build: ggml-cpu flags {bad or 'lack -mavx2'}")
    log(f"check: {len(cmds)} ggml-cpu sources compiled with -mavx2 -mfma -mf16c, none with AVX512/AMX/native")


def _convert_python() -> tuple[str, dict]:
    """The interpreter and environment for convert_hf_to_gguf.py: this one (the project venv, with torch,
    transformers, numpy), gguf-py from the sdist first on PYTHONPATH."""
    env = dict(os.environ)
    paths = [str(src_dir() / "gguf-py"), str(src_dir())]
    extra = root_dir() / "convert-venv"
    py = sys.executable
    if (extra / "bin" / "python").exists():
        py = str(extra / "bin" / "python")
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    return py, env


def _install_missing(module: str) -> None:
    """A module convert_hf_to_gguf.py needs that this interpreter lacks goes into a venv of its own under
    $DEPLOYCC_HOME/llama.cpp/convert-venv, which also sees this interpreter's packages (a .pth file), so
    the project venv is never changed."""
    venv = root_dir() / "convert-venv"
    if not (venv / "bin" / "python").exists():
        log(f"convert: creating {venv} for missing module {module!r}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        site = subprocess.run([str(venv / "bin" / "python"), "-c",
                               "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        # after the venv's own packages: this interpreter's site-packages, .pth files included
        ours = [p for p in sys.path if p.endswith("site-packages")]
        Path(site, "zz_deploycc_parent.pth").write_text(
            "".join(f"import site; site.addsitedir({p!r})\n" for p in ours))
    pkg = PIP_NAMES.get(module.split(".")[0], module.split(".")[0])
    log(f"convert: pip install {pkg} into {venv}")
    _run_logged([str(venv / "bin" / "python"), "-m", "pip", "install", pkg],
                root_dir() / "logs" / f"convert-venv-pip-{pkg}.log")


# model_type -> HF architecture, for a config.json whose "architectures" is null (convert_hf_to_gguf.py picks
# its converter by architecture)
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM", "phi3": "Phi3ForCausalLM"}


def _convert_input(ckpt: Path) -> Path:
    """The checkpoint as convert_hf_to_gguf.py needs it. scripts/fetch_smollm2.py makes the SmolLM2
    checkpoint by dequantizing a GGUF with transformers, which leaves "architectures": null in config.json;
    then stage a copy (symlinks, and config.json with the architecture filled in from model_type) under
    $DEPLOYCC_HOME/llama.cpp/convert-input/ rather than touch the shared checkpoint."""
    cfg = json.loads((ckpt / "config.json").read_text())
    if cfg.get("architectures"):
        return ckpt
    mt = cfg.get("model_type")
    arch = ARCHITECTURES.get(mt)
    if arch is None:
        raise RuntimeError(f"{ckpt}/config.json has no architectures and model_type {mt!r} is not in "
                           "build_llama_cpp.ARCHITECTURES")
    staged = root_dir() / "convert-input" / ckpt.name
    if staged.exists():
        shutil.rmtree(staged)
    staged.mkdir(parents=True)
    for f in ckpt.iterdir():
        if f.name != "config.json":
            (staged / f.name).symlink_to(f.resolve())
    cfg["architectures"] = [arch]
    (staged / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    log(f"F16: {ckpt.name}/config.json has \"architectures\": null; converting a staged copy "
        f"({staged}) with [{arch!r}]")
    return staged


def convert_f16(model: str = MODEL_NAME) -> Path:
    out = gguf_path("F16", model)
    if out.exists():
        log(f"F16: {out} (exists)")
        return out
    ckpt = make_shaped(model) if model in SHAPES else checkpoint_dir()
    if not (ckpt / "config.json").exists() or not list(ckpt.glob("*.safetensors")) \
            or not ((ckpt / "tokenizer.json").exists() or (ckpt / "tokenizer.model").exists()):
        raise RuntimeError(f"{ckpt} is not a transformers checkpoint with safetensors and a tokenizer "
                           "(make it with scripts/fetch_smollm2.py)")
    ckpt = _convert_input(ckpt)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    logfile = root_dir() / "logs" / f"convert-{model}-F16.log"
    for attempt in range(6):
        py, env = _convert_python()
        log(f"F16: convert_hf_to_gguf.py --outtype f16 {ckpt} ({py})")
        script = [str(src_dir() / "convert_hf_to_gguf.py")]
        if model in SHAPES:
            # SmolLM2's tokenizer behind another architecture: convert_hf_to_gguf.py knows the pre-tokenizer by a
            # hash of the tokenizer's output that its llama path skips and its qwen2 path requires; name it
            script = ["-c", "import runpy, sys; from conversion import base; "
                            "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'smollm'; "
                            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')", *script]
        proc = _run_logged([py, *script, str(ckpt), "--outtype", "f16",
                            "--outfile", str(tmp)], logfile, cwd=src_dir(), env=env, check=False)
        if proc.returncode == 0 and tmp.exists():
            break
        m = re.search(r"ModuleNotFoundError: No module named '([\w.]+)'", logfile.read_text(errors="replace"))
        if m and attempt < 5:
            _install_missing(m.group(1))
            continue
        raise RuntimeError(f"convert_hf_to_gguf.py failed; last lines of {logfile}:\n{_tail(logfile)}")
    tmp.rename(out)
    log(f"F16: {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return out


def quantize(qtypes, llama_quantize: Path, f16: Path, model: str = MODEL_NAME) -> dict[str, str]:
    made = {}
    for q in qtypes:
        out = gguf_path(q, model)
        if out.exists():
            log(f"{q}: {out} (exists)")
            made[q] = str(out)
            continue
        tmp = out.with_name(out.name + ".part")
        logfile = root_dir() / "logs" / f"quantize-{model}-{q}.log"
        t0 = time.time()
        proc = _run_logged([str(llama_quantize), str(f16), str(tmp), q, "2"], logfile, check=False)
        if proc.returncode != 0 or not tmp.exists():
            tmp.unlink(missing_ok=True)
            text = logfile.read_text(errors="replace")
            needs_imatrix = "requires an importance matrix" in text or "requires an imatrix" in text
            if q not in REQUIRED_TYPES and (needs_imatrix or "invalid ftype" in text.lower()
                                            or "unknown" in text.lower()):
                why = "needs an importance matrix" if needs_imatrix else "not accepted by this llama-quantize"
                log(f"{q}: skipped, {why} (log: {logfile})")
                continue
            raise RuntimeError(f"llama-quantize {q} failed; last lines of {logfile}:\n{_tail(logfile)}")
        tmp.rename(out)
        log(f"{q}: {out} ({out.stat().st_size / 1e6:.1f} MB, {time.time() - t0:.0f}s)")
        made[q] = str(out)
    return made


def ensure(native: bool = False, types=DEFAULT_TYPES, shapes=(), shaped_types=SHAPED_TYPES) -> dict:
    """Build (or find) llama-bench/llama-quantize and the GGUF files; return their paths:

    {"llama_bench": str, "llama_quantize": str, "build_dir": str, "native": bool, "src": str,
     "llama_cpp_python": "0.3.36", "gguf": {"F16": str, "Q4_0": str, ...},
     "shaped": {SHAPE: {"F16": str, "Q4_0": str, ...}}}

    A type llama-quantize refuses without an imatrix is absent from "gguf". The GGUF files do not depend
    on the build (quantizing is deterministic), so the native and AVX2 builds share them."""
    with _lock():
        src = fetch_source()
        f16 = convert_f16()         # first: a minute, and it fails fast where the build would take 15
        info = build(native, src)
        quant = bin_path(native, "llama-quantize")
        gg = {"F16": str(f16)}
        gg.update(quantize([t for t in types if t != "F16"], quant, f16))
        shaped = {}
        for m in shapes:
            if m not in SHAPES:
                raise RuntimeError(f"unknown model shape {m!r}; known: {', '.join(SHAPES)}")
            sf16 = convert_f16(m)
            shaped[m] = {"F16": str(sf16), **quantize([t for t in shaped_types if t != "F16"], quant, sf16, m)}
    return {"llama_bench": str(bin_path(native, "llama-bench")),
            "llama_quantize": str(quant),
            "build_dir": info["build_dir"], "native": native, "src": str(src_dir()),
            "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION, "gguf": gg, "shaped": shaped}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--native", action="store_true",
                    help="build-native (-march=native, AMX off) instead of the AVX2-only build-avx2")
    ap.add_argument("--types", default=",".join(DEFAULT_TYPES),
                    help=f"comma-separated llama-quantize types (default {','.join(DEFAULT_TYPES)})")
    ap.add_argument("--shapes", default="", help=f"also these random-weight model shapes, quantized to "
                    f"{','.join(SHAPED_TYPES)} (known: {','.join(SHAPES)})")
    ap.add_argument("--bench", action="store_true",
                    help="afterwards run llama-bench -m Q4_K_M -p 128 -n 32 -t 2 as a smoke test")
    ap.add_argument("--json", action="store_true", help="print the paths as one JSON object on stdout")
    a = ap.parse_args(argv)
    t0 = time.time()
    paths = ensure(native=a.native, types=[t.strip() for t in a.types.split(",") if t.strip()],
                   shapes=[m for m in a.shapes.split(",") if m])
    log(f"done in {time.time() - t0:.0f}s")
    if a.bench:
        model = paths["gguf"].get("Q4_K_M") or paths["gguf"]["F16"]
        cmd = [paths["llama_bench"], "-m", model, "-p", "128", "-n", "32", "-t", "2"]
        log("$ " + " ".join(cmd))
        out = subprocess.run(cmd, capture_output=True, text=True)
        print(out.stdout, file=sys.stderr if a.json else sys.stdout, end="")
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            return out.returncode
    if a.json:
        print(json.dumps(paths, indent=2))
    elif not a.bench:
        print(f"llama-bench:    {paths['llama_bench']}\nllama-quantize: {paths['llama_quantize']}")
        for q, p in paths["gguf"].items():
            print(f"{q + ':':15s} {p}")
        for m, files in paths["shaped"].items():
            for q, p in files.items():
                print(f"{m} {q}: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
