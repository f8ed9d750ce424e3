"""Catalogue: checkpoints, GGUF files, context windows and presets that a hostile tester made, through the
command line. Each is refused with one line `error: ...` (exit 1, no traceback) that names what is wrong,
before anything large is allocated: a config's sizes are checked against the tensors present (names and
shapes in the headers), the context window against the model and the device's memory, and preset values
against their ranges. A compile that is refused leaves no output directory and no temporary one beside it.

Each case builds its source in tmp_path and gives the command line and the fragments its error must hold.
"""
from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from bad_inputs.checkpoints import copy_tiny, edit_config, non_utf8_name, safetensors_file, tiny_gguf
from bad_inputs.common import assert_one_line_error

GPT2 = "gpt2-odd"
# Address space of each command: ample for refusing a tiny model (about 50 MB resident), far less than a
# 10**9-layer model, a 2**31-block GGUF or a 10**12-token cache would take before the checks existed.
ADDRESS_SPACE = 1 << 30


def cli_bounded(*args, env: dict):
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    return subprocess.run([sys.executable, "-m", "deploycc", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env}, preexec_fn=limit)


def compile_args(source, *extra):
    return ("compile", source, "-o", "{out}", *extra)


def llama(tmp, **changes):
    return edit_config(copy_tiny(tmp), **changes)


def preset_file(tmp, text: str) -> Path:
    f = tmp / "mine.yaml"
    f.write_text(text)
    return f


PRESET = """\
name: mine
target:
  kind: opencl
  max_threads_per_block: 256
  threads_per_block: 64
  row_tile_m: {row_tile_m}
"""


# ---- config.json ------------------------------------------------------------------------------------

def config_list(tmp):
    p = copy_tiny(tmp)
    (p / "config.json").write_text("[]")
    return compile_args(p), ["config.json holds a JSON list, not an object"]


def config_null(tmp):
    p = copy_tiny(tmp)
    (p / "config.json").write_text("null")
    return compile_args(p), ["config.json holds a JSON null"]


def config_string(tmp):
    p = copy_tiny(tmp)
    (p / "config.json").write_text('"LlamaForCausalLM"')
    return compile_args(p), ["config.json holds a JSON string"]


def config_list_inspect(tmp):
    p = copy_tiny(tmp)
    (p / "config.json").write_text("[1, 2]")
    return ("inspect", p), ["config.json holds a JSON list"]


def layers_float_1e9(tmp):
    return compile_args(llama(tmp, num_hidden_layers=1e9)), ["num_hidden_layers must be a positive integer, got 1000000000.0"]


def layers_int_1e9(tmp):
    return compile_args(llama(tmp, num_hidden_layers=10**9)), [
        "num_hidden_layers is 1000000000, but the checkpoint holds tensors of 2 layers", "fix config.json"]


def layers_negative(tmp):
    return compile_args(llama(tmp, num_hidden_layers=-1)), ["num_hidden_layers is -1; it must be between 1 and"]


def layers_zero(tmp):
    return compile_args(llama(tmp, num_hidden_layers=0)), ["num_hidden_layers is 0; it must be between 1 and"]


def layers_string(tmp):
    return compile_args(llama(tmp, num_hidden_layers="2")), ["num_hidden_layers must be a positive integer, got '2'"]


def layers_fraction(tmp):
    return compile_args(llama(tmp, num_hidden_layers=2.5)), ["num_hidden_layers must be a positive integer, got 2.5"]


def layers_fewer_than_tensors(tmp):
    return ("inspect", llama(tmp, num_hidden_layers=1)), ["num_hidden_layers is 1, but the checkpoint holds tensors of 2 layers"]


def gpt2_layers_more_than_tensors(tmp):
    p = edit_config(copy_tiny(tmp, GPT2), n_layer=7)
    return compile_args(p), ["n_layer is 7, but the checkpoint holds tensors of 3 layers (transformer.h.0..2)"]


def hidden_size_mismatch(tmp):
    return compile_args(llama(tmp, hidden_size=48)), [
        "hidden_size is 48, but tensor model.embed_tokens.weight has shape [101, 32]", "fix config.json to match the weights"]


def vocab_size_mismatch(tmp):
    return compile_args(llama(tmp, vocab_size=100000)), [
        "vocab_size is 100000, but tensor model.embed_tokens.weight has shape [101, 32]"]


def heads_do_not_divide_hidden(tmp):
    p = edit_config(copy_tiny(tmp), drop=("head_dim",), num_attention_heads=5, num_key_value_heads=5)
    return compile_args(p), ["num_attention_heads 5 does not divide hidden_size 32"]


def heads_not_multiple_of_kv_heads(tmp):
    return compile_args(llama(tmp, num_key_value_heads=3)), ["num_attention_heads 4 is not a multiple of num_key_value_heads 3"]


def heads_times_head_dim_mismatch(tmp):
    return compile_args(llama(tmp, head_dim=16)), [
        "num_attention_heads * head_dim is 64, but tensor model.layers.0.self_attn.q_proj.weight has shape [32, 32]"]


def max_position_embeddings_zero(tmp):
    return compile_args(llama(tmp, max_position_embeddings=0)), ["max_position_embeddings is 0; it must be between 1 and"]


def unknown_rope_scaling(tmp):
    return compile_args(llama(tmp, rope_scaling={"rope_type": "dynamic", "factor": 4.0})), [
        "unsupported rope_scaling type 'dynamic'"]


def yarn_without_factor(tmp):
    return compile_args(llama(tmp, rope_scaling={"rope_type": "yarn"})), ["rope_scaling of type yarn lacks 'factor'"]


def longrope_factors_too_few(tmp):
    scaling = {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}
    return compile_args(edit_config(copy_tiny(tmp, "phi3-longrope-partial-window"), rope_scaling=scaling,
                                    drop=("rope_parameters",))), [
        "rope_scaling.short_factor has 1 numbers; the 4 rotated dimensions need 2"]


def layer_types_wrong_length(tmp):
    return compile_args(edit_config(copy_tiny(tmp, "gemma2-gqa2-softcap"), layer_types=["full_attention"])), [
        "layer_types must list 3 of full_attention or sliding_attention"]


def sliding_window_zero(tmp):
    return compile_args(edit_config(copy_tiny(tmp, "mistral-gqa4-window"), sliding_window=0)), [
        "sliding_window is 0; it must be between 1 and"]


def no_rope_layers_not_flags(tmp):
    return compile_args(edit_config(copy_tiny(tmp, "smollm3-nope-yarn"), no_rope_layers=[1, 1, 2, 0])), [
        "no_rope_layers must list 4 values of 1 (rotary) or 0 (none)"]


def partial_rotary_odd(tmp):
    return compile_args(edit_config(copy_tiny(tmp, "phi3-longrope-partial-window"), partial_rotary_factor=0.375,
                                    rope_parameters={"rope_theta": 10000.0, "rope_type": "default"})), [
        "partial_rotary_factor 0.375 rotates 3 of head_dim 8"]


def tie_word_embeddings_string(tmp):
    return compile_args(llama(tmp, tie_word_embeddings="false")), ["tie_word_embeddings must be true or false, got 'false'"]


def architectures_not_a_list(tmp):
    return compile_args(llama(tmp, architectures=7, model_type=["llama"])), ["unsupported architecture ['llama']"]


# ---- safetensors --------------------------------------------------------------------------------------

def header_longer_than_file(tmp):
    p = copy_tiny(tmp)
    safetensors_file(p / "model.safetensors", {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, bytes(4),
                     length=1 << 40)
    return compile_args(p), ["model.safetensors is corrupted: header length 1099511627776 exceeds the file"]


def absurd_offsets(tmp):
    p = copy_tiny(tmp)
    safetensors_file(p / "model.safetensors",
                     {"w": {"dtype": "F32", "shape": [1 << 28, 1 << 28], "data_offsets": [0, 1 << 58]}}, bytes(16))
    return compile_args(p), ["model.safetensors is corrupted or truncated: tensor w needs bytes 0..288230376151711744"]


def negative_offsets(tmp):
    p = copy_tiny(tmp)
    safetensors_file(p / "model.safetensors", {"w": {"dtype": "F32", "shape": [1], "data_offsets": [-8, -4]}}, bytes(16))
    return compile_args(p), ["bad header entry for w", "data_offsets must be [start, end] with 0 <= start <= end"]


def duplicate_tensor_names(tmp):
    p = copy_tiny(tmp)
    entry = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    safetensors_file(p / "model.safetensors", f'{{"w": {entry}, "w": {entry}}}'.encode(), bytes(4))
    return compile_args(p), ["model.safetensors is corrupted: its header names tensor w twice"]


def duplicate_tensor_across_shards(tmp):
    p = copy_tiny(tmp)
    (p / "model-extra.safetensors").write_bytes((p / "model.safetensors").read_bytes())
    return compile_args(p), ["is in both model-extra.safetensors and model.safetensors", "remove the stray shard"]


def unknown_dtype(tmp):
    p = copy_tiny(tmp)
    safetensors_file(p / "model.safetensors", {"w": {"dtype": "F8_E9M9", "shape": [1], "data_offsets": [0, 1]}}, bytes(1))
    return compile_args(p), ["tensor w has unsupported dtype 'F8_E9M9'", "convert the checkpoint"]


def index_names_a_path_outside(tmp):
    p = copy_tiny(tmp)
    (p / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../../etc/passwd"}}))
    return compile_args(p), ["names shard '../../etc/passwd', which is not a .safetensors file beside it"]


# ---- GGUF -----------------------------------------------------------------------------------------------

def gguf_block_count_2_31(tmp):
    return compile_args(tiny_gguf(tmp / "m.gguf", block_count=2**31)), [
        "m.gguf: llama.block_count is 2147483648; it must be between 1 and 2147483647", "re-convert the model"]


def gguf_block_count_beyond_tensors(tmp):
    return compile_args(tiny_gguf(tmp / "m.gguf", block_count=2**31 - 1)), [
        "llama.block_count is 2147483647, but the checkpoint holds tensors of 2 layers (model.layers.0..1)",
        "the GGUF metadata and tensors disagree"]


def gguf_non_utf8_string(tmp):
    return compile_args(non_utf8_name(tiny_gguf(tmp / "m.gguf"))), [
        "m.gguf is not a readable GGUF file", "general.name is not UTF-8 text"]


def gguf_truncated(tmp):
    f = tiny_gguf(tmp / "m.gguf")
    f.write_bytes(f.read_bytes()[:3000])
    return compile_args(f), ["m.gguf is not a readable GGUF file (truncated or corrupted?)"]


def gguf_zero_tensors(tmp):
    return compile_args(tiny_gguf(tmp / "m.gguf", with_tensors=False)), [
        "llama.block_count is 2, but the checkpoint holds no layer tensors"]


def gguf_garbage_after_magic(tmp):
    f = tmp / "m.gguf"
    f.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 60, 1 << 60) + bytes(64))
    return compile_args(f), ["m.gguf is not a readable GGUF file", "cannot fit in"]


# ---- context window and memory ------------------------------------------------------------------------

def context_window_huge(tmp):
    return compile_args(copy_tiny(tmp), "--context-window", str(10**12)), [
        "--context-window 1000000000000 exceeds the 128 positions this model was trained for",
        "use --context-window 128 or less"]


def context_window_past_positions(tmp):
    return compile_args(copy_tiny(tmp), "--context-window", "256"), ["max_position_embeddings in its config"]


def override_context_window_huge(tmp):
    return compile_args(copy_tiny(tmp), "--override", f"context_window={10**12}"), [
        "'context_window' is 1000000000000, outside 1..1048576"]


def kv_cache_does_not_fit_device_memory(tmp):
    return compile_args(copy_tiny(tmp), "--device", "cpu-opencl", "--override", "target.memory_bytes=400000"), [
        "KV cache 64.0 KiB for a context window of 128", "more than the 390.6 KiB device memory of preset cpu-opencl",
        "use --context-window 75 or less"]


def weights_do_not_fit_device_memory(tmp):
    return compile_args(copy_tiny(tmp), "--device", "cpu-opencl", "--override", "target.memory_bytes=65536"), [
        "weights 99.9 KiB", "more than the 64.0 KiB device memory", "the weights alone do not fit"]


def inspect_context_window_past_positions(tmp):
    return ("inspect", copy_tiny(tmp), "--context-window", str(10**12)), ["exceeds the 128 positions this model was trained for"]


# ---- presets ------------------------------------------------------------------------------------------

def preset_row_tile_m_huge(tmp):
    return compile_args(copy_tiny(tmp), "--device", preset_file(tmp, PRESET.format(row_tile_m=100000))), [
        "target: 'row_tile_m' is 100000, outside 1..64"]


def preset_threads_per_block_zero(tmp):
    return compile_args(copy_tiny(tmp), "--override", "target.threads_per_block=0"), [
        "target: 'threads_per_block' is 0, outside 1..4096"]


def preset_vector_width_3(tmp):
    return compile_args(copy_tiny(tmp), "--override", "target.vector_width=3"), [
        "'vector_width' is 3; choose one of 1, 2, 4, 8, 16"]


def preset_cuda_threads_over_hardware(tmp):
    return compile_args(copy_tiny(tmp), "--device", "h100", "--override", "target.max_threads_per_block=2048"), [
        "'max_threads_per_block' is 2048, outside 1..1024 for cuda"]


def preset_tensor_cores_on_opencl(tmp):
    return compile_args(copy_tiny(tmp), "--device", "adreno", "--override", "target.tensor_cores=true"), [
        "'tensor_cores' needs a cuda target of arch sm_80 or later (tf32, bf16)"]


def preset_prefill_chunk_over_context(tmp):
    return compile_args(copy_tiny(tmp), "--override", "context_window=64"), [
        "'prefill_chunk' 512 exceeds 'context_window' 64", "lower prefill_chunk to 64 or less"]


def preset_max_num_sequences_zero(tmp):
    return compile_args(copy_tiny(tmp), "--override", "max_num_sequences=0"), [
        "'max_num_sequences' must be a positive integer, got 0"]


def preset_kv_pool_tokens_huge(tmp):
    return compile_args(copy_tiny(tmp), "--override", "kv_pool_tokens=99999999"), [
        "'kv_pool_tokens' is 99999999, outside 0..4194304"]


def preset_yaml_list(tmp):
    return compile_args(copy_tiny(tmp), "--device", preset_file(tmp, "- name: x\n- target: {}\n")), [
        "mine.yaml must be a YAML mapping of preset keys"]


def preset_invalid_yaml(tmp):
    return compile_args(copy_tiny(tmp), "--device", preset_file(tmp, "name: x\ntarget: {kind: opencl\n")), [
        "mine.yaml is not valid YAML at line"]


def preset_name_with_path(tmp):
    text = PRESET.format(row_tile_m=1).replace("name: mine", "name: ../../escape")
    return compile_args(copy_tiny(tmp), "--device", preset_file(tmp, text)), ["'name' '../../escape' must be 1-64 letters"]


def preset_cpu_isa_unknown(tmp):
    text = (Path(__file__).resolve().parents[2] / "configs" / "cpu.yaml").read_text()
    assert "isa: native" in text
    return compile_args(copy_tiny(tmp), "--device", preset_file(tmp, text.replace("isa: native", 'isa: "avx9000"'))), [
        "mine.yaml: target: 'isa' is 'avx9000'; choose one of native, x86-64-v3, x86-64-v4, generic"]


def preset_isa_on_opencl(tmp):
    return compile_args(copy_tiny(tmp), "--device", "cpu-opencl", "--override", "target.isa=x86-64-v3"), [
        "--override on preset cpu-opencl", "'isa' is for the cpu target; remove it from this opencl preset"]


def preset_web_not_boolean(tmp):
    return compile_args(copy_tiny(tmp), "--device", "chrome-webgpu", "--override", "web=yes"), [
        "runtime 'web' must be true or false, not 'yes'"]


def preset_web_on_opencl(tmp):
    return compile_args(copy_tiny(tmp), "--device", "cpu-opencl", "--override", "web=true"), [
        "'web: true' (a browser bundle) needs target kind webgpu, not opencl"]


CASES = {f.__name__: f for f in [
    config_list, config_null, config_string, config_list_inspect, layers_float_1e9, layers_int_1e9, layers_negative,
    layers_zero, layers_string, layers_fraction, layers_fewer_than_tensors, gpt2_layers_more_than_tensors,
    hidden_size_mismatch, vocab_size_mismatch, heads_do_not_divide_hidden, heads_not_multiple_of_kv_heads,
    heads_times_head_dim_mismatch, max_position_embeddings_zero, unknown_rope_scaling, yarn_without_factor,
    longrope_factors_too_few, layer_types_wrong_length, sliding_window_zero, no_rope_layers_not_flags,
    partial_rotary_odd, tie_word_embeddings_string,
    architectures_not_a_list, header_longer_than_file, absurd_offsets, negative_offsets, duplicate_tensor_names,
    duplicate_tensor_across_shards, unknown_dtype, index_names_a_path_outside, gguf_block_count_2_31,
    gguf_block_count_beyond_tensors,
    gguf_non_utf8_string, gguf_truncated, gguf_zero_tensors, gguf_garbage_after_magic, context_window_huge,
    context_window_past_positions, override_context_window_huge,
    kv_cache_does_not_fit_device_memory, weights_do_not_fit_device_memory,
    inspect_context_window_past_positions, preset_row_tile_m_huge, preset_threads_per_block_zero, preset_vector_width_3,
    preset_cuda_threads_over_hardware, preset_tensor_cores_on_opencl, preset_prefill_chunk_over_context,
    preset_max_num_sequences_zero, preset_kv_pool_tokens_huge, preset_yaml_list, preset_invalid_yaml,
    preset_name_with_path, preset_cpu_isa_unknown, preset_isa_on_opencl, preset_web_not_boolean, preset_web_on_opencl]}


@pytest.mark.parametrize("case", CASES)
def test_refused(tmp_path, case):
    src = tmp_path / "src"
    src.mkdir()
    args, fragments = CASES[case](src)
    out = tmp_path / "out"
    args = [str(out) if a == "{out}" else a for a in args]
    r = cli_bounded(*args, env={"DEPLOYCC_HOME": str(tmp_path / "home")})
    assert_one_line_error(r, *fragments)
    assert not out.exists()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == [], leftovers


@pytest.mark.parametrize("registry", ["closed", "wrong bytes"])
def test_web_bundle_without_its_npm_libraries(tmp_path, registry):
    """The browser bundle's tokenizer and template libraries come from the npm registry, pinned by sha512: one
    that cannot be reached, or that serves other bytes, is one line and leaves no package."""
    import http.server
    import socket
    import threading

    class Wrong(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"not the tarball")

        def log_message(self, *args):
            pass
    if registry == "closed":
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{sock.getsockname()[1]}/"  # nothing listens once this closes
        fragments = ["needs @huggingface/", "could not be reached", "DEPLOYCC_NPM_REGISTRY"]
    else:
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Wrong)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{httpd.server_address[1]}/"
        fragments = ["does not match the sha512 deploycc pins for @huggingface/"]
    src = tmp_path / "src"
    src.mkdir()
    out = tmp_path / "out"
    r = cli_bounded("compile", copy_tiny(src), "--device", "chrome-webgpu", "-o", out,
                    env={"DEPLOYCC_HOME": str(tmp_path / "home"), "DEPLOYCC_NPM_REGISTRY": url})
    assert_one_line_error(r, *fragments)
    assert not out.exists()
    assert not list((tmp_path / "home").glob("npm/*"))  # nothing cached from a bad registry


def test_device_memory_defaults_to_this_machines_ram():
    from deploycc import presets
    from deploycc.limits import device_memory

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert device_memory(presets.load("cpu-opencl")) == (ram, "RAM of this machine")
    assert device_memory(presets.load("h100"))[0] == 80 << 30


def test_suggested_context_window_fits(tmp_path):
    """The window the memory error suggests is the largest that passes the same check."""
    from dataclasses import replace

    import deploycc
    from deploycc import presets
    from deploycc.errors import DeployError
    from deploycc.limits import check_compile

    model = deploycc.load_model(str(copy_tiny(tmp_path)))
    base = presets.load("cpu-opencl")
    small = replace(base, target=replace(base.target, memory_bytes=400000))
    with pytest.raises(DeployError, match=r"use --context-window (\d+) or less") as e:
        check_compile(model, small, None)
    best = int(e.value.args[0].split("use --context-window ")[1].split()[0])
    assert check_compile(model, small, best) == (best, min(best, base.prefill_chunk))
    with pytest.raises(DeployError):
        check_compile(model, small, best + 1)
