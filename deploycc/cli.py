"""The command line: parse, call an importable function, render. Errors are one line, no traceback.

    deploycc compile MODEL --device PRESET|YAML [-o DIR]    a self-contained package (deploycc.package)
    deploycc run PKG|MODEL --prompt TEXT                     one reply, streamed
    deploycc chat PKG|MODEL                                  a REPL (runtime/cli.py holds the loop)
    deploycc serve PKG|MODEL                                 OpenAI's API (runtime/server.py)
    deploycc bench PKG                                       prefill / decode tok/s, memory (cli_measure.py)
    deploycc verify PKG [--against numpy|transformers]       package logits against a reference (cli_measure.py)
    deploycc perplexity PKG --text FILE                      (cli_measure.py)
    deploycc devices                                         runtimes on this machine, presets they can run
    deploycc inspect MODEL [--stage S | --kernels | --memory] (cli_inspect.py)
    deploycc keygen NAME / deploycc sign PKG --key NAME      Ed25519 keys and signed packages (cli_signing.py)

A package directory, or MODEL compiled for --device into deploycc's cache: cli_open.py.

run, chat, serve, bench, verify and perplexity take --trust KEY.pub (and $DEPLOYCC_TRUSTED_KEYS): then only a
package signed by one of those keys loads (runtime/trust.py).

An uncompiled MODEL given with --device is compiled once into $DEPLOYCC_HOME/packages (default
~/.cache/deploycc/packages), keyed by the source files, the preset, the quantization and the context
window; without --device, run and chat use the numpy reference interpreter.
"""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import click

from .cli_inspect import human_size, inspect, kv_cache_text
from .cli_measure import bench, perplexity, verify
from .cli_open import CompileProgress, open_package, session_for, source_path
from .cli_signing import keygen, sign, trust_option, trust_policy
from .errors import DeployError
from .runtime.cli import USER_ERRORS
from .runtime.server import ServeOptions

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
        click.option("--json-schema", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                     help="Reply with a JSON document of this schema (structured output; needs llguidance)."),
        click.option("--grammar", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                     help="Reply in this grammar: Lark, or llama.cpp's GBNF (needs llguidance)."),
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
              help="Integer targets: the bits a linear's input is rounded to. cpu: auto gives 16 to the linears whose "
                   "8-bit rounding costs most on a calibration text (deploycc/calibrate.py), 8 elsewhere. h100 (dp4a): "
                   "8 takes decode's __dp4a GEMV; auto keeps activations float.")
@click.option("--verify-kernels", is_flag=True,
              help="Before the package is written, run each kernel on this machine's device against its loop-level "
                   "program (as `verify PKG --kernels`); a kernel that disagrees writes nothing.")
@click.option("--chat-template", default=None, metavar="FILE|NAME",
              help="The package's chat template: a Jinja file, or chatml, llama3 or gemma; for a model whose files "
                   "have none (a base model, a GGUF without tokenizer.chat_template) or a wrong one.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (no progress display).")
def compile_cmd(model, device, quantization, head_quantization, context_window, overrides, output, force, revision,
                sign_key, activations, verify_kernels, chat_template, as_json):
    """Compile MODEL into a self-contained package directory for a device preset."""
    from .package import compile_model

    with CompileProgress(enabled=not as_json) as progress:
        path = compile_model(source_path(model), device, quantization, context_window, tuple(overrides), output, force,
                             revision, progress=progress, head_quantization=head_quantization,
                             verify_kernels=verify_kernels, sign=sign_key,
                             activations=activations, chat_template=chat_template)
    manifest = json.loads((path / "manifest.json").read_text())
    summary = _package_summary(path, manifest)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(str(path))
    mem = summary["memory"]
    click.echo(f"{summary['preset']} ({summary['backend']}), {summary['quantization']}, context window "
               f"{summary['context_window']}: {summary['kernels']} kernels, weights {human_size(mem['weights_bytes'])}, "
               f"{kv_cache_text(mem['kv_cache_bytes'], summary['kv_cache_dtype'])}, "
               f"activations {human_size(mem['activation_bytes'])}")
    by_type = manifest["model"].get("weights_by_type")
    if by_type:
        click.echo(weights_by_type_text(by_type))
    if summary["web"]:
        click.echo(f"web bundle: `python -m http.server -b 127.0.0.1 -d {path}`, then open http://127.0.0.1:8000/ "
                   f"(a browser with WebGPU)")


def weights_by_type_text(rows: list[dict]) -> str:
    """A GGUF source's weights per stored type, kept or converted, and the package's weight bytes against the file's."""
    parts = [f"{r['type']}{'' if r['into'] == 'kept' else ' -> ' + r['into']} x{r['tensors']} {human_size(r['package_bytes'])}"
             for r in rows]
    file, pkg = sum(r["file_bytes"] for r in rows), sum(r["package_bytes"] for r in rows)
    return (f"weights by GGUF type: {', '.join(parts)}; package {human_size(pkg)} against the file's tensors "
            f"{human_size(file)} ({pkg / max(file, 1):.2f}x)")


def _package_summary(path: Path, manifest: dict) -> dict:
    return {"package": str(path), "model": manifest["model"]["architecture"], "source": manifest["model"]["source"],
            "preset": manifest["preset"]["name"], "backend": manifest["preset"]["backend"],
            "quantization": manifest["quantization"],
            "head_quantization": manifest.get("head_quantization", manifest["quantization"]),
            "context_window": manifest["bounds"]["context_window"],
            "prefill_chunk": manifest["bounds"]["prefill_chunk"], "kernels": len(manifest["kernels"]["entries"]),
            "kv_cache_dtype": manifest["kv_cache"].get("dtype", "float32"),
            "memory": manifest.get("memory", {}), "web": "index.html" in manifest["files"],
            **({"weights_by_type": manifest["model"]["weights_by_type"]} if "weights_by_type" in manifest["model"] else {})}


# ---- run / chat --------------------------------------------------------------------------------

@cli.command(short_help="One reply to a prompt, streamed to stdout.")
@click.argument("model")
@click.option("--prompt", required=True,
              help="The user message (the chat template is applied; a model without one gets the text as it is, and "
                   "run says so).")
@click.option("--no-chat", is_flag=True, help="Feed the prompt as raw text, without the chat template.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (prompt, prompt_ids, generated ids, text, sampler, timings) instead of "
                   "streaming.")
@_generation_options(max_tokens=64)
def run(model, prompt, no_chat, as_json, max_tokens, temperature, top_p, top_k, min_p, repetition_penalty, seed,
        json_schema, grammar, device, context_window, revision, trust):
    """Generate a reply to PROMPT, streaming to stdout.

    MODEL is a compiled package directory (run on its device), or a checkpoint / Hub id: with --device
    it is compiled for that preset first (cached under ~/.cache/deploycc/packages); without --device
    it runs on the numpy reference interpreter, which is exact but slow."""
    from .runtime.cli import grammar_option, run_prompt, sampling_options, with_model_sampling
    from .runtime.tokenizer import clean_text

    options = {**sampling_options(max_tokens, temperature, top_p, top_k, repetition_penalty, seed, min_p),
               **grammar_option(json_schema, grammar)}
    prompt = clean_text(prompt)  # undecodable bytes of argv arrive as lone surrogates: U+FFFD, as chat clients show
    session, tok, info = session_for(model, device, context_window, revision, as_json, prompt, not no_chat,
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
def chat(model, system, max_tokens, temperature, top_p, top_k, min_p, repetition_penalty, seed, json_schema, grammar,
         device, context_window, revision, trust):
    """Chat with MODEL: streaming replies, multi-turn history, /reset, /stats, /system TEXT, /exit.

    Reads stdin when it is not a terminal (one message per line, replies only). MODEL is a package, or
    a checkpoint compiled for --device first (cached), or without --device the numpy reference."""
    from .runtime.cli import chat_repl, grammar_option, sampling_options, with_model_sampling

    options = {**sampling_options(max_tokens, temperature, top_p, top_k, repetition_penalty, seed, min_p),
               **grammar_option(json_schema, grammar)}
    session, tok, info = session_for(model, device, context_window, revision, False, trust=trust_policy(trust))
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

    opened = open_package(model, device, context_window, revision, False, paged=True, trust=trust_policy(trust))
    if opened is None:
        raise DeployError(f"{model} is not a package; give --device PRESET to compile it first (e.g. --device cpu)")
    engine, info = opened
    options = ServeOptions(host, port, api_key, max_queue, max_num_sequences, shutdown_timeout, max_body_bytes,
                           parse_hosts(allowed_hosts))
    run_server(engine, model_name or Path(info.get("package") or model).name, options)


# ---- bench -------------------------------------------------------------------------------------

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
    parts = [f"{k}={human_size(x[k]) if k.endswith('_size') else x[k]}" for k in keys if k in x]
    return ", ".join(parts) + (" (default)" if x.get("default") else "")


for command in (bench, perplexity, verify, inspect, keygen, sign):
    cli.add_command(command)


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
