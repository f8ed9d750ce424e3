"""The cpu target's intrinsics (deploycc/schedule/qgemv.py tensorizes into them), one C source with a
branch per instruction set, chosen by the compiler's -march macros:

    __AVX512VNNI__ + __AVX512VL__, or __AVXVNNI__   vpdpbusd: u8 codes x s8 activations -> i32, 4 per lane
    __AVX2__                                       vpmaddubsw + vpmaddwd (llama.cpp's AVX2 path)
    otherwise                                      plain C (ARM's sdot would go here, as another branch)

Activations: `quantize_q8_pairs` (for 4-bit codes) stores each block of 32 as its 16 even then its 16
odd elements, the order in which the low and the high nibbles of the block's 16 code bytes come out;
`quantize_q8_linear` (8-bit codes) keeps the order. Each block gets its scale d = max|x| / 127 and
d * (the sum of its codes), for the zero point or the minimum. Every dot returns, for one row r,
    sum_b  s_b * d_b * (codes . xq)_b  +  c_b * (d * sum)_b,   c_b = m_b (asymmetric) or -zero * s_b
The corrections are one short float dot product per row (and token), outside the block loop.

Interleaved weights (`*_x16*`, the layout of InterleavedScheme and InterleavedQ5): targets/c_x16.py and, 8-bit,
c_x16_q8.py, whose source follows this one (the layout is chosen for CPUs with AVX2 or AVX-512, runtime/native.weight_interleave).

Prefill (`*_tile`): DCC_TILE activation rows against one weight row, each block's codes unpacked once. With
AVX-512 VNNI two blocks go through one 512-bit `vpdpbusd` (their scales spread over the two halves);
AVX-VNNI and AVX2 take one block per 256-bit step.
"""

INTRINSICS = r"""
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__))
#define DCC_DOT_U8S8(a, b) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (a), (b))
#elif defined(__AVXVNNI__)
#define DCC_DOT_U8S8(a, b) _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), (a), (b))
#elif defined(__AVX2__)
/* codes <= 15 keep the pair sums of vpmaddubsw within int16 (15 * 127 * 2) */
#define DCC_DOT_U8S8(a, b) _mm256_madd_epi16(_mm256_maddubs_epi16((a), (b)), _mm256_set1_epi16(1))
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define DCC_ZMM 1
#endif

static inline void dcc_quantize_block(const float* x, int8_t* q, float* d, float* dsum, int pairs) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) { float a = fabsf(x[i]); amax = a > amax ? a : amax; }
  float dd = amax / 127.0f, id = dd > 0.0f ? 1.0f / dd : 0.0f;
  int32_t s = 0;
  for (int i = 0; i < 32; ++i) {
    int v = (int)lrintf(x[i] * id);
    int at = pairs ? ((i & 1) ? 16 + (i >> 1) : (i >> 1)) : i;
    q[at] = (int8_t)v;
    s += v;
  }
  *d = dd;
  *dsum = dd * (float)s;
}

/* n activations from x + off into row `row` of q (n per row), d and dsum (n / 32 per row) */
static inline void dcc_quantize_q8_pairs(const float* x, int8_t* q, float* d, float* dsum, int off, int n, int row) {
  const int64_t r = row, nb = n / 32;
  for (int b = 0; b < nb; ++b)
    dcc_quantize_block(x + off + 32 * b, q + r * n + 32 * b, d + r * nb + b, dsum + r * nb + b, 1);
}

static inline void dcc_quantize_q8_linear(const float* x, int8_t* q, float* d, float* dsum, int off, int n, int row) {
  const int64_t r = row, nb = n / 32;
  for (int b = 0; b < nb; ++b)
    dcc_quantize_block(x + off + 32 * b, q + r * n + 32 * b, d + r * nb + b, dsum + r * nb + b, 0);
}

/* sum_b c_b * dsum_b with c_b = m_b, or -zero * s_b when m is 0 */
static inline float dcc_correction(const half* s, const half* m, float zero, const float* dsum, int nb) {
  float corr = 0.0f;
  if (m) {
    for (int b = 0; b < nb; ++b) corr += (float)m[b] * dsum[b];
  } else {
    for (int b = 0; b < nb; ++b) corr += (float)s[b] * dsum[b];
    corr *= -zero;
  }
  return corr;
}

#if defined(DCC_DOT_U8S8)
static inline float dcc_hsum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}
/* one block's 16 code bytes as its 32 codes: low nibbles (even elements), then high nibbles (odd) */
static inline __m256i dcc_nibbles(const uint32_t* w) {
  const __m128i c = _mm_loadu_si128((const __m128i*)w), lo = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(c, 4), lo), _mm_and_si128(c, lo));
}
#endif
#if defined(DCC_ZMM)
/* two blocks' codes in one zmm: [even b, odd b, even b+1, odd b+1] */
static inline __m512i dcc_nibbles2(const uint32_t* w) {
  const __m256i c = _mm256_loadu_si256((const __m256i*)w), m = _mm256_set1_epi8(0x0F);
  const __m256i lo = _mm256_and_si256(c, m), hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), m);
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_permute2x128_si256(lo, hi, 0x20)),
                            _mm256_permute2x128_si256(lo, hi, 0x31), 1);
}
/* two consecutive floats spread over the two halves of a zmm */
static inline __m512 dcc_halves(float a, float b) {
  return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}
#endif

/* DCC_TILE rows t0.. of the activations (rows past `rows` repeat the last) against one weight row */
#define DCC_TILE 4
static inline void dcc_tile_rows(const int8_t* xq, const float* xd, const float* xsd, int nb, int t0, int rows,
                                 const int8_t** xr, const float** dr, const float** sr) {
  for (int t = 0; t < DCC_TILE; ++t) {
    const int64_t row = t0 + t < rows ? t0 + t : rows - 1;
    xr[t] = xq + row * nb * 32;
    dr[t] = xd + row * nb;
    sr[t] = xsd + row * nb;
  }
}

/* one block (b) of the tile, 256 bits: acc[t] += cvt(codes . x_t) * s_b * d_tb */
#if defined(DCC_DOT_U8S8)
#define DCC_TILE_BLOCK256(CODES, SW, ACC)                                                            \
  for (int t = 0; t < R; ++t) {                                                               \
    const __m256i d_ = DCC_DOT_U8S8((CODES), _mm256_loadu_si256((const __m256i*)(xr[t] + 32 * b))); \
    ACC[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d_), _mm256_set1_ps((SW) * dr[t][b]), ACC[t]);      \
  }
#endif

#if defined(DCC_ZMM)
/* blocks b, b + 1, ... two at a time through 512-bit vpdpbusd (CODES: the two blocks' codes at b), added to out[] */
#define DCC_TILE_BLOCKS512(CODES)                                                                                 \
  {                                                                                                               \
    __m512 acc2[DCC_TILE];                                                                                        \
    for (int t = 0; t < R; ++t) acc2[t] = _mm512_setzero_ps();                                             \
    for (; b + 1 < nb; b += 2) {                                                                                  \
      const __m512i codes = (CODES);                                                                              \
      const __m512 sw = dcc_halves((float)s[b], (float)s[b + 1]);                                                 \
      _Pragma("GCC unroll 8") for (int t = 0; t < R; ++t) {                                                \
        const __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, _mm512_loadu_si512(xr[t] + 32 * b)); \
        acc2[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(sw, dcc_halves(dr[t][b], dr[t][b + 1])),   \
                                  acc2[t]);                                                                        \
      }                                                                                                           \
    }                                                                                                             \
    for (int t = 0; t < R; ++t) out[t] += _mm512_reduce_add_ps(acc2[t]);                                  \
  }
#endif

static inline __attribute__((always_inline)) void dcc_dot_q4_rows(
    float* out, const uint32_t* q, const half* s, const half* m, const int8_t* xq, const float* xd, const float* xsd,
    int nb, float zero, int t0, int rows, int R) {
  const int8_t* xr[DCC_TILE];
  const float* dr[DCC_TILE];
  const float* sr[DCC_TILE];
  dcc_tile_rows(xq, xd, xsd, nb, t0, rows, xr, dr, sr);
  for (int t = 0; t < R; ++t) out[t] = dcc_correction(s, m, zero, sr[t], nb);
#if defined(DCC_DOT_U8S8)
  __m256 acc[DCC_TILE];
  for (int t = 0; t < R; ++t) acc[t] = _mm256_setzero_ps();
  int b = 0;
#if defined(DCC_ZMM)
  DCC_TILE_BLOCKS512(dcc_nibbles2(q + 4 * b))
#endif
  for (; b < nb; ++b) {
    const __m256i codes = dcc_nibbles(q + 4 * b);
    const float sw = (float)s[b];
    DCC_TILE_BLOCK256(codes, sw, acc)
  }
  for (int t = 0; t < R; ++t) out[t] += dcc_hsum8(acc[t]);
#else
  for (int b = 0; b < nb; ++b) {
    const uint8_t* c = (const uint8_t*)(q + 4 * b);
    for (int t = 0; t < R; ++t) {
      int32_t dot = 0;
      for (int p = 0; p < 16; ++p) dot += (c[p] & 15) * xr[t][32 * b + p] + (c[p] >> 4) * xr[t][32 * b + 16 + p];
      out[t] += (float)s[b] * dr[t][b] * (float)dot;
    }
  }
#endif
}

static inline __attribute__((always_inline)) void dcc_dot_q8_rows(
    float* out, const uint32_t* q, const half* s, const int8_t* xq, const float* xd, const float* xsd, int nb, int t0,
    int rows, int R) {
  const int8_t* xr[DCC_TILE];
  const float* dr[DCC_TILE];
  const float* sr[DCC_TILE];
  dcc_tile_rows(xq, xd, xsd, nb, t0, rows, xr, dr, sr);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
  __m256 acc[DCC_TILE];
  for (int t = 0; t < R; ++t) {
    acc[t] = _mm256_setzero_ps();
    out[t] = dcc_correction(s, 0, 128.0f, sr[t], nb);
  }
  int b = 0;
#if defined(DCC_ZMM)
  DCC_TILE_BLOCKS512(_mm512_loadu_si512(q + 8 * b))
#endif
  for (; b < nb; ++b) {
    const __m256i codes = _mm256_loadu_si256((const __m256i*)(q + 8 * b));
    const float sw = (float)s[b];
    DCC_TILE_BLOCK256(codes, sw, acc)
  }
  for (int t = 0; t < R; ++t) out[t] += dcc_hsum8(acc[t]);
#elif defined(__AVX2__)
  __m256 acc[DCC_TILE];
  for (int t = 0; t < R; ++t) acc[t] = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(q + 8 * b)), _mm256_set1_epi8((char)0x80));
    const __m256i aw = _mm256_sign_epi8(w, w);
    const float sw = (float)s[b];
    for (int t = 0; t < R; ++t) {
      const __m256i x = _mm256_loadu_si256((const __m256i*)(xr[t] + 32 * b));
      const __m256i d = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(sw * dr[t][b]), acc[t]);
    }
  }
  for (int t = 0; t < R; ++t) out[t] = dcc_hsum8(acc[t]);
  (void)sr;
#else
  for (int t = 0; t < R; ++t) {
    float acc = 0.0f;
    for (int b = 0; b < nb; ++b) {
      const uint8_t* c = (const uint8_t*)(q + 8 * b);
      int32_t dot = 0;
      for (int p = 0; p < 32; ++p) dot += ((int)c[p] - 128) * xr[t][32 * b + p];
      acc += (float)s[b] * dr[t][b] * (float)dot;
    }
    out[t] = acc;
  }
  (void)sr;
#endif
}

/* Residue dispatch (Nimble): a tile of R = min(DCC_TILE, rows - t0) real rows runs the copy compiled for that R,
   so a batched decode of a few sequences does the work of its rows, not of a whole tile. */
#define DCC_TILE_RESIDUE(CALL)                                                                       \
  switch (rows - t0 < DCC_TILE ? rows - t0 : DCC_TILE) {                                             \
    case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; default: CALL(4); break;  \
  }
static inline void dcc_dot_q4_tile(float* out, const uint32_t* q, const half* s, const half* m, const int8_t* xq,
                                   const float* xd, const float* xsd, int nb, float zero, int t0, int rows) {
#define DCC_Q4_ROWS(R) dcc_dot_q4_rows(out, q, s, m, xq, xd, xsd, nb, zero, t0, rows, R)
  DCC_TILE_RESIDUE(DCC_Q4_ROWS)
#undef DCC_Q4_ROWS
}
static inline void dcc_dot_q8_tile(float* out, const uint32_t* q, const half* s, const int8_t* xq, const float* xd,
                                   const float* xsd, int nb, int t0, int rows) {
#define DCC_Q8_ROWS(R) dcc_dot_q8_rows(out, q, s, xq, xd, xsd, nb, t0, rows, R)
  DCC_TILE_RESIDUE(DCC_Q8_ROWS)
#undef DCC_Q8_ROWS
}

/* One row of activations (decode) is the tile of one row: the same arithmetic, so a row's result is the same
   bits whether it is computed alone, in a tile of prefill rows, or beside other sequences in a batched step. */
static inline float dcc_dot_q4(const uint32_t* q, const half* s, const half* m, const int8_t* xq, const float* xd,
                               const float* xsd, int nb, float zero) {
  float out[DCC_TILE];
  dcc_dot_q4_rows(out, q, s, m, xq, xd, xsd, nb, zero, 0, 1, 1);
  return out[0];
}
static inline float dcc_dot_q8(const uint32_t* q, const half* s, const int8_t* xq, const float* xd, const float* xsd,
                               int nb) {
  float out[DCC_TILE];
  dcc_dot_q8_rows(out, q, s, xq, xd, xsd, nb, 0, 1, 1);
  return out[0];
}

/* the kernels' entry points: weight row r of a [rows, nb] block matrix */
static inline void dcc_dot_q4_sym_q8(float* acc, const uint32_t* q, const half* s, const int8_t* xq, const float* xd,
                                     const float* xsd, int r, int nb) {
  acc[0] = dcc_dot_q4(q + (int64_t)r * nb * 4, s + (int64_t)r * nb, 0, xq, xd, xsd, nb, 8.0f);
}
static inline void dcc_dot_q4_asym_q8(float* acc, const uint32_t* q, const half* s, const half* m, const int8_t* xq,
                                      const float* xd, const float* xsd, int r, int nb) {
  acc[0] = dcc_dot_q4(q + (int64_t)r * nb * 4, s + (int64_t)r * nb, m + (int64_t)r * nb, xq, xd, xsd, nb, 0.0f);
}
static inline void dcc_dot_q8_sym_q8(float* acc, const uint32_t* q, const half* s, const int8_t* xq, const float* xd,
                                     const float* xsd, int r, int nb) {
  acc[0] = dcc_dot_q8(q + (int64_t)r * nb * 8, s + (int64_t)r * nb, xq, xd, xsd, nb);
}
static inline void dcc_dot_q4_sym_q8_tile(float* acc, const uint32_t* q, const half* s, const int8_t* xq,
                                          const float* xd, const float* xsd, int r, int nb, int t0, int rows) {
  dcc_dot_q4_tile(acc, q + (int64_t)r * nb * 4, s + (int64_t)r * nb, 0, xq, xd, xsd, nb, 8.0f, t0, rows);
}
static inline void dcc_dot_q4_asym_q8_tile(float* acc, const uint32_t* q, const half* s, const half* m,
                                           const int8_t* xq, const float* xd, const float* xsd, int r, int nb,
                                           int t0, int rows) {
  dcc_dot_q4_tile(acc, q + (int64_t)r * nb * 4, s + (int64_t)r * nb, m + (int64_t)r * nb, xq, xd, xsd, nb, 0.0f, t0,
                  rows);
}
static inline void dcc_dot_q8_sym_q8_tile(float* acc, const uint32_t* q, const half* s, const int8_t* xq,
                                          const float* xd, const float* xsd, int r, int nb, int t0, int rows) {
  dcc_dot_q8_tile(acc, q + (int64_t)r * nb * 8, s + (int64_t)r * nb, xq, xd, xsd, nb, t0, rows);
}


/* 16-bit activations (the linears whose 8-bit rounding costs too much, chosen by calibration at compile time,
   deploycc/calibrate.py): d = max|x| / 32767 and int16 codes, in the same pairs/linear orders as the 8-bit ones.
   A block's dot is vpmaddwd on codes widened to int16 (AVX2), its second half through vpdpwssd where AVX-512
   VNNI has it; the int32 sums stay below 2^31 (15 * 32767 * 32, and 255 * 32767 * 32 for 8-bit codes). */
static inline void dcc_quantize_block16(const float* x, int16_t* q, float* d, float* dsum, int pairs) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) { float a = fabsf(x[i]); amax = a > amax ? a : amax; }
  float dd = amax / 32767.0f, id = dd > 0.0f ? 1.0f / dd : 0.0f;
  int32_t s = 0;
  for (int i = 0; i < 32; ++i) {
    int v = (int)lrintf(x[i] * id);
    q[pairs ? ((i & 1) ? 16 + (i >> 1) : (i >> 1)) : i] = (int16_t)v;
    s += v;
  }
  *d = dd;
  *dsum = dd * (float)s;
}
static inline void dcc_quantize_q16_pairs(const float* x, int16_t* q, float* d, float* dsum, int off, int n, int row) {
  const int64_t r = row, nb = n / 32;
  for (int b = 0; b < nb; ++b)
    dcc_quantize_block16(x + off + 32 * b, q + r * n + 32 * b, d + r * nb + b, dsum + r * nb + b, 1);
}
static inline void dcc_quantize_q16_linear(const float* x, int16_t* q, float* d, float* dsum, int off, int n,
                                           int row) {
  const int64_t r = row, nb = n / 32;
  for (int b = 0; b < nb; ++b)
    dcc_quantize_block16(x + off + 32 * b, q + r * n + 32 * b, d + r * nb + b, dsum + r * nb + b, 0);
}
static inline void dcc_tile_rows16(const int16_t* xq, const float* xd, const float* xsd, int nb, int t0, int rows,
                                   const int16_t** xr, const float** dr, const float** sr) {
  for (int t = 0; t < DCC_TILE; ++t) {
    const int64_t row = t0 + t < rows ? t0 + t : rows - 1;
    xr[t] = xq + row * nb * 32;
    dr[t] = xd + row * nb;
    sr[t] = xsd + row * nb;
  }
}
#if defined(__AVX2__)
/* (lo . x[0:16]) + (hi . x[16:32]) in 8 int32 lanes, lo and hi 16 codes widened to int16 */
static inline __m256i dcc_dot16(__m256i lo, __m256i hi, const int16_t* x) {
  const __m256i a = _mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i*)x));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(a, hi, _mm256_loadu_si256((const __m256i*)(x + 16)));
#else
  return _mm256_add_epi32(a, _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i*)(x + 16))));
#endif
}
#endif

/* R rows against one weight row of 4-bit codes (zero: the symmetric zero point, or 0 with minimums m) */
static inline __attribute__((always_inline)) void dcc_dot_q4_rows16(
    float* out, const uint32_t* q, const half* s, const half* m, const int16_t* xq, const float* xd, const float* xsd,
    int nb, float zero, int t0, int rows, int R) {
  const int16_t* xr[DCC_TILE];
  const float* dr[DCC_TILE];
  const float* sr[DCC_TILE];
  dcc_tile_rows16(xq, xd, xsd, nb, t0, rows, xr, dr, sr);
  for (int t = 0; t < R; ++t) out[t] = dcc_correction(s, m, zero, sr[t], nb);
#if defined(__AVX2__)
  __m256 acc[DCC_TILE];
  for (int t = 0; t < R; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i nib = _mm256_set1_epi16(0x0F);
  for (int b = 0; b < nb; ++b) {  /* the 16 code bytes widened once; nibbles split in the 16-bit lanes */
    const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(q + 4 * b)));
    const __m256i lo = _mm256_and_si256(c, nib), hi = _mm256_srli_epi16(c, 4);
    const float sw = (float)s[b];
    for (int t = 0; t < R; ++t)
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dcc_dot16(lo, hi, xr[t] + 32 * b)), _mm256_set1_ps(sw * dr[t][b]),
                               acc[t]);
  }
  for (int t = 0; t < R; ++t) out[t] += dcc_hsum8(acc[t]);
#else
  for (int b = 0; b < nb; ++b) {
    const uint8_t* c = (const uint8_t*)(q + 4 * b);
    for (int t = 0; t < R; ++t) {
      int32_t dot = 0;
      for (int p = 0; p < 16; ++p) dot += (c[p] & 15) * xr[t][32 * b + p] + (c[p] >> 4) * xr[t][32 * b + 16 + p];
      out[t] += (float)s[b] * dr[t][b] * (float)dot;
    }
  }
#endif
}

/* R rows against one weight row of 8-bit codes (0..255; the zero point 128 goes through the correction term) */
static inline __attribute__((always_inline)) void dcc_dot_q8_rows16(
    float* out, const uint32_t* q, const half* s, const int16_t* xq, const float* xd, const float* xsd, int nb, int t0,
    int rows, int R) {
  const int16_t* xr[DCC_TILE];
  const float* dr[DCC_TILE];
  const float* sr[DCC_TILE];
  dcc_tile_rows16(xq, xd, xsd, nb, t0, rows, xr, dr, sr);
#if defined(__AVX2__)
  __m256 acc[DCC_TILE];
  for (int t = 0; t < R; ++t) acc[t] = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const __m256i lo = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(q + 8 * b)));
    const __m256i hi = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(q + 8 * b + 4)));
    const float sw = (float)s[b];
    for (int t = 0; t < R; ++t)
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dcc_dot16(lo, hi, xr[t] + 32 * b)), _mm256_set1_ps(sw * dr[t][b]),
                               acc[t]);
  }
  for (int t = 0; t < R; ++t) out[t] = dcc_hsum8(acc[t]) + dcc_correction(s, 0, 128.0f, sr[t], nb);
#else
  (void)sr;
  for (int t = 0; t < R; ++t) {
    float a = 0.0f;
    for (int b = 0; b < nb; ++b) {
      const uint8_t* c = (const uint8_t*)(q + 8 * b);
      int32_t dot = 0;
      for (int p = 0; p < 32; ++p) dot += ((int)c[p] - 128) * xr[t][32 * b + p];
      a += (float)s[b] * dr[t][b] * (float)dot;
    }
    out[t] = a;
  }
#endif
}

/* entry points, as the 8-bit ones: one row (decode) is the tile of one row */
static inline void dcc_dot_q4_sym_q16(float* acc, const uint32_t* q, const half* s, const int16_t* xq,
                                      const float* xd, const float* xsd, int r, int nb) {
  dcc_dot_q4_rows16(acc, q + (int64_t)r * nb * 4, s + (int64_t)r * nb, 0, xq, xd, xsd, nb, 8.0f, 0, 1, 1);
}
static inline void dcc_dot_q4_asym_q16(float* acc, const uint32_t* q, const half* s, const half* m, const int16_t* xq,
                                       const float* xd, const float* xsd, int r, int nb) {
  dcc_dot_q4_rows16(acc, q + (int64_t)r * nb * 4, s + (int64_t)r * nb, m + (int64_t)r * nb, xq, xd, xsd, nb, 0.0f,
                    0, 1, 1);
}
static inline void dcc_dot_q8_sym_q16(float* acc, const uint32_t* q, const half* s, const int16_t* xq,
                                      const float* xd, const float* xsd, int r, int nb) {
  dcc_dot_q8_rows16(acc, q + (int64_t)r * nb * 8, s + (int64_t)r * nb, xq, xd, xsd, nb, 0, 1, 1);
}
static inline void dcc_dot_q4_sym_q16_tile(float* acc, const uint32_t* q, const half* s, const int16_t* xq,
                                           const float* xd, const float* xsd, int r, int nb, int t0, int rows) {
  q += (int64_t)r * nb * 4, s += (int64_t)r * nb;
#define DCC_ROWS(R) dcc_dot_q4_rows16(acc, q, s, 0, xq, xd, xsd, nb, 8.0f, t0, rows, R)
  DCC_TILE_RESIDUE(DCC_ROWS)
#undef DCC_ROWS
}
static inline void dcc_dot_q4_asym_q16_tile(float* acc, const uint32_t* q, const half* s, const half* m,
                                            const int16_t* xq, const float* xd, const float* xsd, int r, int nb,
                                            int t0, int rows) {
  q += (int64_t)r * nb * 4, s += (int64_t)r * nb, m += (int64_t)r * nb;
#define DCC_ROWS(R) dcc_dot_q4_rows16(acc, q, s, m, xq, xd, xsd, nb, 0.0f, t0, rows, R)
  DCC_TILE_RESIDUE(DCC_ROWS)
#undef DCC_ROWS
}
static inline void dcc_dot_q8_sym_q16_tile(float* acc, const uint32_t* q, const half* s, const int16_t* xq,
                                           const float* xd, const float* xsd, int r, int nb, int t0, int rows) {
  q += (int64_t)r * nb * 8, s += (int64_t)r * nb;
#define DCC_ROWS(R) dcc_dot_q8_rows16(acc, q, s, xq, xd, xsd, nb, t0, rows, R)
  DCC_TILE_RESIDUE(DCC_ROWS)
#undef DCC_ROWS
}
"""
