#!/usr/bin/env bash
# The checks of a session that is lent an NVIDIA GPU (the workplace's device tool), in one command that fits a short
# lease: every CUDA and WebGPU kernel test on the GPU, then SmolLM2-shaped and Llama-3.2-1B-shaped packages
# (random weights: the real GGUF does not fit what travels) compiled for h100 and cpu-webgpu (wgpu on the GPU's Vulkan driver), verified against
# the numpy reference, and benchmarked against the GPU's own read bandwidth (bench --roofline).
#
# Prepared on the CPU machine, in the repository root (what travels: .whl and .gl, .gpu):
#   pip wheel --no-deps --no-build-isolation -w .whl .       # deploycc itself
#   pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl wgpu cffi pycparser rendercanvas gguf
#   apt-get download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 (into .gl)
#   .gpu/tok: SmolLM2's tokenizer.json, tokenizer_config.json, chat_template.jinja
#   .gpu/npm: the web bundle's npm tarballs (from $DEPLOYCC_HOME/npm), for the tests that compile chrome-webgpu
# On the GPU machine: bash benchmarks/gpu_check.sh [tests|packages|all|wide|split|graphs|lease|kv]; logs and JSON land in $OUT.
# graphs: the decode step as CUDA graphs (runtime/graphs.py) against launch by launch (DEPLOYCC_CUDA_GRAPHS=0), interleaved,
# then the server's batched step profiled kernel by kernel (bench --sequences --profile).
# lease: the one call a 15-minute lease affords, in order of worth: the kernel tests (dp4a's too), then SmolLM2- and
# Llama-3.2-1B-shaped h100 packages with float and 8-bit (--activations 8, dp4a) activations and a cpu-webgpu one,
# verified, the decode GEMV's K split, the prefill tiles (3xTF32 against the codes' tiles, each with and without
# prefetch) and the norms' fold A/B (gpu_gemv.py, gpu_tiles.py, gpu_fold.py), the packages benchmarked with
# --roofline, graphs against launch by launch, the step of one sequence as step_one and as step (DEPLOYCC_STEP_ONE=0),
# and the batched step profiled (2026-11-28, evening: 314 s with
# TESTS_N=14 TESTS_S=170, which cut the last 13% of the tests; with the folds A/B and the tiles' five variants since,
# TESTS_N=14 TESTS_S=200 should take about 550 s).
# benchmarks/gpu_calibrate.py then compares the profiles
# (lease-bench.jsonl) with the performance model, on packages compiled here from the same code.
# kv: the float16 KV cache (h100's default since 2026-11-29) against float32 (--override kv_cache=float32), a
# Llama-3.2-1B-shaped package decoding after a 4,000-token prompt, interleaved: a second call after `lease`. Its
# prefill of 4,000 tokens (chunks of 2,048) also A/Bs the attention: the tensor cores' tiles take a float16 cache
# only, so the float32 package's prefill runs the SIMT tiles. Then the same on WebGPU (wgpu on the Vulkan driver): a
# SmolLM2-shaped cpu-webgpu package with each cache after a 2,000-token prompt, the float16 one with shader-f16 and
# without (its packed atomics), interleaved.
# wide: every test that names cuda, h100, rtx4090 or webgpu (the CLI ones too), then prefill at 512 tokens, decode
# at a 2048-token context and batched decode (--sequences) of the h100 packages.
set -u
STAGE=${1:-all}
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$ICD" ] && export VK_DRIVER_FILES=$ICD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 DEPLOYCC_HOME=/tmp/dcchome PYTHONSAFEPATH=1
PY="python3 -P"  # -P (and PYTHONSAFEPATH for the CLI the tests start): the checkout's deploycc/ (its runtime lives beside it) must not shadow the installed wheel
t0=$(date +%s)
stamp() { echo "== $(( $(date +%s) - t0 ))s: $*"; }
tok_s() { $PY -c "import json,sys; r=json.loads(sys.stdin.read()); print({k: r.get(k) for k in ('prefill_tok_s', 'decode_tok_s')})"; }

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
$PY - <<'EOF'
import cupy, wgpu
print("cupy", cupy.__version__, "wgpu", wgpu.__version__)
from deploycc.runtime.devices import available
for d in available():
    print(d["kind"], d["name"], {k: v for k, v in d["details"].items() if k in ("arch", "backend", "error", "adapter_type")})
EOF

# the checkpoints (transformers, seed 0) with SmolLM2's tokenizer: built while the tests run
mkdir -p $DEPLOYCC_HOME/models/SmolLM2-135M-Instruct $DEPLOYCC_HOME/npm
cp .gpu/npm/* $DEPLOYCC_HOME/npm/ 2>/dev/null
cp .gpu/tok/* $DEPLOYCC_HOME/models/SmolLM2-135M-Instruct/
LOGS=/tmp/gpu-check-logs; mkdir -p $LOGS
# every log comes back as one file (the device tool returns at most 8), also when an outer timeout stops the script
trap 'tar czf "$OUT/logs.tgz" -C /tmp gpu-check-logs 2>/dev/null' EXIT
trap 'exit 124' TERM
$PY -c "import sys; sys.path.insert(0, 'benchmarks'); import build_llama_cpp as b
b.make_shaped('SmolLM2-135M-shaped'); '$STAGE' == 'split' or b.make_shaped('Llama-3.2-1B-shaped')" >"$LOGS/checkpoints.log" 2>&1 &
CKPT=$!
COMPILES=
if [ "$STAGE" = lease ]; then
  ( wait_for() { while [ ! -f "$DEPLOYCC_HOME/models/$1/config.json" ]; do kill -0 $CKPT 2>/dev/null || break; sleep 2; done; }  # renamed whole
    for spec in "S SmolLM2-135M-shaped h100" "S SmolLM2-135M-shaped h100 -a8" "S SmolLM2-135M-shaped cpu-webgpu" \
                "L Llama-3.2-1B-shaped h100" "L Llama-3.2-1B-shaped h100 -a8"; do
      set -- $spec; wait_for $2; dev=${3#cpu-}; act=""; [ "${4:-}" = -a8 ] && act="--activations 8"
      timeout 200 $PY -m deploycc compile "$DEPLOYCC_HOME/models/$2" --device $3 --quantization q4f16_1 $act -o /tmp/pkg/$1-$dev${4:-} \
        >"$LOGS/compile-$1-$dev${4:-}.log" 2>&1 &
    done; wait ) &
  COMPILES=$!
fi

if [ "$STAGE" = split ]; then  # the split decode attention: its tests on the GPU, and SmolLM2's decode at 2k
  stamp "attention and model kernel tests on the GPU"
  timeout ${TESTS_S:-150} $PY -m pytest -q -p no:cacheprovider -n 12 -rs tests/kernels/test_cpu_attention.py \
      tests/kernels/test_model_kernels.py -k "cuda and not emu" 2>&1 | tee "$LOGS/split.log" | tail -4
elif [ "$STAGE" = wide ]; then
  stamp "every cuda/h100/rtx4090/webgpu test"
  timeout ${TESTS_S:-200} $PY -m pytest -q -p no:cacheprovider -n 12 -rs --durations=5 tests \
      -k "cuda or h100 or rtx4090 or webgpu" --deselect tests/web 2>&1 | tee "$LOGS/wide.log" \
      | grep -v "PytestBenchmarkWarning\|warner(" | grep -v "^SKIPPED.*\(conftest.py:45\|oclgrind\|no network\)" | tail -30
elif [ "$STAGE" != packages ] && [ "$STAGE" != kv ]; then
  stamp "kernel tests on the GPU (cuda, webgpu)"
  timeout ${TESTS_S:-240} $PY -m pytest -v --tb=short -p no:cacheprovider -n ${TESTS_N:-8} -rsfE --durations=5 \
      tests/kernels/test_model_kernels.py tests/kernels/test_paged_attention.py tests/kernels/test_cpu_attention.py \
      tests/kernels/test_packed_and_half.py tests/kernels/test_cuda_kernels.py tests/devices/test_cuda_compile.py \
      tests/kernels/test_subgroup_reduce.py tests/kernels/test_mma_rule.py tests/runtime/test_cuda_graphs.py \
      tests/runtime/test_kv_fuse.py tests/kernels/test_dp4a.py tests/kernels/test_dispatch_rows.py \
      tests/kernels/test_attention_tiles.py tests/runtime/test_half_cache.py tests/kernels/test_wgsl_f16_packed.py \
      tests/kernels/test_split_arrivals.py tests/kernels/test_attention_append.py -k "cuda or h100 or webgpu or rtx4090 or compile or include or gpu" 2>&1 | tee "$LOGS/tests.log" | grep -v "PASSED\|PytestBenchmarkWarning\|warner(" | tail -60
fi
wait $CKPT; tail -3 "$LOGS/checkpoints.log"
[ "$STAGE" = tests ] && exit 0
if [ "$STAGE" = lease ]; then
  M=$DEPLOYCC_HOME/models
  wait $COMPILES
  for p in S-h100 S-h100-a8 S-webgpu; do
    stamp "verify $p"; timeout 60 $PY -m deploycc verify /tmp/pkg/$p --steps 4 2>&1 | tail -2
  done
  bench() {  # name, then bench's arguments
    local name=$1; shift; stamp "bench $name $*"
    timeout 90 $PY -m deploycc bench /tmp/pkg/$name --repeat 2 --json "$@" 2>>"$LOGS/bench.err" | tee -a "$OUT/lease-bench.jsonl" \
      | $PY -c "import json,sys; r=json.loads(sys.stdin.read()); roof=r.get('roofline') or {}; p=r.get('profile') or {}
print({k: r.get(k) for k in ('prefill_tok_s', 'decode_tok_s', 'cuda_graphs')}, 'probe', roof.get('bandwidth_before', {}).get('all_threads_gb_s'),
      'achieved', roof.get('achieved_gb_s'), 'MB', (roof.get('weight_bytes_per_step') or 0) / 1e6, 'launches', p.get('launches_per_token'),
      'kernel ms', p.get('kernel_ms_per_token'), 'host ms', p.get('host_ms_per_token'))
for k in p.get('kernels', [])[:6]: print('   ', k['kernel'][:50], round(k['launches_per_token']), round(k['us_each'], 1), 'us', round(k.get('gb_s', 0)), 'GB/s')" \
      || tail -3 "$LOGS/bench.err"
  }
  stamp "the decode GEMV with and without its K split (benchmarks/gpu_gemv.py)"
  timeout 90 $PY benchmarks/gpu_gemv.py --shapes 2048x8192,2048x2048,3072x2048,16384x2048,576x1536 2>&1 | tee "$LOGS/gemv.log"
  stamp "the prefill tiles: 3xTF32 with and without their K steps' prefetch, the codes' (benchmarks/gpu_tiles.py)"
  timeout 130 $PY benchmarks/gpu_tiles.py 2>&1 | tee "$LOGS/tiles.log"
  stamp "what is folded into the GEMVs against kernels of their own (benchmarks/gpu_fold.py)"
  timeout 240 $PY benchmarks/gpu_fold.py 2>&1 | tee "$LOGS/fold.log"
  bench S-h100 --roofline; bench S-h100-a8 --roofline; bench L-h100 --roofline; bench L-h100-a8 --roofline
  DEPLOYCC_CUDA_GRAPHS=0 bench S-h100; DEPLOYCC_CUDA_GRAPHS=0 bench L-h100
  bench S-h100 --prompt-len 512 --gen-len 32; bench L-h100 --prompt-len 512 --gen-len 32
  bench S-webgpu
  stamp "the step of one sequence: step_one against step (DEPLOYCC_STEP_ONE=0)"
  for one in 1 0; do
    DEPLOYCC_STEP_ONE=$one timeout 60 $PY -m deploycc bench /tmp/pkg/S-h100 --sequences 1,2 --prompt-len 128 --gen-len 64 \
      --json 2>>"$LOGS/bench.err" | tee -a "$OUT/lease-bench.jsonl" | $PY -c "import json,sys; r=json.loads(sys.stdin.read())
print('DEPLOYCC_STEP_ONE=$one', [(x['sequences'], x.get('function'), x['step_ms']) for x in r['rows']])" || tail -3 "$LOGS/bench.err"
  done
  stamp "profile of the batched step, SmolLM2-135M-shaped, 1 and 16 sequences"
  timeout 90 $PY -m deploycc bench /tmp/pkg/S-h100 --sequences 1,16 --profile --prompt-len 128 --gen-len 32 \
    --json 2>>"$LOGS/bench.err" | tee "$OUT/step-profile.json" | $PY -c "import json,sys; r=json.loads(sys.stdin.read())
for p in r['profiles']:
    print(p['sequences'], {k: round(v, 3) for k, v in p.items() if k.endswith('per_token')})
    print([(k['kernel'], round(k['us_each'], 1), k['launches_per_token']) for k in p['kernels'][:8]])" || tail -3 "$LOGS/bench.err"
  stamp "done"; exit 0
fi
if [ "$STAGE" = kv ]; then  # the float16 KV cache against float32 at a long context, interleaved (about 200 s)
  m=Llama-3.2-1B-shaped
  for kv in float16 float32; do
    timeout 200 $PY -m deploycc compile "$DEPLOYCC_HOME/models/$m" --device h100 --override kv_cache=$kv -o /tmp/pkg/kv-$kv \
      >"$LOGS/compile-kv-$kv.log" 2>&1 &
  done; wait
  timeout 60 $PY -m deploycc verify /tmp/pkg/kv-float16 --steps 4 2>&1 | tail -1
  for kv in float16 float32 float16 float32; do
    stamp "bench $m kv_cache=$kv, prompt 4000"
    timeout 60 $PY -m deploycc bench /tmp/pkg/kv-$kv --repeat 1 --prompt-len 4000 --gen-len 64 --json \
      2>>"$LOGS/bench.err" | tee -a "$OUT/kv-bench.jsonl" | tok_s || tail -3 "$LOGS/bench.err"
  done
  # WebGPU on the GPU's Vulkan driver (the browser's float16 cache, since 2026-11-29): SmolLM2-shaped cpu-webgpu with
  # each cache, the float16 one also without shader-f16 (DEPLOYCC_WEBGPU_F16=0: its appends' packed atomics)
  w=SmolLM2-135M-shaped
  for kv in float16 float32; do
    timeout 200 $PY -m deploycc compile "$DEPLOYCC_HOME/models/$w" --device cpu-webgpu --quantization q4f16_1 \
      --override kv_cache=$kv -o /tmp/pkg/kvw-$kv >"$LOGS/compile-kvw-$kv.log" 2>&1 &
  done; wait
  for f16 in 1 0; do DEPLOYCC_WEBGPU_F16=$f16 timeout 60 $PY -m deploycc verify /tmp/pkg/kvw-float16 --steps 4 2>&1 | tail -1; done
  for run in "float16 1" "float32 1" "float16 0" "float16 1" "float32 1" "float16 0"; do
    set -- $run; stamp "bench $w cpu-webgpu kv_cache=$1 DEPLOYCC_WEBGPU_F16=$2, prompt 2000"
    DEPLOYCC_WEBGPU_F16=$2 timeout 60 $PY -m deploycc bench /tmp/pkg/kvw-$1 --repeat 1 --prompt-len 2000 --gen-len 64 \
      --json 2>>"$LOGS/bench.err" | tee -a "$OUT/kv-bench.jsonl" | tok_s || tail -3 "$LOGS/bench.err"
  done
  stamp "done"; exit 0
fi
if [ "$STAGE" = graphs ]; then  # the decode step as CUDA graphs against launch by launch, interleaved
  for m in SmolLM2-135M-shaped Llama-3.2-1B-shaped; do
    $PY -m deploycc compile "$DEPLOYCC_HOME/models/$m" --device h100 -o /tmp/pkg/$m >"$LOGS/compile-$m.log" 2>&1 || tail -2 "$LOGS/compile-$m.log"
    timeout 60 $PY -m deploycc verify /tmp/pkg/$m --steps 4 2>&1 | tail -1
    for g in 0 1 0 1; do
      stamp "bench $m DEPLOYCC_CUDA_GRAPHS=$g"
      DEPLOYCC_CUDA_GRAPHS=$g timeout 60 $PY -m deploycc bench /tmp/pkg/$m --repeat 2 --prompt-len 128 --gen-len 128 --json \
        2>>"$LOGS/bench.err" | tee -a "$OUT/graphs-bench.jsonl" | $PY -c "import json,sys; r=json.loads(sys.stdin.read()); \
print({k: r.get(k) for k in ('prefill_tok_s', 'decode_tok_s', 'cuda_graphs')})" || tail -3 "$LOGS/bench.err"
    done
  done
  # the server's batched step kernel by kernel (the performance model misses it most: docs/gpu.md)
  stamp "profile of the batched step, SmolLM2-135M-shaped, 1 and 16 sequences"
  timeout 90 $PY -m deploycc bench /tmp/pkg/SmolLM2-135M-shaped --sequences 1,16 --profile --prompt-len 128 --gen-len 32 \
    --json 2>>"$LOGS/bench.err" | tee "$OUT/step-profile.json" | $PY -c "import json,sys; r=json.loads(sys.stdin.read())
for p in r['profiles']:
    print(p['sequences'], {k: round(v, 3) for k, v in p.items() if k.endswith('per_token')})
    print([(k['kernel'], round(k['us_each'], 1), k['launches_per_token']) for k in p['kernels'][:8]])" || tail -3 "$LOGS/bench.err"
  stamp "done"; exit 0
fi
if [ "$STAGE" = split ]; then
  m=SmolLM2-135M-shaped
  $PY -m deploycc compile "$DEPLOYCC_HOME/models/$m" --device h100 -o /tmp/pkg/$m >"$LOGS/compile.log" 2>&1 || tail -2 "$LOGS/compile.log"
  timeout 60 $PY -m deploycc verify /tmp/pkg/$m --steps 4 2>&1 | tail -1
  for run in "--prompt-len 2048 --gen-len 64" "--prompt-len 512 --gen-len 64" "--prompt-len 128 --gen-len 64"; do
    stamp "bench $m $run"
    timeout 60 $PY -m deploycc bench /tmp/pkg/$m --repeat 2 $run 2>&1 | grep -i "tok/s\|error" | head -4
  done
  stamp "done"; exit 0
fi
if [ "$STAGE" = wide ]; then
  M=$DEPLOYCC_HOME/models
  for m in SmolLM2-135M-shaped Llama-3.2-1B-shaped; do
    $PY -m deploycc compile "$M/$m" --device h100 --quantization q4f16_1 -o "/tmp/pkg/$m" >"$LOGS/compile-$m.log" 2>&1 || tail -2 "$LOGS/compile-$m.log"
    for run in "--prompt-len 512 --gen-len 32" "--prompt-len 2048 --gen-len 64" "--prompt-len 128 --gen-len 64 --sequences 1,8,32"; do
      stamp "bench $m $run"
      timeout 120 $PY -m deploycc bench "/tmp/pkg/$m" --repeat 2 $run --json 2>"$LOGS/bench.err" | tee -a "$OUT/wide-bench.jsonl" \
        | $PY -c "import json,sys; r=json.loads(sys.stdin.read()); print({k: v for k, v in r.items() if k.endswith('tok_s') or k in ('prompt_len', 'rows')})" \
        || tail -3 "$LOGS/bench.err"
    done
  done
  stamp "done"; exit 0
fi

M=$DEPLOYCC_HOME/models
dcc() { $PY -m deploycc "$@"; }
stamp "compile"
for spec in "SmolLM2-135M-shaped h100 q4f16_1" "SmolLM2-135M-shaped h100 q0f16" "SmolLM2-135M-shaped cpu-webgpu q4f16_1" \
            "Llama-3.2-1B-shaped h100 q4f16_1"; do
  set -- $spec
  ( timeout 240 $PY -m deploycc compile "$M/$1" --device "$2" --quantization "$3" -o "/tmp/pkg/$1-$2-$3" \
      >"$LOGS/compile-$1-$2-$3.log" 2>&1; echo "compile $spec: rc $? $(tail -1 $LOGS/compile-$1-$2-$3.log)" ) &
done
wait
for spec in "SmolLM2-135M-shaped h100 q4f16_1" "SmolLM2-135M-shaped cpu-webgpu q4f16_1"; do
  set -- $spec
  stamp "verify $spec"
  timeout 120 $PY -m deploycc verify "/tmp/pkg/$1-$2-$3" --steps 4 2>&1 | tail -6
done
for spec in "SmolLM2-135M-shaped h100 q4f16_1" "SmolLM2-135M-shaped h100 q0f16" "Llama-3.2-1B-shaped h100 q4f16_1" \
            "SmolLM2-135M-shaped cpu-webgpu q4f16_1"; do
  set -- $spec
  stamp "bench $spec"
  extra=""; [ "$2" = h100 ] && extra="--roofline"
  timeout 150 $PY -m deploycc bench "/tmp/pkg/$1-$2-$3" --repeat 2 $extra --json >"$OUT/bench-$1-$2-$3.json" 2>"$LOGS/bench-$1-$2-$3.err"
  echo "rc $?"; tail -2 "$LOGS/bench-$1-$2-$3.err"
  $PY - "$OUT/bench-$1-$2-$3.json" <<'EOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"no result: {e}")
print(f"  {r['preset']} on {r['device']}: prefill {r['prefill_tok_s']:.1f} tok/s, decode {r['decode_tok_s']:.1f} tok/s")
p = r.get("profile")
if p:
    print(f"  decode step {p['wall_ms_per_token']:.2f} ms wall, {p['kernel_ms_per_token']:.3f} ms in {p['launches_per_token']:.0f} "
          f"kernels, host {p['host_ms_per_token']:.2f} ms")
    for k in p["kernels"][:8]:
        print(f"    {k['kernel'][:48]:48s} x{k['launches_per_token']:3.0f} {k['us_each']:8.1f} us {k.get('gb_s', 0):7.1f} GB/s")
roof = r.get("roofline")
if roof:
    print(f"  read probe {roof['bandwidth_before']['all_threads_gb_s']:.0f} GB/s; step reads {roof['weight_bytes_per_step']/1e6:.1f} MB "
          f"weights + {roof['kv_bytes_per_step']/1e6:.1f} MB KV: {roof['achieved_gb_s']:.1f} GB/s "
          f"({100 * roof['roofline_fraction']:.2f}%), limit {roof['roofline_tok_s']:.0f} tok/s")
EOF
done
stamp "done"
