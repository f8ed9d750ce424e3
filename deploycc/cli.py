"""The command line: parse, call an importable function, render. Errors are one line, no traceback."""
from __future__ import annotations

import json
import sys

import click

from .errors import DeployError
from .pipeline import STAGES as PIPELINE_STAGES


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="deploycc")
def cli():
    """deploycc: compile Hugging Face LLMs for CUDA, OpenCL and WebGPU, and run them."""


@cli.command()
@click.argument("model")
@click.option("--stage", type=click.Choice(PIPELINE_STAGES), default="exported", show_default=True,
              help="Pipeline stage whose IR to print.")
@click.option("--device", "device", default=None, help="Device preset name or YAML path (needed for scheduled/kernels).")
@click.option("--kernels", is_flag=True, help="List every kernel and the kernel launches per decode step.")
@click.option("--json", "as_json", is_flag=True, help="With --kernels: print one JSON object.")
@click.option("--revision", default=None, help="Hub revision (branch, tag or commit) when MODEL is a repo id.")
@click.option("--context-window", type=int, default=None, help="Upper bound of total_len (default: from the config).")
def inspect(model, stage, device, kernels, as_json, revision, context_window):
    """Print the IR of MODEL (a checkpoint directory or Hugging Face repo id) after a pipeline stage,
    or its kernel list with --kernels."""
    from . import pipeline, presets
    from .hub import load_model
    from .session import export

    preset = presets.load(device) if device else None
    target = preset.target if preset else None
    if (kernels or stage == "scheduled") and preset is None:
        raise DeployError("--kernels and --stage scheduled need --device PRESET (e.g. cpu-opencl)")
    loaded = load_model(model, revision)
    exported = export(loaded, context_window or (preset.context_window if preset else None))
    if kernels:
        report = pipeline.kernel_report(exported, target)
        if as_json:
            click.echo(json.dumps(report, indent=2))
            return
        _print_kernels(report, preset.name)
        return
    click.echo(str(pipeline.run(exported, target, stage)), nl=False)


def _print_kernels(report: dict, device: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"kernels for {device}")
    for col in ("kernel", "pattern", "rule", "launches / decode step"):
        table.add_column(col)
    for k in report["kernels"]:
        table.add_row(k["name"], k["pattern"], k["rule"], str(k["launches_per_decode"]))
    console = Console()
    console.print(table)
    layers = report.get("layers") or 1
    console.print(f"decode kernel launches per step: {report['decode_launches']} fused, "
                  f"{report['decode_launches_unfused']} unfused ({layers} layers: "
                  f"{report['decode_launches'] / layers:.1f} vs {report['decode_launches_unfused'] / layers:.1f} per layer)")


@cli.command()
@click.argument("model")
@click.option("--prompt", required=True, help="The user message (the chat template is applied).")
@click.option("--max-tokens", type=int, default=64, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=int, default=0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-chat", is_flag=True, help="Feed the prompt as raw text, without the chat template.")
@click.option("--context-window", type=int, default=None, help="Upper bound of total_len (default: from the config).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming text.")
def run(model, prompt, max_tokens, temperature, top_p, top_k, seed, no_chat, context_window, as_json):
    """Generate a reply to PROMPT with MODEL on the numpy reference interpreter, streaming to stdout.

    Compiled packages (kernels on OpenCL, WebGPU, CUDA) come with the runtime; until then this runs
    the reference, which is exact but slow."""
    import time

    from .hub import load_model
    from .runtime.generate import generate
    from .runtime.tokenizer import Tokenizer
    from .session import reference_session

    loaded = load_model(model)
    stats: dict = {}
    t0 = time.perf_counter()
    pieces = []
    try:
        tok = Tokenizer.from_dir(loaded.path)
        session = reference_session(loaded, context_window=context_window)
        for piece in generate(session, tok, prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                              top_k=top_k, seed=seed, chat=not no_chat, stats=stats):
            pieces.append(piece)
            if not as_json:
                click.echo(piece, nl=False)
    except ValueError as e:  # tokenizer files, context window, sampler arguments, missing chat template
        raise DeployError(str(e)) from None
    if as_json:
        click.echo(json.dumps({"model": model, "prompt": prompt, "text": "".join(pieces),
                               "seconds": round(time.perf_counter() - t0, 3),
                               **{k: v for k, v in stats.items()}}, default=str))
    else:
        click.echo()


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except DeployError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
