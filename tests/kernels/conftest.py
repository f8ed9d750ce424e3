import pytest

from deploycc import presets
from deploycc.ir import sym


@pytest.fixture(scope="session")
def quantized_programs():
    """A tiny Llama's fused prefill programs in q4f16_1 for h100: each linear reads 4-bit codes and fp16 scales (the
    dequantize inlined in the kernels' B staging or registers), some with a residual add (the epilogue), some behind a
    reshape. For the tensor-core and the few-row GEMV tests (test_mma_rule.py, test_dispatch_rows.py)."""
    import deploycc
    from deploycc.export import export
    from deploycc.pipeline import run as run_pipeline
    from deploycc.quantization import quantize
    from fixtures import make_tiny

    model = quantize(deploycc.load_model(str(make_tiny("llama-gqa1"))), "q4f16_1", None, False)
    fused = run_pipeline(export(model, 64), presets.load("h100").target, "fused")
    return [p for name, p in fused.programs().items() if "dequantize" in name and not all(
        sym.as_expr(d).is_const for b in p.params for d in b.shape)]
