"""deploycc inspect: a model's IR after a pipeline stage, its VM bytecode, kernel list or memory plan, or a
compiled package's kernels and activation precision (split from cli.py, which registers the command)."""
from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

from .errors import DeployError
from .pipeline import STOPS


def human_size(n) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 100 * scale else f"{n / scale:.0f} {unit}"
    return f"{n} B"


def kv_cache_text(nbytes, dtype: str | None = None) -> str:
    """"KV cache 94.4 MB (float16)": its bytes and, where known, its element type."""
    return f"KV cache {human_size(nbytes)}" + (f" ({dtype})" if dtype else "")


@click.command(short_help="IR after a pipeline stage, VM bytecode, kernel list or memory plan.")
@click.argument("model")
@click.option("--stage", type=click.Choice(STOPS), default="exported", show_default=True,
              help="Pipeline stage whose IR to print; vm: the disassembled VM bytecode (needs --device).")
@click.option("--device", "device", default=None,
              help="Device preset name or YAML path (needed for scheduled, vm and kernels). With a preset, the "
                   "model is quantized, calibrated and exported exactly as `compile` does it for that preset.")
@click.option("--quantization", default=None,
              help="With --device: the weights' quantization, as compile's (default: the preset's; gguf for a "
                   "GGUF file).")
@click.option("--head-quantization", default=None, help="With --device: the output head's, as compile's.")
@click.option("--activations", type=click.Choice(["auto", "8", "16"]), default="auto", show_default=True,
              help="With --device on an integer target (cpu): the linears' activation bits, as compile's.")
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE", help="Change a preset value, as in compile.")
@click.option("--kernels", is_flag=True, help="List every kernel and the kernel launches per decode step.")
@click.option("--source", "source", default=None, metavar="KERNEL",
              help="Print KERNEL's source as the package's kernel file holds it for --device's target (OpenCL C, "
                   "WGSL, CUDA C or C); `--kernels` lists the names.")
@click.option("--memory", is_flag=True,
              help="The memory plan: weights, KV cache, activations with and without planning (prefill 128/256/512, decode).")
@click.option("--json", "as_json", is_flag=True, help="With --kernels or --memory: print one JSON object.")
@click.option("--as-python", is_flag=True,
              help="Print the graph functions at --stage as Python on torch (edit, then run with "
                   "deploycc.topython.load_python).")
@click.option("--function", "functions", multiple=True, metavar="NAME",
              help="With --as-python: only these functions (prefill, prefill_all, decode).")
@click.option("--revision", default=None, help="Hub revision (branch, tag or commit) when MODEL is a repo id.")
@click.option("--context-window", type=click.IntRange(min=1), default=None,
              help="Upper bound of total_len (default: from the config, at most the preset's). With --kernels on a "
                   "CUDA package: the context of the modelled decode step (default: half the package's window).")
def inspect(model, stage, device, quantization, head_quantization, activations, overrides, kernels, source, memory,
            as_json, as_python, functions, revision, context_window):
    """Print the IR of MODEL (a checkpoint directory or Hugging Face repo id) after a pipeline stage,
    its VM bytecode, its kernel list (--kernels) or its memory plan (--memory). MODEL may be a compiled package
    with --kernels: its kernels, and on an integer target the bits each linear's activations are rounded to; on
    a CUDA package, each kernel's launches, bytes, FLOPs, blocks x threads, registers, occupancy and predicted time
    in a decode and a prefill step on the preset's GPU (deploycc/perfmodel.py)."""
    from . import pipeline, presets
    from .export import export
    from .hub import load_model
    from .package import apply_overrides, kv_cache_bytes, prepare, resolve_quantization

    if kernels and memory:
        raise DeployError("choose one of --kernels and --memory")
    if kernels and (Path(model) / "manifest.json").is_file():
        from .runtime.package import read_manifest

        manifest = read_manifest(Path(model))
        if manifest["target"]["kind"] == "cuda":  # and how long each takes on the preset's GPU, by the model
            _print_predicted(Path(model), context_window, as_json)
            return
        _print_package_kernels(manifest, as_json)
        return
    if as_python and (kernels or memory or stage == "vm"):
        raise DeployError("--as-python prints graph functions; it does not combine with --kernels, --memory "
                          "or --stage vm")
    if overrides and not device:
        raise DeployError("--override changes a device preset; give --device PRESET too")
    if (quantization or head_quantization) and not device:
        raise DeployError("--quantization is a package's, for a device: give --device PRESET too")
    preset = apply_overrides(presets.load(device), list(overrides)) if device else None
    target = preset.target if preset else None
    if source and (kernels or memory or as_python):
        raise DeployError("--source prints one kernel; it does not combine with --kernels, --memory or --as-python")
    if (kernels or source or stage in ("scheduled", "vm")) and preset is None:
        what = "--kernels" if kernels else "--source" if source else f"--stage {stage}"
        raise DeployError(f"{what} needs --device PRESET (e.g. cpu-opencl)")
    if preset is None:  # the model as loaded, in float, with no target
        loaded = load_model(model, revision)
        exported = export(loaded, context_window)
        cfg = loaded.config
    else:  # the very export compile makes
        quant, head = resolve_quantization(model, preset, quantization, head_quantization)
        prepared = prepare(model, preset, quant, head, context_window, revision, activations)
        exported = prepared.exported
        cfg = prepared.model.config
    if source:  # one kernel of the package, rendered for the target
        from .kernel_runner import kernel_source

        shipped = pipeline.compile(exported, target, prepared.prefill_chunk).lowered.kernels
        if source not in shipped:
            raise DeployError(f"no kernel {source!r} for {preset.name}; `deploycc inspect MODEL --device "
                              f"{preset.name} --kernels` lists the {len(shipped)} kernels (e.g. {', '.join(sorted(shipped)[:3])})")
        click.echo(kernel_source(shipped[source], target), nl=False)
        return
    if kernels:  # the package's kernels: the whole compile, to the bytecode
        report = pipeline.kernel_report(exported, target, pipeline.compile(exported, target, prepared.prefill_chunk))
        if as_json:
            click.echo(json.dumps(report, indent=2))
            return
        _print_kernels(report, preset.name)
        return
    if memory:
        from .transform.plan_memory import memory_report

        if preset is None:
            report = memory_report(pipeline.run(exported, None, "fused"), cfg.num_key_value_heads, cfg.head_dim)
        else:  # the package's figures: its constants are weights too, its storages the planned activations
            compiled = pipeline.compile(exported, target, prepared.prefill_chunk)
            report = memory_report(compiled.module, cfg.num_key_value_heads, cfg.head_dim)
            consts = sum(4 * int(np.size(a)) for a in compiled.lowered.constants.values())  # written as float32
            report["weights_bytes"] += consts
            report["activation_bytes"] = sum(st["bytes"] for st in compiled.lowered.storages)
            kv = kv_cache_bytes(compiled.lowered, cfg, prepared.context_window, preset.kv_cache) \
                if report["kv_cache_bytes"] else 0
            report["total_bytes"] += consts + kv - report["kv_cache_bytes"]
            report["kv_cache_bytes"], report["kv_cache_dtype"] = kv, preset.kv_cache
        if as_json:
            click.echo(json.dumps(report, indent=2))
        else:
            _print_memory(report, preset.name if preset else "fused, no target")
        return
    compiled = pipeline.compile(exported, target, prepared.prefill_chunk if preset else None, stage)
    if stage == "vm":
        from .vm import disassemble

        click.echo(disassemble(compiled.lowered.bytecode), nl=False)
        return
    mod = compiled.module
    if as_python:
        from .topython import module_to_python

        unknown = [f for f in functions if f not in mod.graph_functions()]
        if unknown:
            raise DeployError(f"no function {unknown[0]!r}; choose from {', '.join(mod.graph_functions())}")
        click.echo(module_to_python(mod, list(functions) or None), nl=False)
        return
    click.echo(str(mod), nl=False)


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
    fused, unfused = report["decode_launches"], report["decode_launches_unfused"]
    if unfused is None:  # an integer target: its linears exist only fused (pipeline.kernel_report)
        console.print(f"decode kernel launches per step: {fused} ({layers} layers: {fused / layers:.1f} per layer)")
        return
    console.print(f"decode kernel launches per step: {fused} fused, {unfused} unfused ({layers} layers: "
                  f"{fused / layers:.1f} vs {unfused / layers:.1f} per layer)")


def _print_package_kernels(manifest: dict, as_json: bool) -> None:
    """A package's kernel entry points, and the activation precision per linear its manifest records
    (kernels.native.activations: deploycc/calibrate.py chose them)."""
    from rich.console import Console
    from rich.table import Table

    entries = manifest["kernels"]["entries"]
    bits = manifest["kernels"].get("native", {}).get("activations") or {}
    if as_json:
        click.echo(json.dumps({"kernels": sorted(entries), "activations": bits}, indent=2))
        return
    console = Console()
    table = Table(title=f"kernels of the package ({manifest['kernels']['language']})")
    table.add_column("kernel")
    for name in sorted(entries):
        table.add_row(name)
    console.print(table)
    if bits:
        table = Table(title="activations of the integer linears (bits per block of 32)")
        table.add_column("linear")
        table.add_column("bits", justify="right")
        for name, b in bits.items():
            table.add_row(name, str(b))
        console.print(table)
        counts = {b: sum(v == b for v in bits.values()) for b in sorted(set(bits.values()))}
        console.print("activations: " + ", ".join(f"{n} linears at {b} bits" for b, n in counts.items()))


def _print_predicted(pkg: Path, context: int | None, as_json: bool) -> None:
    """The performance model's table of a CUDA package (deploycc/perfmodel.py)."""
    from rich.console import Console
    from rich.table import Table

    from .perfmodel import predict, rows, summary

    pred = predict(pkg, context=context)
    figures = summary(pred)
    if as_json:
        click.echo(json.dumps({"preset": pred["preset"], "hardware": pred["hardware"], "model": pred["model"],
                               "summary": figures, "decode": rows(pred["steps"]["decode"]),
                               "prefill": rows(pred["steps"]["prefill"])}, indent=2))
        return
    console = Console()
    for fname in ("decode", "prefill"):
        step = pred["steps"][fname]
        table = Table(title=f"{fname} step of {step.tokens} token(s) at context {step.context} on {pred['preset']} "
                            f"(predicted)")
        for col in ("kernel", "launches", "blocks x threads", "regs", "occupancy", "MB", "GFLOP", "us each", "bound"):
            table.add_column(col, justify="left" if col == "kernel" else "right")
        for r in rows(step):
            table.add_row(r["kernel"], str(r["launches"]), f"{r['blocks']} x {r['threads']}",
                          "-" if r["registers"] is None else str(r["registers"]), f"{r['occupancy']:.0%}",
                          f"{r['bytes'] / 1e6:.2f}", f"{r['flops'] / 1e9:.3f}",
                          f"{r['seconds'] / r['launches'] * 1e6:.1f}", r["bound"])
        console.print(table)
    f = figures
    click.echo(f"decode: {f['decode_launches']} launches, {f['decode_bytes'] / 1e6:.1f} MB, device "
               f"{f['decode_device_ms']:.2f} ms, host {f['decode_host_ms']:.2f} ms"
               f"{' (a CUDA graph)' if f['decode_graph'] else ''}: {f['decode_tok_s']:.0f} tok/s, "
               f"{f['decode_roofline_fraction']:.1%} of the HBM roofline ({f['roofline_tok_s']:.0f} tok/s)")
    click.echo(f"prefill: {f['prefill_tokens']} tokens in {f['prefill_launches']} launches: "
               f"{f['prefill_tok_s']:.0f} tok/s ({f['prefill_tflops']:.1f} TFLOP/s)")


def _print_memory(report: dict, where: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"memory plan of {report['model']} ({where}), context window {report['context_window']}")
    for col in ("function", "seq_len bound", "tensors", "without planning", "planned", "storages", "saved"):
        table.add_column(col, justify="right")
    for r in report["activations"]:
        n = str(r["seq_len"])
        if r["effective_seq_len"] is not None and r["effective_seq_len"] != r["seq_len"]:
            n += f" (≤ {r['effective_seq_len']})"
        table.add_row(r["function"], n, str(r["tensors"]), human_size(r["unplanned_bytes"]), human_size(r["planned_bytes"]),
                      str(r["storages"]), f"{100 * r['reduction']:.0f}%")
    console = Console()
    console.print(table)
    kv = kv_cache_text(report["kv_cache_bytes"], report.get("kv_cache_dtype"))
    console.print(f"weights {human_size(report['weights_bytes'])}, {kv}, "
                  f"total at load {human_size(report['total_bytes'])} (weights + KV cache + the largest prefill plan + decode)")
