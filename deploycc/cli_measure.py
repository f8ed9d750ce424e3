"""The commands that measure a package: bench (tok/s, memory, per-kernel profile and roofline), perplexity and verify
(logits against numpy or transformers, kernels against their loop-level programs). cli.py registers them."""
from __future__ import annotations

import json

import click

from .cli_inspect import human_size
from .cli_open import open_package
from .cli_signing import trust_option, trust_policy
from .errors import DeployError
from .verify import Against


@click.command(short_help="Prefill / decode tokens per second and memory of a package.")
@click.argument("package")
@click.option("--prompt-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--gen-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random prompt ids.")
@click.option("--device", default=None, help="Compile an uncompiled MODEL for this preset first (cached).")
@click.option("--profile", is_flag=True,
              help="Also break a decode step down (with --sequences: the batched step of each count): device time per "
                   "kernel, host (VM + enqueue) time (cpu, OpenCL, CUDA).")
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
    from .runtime.bench import batch_bench, batch_bench_lines, parse_counts, profile_decode, profile_steps
    from .runtime.bench import bench as run_bench

    counts = None
    if sequences is not None:
        try:
            counts = parse_counts(sequences)
        except ValueError as e:
            raise DeployError(str(e)) from None
        if roofline:
            raise DeployError("--roofline breaks down a single-sequence decode step; it does not combine with "
                              "--sequences (--profile does: the batched step, kernel by kernel)")
    opened = open_package(package, device, None, None, as_json, paged=counts is not None, trust=trust_policy(trust))
    if opened is None:
        raise DeployError(f"{package} is not a compiled package; compile it (deploycc compile {package} --device PRESET) "
                          f"or pass --device PRESET")
    if counts is not None:
        r = batch_bench(opened[0], counts, prompt_len, gen_len, seed)
        if profile:
            r["profiles"] = profile_steps(opened[0], counts, prompt_len)
        click.echo(json.dumps(r, indent=2) if as_json else "\n".join(batch_bench_lines(r)))
        for pr in r.get("profiles", []) if not as_json else ():
            _profile_table(pr, f"batched step of {pr['sequences']} sequence(s)", "step", None)
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
                 ("repeats (median)", str(repeat)), ("peak RSS", human_size(r["peak_rss_bytes"])),
                 ("device memory", human_size(m["total_bytes"])), ("  weights", human_size(m["weights_bytes"])),
                 ("  KV cache", human_size(m["kv_cache_bytes"])), ("  activations", human_size(m["activation_bytes"]))]:
        t.add_row(k, v)
    Console().print(t)
    if "profile" in r:
        roof = r.get("roofline")
        _profile_table(r["profile"], "decode step", "token", roof)
        if roof:
            from .runtime import roofline as rl

            click.echo("\n".join(rl.roofline_lines(roof)))


def _profile_table(pr: dict, what: str, per: str, roof: dict | None) -> None:
    """A profile (runtime/bench.py profile_decode, profile_steps) as a table of its 15 costliest kernels."""
    from rich.console import Console
    from rich.table import Table

    from .runtime import roofline as rl

    pt = Table(title=(f"{what}: {pr['wall_ms_per_token']:.2f} ms wall, {pr['kernel_ms_per_token']:.2f} ms in "
                      f"{pr['launches_per_token']:.0f} kernels, {pr['host_ms_per_token']:.2f} ms host (VM + enqueue, "
                      f"overlapping the kernels)"))
    cols = ("kernel", f"launches / {per}", "us each", f"ms / {per}", "share") + (rl.COLUMNS if roof else ())
    for col in cols:
        pt.add_column(col, justify="left" if col == "kernel" else "right")
    for k in pr["kernels"][:15]:
        extra = rl.kernel_cells(k) if roof else ()
        pt.add_row(k["kernel"], f"{k['launches_per_token']:.0f}", f"{k['us_each']:.1f}", f"{k['ms_per_token']:.2f}",
                   f"{100 * k['share']:.1f}%", *extra)
    Console(width=max(Console().width, 150)).print(pt)


@click.command(short_help="Perplexity of a package on a text file (sliding windows).")
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

@click.command(short_help="Check a package's logits against a reference: numpy (same quantization) or transformers.")
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
                   f"(what {report.quantization}{' and the float16 KV cache' if report.kv_cache == 'float16' else ''}"
                   f" costs; not checked)")
    if report.passed:
        click.echo(f"ok: against {report.reference}: {report.measured:.3e}, within {c.describe()}")


# ---- devices -----------------------------------------------------------------------------------
