"""Native code for the cpu target: the C compiler, the CPU's instruction sets, loading a module.

A cpu-target module is C source (targets/c.py) compiled into a shared object: at `deploycc compile`
time for a package (the .so ships inside it, built for the preset's ISA), or by the cpu device's
`build` for launch-by-launch use (tests). Both go through a cache keyed by the hash of source, flags and
compiler (its installed executable), so the same kernels are compiled once. Loading checks
that this CPU has every instruction-set flag the object was built for before it is mapped, so a
package for another CPU is a one-line error and never an illegal-instruction crash.

The compiler works in a marked scratch directory (runtime/scratch.py) inside the package's staging
directory or the cache, never in /tmp, and its process group dies with the process that started it,
so a killed compile leaves nothing that a later one does not remove.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from . import scratch
from .vm import SHAPE_VARS

# The CPU flags (as /proc/cpuinfo spells them) that code compiled for an ISA may use.
X86_64_V3 = ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "sse4_1", "sse4_2", "ssse3", "popcnt")
X86_64_V4 = X86_64_V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
ISA_FLAGS = {"generic": (), "x86-64-v3": X86_64_V3, "x86-64-v4": X86_64_V4}
# -march=native may use anything the compiling CPU has; these are the flags we record and check for it.
NATIVE_CANDIDATES = X86_64_V4 + ("avx512_vnni", "avx_vnni", "avx512_bf16", "avx512vbmi", "avx512_fp16",
                                 "amx_tile", "amx_int8", "amx_bf16", "gfni", "vpclmulqdq", "vaes")
MARCH = {"generic": "x86-64", "x86-64-v3": "x86-64-v3", "x86-64-v4": "x86-64-v4", "native": "native"}
INSTALL_CC = "install a C compiler: apt-get install gcc (Debian/Ubuntu), or pip install ziglang (python -m ziglang cc)"


# The step functions' layout, derived from the bytecode alone (deploycc/vm/capture.py writes the C from
# it; runtime/validate.py recomputes it and refuses a manifest that says otherwise).
HEAP = SHAPE_VARS  # h[0], h[1], ... of every step function
PROLOGUE = ("vm.match_shape", "kv.begin", "kv.pages", "vm.move")  # run in Python before the native call
EPILOGUE = ("vm.alloc", "vm.move", "vm.tuple", "vm.get")  # may build the returned tensor after it


def step_weights(bytecode: dict) -> list[str]:
    """dcc_w[] order: every function's weight parameters, then its constants, first appearance first."""
    out: list[str] = []
    for spec in bytecode["functions"].values():
        for name in list(spec["params"][spec["num_inputs"]:]) + [c[0] for c in spec["constants"]]:
            if name not in out:
                out.append(name)
    return out


def step_split(spec: dict) -> tuple[int, list[int]]:
    """(prologue length, epilogue instruction indices): the leading PROLOGUE instructions, and the
    instructions after them that compute the returned register (an EPILOGUE chain)."""
    ins = spec["instructions"]
    k = 0
    while k < len(ins) and ins[k].get("op") == "call" and ins[k].get("fn") in PROLOGUE:
        k += 1
    ret = next((i for i in range(k, len(ins)) if ins[i].get("op") == "ret"), None)
    if ret is None:
        raise NativeError("a step function has no ret after its prologue")
    defs = {}
    for i in range(k, ret):
        if ins[i].get("dst") is not None:
            defs[ins[i]["dst"]] = i
    out: set[int] = set()
    todo = [a["r"] for a in ins[ret]["args"] if isinstance(a, dict) and "r" in a]
    while todo:
        r = todo.pop()
        if r not in defs or defs[r] in out:
            continue
        x = ins[defs[r]]
        if x.get("fn") not in EPILOGUE:
            raise NativeError(f"the returned register is made by {x.get('fn')}, which has no native lowering")
        out.add(defs[r])
        todo += [a["r"] for a in x.get("args", []) if isinstance(a, dict) and "r" in a]
    return k, sorted(out)


# The step functions are the bytecode and the kernels' argument tables compiled in: the loader's checks (the
# schema, the dry run of every launch against those tables) hold for the native code only if it was compiled
# from exactly these documents. So the module records digests of them (the argument tables, and each bytecode
# function), and the loader compares them with the package's own: an edit of a bytecode function or of a
# kernel's argument table (which states the constant shapes its C reads, e.g. a weight's rows) is refused,
# instead of a step reading past a buffer. A function the bytecode no longer has is not looked for.
LOWERED_FROM = "dcc_lowered_from"


def lowered_digests(bytecode, entries) -> dict:
    """{"kernels": sha256 of manifest kernels.entries, "functions": {name: sha256 of bytecode.json's function}},
    of the documents as JSON gives them (sorted keys)."""
    def digest(doc) -> str:
        return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return {"kernels": digest(entries), "functions": {n: digest(f) for n, f in bytecode["functions"].items()}}


def check_lowered_from(lib: ctypes.CDLL, path: Path, bytecode: dict, entries: dict) -> None:
    try:
        recorded = json.loads(ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(lib, LOWERED_FROM))))
    except ValueError:  # no such symbol (or not JSON)
        recorded = None
    if type(recorded) is not dict or type(recorded.get("functions")) is not dict:
        raise NativeError(f"{path.name} does not record the bytecode it was compiled from (an older deploycc "
                          f"built it); recompile the package")
    want = lowered_digests(bytecode, entries)
    if recorded.get("kernels") != want["kernels"]:
        raise NativeError(f"{path.name} was compiled for other kernel argument tables than manifest.json "
                          f"kernels.entries (edited after the compile?); recompile the package")
    for name, digest in want["functions"].items():
        if recorded["functions"].get(name) != digest:
            raise NativeError(f"{path.name} was compiled from another bytecode.json function {name} (edited after "
                              f"the compile?); recompile the package")


class NativeError(RuntimeError):
    """No compiler, a failed build, or a module this CPU cannot run (one-line message)."""


def cpu_flags() -> set[str] | None:
    """This CPU's feature flags (Linux /proc/cpuinfo), or None where they cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else the machine type."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine() or "cpu"


def isa_flags(isa: str) -> list[str]:
    """The flags a module built for `isa` needs (native: what this CPU has of NATIVE_CANDIDATES)."""
    if isa == "native":
        have = cpu_flags() or set()
        return sorted(f for f in NATIVE_CANDIDATES if f in have)
    return sorted(ISA_FLAGS[isa])


def weight_interleave(isa: str) -> bool:
    """Whether packages for `isa` store 4-bit weights interleaved in 16s: the layout of the AVX-512 VNNI kernels
    (one output per lane of a 512-bit vpdpbusd) and of the AVX2 ones (two 8-lane halves, vpmaddubsw); plain C
    reads the plain layout faster."""
    return "avx2" in set(isa_flags(isa))


def check_cpu(required: list[str], what: str) -> None:
    have = cpu_flags()
    if have is None:
        return  # no cpuinfo to read (not Linux): the loader cannot tell, the module is tried as is
    lacking = [f for f in required if f not in have]
    if lacking:
        raise NativeError(f"{what} needs CPU features this CPU lacks ({', '.join(lacking)}); compile it for this "
                          f"machine with --device cpu (or cpu-avx2)")


def physical_cores() -> int:
    """Cores this process may run on, counting hyper-threads once."""
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:
        allowed = set(range(os.cpu_count() or 1))
    cores, cpu, phys = set(), None, "0"
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, val = line.partition(":")
                key, val = key.strip(), val.strip()
                if key == "processor":
                    cpu = int(val)
                elif key == "physical id":
                    phys = val
                elif key == "core id" and cpu in allowed:
                    cores.add((phys, val))
    except (OSError, ValueError):
        pass
    return max(1, min(len(cores) or len(allowed), len(allowed)))


def compiler() -> list[str]:
    """argv of the C compiler: $CC, cc, gcc, clang, or `python -m ziglang cc`."""
    env = os.environ.get("CC", "").split()
    for cand in ([env] if env else []) + [["cc"], ["gcc"], ["clang"]]:
        if shutil.which(cand[0]):
            return cand
    try:
        import ziglang  # noqa: F401
    except ImportError:
        raise NativeError(f"no C compiler found for the cpu target; {INSTALL_CC}") from None
    return [sys.executable, "-m", "ziglang", "cc"]


def compile_flags(isa: str, fast_math: bool) -> list[str]:
    flags = ["-O3", "-std=gnu11", "-fPIC", "-shared", "-pthread", f"-march={MARCH[isa]}", "-fno-plt",
             "-fvisibility=hidden", "-fno-semantic-interposition"]
    if isa == "x86-64-v4":
        flags.append("-mprefer-vector-width=512")
    if fast_math:  # -ffast-math's reassociation (vectorised reductions), without linking crtfastmath.o (gcc 12
        # links it into shared objects too, and it sets flush-to-zero for the whole process that loads the
        # package) and without -freciprocal-math (x / 127 must round as the numpy reference of the 8-bit
        # activations does)
        flags += ["-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math", "-fno-math-errno"]
    return flags


CC_WORK = ".cc-"  # the C compiler's work directories (runtime/scratch.py), inside the caller's own directory
# On Linux the compiler runs under this shell, which leads a session of its own: when the process that started it
# dies, even of SIGKILL, the shell gets SIGTERM (PR_SET_PDEATHSIG) and kills the whole group. A death signal for
# the driver alone would not be enough: cc1, as and ld, its children, would be orphaned and go on writing.
GUARD = 'trap "kill -s KILL 0" TERM; "$@" & wait $!'


def build_shared(source: str, out: Path, isa: str, fast_math: bool, work_in: Path) -> None:
    """Compile `source` into the shared object `out` (renamed into place whole). The compiler works, its temporary
    files included (TMPDIR), in a marked directory made inside `work_in` (on out's file system) and removed
    after: never in /tmp, so what a killed build leaves lies where the next build or compile removes it."""
    cc = compiler()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = scratch.make(work_in, CC_WORK)
    try:
        src = work / "module.c"
        src.write_text(source)
        obj = work / "module.so"
        code, stdout, stderr = _run_compiler(cc, compile_flags(isa, fast_math) + [str(src), "-o", str(obj), "-lm"],
                                             work)
        if code != 0:
            lines = [ln for ln in (stderr or stdout).splitlines() if "error" in ln.lower()] or \
                (stderr or stdout).splitlines()
            raise NativeError(f"the C compiler failed on the cpu kernels: {' | '.join(lines[:3])[:500]}")
        os.replace(obj, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_compiler(cc: list[str], args: list[str], work: Path, timeout: int = 600) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the compiler run in `work`. Its process group is killed with this process:
    on any exception here (Ctrl-C, the timeout) and, on Linux, when this process dies (GUARD)."""
    linux = sys.platform.startswith("linux")
    argv = ["/bin/sh", "-c", GUARD, "sh", *cc, *args] if linux else cc + args
    try:
        p = subprocess.Popen(argv, cwd=work, env={**os.environ, "TMPDIR": str(work)}, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                             preexec_fn=_parent_death_signal(signal.SIGTERM) if linux else None)
    except OSError as e:
        raise NativeError(f"the C compiler {' '.join(cc)} did not run ({e}); {INSTALL_CC}") from None
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except BaseException as e:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            raise NativeError(f"the C compiler {' '.join(cc)} did not finish within {timeout} s on the cpu "
                              f"kernels") from None
        raise
    return p.returncode, stdout, stderr


def _parent_death_signal(sig: int):
    """A preexec_fn: the child is sent `sig` when this process dies (Linux prctl PR_SET_PDEATHSIG); a child whose
    parent died before the prctl took effect exits at once. prctl is looked up here, before the fork."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def set_signal():
        prctl(1, sig)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)
    return set_signal


def cache_dir() -> Path:
    return Path(os.environ.get("DEPLOYCC_HOME", Path.home() / ".cache" / "deploycc")) / "native"


def compiler_id(cc: list[str]) -> str:
    """The compiler's executable as installed (its resolved path, size and modification time): part of the cache
    key, so that another compiler, or an upgraded one, builds anew. (No `cc --version` run: a stat costs nothing.)"""
    exe = shutil.which(cc[0])
    if exe is None:
        return ""
    real = os.path.realpath(exe)
    try:
        st = os.stat(real)
    except OSError:
        return real
    return f"{real} {st.st_size} {st.st_mtime_ns}"


def cached_path(source: str, isa: str, fast_math: bool) -> Path:
    """Where the cache keeps the shared object of `source` built with these flags by this compiler."""
    cc = compiler()
    key = hashlib.sha256("\0".join([source, isa, str(fast_math), " ".join(cc), compiler_id(cc),
                                    " ".join(compile_flags(isa, fast_math))]).encode()).hexdigest()[:32]
    return cache_dir() / f"{key}.so"


def build_cached(source: str, isa: str, fast_math: bool) -> Path:
    """The shared object of `source`, compiled once per (source, flags, compiler) into the cache. The work
    directories of builds that were killed are removed first (those of builds still running are left alone)."""
    out = cached_path(source, isa, fast_math)
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        scratch.remove_stale(out.parent, CC_WORK)
        build_shared(source, out, isa, fast_math, out.parent)
    return out


def build_package_library(source: str, out: Path, isa: str, fast_math: bool, work_in: Path) -> None:
    """build_shared() for a package, through the cache: a library built before from the same source with the same
    flags and compiler is copied (a whole shared object: check_elf), else the compiler builds it in `work_in` (the
    package's staging directory, as build_shared says) and a copy goes into the cache. Recompiling a model, or
    compiling it again for another output, runs the C compiler once. A cache that cannot be written is no error."""
    hit = cached_path(source, isa, fast_math)
    if hit.is_file():
        try:
            check_elf(hit)
            shutil.copy(hit, out)  # with its mode, as the compiler wrote it
            return
        except (NativeError, OSError):
            pass  # a damaged entry: built again below, and replaced
    build_shared(source, out, isa, fast_math, work_in)
    try:
        hit.parent.mkdir(parents=True, exist_ok=True)
        scratch.remove_stale(hit.parent, CC_WORK)
        work = scratch.make(hit.parent, CC_WORK)  # a copy killed halfway is a stale work directory, never an entry
        try:
            shutil.copy(out, work / hit.name)
            os.replace(work / hit.name, hit)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    except OSError:
        pass


def check_elf(path: Path) -> None:
    """A shared object whose loadable segments lie inside the file (mapping a truncated one dies of SIGBUS)."""
    import struct

    try:
        data = path.read_bytes()
    except OSError as e:
        raise NativeError(f"cannot read {path}: {e}; recompile the package") from None
    bad = NativeError(f"{path.name} is not a complete 64-bit shared object; recompile the package")
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise bad
    e_type, = struct.unpack_from("<H", data, 16)
    e_phoff, = struct.unpack_from("<Q", data, 32)
    e_shoff, = struct.unpack_from("<Q", data, 40)
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 54)
    if e_type != 3 or e_phentsize < 56 or e_phoff + e_phnum * e_phentsize > len(data) or e_shoff > len(data):
        raise bad
    for i in range(e_phnum):
        _, _, off, _, _, filesz = struct.unpack_from("<IIQQQQ", data, e_phoff + i * e_phentsize)
        if off + filesz > len(data):
            raise bad


def load(path: Path, required: list[str], threads: int = 0, symbols: tuple[str, ...] = ()) -> ctypes.CDLL:
    """Map a module after checking this CPU has every flag it was built for, that the file is a whole shared
    object and that it has `symbols`; start its thread pool."""
    check_cpu(required, f"the native module {path.name}")
    check_elf(path)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise NativeError(f"cannot load {path}: {str(e).splitlines()[0]}; recompile the package") from None
    for name in ("dcc_init", *symbols):
        if not hasattr(lib, name):
            raise NativeError(f"{path.name} has no function {name}: it is not this package's native module; "
                              f"recompile the package")
    lib.dcc_init.argtypes = [ctypes.c_int]
    lib.dcc_init.restype = ctypes.c_int
    lib.dcc_init(threads or physical_cores())
    return lib
