"""Tensors larger than one WebGPU storage binding are bound as several ranges: with the binding
limit forced down to 4 KiB, every kernel of a tiny model that reads a big weight binds it in parts,
and the compiled package still matches the reference logits (max |diff| 1e-4) on lavapipe."""
import numpy as np
import pytest
from conftest import require_device

import deploycc
from deploycc.package import compile_model
from fixtures import make_tiny


@pytest.mark.parametrize("name", ["llama-gqa1", "gpt2-odd"])
def test_split_bindings_package_matches_reference(tmp_path, name):
    from deploycc.runtime.engine import Engine

    require_device("webgpu")
    src = str(make_tiny(name))
    out = compile_model(src, "cpu-webgpu", out=str(tmp_path / "pkg"), context_window=32,
                        overrides=("target.max_storage_binding=4096",))
    import json

    entries = json.loads((out / "manifest.json").read_text())["kernels"]["entries"]
    split = {k: e["split"] for k, e in entries.items() if "split" in e}
    assert split, "some weight exceeds 4 KiB and is split"
    assert all(parts >= 2 for e in split.values() for _, parts in e.values())
    eng = Engine.load(out)
    ref = deploycc.reference_session(deploycc.load_model(src), context_window=32)
    ids = [3, 1, 4, 1, 5, 9, 2]
    assert np.abs(eng.prefill(ids, all_logits=True) - ref.prefill(ids, all_logits=True)).max() <= 1e-4
    for t in (6, 5, 3):
        assert np.abs(eng.decode(t) - ref.decode(t)).max() <= 1e-4


def test_too_many_bindings_is_a_compile_error(tmp_path):
    from deploycc import DeployError

    with pytest.raises(DeployError, match="storage bindings, more than the target's 8"):
        compile_model(str(make_tiny("llama-gqa1")), "chrome-webgpu", out=str(tmp_path / "pkg"), context_window=32,
                      overrides=("target.max_storage_binding=256",))
