"""The command line: parse, call an importable function, render. Errors are one line, no traceback.

    deploycc compile MODEL --device PRESET|YAML [-o DIR]    a self-contained package (deploycc.package)
    deploycc run PKG|MODEL --prompt TEXT                     one reply, streamed
    deploycc chat PKG|MODEL                                  a REPL (runtime/cli.py holds the loop)
    deploycc bench PKG                                       prefill / decode tok/s, memory
    deploycc verify PKG [--against numpy|transformers]       package logits against a reference
    deploycc devices                                         runtimes on this machine, presets they can run
    deploycc inspect MODEL [--stage S | --kernels | --memory]
    deploycc keygen NAME / deploycc sign PKG --key NAME      Ed25519 keys and signed packages (cli_signing.py)

run, chat, serve, bench, verify and perplexity take --trust KEY.pub (and $DEPLOYCC_TRUSTED_KEYS): then only a
package signed by one of those keys loads (runtime/trust.py).

An uncompiled MODEL given with --device is compiled once into $DEPLOYCC_HOME/packages (default
~/.cache/deploycc/packages), keyed by the source files, the preset, the quantization and the context
window; without --device, run and chat use the numpy reference interpreter.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import click

from .cli_inspect import _size, inspect
from .cli_signing import keygen, sign, trust_option, trust_policy
from .errors import DeployError
from .runtime.cli import USER_ERRORS
from .runtime.server import ServeOptions
from .verify import Against

ERRORS = (DeployError, *USER_ERRORS)


def _generation_options(max_tokens: int):
    """The sampling options shared by run and chat (a decorator)."""
    options = [
        click.option("--max-tokens", type=click.IntRange(min=1), default=max_tokens, show_default=True),
        click.option("--temperature", type=click.FloatRange(min=0), default=None,
                     help="0 is greedy (argmax). Default: the model's generation_config.json, else llama.cpp's 0.8; "
                          "the same for the sampling options below."),
        click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=None,
                     help="1 means off. Default: 0.95."),
        click.option("--top-k", type=click.IntRange(min=0), default=None, help="0 means off. Default: 40."),
        click.option("--min-p", type=click.FloatRange(0, 1), default=None, help="0 means off. Default: 0.05."),
        click.option("--repetition-penalty", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="1 means off. Default: 1."),
        click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True),
        click.option("--device", default=None,
                     help="Preset name or YAML path: compile an uncompiled MODEL for it (cached) and run the package. "
                          "Without it, a MODEL runs on the numpy reference interpreter (exact but slow)."),
        click.option("--context-window", type=click.IntRange(min=1), default=None,
                     help="Upper bound of total_len for an uncompiled MODEL (default: from the config and preset)."),
        click.option("--revision", default=None, help="Hub revision when MODEL is a repo id."),
        trust_option,
    ]

    def decorate(f):
        for option in reversed(options):
            f = option(f)
        return f
    return decorate


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="deploycc")
def cli():
    """deploycc: compile Hugging Face LLMs for CUDA, OpenCL and WebGPU, and run them.

    PKG is a directory written by `deploycc compile`; MODEL is a checkpoint directory or a Hugging Face
    repo id."""


# ---- compile -----------------------------------------------------------------------------------

@cli.command(name="compile", short_help="Compile a model into a self-contained package for a device preset.")
@click.argument("model")
@click.option("--device", default=None,
              help="Device preset name (see `deploycc devices`) or a preset YAML file. Default: cpu (native C for this "
                   "CPU) when a C compiler is found, else cpu-opencl; a GPU needs its preset named.")
@click.option("--quantization", default=None,
              help="Weight quantization (default: the preset's; available: q0f32, q0f16, q4f16_1, q4f32_1, q4f16_2, q8f16_0).")
@click.option("--head-quantization", default=None,
              help="Quantization of the token embedding and output head (default: the same as --quantization); "
                   "q8f16_0 keeps them at 8 bits, as llama.cpp's Q4 files do.")
@click.option("--context-window", type=click.IntRange(min=1), default=None,
              help="Upper bound of total_len (default: the smaller of the preset's and the model's).")
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Change a preset value: prefill_chunk=256, context_window=2048, target.threads_per_block=128, ...")
@click.option("-o", "--output", default=None, help="Package directory (default: dist/MODEL-QUANT-PRESET).")
@click.option("--force", is_flag=True,
              help="Replace OUTPUT when it holds a package deploycc wrote (never a directory with anything else in it).")
@click.option("--revision", default=None, help="Hub revision (branch, tag or commit) when MODEL is a repo id.")
@click.option("--sign", "sign_key", default=None, metavar="KEY",
              help="Sign the package with this private key (deploycc keygen makes one): signature.json, checked by "
                   "--trust.")
@click.option("--activations", type=click.Choice(["auto", "8", "16"]), default="auto", show_default=True,
              help="Integer targets (cpu): the bits a linear's input is rounded to. auto: 16 for the linears whose "
                   "8-bit rounding costs most on a calibration text (deploycc/calibrate.py), 8 elsewhere.")
@click.option("--verify-kernels", is_flag=True,
              help="Before the package is written, run each kernel on this machine's device against its loop-level "
                   "program (as `verify PKG --kernels`); a kernel that disagrees writes nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (no progress display).")
def compile_cmd(model, device, quantization, head_quantization, context_window, overrides, output, force, revision,
                sign_key, activations, verify_kernels, as_json):
    """Compile MODEL into a self-contained package directory for a device preset."""
    from .package import compile_model

    with _CompileProgress(enabled=not as_json) as progress:
        path = compile_model(_source(model), device, quantization, context_window, tuple(overrides), output, force,
                             revision, progress=progress, head_quantization=head_quantization,
                             verify_kernels=verify_kernels, sign=sign_key,
                             activations=activations)
    manifest = json.loads((path / "manifest.json").read_text())
    summary = _package_summary(path, manifest)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(str(path))
    mem = summary["memory"]
    click.echo(f"{summary['preset']} ({summary['backend']}), {summary['quantization']}, context window "
               f"{summary['context_window']}: {summary['kernels']} kernels, weights {_size(mem['weights_bytes'])}, "
               f"KV cache {_size(mem['kv_cache_bytes'])}, activations {_size(mem['activation_bytes'])}")
    by_type = manifest["model"].get("weights_by_type")
    if by_type:
        click.echo(weights_by_type_text(by_type))
    if summary["web"]:
        click.echo(f"web bundle: `python -m http.server -b 127.0.0.1 -d {path}`, then open http://127.0.0.1:8000/ "
                   f"(a browser with WebGPU)")


def weights_by_type_text(rows: list[dict]) -> str:
    """A GGUF source's weights per stored type, kept or converted, and the package's weight bytes against the file's."""
    parts = [f"{r['type']}{'' if r['into'] == 'kept' else ' -> ' + r['into']} x{r['tensors']} {_size(r['package_bytes'])}"
             for r in rows]
    file, pkg = sum(r["file_bytes"] for r in rows), sum(r["package_bytes"] for r in rows)
    return (f"weights by GGUF type: {', '.join(parts)}; package {_size(pkg)} against the file's tensors "
            f"{_size(file)} ({pkg / max(file, 1):.2f}x)")


def _source(model: str) -> str:
    """A local checkpoint as an absolute path, so that the manifest's source works from any directory."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.is_dir() else model


def _package_summary(path: Path, manifest: dict) -> dict:
    return {"package": str(path), "model": manifest["model"]["architecture"], "source": manifest["model"]["source"],
            "preset": manifest["preset"]["name"], "backend": manifest["preset"]["backend"],
            "quantization": manifest["quantization"],
            "head_quantization": manifest.get("head_quantization", manifest["quantization"]),
            "context_window": manifest["bounds"]["context_window"],
            "prefill_chunk": manifest["bounds"]["prefill_chunk"], "kernels": len(manifest["kernels"]["entries"]),
            "memory": manifest.get("memory", {}), "web": "index.html" in manifest["files"],
            **({"weights_by_type": manifest["model"]["weights_by_type"]} if "weights_by_type" in manifest["model"] else {})}


class _CompileProgress:
    """compile_model's progress callback -> rich progress on stderr: one line per step, the weights
    counted tensor by tensor. Disabled, it is a no-op callback."""

    LABELS = {"calibrate": "calibrate (activation precision per linear)", "export": "export",
              "compile": "compile (passes, kernels, memory plan, bytecode)",
              "native": "C compiler (kernels and steps into kernels.so)", "weights": "write weights"}

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.progress = None
        self.task = None

    def __enter__(self):
        return self

    def _start(self) -> None:
        """On the first step, so that a compile refused before any work prints nothing but its error."""
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.progress = Progress(SpinnerColumn(finished_text="[green]✓"), TextColumn("{task.description}"),
                                 BarColumn(), TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                                 console=Console(stderr=True))
        self.progress.start()

    def __call__(self, step: str, name: str | None = None) -> None:
        if not self.enabled:
            return
        if self.progress is None:
            self._start()
        if step == "note":  # a line the compile must say (a GGUF type converted), above the progress display
            self.progress.console.print(name, markup=False, highlight=False)
            return
        if step == "weight":
            done = self.progress.tasks[self.task].completed + 1
            self.progress.update(self.task, completed=done, detail=f"{done} tensors  {name}")
            return
        self._finish()
        self.task = self.progress.add_task(self.LABELS.get(step, step), total=None, detail="")

    def _finish(self) -> None:
        if self.task is not None:
            t = self.progress.tasks[self.task]
            detail = f"{int(t.completed)} tensors" if t.completed else ""
            self.progress.update(self.task, total=max(t.completed, 1), completed=max(t.completed, 1), detail=detail)

    def __exit__(self, exc_type, exc, tb):
        if self.progress is not None:
            if exc_type is None:
                self._finish()
            elif not self.progress.console.is_terminal:
                self.progress.live.transient = True  # a log gets the error line alone
            self.progress.stop()
        return False


# ---- packages for run / chat / bench ---------------------------------------------------------------

def _home() -> Path:
    return Path(os.environ.get("DEPLOYCC_HOME") or Path.home() / ".cache" / "deploycc").expanduser()


def _is_package(path: Path) -> bool:
    """A package directory, or what is left of one (then the loader says what is missing)."""
    return path.is_dir() and any((path / f).exists() for f in ("manifest.json", "bytecode.json", "__main__.py"))


def _cache_key(model: str, revision: str | None, preset, quantization: str | None, context_window: int | None) -> str:
    """Source files (name, size, mtime), preset, quantization, context window and the compiler's own files:
    a changed checkpoint, preset or compiler compiles anew."""
    from . import __version__
    from .hub import resolve

    src = resolve(model, revision)
    files = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(src.iterdir()) if p.is_file()]
    key = {"source": str(src.resolve()), "revision": revision, "files": files, "target": preset.target.to_dict(),
           "backend": preset.backend, "preset": preset.name, "prefill_chunk": preset.prefill_chunk,
           "preset_context_window": preset.context_window, "quantization": quantization or preset.quantization,
           "context_window": context_window, "deploycc": __version__, "code": compiler_code_mtime_ns()}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def compiler_code_mtime_ns() -> int:
    """The newest modification time of the compiler's Python files (deploycc, models, runtime, targets) and of
    the browser bundle's sources (deploycc/web): a compiled package older than this may be stale (the package
    cache and benchmarks/ use it)."""
    roots = {Path(m.__file__).resolve().parent for m in _compiler_modules()}
    return max((p.stat().st_mtime_ns for r in roots for pattern in ("*.py", "*.js", "*.html") for p in r.rglob(pattern)),
               default=0)


def _compiler_modules():
    import deploycc
    import deploycc.models
    import deploycc.runtime
    import deploycc.targets

    return (deploycc, deploycc.models, deploycc.runtime, deploycc.targets)


def _open_package(model: str, device: str | None, context_window: int | None, revision: str | None, quiet: bool,
                  paged: bool | str = False, trust=None):
    """(engine, info) for a package directory, or for MODEL compiled for --device into the cache;
    None when MODEL is an uncompiled checkpoint and no --device was given. paged: the engine of batched steps.
    trust: a TrustPolicy (runtime/trust.py); a package of the cache is unsigned, so under one it is refused."""
    from . import presets
    from .runtime.engine import Engine
    from .runtime.package import PackageError, load_manifest

    path = Path(model).expanduser()
    if _is_package(path):
        manifest = load_manifest(path, trust)  # checked: the fields below are read before Engine.load
        if device is not None:
            preset = presets.load(device)
            if preset.target.to_dict() != manifest["target"] or preset.backend != manifest["preset"]["backend"]:
                raise DeployError(f"{model} is a package compiled for {manifest['preset']['name']}; --device applies to "
                                  f"an uncompiled MODEL (recompile: deploycc compile SOURCE --device {device})")
        ctx = manifest["bounds"]["context_window"]
        if context_window is not None and context_window != ctx:
            raise DeployError(f"{model} was compiled with a context window of {ctx}; --context-window applies to an "
                              f"uncompiled MODEL (recompile with deploycc compile --context-window {context_window})")
        return Engine.load(path, paged=paged, trust=trust), {"package": str(path), "device": manifest["preset"]["name"]}
    if device is None:
        return None
    if trust is not None:
        raise DeployError(f"a trust policy (--trust, DEPLOYCC_TRUSTED_KEYS) runs only signed packages, and {model} "
                          f"compiled for --device would be an unsigned one; compile it with deploycc compile --sign KEY "
                          f"and run that package")
    from .package import compile_model

    preset = presets.load(device)
    out = _home() / "packages" / _cache_key(model, revision, preset, None, context_window)
    info = {"package": str(out), "model": model, "device": preset.name}
    if (out / "manifest.json").exists():
        try:
            return Engine.load(out, paged=paged), info
        except PackageError as e:  # a damaged entry of deploycc's own cache (named by its key): compile it anew
            if not quiet:
                click.echo(f"the cached package {out} is damaged ({e}); compiling it again", err=True)
            shutil.rmtree(out, ignore_errors=True)
    if not quiet:
        click.echo(f"compiling {model} for {preset.name} into {out}", err=True)
    with _CompileProgress(enabled=not quiet) as progress:
        compile_model(_source(model), device, None, context_window, (), str(out), True, revision, progress=progress)
    return Engine.load(out, paged=paged), info


def _checked_tokenizer(model: str, revision: str | None, prompt: str | None, chat: bool):
    """(loaded checkpoint, tokenizer) of an uncompiled MODEL, checked before any compile or model work: the
    tokenizer loads and fits the model's vocabulary, and the chat template renders (run's prompt; for chat,
    whose `prompt` is None, a one-message probe)."""
    from .hub import load_model
    from .runtime.cli import require_chat_template
    from .runtime.generate import encode_prompt
    from .runtime.tokenizer import Tokenizer

    loaded = load_model(model, revision)
    tok = Tokenizer.from_dir(loaded.path, vocab_size=loaded.config.vocab_size)
    if prompt is None:
        require_chat_template(tok, model)
        encode_prompt(tok, [{"role": "user", "content": "Hello"}])
    else:
        encode_prompt(tok, prompt, chat)
    return loaded, tok


def _session(model, device, context_window, revision, quiet, prompt: str | None = None, chat: bool = True,
             trust=None):
    """(session, tokenizer, info) for run (`prompt`) and chat (no prompt): a package's engine, MODEL compiled
    for --device (cached), or MODEL on the numpy reference."""
    if not _is_package(Path(model).expanduser()):
        loaded, tok = _checked_tokenizer(model, revision, prompt, chat)
        if device is None:
            from .session import reference_session

            return reference_session(loaded, context_window=context_window), tok, {"model": model, "device": "reference"}
    from .runtime.batch import session_of

    engine, info = _open_package(model, device, context_window, revision, quiet, paged="auto", trust=trust)
    if engine.f16:  # WebGPU: whether the kernels read f16 natively (shader-f16) or from packed words
        info = {**info, "f16": engine.f16}
    return session_of(engine), engine.tokenizer, info


# ---- run / chat --------------------------------------------------------------------------------

@cli.command(short_help="One reply to a prompt, streamed to stdout.")
@click.argument("model")
@click.option("--prompt", required=True, help="The user message (the chat template is applied).")
@click.option("--no-chat", is_flag=True, help="Feed the prompt as raw text, without the chat template.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (prompt, prompt_ids, generated ids, text, sampler, timings) instead of "
                   "streaming.")
@_generation_options(max_tokens=64)
def run(model, prompt, no_chat, as_json, max_tokens, temperature, top_p, top_k, min_p, repetition_penalty, seed,
        device, context_window, revision, trust):
    """Generate a reply to PROMPT, streaming to stdout.

    MODEL is a compiled package directory (run on its device), or a checkpoint / Hub id: with --device
    it is compiled for that preset first (cached under ~/.cache/deploycc/packages); without --device
    it runs on the numpy reference interpreter, which is exact but slow."""
    from .runtime.cli import run_prompt, sampling_options, with_model_sampling
    from .runtime.tokenizer import clean_text

    options = sampling_options(max_tokens, temperature, top_p, top_k, repetition_penalty, seed, min_p)
    prompt = clean_text(prompt)  # undecodable bytes of argv arrive as lone surrogates: U+FFFD, as chat clients show
    session, tok, info = _session(model, device, context_window, revision, as_json, prompt, not no_chat,
                                  trust_policy(trust))
    try:
        run_prompt(session, tok, prompt, chat=not no_chat, as_json=as_json, info=info,
                   **with_model_sampling(options, tok))
    except ERRORS:
        raise
    except ValueError as e:  # an empty prompt, and the like
        raise DeployError(str(e)) from None


@cli.command(short_help="Interactive multi-turn chat with a package or model, streaming.")
@click.argument("model")
@click.option("--system", default=None, help="System prompt (change it in the chat with /system TEXT).")
@_generation_options(max_tokens=256)
def chat(model, system, max_tokens, temperature, top_p, top_k, min_p, repetition_penalty, seed, device,
         context_window, revision, trust):
    """Chat with MODEL: streaming replies, multi-turn history, /reset, /stats, /system TEXT, /exit.

    Reads stdin when it is not a terminal (one message per line, replies only). MODEL is a package, or
    a checkpoint compiled for --device first (cached), or without --device the numpy reference."""
    from .runtime.cli import chat_repl, sampling_options, with_model_sampling

    options = sampling_options(max_tokens, temperature, top_p, top_k, repetition_penalty, seed, min_p)
    session, tok, info = _session(model, device, context_window, revision, False, trust=trust_policy(trust))
    if info.get("device") == "reference" and sys.stdin.isatty():
        click.echo("(no --device: the numpy reference interpreter runs this model; exact but slow)", err=True)
    name = Path(info.get("package") or model).name if "model" not in info else model
    return chat_repl(session, tok, name=name, system=system, errors=ERRORS, **with_model_sampling(options, tok))


# ---- serve -------------------------------------------------------------------------------------

@cli.command(short_help="An OpenAI-compatible HTTP server for a package or model.")
@click.argument("model")
@click.option("--device", default=None, help="Compile MODEL for this preset first (cached); a package runs as compiled.")
@click.option("--context-window", type=click.IntRange(min=1), default=None, help="With --device: the context window.")
@click.option("--revision", default=None, help="Hub revision of MODEL.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (this machine only by default).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--api-key", default=None, help="Require 'Authorization: Bearer KEY' on every /v1 call.")
@click.option("--max-queue", type=click.IntRange(min=1), default=16, show_default=True,
              help="Requests that may wait for the engine; beyond it the server answers 429.")
@click.option("--model-name", default=None, help="The model id clients name (default: the package's directory name).")
@click.option("--max-num-sequences", type=click.IntRange(min=1), default=None,
              help="Requests batched at once (default: the package's max_num_sequences, 16 unless compiled otherwise).")
@click.option("--allowed-hosts", default=None,
              help="Host headers to answer, comma-separated HOST or HOST:PORT, or '*' for any (default: the bound "
                   "address and localhost names; IP addresses always). Refuses pages of other sites reaching a local "
                   "server by DNS rebinding.")
@click.option("--max-body-bytes", type=click.IntRange(min=1), default=ServeOptions.max_body_bytes, show_default=True,
              help="Largest request body; beyond it the server answers 413.")
@click.option("--shutdown-timeout", type=click.FloatRange(min=0), default=ServeOptions.shutdown_timeout,
              show_default=True, help="Seconds the requests in flight get after SIGTERM or Ctrl-C; a second signal "
                                      "exits at once.")
@trust_option
def serve(model, device, context_window, revision, host, port, api_key, max_queue, model_name, max_num_sequences,
          allowed_hosts, max_body_bytes, shutdown_timeout, trust):
    """Serve MODEL (a package, or a checkpoint compiled for --device) with OpenAI's API:
    POST /v1/chat/completions and /v1/completions (streamed as server-sent events or whole), GET /v1/models,
    /health and /metrics (Prometheus). Up to --max-num-sequences requests run at once with continuous batching
    over a paged KV cache; up to --max-queue more wait."""
    from .runtime.server import allowed_hosts as parse_hosts
    from .runtime.server import serve as run_server

    opened = _open_package(model, device, context_window, revision, False, paged=True, trust=trust_policy(trust))
    if opened is None:
        raise DeployError(f"{model} is not a package; give --device PRESET to compile it first (e.g. --device cpu)")
    engine, info = opened
    options = ServeOptions(host, port, api_key, max_queue, max_num_sequences, shutdown_timeout, max_body_bytes,
                           parse_hosts(allowed_hosts))
    run_server(engine, model_name or Path(info.get("package") or model).name, options)


# ---- bench -------------------------------------------------------------------------------------

@cli.command(short_help="Prefill / decode tokens per second and memory of a package.")
@click.argument("package")
@click.option("--prompt-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--gen-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random prompt ids.")
@click.option("--device", default=None, help="Compile an uncompiled MODEL for this preset first (cached).")
@click.option("--profile", is_flag=True,
              help="Also break a decode step down: device time per kernel, host (VM + enqueue) time (cpu, OpenCL, "
                   "CUDA).")
@click.option("--roofline", is_flag=True,
              help="cpu and cuda: with --profile's table, the read bandwidth before and after (cpu: one thread, all "
                   "threads; cuda: the GPU's memory), the bytes a decode step reads, achieved GB/s and the fraction "
                   "of the roofline, per step and per kernel.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--sequences", default=None, metavar="N,N,...",
              help="Batched decode of this many sequences at once (e.g. 1,4,8): the serving capacity of the batched step.")
@trust_option
def bench(package, prompt_len, gen_len, repeat, seed, device, profile, roofline, as_json, sequences, trust):
    """Prefill and decode tokens per second of PACKAGE (medians after a warm-up), peak RSS, device memory; with
    --sequences, the aggregate decode tok/s of batched steps over that many sequences."""
    from .runtime.cli import batch_bench, batch_bench_lines, parse_counts, profile_decode
    from .runtime.cli import bench as run_bench

    counts = None
    if sequences is not None:
        try:
            counts = parse_counts(sequences)
        except ValueError as e:
            raise DeployError(str(e)) from None
        if profile or roofline:
            raise DeployError("--profile and --roofline break down a single-sequence decode step; they do not combine "
                              "with --sequences")
    opened = _open_package(package, device, None, None, as_json, paged=counts is not None, trust=trust_policy(trust))
    if opened is None:
        raise DeployError(f"{package} is not a compiled package; compile it (deploycc compile {package} --device PRESET) "
                          f"or pass --device PRESET")
    if counts is not None:
        r = batch_bench(opened[0], counts, prompt_len, gen_len, seed)
        click.echo(json.dumps(r, indent=2) if as_json else "\n".join(batch_bench_lines(r)))
        return
    r = run_bench(opened[0], prompt_len, gen_len, repeat, seed)
    if roofline:
        from .runtime import roofline as rl

        before = rl.probe(opened[0])
        if before is None:
            raise DeployError(f"--roofline needs a cpu package compiled by this deploycc (its native module has the "
                              f"bandwidth probe) or a cuda one; recompile {package}")
        r["profile"] = profile_decode(opened[0], prompt_len)
        r["roofline"] = rl.roofline(opened[0], r["profile"], before, rl.probe(opened[0]), prompt_len)
    elif profile:
        r["profile"] = profile_decode(opened[0], prompt_len)
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"bench {r['package']}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    m = r["device_memory"]
    for k, v in [("preset", r["preset"]), ("device", r["device"]), ("prompt / generated tokens", f"{prompt_len} / {gen_len}"),
                 ("prefill", f"{r['prefill_tok_s']:.1f} tok/s"), ("decode", f"{r['decode_tok_s']:.1f} tok/s"),
                 ("repeats (median)", str(repeat)), ("peak RSS", _size(r["peak_rss_bytes"])),
                 ("device memory", _size(m["total_bytes"])), ("  weights", _size(m["weights_bytes"])),
                 ("  KV cache", _size(m["kv_cache_bytes"])), ("  activations", _size(m["activation_bytes"]))]:
        t.add_row(k, v)
    Console().print(t)
    if "profile" in r:
        pr = r["profile"]
        pt = Table(title=(f"decode step: {pr['wall_ms_per_token']:.2f} ms wall, {pr['kernel_ms_per_token']:.2f} ms in "
                          f"{pr['launches_per_token']:.0f} kernels, {pr['host_ms_per_token']:.2f} ms host (VM + enqueue, "
                          f"overlapping the kernels)"))
        roof = r.get("roofline")
        from .runtime import roofline as rl

        cols = ("kernel", "launches / token", "us each", "ms / token", "share") + (rl.COLUMNS if roof else ())
        for col in cols:
            pt.add_column(col, justify="left" if col == "kernel" else "right")
        for k in pr["kernels"][:15]:
            extra = rl.kernel_cells(k) if roof else ()
            pt.add_row(k["kernel"], f"{k['launches_per_token']:.0f}", f"{k['us_each']:.1f}", f"{k['ms_per_token']:.2f}",
                       f"{100 * k['share']:.1f}%", *extra)
        Console(width=max(Console().width, 150)).print(pt)
        if roof:
            click.echo("\n".join(rl.roofline_lines(roof)))


@cli.command(short_help="Perplexity of a package on a text file (sliding windows).")
@click.argument("package")
@click.option("--text", "text_file", required=True, type=click.Path(exists=True, dir_okay=False),
              help="A UTF-8 text file.")
@click.option("--window", type=click.IntRange(min=2), default=512, show_default=True, help="Tokens per prefill.")
@click.option("--stride", type=click.IntRange(min=1), default=512, show_default=True,
              help="Tokens between window starts (each token is scored once).")
@click.option("--device", default=None, help="Device kind to run on (default: the package's backend).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@trust_option
def perplexity(package, text_file, window, stride, device, as_json, trust):
    """exp(mean NLL) of every token of the text after the first, scored once, by PACKAGE."""
    from .perplexity import package_perplexity, read_text_file

    policy = trust_policy(trust)
    text = read_text_file(text_file)
    r = package_perplexity(package, text, window, stride, device, policy)
    if as_json:
        click.echo(json.dumps({"package": str(package), "text": str(text_file), **r.to_dict()}, indent=2))
        return
    click.echo(f"perplexity {r.perplexity:.4f}  (mean NLL {r.mean_nll:.5f}, {r.tokens_scored} tokens, "
               f"{r.windows} windows of {window}, stride {stride})")


# ---- verify ------------------------------------------------------------------------------------

@cli.command(short_help="Check a package's logits against a reference: numpy (same quantization) or transformers.")
@click.argument("package")
@click.option("--source", default=None, help="The model the package was compiled from (default: the manifest's source).")
@click.option("--against", type=click.Choice([a.value for a in Against]), default=Against.NUMPY.value, show_default=True,
              help="numpy: deploycc's numpy reference of the package's own quantization. transformers: the source "
                   "under transformers in float32 (needs torch and transformers), its weights rounded by the package's "
                   "scheme; the distance to the unrounded float model is reported too.")
@click.option("--steps", type=click.IntRange(min=0), default=8, show_default=True, help="Decode steps per prompt.")
@click.option("--tolerance", type=click.FloatRange(min=0), default=None,
              help="Largest allowed |logit difference| (default: 1e-3, what a correct package meets on every backend).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random prompts.")
@click.option("--kernels", is_flag=True,
              help="Instead: run each kernel on this machine's device against its loop-level program, on random inputs at "
                   "the corners of its size bounds (what `python PKG verify --kernels` runs); --seed and --json apply.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@trust_option
def verify(package, source, against, steps, tolerance, seed, as_json, kernels, trust):
    """Run PACKAGE and a reference side by side on random prompts (1, 7 and prefill_chunk+3 tokens, at most
    33) and greedy decode steps on the reference's path; report the difference per step; exit 1 when the
    package fails the tolerance."""
    policy = trust_policy(trust)
    if kernels:
        from .runtime.kernel_check import verify_command

        report = verify_command(package, as_json, seed, trust=policy)
        if not report.passed:
            raise DeployError(report.failure)
        return
    from .verify import verify_package

    report = verify_package(package, source, Against(against), steps, tolerance, seed, policy)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        _render_verify(report)
    if not report.passed:
        raise DeployError(report.failure)


def _render_verify(report) -> None:
    from rich.console import Console
    from rich.table import Table

    from .verify import summary

    c = report.criterion
    limit = c.limit
    t = Table(title=f"{report.package} against {report.reference}")
    for col in ("prompt", "step", "max |diff|", "rel RMS", "KL", "top-1"):
        t.add_column(col, justify="right")
    for s in report.steps:
        diff, rel = f"{s.max_abs_diff:.3e}", f"{s.rel_rms:.2e}"
        if c.metric == "max_abs_diff" and s.max_abs_diff > limit:
            diff = f"[red]{diff}[/red]"
        elif c.metric == "rel_rms" and s.rel_rms > limit:
            rel = f"[red]{rel}[/red]"
        top1 = f"{s.top1_agree}/{s.positions}" if s.positions > 1 else ("same" if s.argmax_match else "differs")
        t.add_row(str(s.prompt_len), str(s.step), diff, rel, f"{s.kl:.2e}",
                  top1 if s.argmax_match else f"[yellow]{top1}[/yellow]")
    Console().print(t)
    if report.float_steps:
        f = summary(report.float_steps)
        click.echo(f"the unrounded float model: largest difference {f['max_abs_diff']:.3g}, relative RMS error "
                   f"{f['rel_rms']:.3g}, KL {f['kl']:.3g} nats, top-1 agreement {f['top1_agreement']:.1%} "
                   f"(what {report.quantization} costs; not checked)")
    if report.passed:
        click.echo(f"ok: against {report.reference}: {report.measured:.3e}, within {c.describe()}")


# ---- devices -----------------------------------------------------------------------------------

@cli.command(short_help="Device runtimes on this machine and the presets they can run.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def devices(as_json):
    """The device runtimes this machine has (OpenCL, WebGPU, CUDA, host) and the presets it can run."""
    from . import presets
    from .runtime.devices import available

    found = available()
    usable = {d["kind"] for d in found if d.get("name")}
    errors = {d["kind"]: d["details"].get("error") for d in found if not d.get("name")}
    rows = []
    for name in presets.names():
        p = presets.load(name)
        ok = p.backend in usable
        rows.append({"name": name, "backend": p.backend, "target": p.target.kind, "description": p.description,
                     "runnable": ok, "reason": None if ok else errors.get(p.backend) or f"no {p.backend} device found"})
    if as_json:
        click.echo(json.dumps({"devices": found, "presets": rows}, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title="device runtimes")
    for col in ("kind", "device", "details"):
        t.add_column(col)
    for d in found:
        t.add_row(d["kind"], d.get("name") or "[red]unavailable[/red]", _device_details(d))
    console.print(t)
    t = Table(title="presets")
    for col in ("preset", "backend", "runs here", "description"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["backend"], "[green]yes[/green]" if r["runnable"] else "[red]no[/red]", r["description"])
    console.print(t)


def _device_details(d: dict) -> str:
    x = d.get("details") or {}
    if "error" in x:
        return str(x["error"])
    keys = ("platform", "backend", "adapter_type", "compute_units", "global_mem_size", "machine")
    parts = [f"{k}={_size(x[k]) if k.endswith('_size') else x[k]}" for k in keys if k in x]
    return ", ".join(parts) + (" (default)" if x.get("default") else "")


cli.add_command(inspect)
cli.add_command(keygen)
cli.add_command(sign)


# ---- entry point -------------------------------------------------------------------------------

def _terminated(signum, frame):
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C: a compile's staging directory is removed on the way out


def main() -> None:
    signal.signal(signal.SIGTERM, _terminated)  # `serve` installs its own while it serves
    try:
        rv = cli.main(standalone_mode=False)
    except ERRORS as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.exceptions.NoArgsIsHelpError as e:  # `deploycc` or `deploycc compile` alone: the help text
        e.show()
        sys.exit(e.exit_code)
    except click.UsageError as e:  # a bad option value: one line, with where to look (exit 2, the usage convention)
        where = f"; see '{e.ctx.command_path} --help'" if e.ctx is not None else ""
        click.echo(f"error: {e.format_message().rstrip('.')}{where}", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # `deploycc run ... | head`: the reader left
        from .runtime.cli import quiet_stdout

        quiet_stdout()
        sys.exit(0)
    except OSError as e:  # a file we cannot write or read: say which, without a traceback
        where = f": {e.filename}" if e.filename else ""
        click.echo(f"error: {e.strerror or e}{where}", err=True)
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
