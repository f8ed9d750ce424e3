"""Packages for run / chat / serve / bench: a package directory as it is, or an uncompiled MODEL compiled for --device
once into deploycc's cache ($DEPLOYCC_HOME/packages, keyed by the source files, the preset, the quantization, the
context window and the compiler's own files), with compile's progress display."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import click

from .errors import DeployError


def source_path(model: str) -> str:
    """A local checkpoint as an absolute path, so that the manifest's source works from any directory."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.is_dir() else model


class CompileProgress:
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

def deploycc_home() -> Path:
    return Path(os.environ.get("DEPLOYCC_HOME") or Path.home() / ".cache" / "deploycc").expanduser()


def is_package(path: Path) -> bool:
    """A package directory, or what is left of one (then the loader says what is missing)."""
    return path.is_dir() and any((path / f).exists() for f in ("manifest.json", "bytecode.json", "__main__.py"))


def cache_key(model: str, revision: str | None, preset, quantization: str | None, context_window: int | None) -> str:
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


def open_package(model: str, device: str | None, context_window: int | None, revision: str | None, quiet: bool,
                  paged: bool | str = False, trust=None):
    """(engine, info) for a package directory, or for MODEL compiled for --device into the cache;
    None when MODEL is an uncompiled checkpoint and no --device was given. paged: the engine of batched steps.
    trust: a TrustPolicy (runtime/trust.py); a package of the cache is unsigned, so under one it is refused."""
    from . import presets
    from .runtime.engine import Engine
    from .runtime.package import PackageError, load_manifest

    path = Path(model).expanduser()
    if is_package(path):
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
    out = deploycc_home() / "packages" / cache_key(model, revision, preset, None, context_window)
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
    with CompileProgress(enabled=not quiet) as progress:
        compile_model(source_path(model), device, None, context_window, (), str(out), True, revision, progress=progress)
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


def session_for(model, device, context_window, revision, quiet, prompt: str | None = None, chat: bool = True,
             trust=None):
    """(session, tokenizer, info) for run (`prompt`) and chat (no prompt): a package's engine, MODEL compiled
    for --device (cached), or MODEL on the numpy reference."""
    if not is_package(Path(model).expanduser()):
        loaded, tok = _checked_tokenizer(model, revision, prompt, chat)
        if device is None:
            from .session import reference_session

            return reference_session(loaded, context_window=context_window), tok, {"model": model, "device": "reference"}
    from .runtime.batch import session_of

    engine, info = open_package(model, device, context_window, revision, quiet, paged="auto", trust=trust)
    # WebGPU: whether the kernels read f16 natively (shader-f16) or from packed words, and use subgroups
    info = {**info, **engine.variants}
    return session_of(engine), engine.tokenizer, info
