"""The command line: parse, call an importable function, render. Errors are one line, no traceback."""
from __future__ import annotations

import sys

import click

from .errors import DeployError
from .session import STAGES


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="deploycc")
def cli():
    """deploycc: compile Hugging Face LLMs for CUDA, OpenCL and WebGPU, and run them."""


@cli.command()
@click.argument("model")
@click.option("--stage", type=click.Choice(STAGES), default="exported", show_default=True,
              help="Pipeline stage whose IR to print.")
@click.option("--revision", default=None, help="Hub revision (branch, tag or commit) when MODEL is a repo id.")
@click.option("--context-window", type=int, default=None, help="Upper bound of total_len (default: from the config).")
def inspect(model, stage, revision, context_window):
    """Print the IR of MODEL (a checkpoint directory or Hugging Face repo id) after a pipeline stage."""
    from .hub import load_model
    from .session import export, lower

    loaded = load_model(model, revision)
    click.echo(str(lower(export(loaded, context_window), stage)), nl=False)


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
    import json
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
