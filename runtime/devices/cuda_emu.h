// CUDA C executed on the CPU (runtime/devices/cuda_emu.py): the exact text a CUDA package carries, compiled as C++
// with this header in front of it. One fiber per CUDA thread, so that __syncthreads() is a true barrier: every thread
// of the block runs up to it before any runs past it. Blocks run one after another; before each, the block's shared
// memory (every __shared__ array, one linker section) is filled with 0xFF bytes (NaN as float, -1 as int), so a read
// of shared memory no thread of the block wrote shows. Threads start in the order asked for (forward, reverse, or
// shuffled by a seed) and, after each barrier, run on in that order. A barrier that some threads of a block reach and
// others do not (divergent, at different lines, or after some threads returned) stops the launch with an error.
// `half` is 16-bit storage with round-to-nearest-even conversions, as cuda_fp16.h's __float2half.
//
// What this proves: indexing, launch geometry, barriers, shared memory and the numerics up to the CPU's libm. What it
// does not: speed, occupancy, or the GPU's weak memory model (a thread here sees every store made before it ran).
// Warp primitives (__shfl_*_sync, __syncwarp, the wmma calls) are collective over the 32 lanes of a warp, as the fibers
// run them, and a warp whose lanes all reach one runs on alone: between two barriers each warp runs as far as it can
// before the next warp starts (the warps in the order their first threads come), as a GPU's warps may run ahead of
// each other, so a barrier between warps left out shows (since 2026-11-29; before, every thread ran up to its next
// warp primitive first, which hid it). __dp4a is arithmetic; atomicAdd and __threadfence below.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __restrict__ __restrict
#define __shared__ static __attribute__((section("dcc_shared"), aligned(16)))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

struct uint3 { unsigned int x, y, z; };
struct dim3 { unsigned int x, y, z; };
struct uint4 { unsigned int x, y, z, w; };
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return {x, y, z, w}; }

// The current thread's coordinates: the scheduler sets them before it switches to a thread.
extern "C" {
extern uint3 dcc_threadIdx, dcc_blockIdx;
extern dim3 dcc_blockDim, dcc_gridDim;
void dcc_barrier(int line);
}
#define threadIdx dcc_threadIdx
#define blockIdx dcc_blockIdx
#define blockDim dcc_blockDim
#define gridDim dcc_gridDim
#define __syncthreads() dcc_barrier(__LINE__)

// -- warp-level primitives: every lane of a warp waits at the call until all 32 have made it (at the same line, with
// the full mask), then each reads the value of the lane it names (a warp of fewer lanes, a partial mask or a lane
// that returned first is an error). Values travel as 64 bits.
extern "C" unsigned long long dcc_warp_exchange(unsigned mask, unsigned long long bits, int src_lane, int line);
static inline int dcc_lane() {
  return (int)((dcc_threadIdx.z * dcc_blockDim.y + dcc_threadIdx.y) * dcc_blockDim.x + dcc_threadIdx.x) & 31;
}
template <class T> static inline T dcc_shfl(unsigned mask, T v, int src, int line) {
  static_assert(sizeof(T) <= 8, "a shuffled value is at most 64 bits");
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof(T));
  bits = dcc_warp_exchange(mask, bits, src, line);
  T out;
  memcpy(&out, &bits, sizeof(T));
  return out;
}
// CUDA's source lane rules: within segments of `width` lanes; a source past the segment (down, up) keeps its own
template <class T> static inline T dcc_shfl_xor(unsigned mask, T v, int line, int lane_mask, int width = 32) {
  int lane = dcc_lane(), seg = lane & ~(width - 1), src = lane ^ lane_mask;
  return dcc_shfl(mask, v, (src & ~(width - 1)) == seg ? src : lane, line);
}
template <class T> static inline T dcc_shfl_down(unsigned mask, T v, int line, unsigned delta, int width = 32) {
  int lane = dcc_lane(), src = (lane & (width - 1)) + (int)delta;
  return dcc_shfl(mask, v, src < width ? lane + (int)delta : lane, line);
}
template <class T> static inline T dcc_shfl_up(unsigned mask, T v, int line, unsigned delta, int width = 32) {
  int lane = dcc_lane(), src = (lane & (width - 1)) - (int)delta;
  return dcc_shfl(mask, v, src >= 0 ? lane - (int)delta : lane, line);
}
template <class T> static inline T dcc_shfl_idx(unsigned mask, T v, int line, int src, int width = 32) {
  int lane = dcc_lane();
  return dcc_shfl(mask, v, (lane & ~(width - 1)) + (src & (width - 1)), line);
}
#define __shfl_xor_sync(mask, var, ...) dcc_shfl_xor((mask), (var), __LINE__, __VA_ARGS__)
#define __shfl_down_sync(mask, var, ...) dcc_shfl_down((mask), (var), __LINE__, __VA_ARGS__)
#define __shfl_up_sync(mask, var, ...) dcc_shfl_up((mask), (var), __LINE__, __VA_ARGS__)
#define __shfl_sync(mask, var, ...) dcc_shfl_idx((mask), (var), __LINE__, __VA_ARGS__)
#define __syncwarp(...) ((void)dcc_warp_exchange(0xffffffffu, 0, dcc_lane(), __LINE__))
// -- device-scope atomics and fences (schedule/attention.py's last-block combine). A launch's fibers run on one OS
// thread, one at a time, switching only at a barrier or a warp primitive, so a read-modify-write is indivisible here,
// and __threadfence has nothing to order: which block arrives last follows the block order asked for, but a fence
// left out goes unseen (the weak memory model is what the emulation does not prove).
static inline int atomicAdd(int* p, int v) { int old = *p; *p = old + v; return old; }
static inline unsigned int atomicAdd(unsigned int* p, unsigned int v) { unsigned int old = *p; *p = old + v; return old; }
static inline void __threadfence() {}

// four signed (unsigned) bytes of a times those of b, summed, plus c (sm_61+)
static inline int __dp4a(int a, int b, int c) {
  for (int k = 0; k < 4; k++) c += (int)(signed char)(a >> (8 * k)) * (int)(signed char)(b >> (8 * k));
  return c;
}
static inline unsigned int __dp4a(unsigned int a, unsigned int b, unsigned int c) {
  for (int k = 0; k < 4; k++) c += ((a >> (8 * k)) & 0xffu) * ((b >> (8 * k)) & 0xffu);
  return c;
}

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
// CUDA's integer and float min/max overloads
#define DCC_MINMAX(T) \
  static inline T max(T a, T b) { return a > b ? a : b; } \
  static inline T min(T a, T b) { return a < b ? a : b; }
DCC_MINMAX(int)
DCC_MINMAX(unsigned int)
DCC_MINMAX(long long)
DCC_MINMAX(unsigned long long)
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline float min(float a, float b) { return fminf(a, b); }

// -- half: storage, with cuda_fp16.h's conversions (round to nearest, ties to even; subnormals, inf and NaN kept)
struct half { uint16_t x; };
static inline half __float2half(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7fffffffu;
  half h;
  if (mag > 0x7f800000u) { h.x = (uint16_t)(sign | 0x7e00u); return h; }  // NaN
  if (mag >= 0x477ff000u) { h.x = (uint16_t)(sign | 0x7c00u); return h; }  // rounds past 65504: inf
  if (mag < 0x38800000u) {  // below 2^-14: a subnormal half (or zero), m * 2^-24
    float a;
    memcpy(&a, &mag, 4);
    float scaled = a * 16777216.0f;  // exact: a power of two
    float r = nearbyintf(scaled);  // the default rounding mode: to nearest, ties to even
    h.x = (uint16_t)(sign | (uint32_t)r);
    return h;
  }
  uint32_t e = (mag >> 23) - 112, m = mag & 0x7fffffu;  // rebias 127 -> 15
  uint32_t out = (e << 10) | (m >> 13), rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (out & 1u))) out += 1;  // a carry into the exponent is right too
  h.x = (uint16_t)(sign | out);
  return h;
}
static inline float __half2float(half h) {
  uint32_t sign = (uint32_t)(h.x & 0x8000u) << 16, e = (h.x >> 10) & 0x1fu, m = h.x & 0x3ffu, u;
  if (e == 0) {
    float f = (float)m * 5.9604644775390625e-08f;  // m * 2^-24, exact
    memcpy(&u, &f, 4);
    u |= sign;
  } else if (e == 31) {
    u = sign | 0x7f800000u | (m << 13);
  } else {
    u = sign | ((e + 112) << 23) | (m << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// -- bfloat16: storage, with cuda_bf16.h's conversions (round to nearest, ties to even; inf and NaN kept)
struct __nv_bfloat16 { uint16_t x; };
static inline __nv_bfloat16 __float2bfloat16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  __nv_bfloat16 h;
  if ((u & 0x7fffffffu) > 0x7f800000u) { h.x = (uint16_t)((u >> 16) | 0x40u); return h; }  // NaN, quiet
  u += 0x7fffu + ((u >> 16) & 1u);  // a carry into the exponent is right too (up to inf)
  h.x = (uint16_t)(u >> 16);
  return h;
}
static inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = (uint32_t)h.x << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// A fault a kernel's call makes (a fragment's pointer or leading dimension outside what the API allows): the launch
// fails with it once its block has run (runtime/devices/cuda_emu_run.inc).
extern "C" void dcc_fault(int line, const char* what);

// -- tensor cores: nvcuda::wmma, the shapes the schedules use (deploycc/schedule/mma.py): m16n16k8 with tf32 inputs
// and m16n16k16 with half or __nv_bfloat16 inputs, float accumulators (sm_80+). CUDA leaves a fragment's distribution
// over the warp's lanes unspecified (kernels touch fragments only through these calls and elementwise loops over
// x[0 .. num_elements) of fragments of one type, which share their layout), so here every lane holds the whole tile,
// element (r, c) at x[r * cols + c], as float (a half or bfloat16 exactly). Every call is collective over the warp,
// as __syncwarp: each lane waits until all 32 reach the same call, and a lane elsewhere or returned is an error.
// As CUDA documents, a load's or store's pointer must be 256-bit aligned and its leading dimension a multiple of 16
// bytes; either outside that is a fault. mma_sync multiplies in double (a product of two tf32, half or bfloat16
// values is exact) and adds the products to c in k order; a GPU's order and rounding inside one mma differ, within a
// few float ulps of the sum's magnitudes.
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision { struct tf32 {}; }
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K> struct dcc_tile;
template <int M, int N, int K> struct dcc_tile<matrix_a, M, N, K> { enum { rows = M, cols = K }; };
template <int M, int N, int K> struct dcc_tile<matrix_b, M, N, K> { enum { rows = K, cols = N }; };
template <int M, int N, int K> struct dcc_tile<accumulator, M, N, K> { enum { rows = M, cols = N }; };
// the element types each shape takes, and the type a fragment of them loads from memory
template <class T, int K> struct dcc_element { enum { ok = 0 }; };
template <> struct dcc_element<precision::tf32, 8> { enum { ok = 1 }; typedef float stored; };
template <> struct dcc_element<float, 8> { enum { ok = 1 }; typedef float stored; };
template <> struct dcc_element<half, 16> { enum { ok = 1 }; typedef half stored; };
template <> struct dcc_element<__nv_bfloat16, 16> { enum { ok = 1 }; typedef __nv_bfloat16 stored; };
template <> struct dcc_element<float, 16> { enum { ok = 1 }; typedef float stored; };
template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
  static_assert(M == 16 && N == 16 && dcc_element<T, K>::ok,
                "the emulation has wmma's m16n16k8 (tf32) and m16n16k16 (half, __nv_bfloat16) shapes only");
  enum { rows = dcc_tile<Use, M, N, K>::rows, cols = dcc_tile<Use, M, N, K>::cols, num_elements = rows * cols };
  float x[num_elements];
};
// cvt.rna.tf32.f32: the float rounded to 10 mantissa bits, to nearest with ties away from zero (NaN and inf kept)
static inline float __float_to_tf32(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  memcpy(&f, &u, 4);
  return f;
}
static inline float dcc_value(float v) { return v; }
static inline float dcc_value(half v) { return __half2float(v); }
static inline float dcc_value(__nv_bfloat16 v) { return __bfloat162float(v); }
static inline void dcc_warp_call(int line) { (void)dcc_warp_exchange(0xffffffffu, 0, dcc_lane(), line); }
template <class E> static inline void dcc_check(const E* p, unsigned ldm, int line) {
  if ((uintptr_t)p % 32)
    dcc_fault(line, "a wmma load or store whose pointer is not 256-bit aligned");
  else if ((ldm * sizeof(E)) % 16)
    dcc_fault(line, "a wmma load or store whose leading dimension is not a multiple of 16 bytes");
}
template <class L> static inline bool dcc_row_major(L) { return true; }
static inline bool dcc_row_major(col_major) { return false; }
template <class F, class E> static inline void dcc_load(F& f, const E* p, unsigned ldm, bool row, int line) {
  dcc_warp_call(line);
  dcc_check(p, ldm, line);
  for (int r = 0; r < F::rows; r++)
    for (int c = 0; c < F::cols; c++)
      f.x[r * F::cols + c] = dcc_value(row ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]);
}
template <class Use, int K, class T, class L>
static inline void dcc_load_matrix(fragment<Use, 16, 16, K, T, L>& f, const typename dcc_element<T, K>::stored* p,
                                   unsigned ldm, int line) {
  dcc_load(f, p, ldm, dcc_row_major(L()), line);
}
template <int K, class T>
static inline void dcc_load_matrix(fragment<accumulator, 16, 16, K, T>& f, const float* p, unsigned ldm, layout_t l,
                                   int line) {
  dcc_load(f, p, ldm, l == mem_row_major, line);
}
template <int K, class T>
static inline void dcc_store_matrix(float* p, const fragment<accumulator, 16, 16, K, T>& f, unsigned ldm, layout_t l,
                                    int line) {
  dcc_warp_call(line);
  dcc_check(p, ldm, line);
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) (l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]) = f.x[r * 16 + c];
}
template <class F> static inline void dcc_fill(F& f, float v, int line) {
  dcc_warp_call(line);
  for (int e = 0; e < F::num_elements; e++) f.x[e] = v;
}
template <int K, class TA, class TB, class LA, class LB, class T>
static inline void dcc_mma(fragment<accumulator, 16, 16, K, T>& d, const fragment<matrix_a, 16, 16, K, TA, LA>& a,
                           const fragment<matrix_b, 16, 16, K, TB, LB>& b, const fragment<accumulator, 16, 16, K, T>& c,
                           int line) {
  static_assert(sizeof(TA) == sizeof(TB) && dcc_element<TA, K>::ok && dcc_element<TB, K>::ok,
                "mma_sync multiplies fragments of one element type");
  dcc_warp_call(line);
  // as the tensor cores add (Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021): the products exact,
  // summed with the accumulator, and the sum rounded toward zero once, not to nearest after each product. The bias
  // of that rounding is what a long K accumulated in one fragment gathers (an H200 measured it: tests/kernels/
  // test_mma_rule.py); the products are exact in double and K + 1 terms of them sum there to well past float.
  float out[256];
  for (int r = 0; r < 16; r++)
    for (int n = 0; n < 16; n++) {
      double s = c.x[r * 16 + n];
      for (int k = 0; k < K; k++) s += (double)a.x[r * K + k] * (double)b.x[k * 16 + n];
      float f = (float)s;
      if (fabs((double)f) > fabs(s)) f = nextafterf(f, 0.0f);
      out[r * 16 + n] = f;
    }
  memcpy(d.x, out, sizeof out);
}
#define load_matrix_sync(...) dcc_load_matrix(__VA_ARGS__, __LINE__)
#define store_matrix_sync(...) dcc_store_matrix(__VA_ARGS__, __LINE__)
#define fill_fragment(f, v) dcc_fill((f), (v), __LINE__)
#define mma_sync(...) dcc_mma(__VA_ARGS__, __LINE__)
}  // namespace wmma
}  // namespace nvcuda
