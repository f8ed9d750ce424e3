"""The model as a graph-level module: `export(model, context_window, step, pool)` builds the model's nn.Module
and traces its functions (`prefill`, `prefill_all`, `decode` and, with a page pool, the batched `step`) with symbolic
shapes; the first stage of the compiler (pipeline.py) and what the reference session (session.py) runs."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from . import nn
from .errors import DeployError
from .ir.module import IRModule
from .loaded import LoadedModel

PAGE_SIZE = 16  # rows per page: one block of the cpu attention schedule


@dataclass(frozen=True)
class Pool:
    """The page pool of batched steps: `pages` pages of `page_size` rows each for every layer, shared by at most
    `sequences` sequences, whose steps hold at most the prefill chunk's tokens all together."""

    pages: int
    sequences: int
    page_size: int = PAGE_SIZE


def export(model: LoadedModel, context_window: int | None = None, step: int = 0, pool: Pool | None = None,
           kv_cache: str = "float32", one_token_step: bool = False) -> IRModule:
    """The graph-level module: `prefill` (input ids [1, seq_len]) and `decode` (one token). With `step` (the
    most tokens a prefill step holds, the package's prefill chunk), sliding-window layers keep a ring of
    window + step - 1 rows instead of the whole context window (nn.Cache.rows). With a `pool`, also `step`:
    a batched step of several sequences over a page pool (continuous batching, runtime/batch.py). `kv_cache`: the
    cache's element type (float16: the keys and values rounded as they are stored, the module's attr says so).
    `one_token_step` (the CUDA presets: package.one_token_step): also `step_one`, the batched step of one token,
    which is one sequence's decoding (a server with one client): its shapes are constants, so its linears take the
    decode GEMVs with the norms and the gated product folded in, as `decode` does, where `step`'s rows are known
    only at run time."""
    cfg = model.config
    ctx = context_window or cfg.context_window
    limit = getattr(cfg, "max_context_window", None)
    if limit is not None and ctx > limit:
        raise DeployError(f"context window {ctx} exceeds the {limit} positions this model was trained for; "
                          f"use --context-window {limit} or less")
    spec = {
        # prefill returns the last position's logits (what generation needs), prefill_all every position's.
        "prefill": {"input_ids": nn.spec((1, "seq_len"), "int32"), "cache": nn.kv_cache_spec(ctx, step, dtype=kv_cache)},
        "prefill_all": {"input_ids": nn.spec((1, "seq_len"), "int32"),
                        "cache": nn.kv_cache_spec(ctx, step, dtype=kv_cache)},
        "decode": {"input_ids": nn.spec((1, 1), "int32"), "cache": nn.kv_cache_spec(ctx, step, dtype=kv_cache)},
    }
    bounds = {"total_len": ctx, "seq_len": step or ctx}
    if pool is not None:
        for fname in ("step", "step_all") + (("step_one",) if one_token_step else ()):
            # the last tokens' logits, every token's, one token's
            spec[fname] = {"input_ids": nn.spec((1, 1 if fname == "step_one" else "seq_len"), "int32"),
                           "cache": nn.kv_cache_spec(ctx, step, pool.page_size, pool.pages, kv_cache)}
        bounds.update(batch=pool.sequences, pages_len=-(-ctx // pool.page_size))
    mod, _ = model.build().export(spec, bounds=bounds)
    mod.attrs.update(context_window=ctx, model=model.architecture, num_layers=cfg.num_hidden_layers)
    if kv_cache != "float32":
        mod.attrs["kv_cache"] = kv_cache
    if pool is not None:
        mod.attrs["pool"] = asdict(pool)
    return mod
