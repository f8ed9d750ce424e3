"""The cpu target's intrinsics (deploycc/schedule/qgemv.py tensorizes into them), one C source with a
branch per instruction set, chosen by the compiler's -march macros:

    __AVX512VNNI__ + __AVX512VL__, or __AVXVNNI__   vpdpbusd: u8 codes x s8 activations -> i32, 4 per lane
    __AVX2__                                       vpmaddubsw + vpmaddwd (llama.cpp's AVX2 path)
    otherwise                                      plain C (ARM's sdot would go here, as another branch)

Activations: `quantize_q8_pairs` (for 4-bit codes) stores each block of 32 as its 16 even then its 16
odd elements, the order in which the low and the high nibbles of the block's 16 code bytes come out;
`quantize_q8_linear` (8-bit codes) keeps the order. Each block gets its scale d = max|x| / 127 and the
sum of its codes (for the zero point or the minimum). Every dot returns, for one row r,
    sum_b  s_b * d_b * (codes . xq)_b  +  correction_b
with correction -zero * s_b * d_b * sum_b (symmetric) or m_b * d_b * sum_b (asymmetric).
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

static inline void dcc_quantize_block(const float* x, int8_t* q, float* d, int32_t* sum, int pairs) {
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
  *sum = s;
}

/* n activations from x + off into row `row` of q (n per row), d and sum (n / 32 per row) */
static inline void dcc_quantize_q8_pairs(const float* x, int8_t* q, float* d, int32_t* sum, int off, int n, int row) {
  const int64_t r = row, nb = n / 32;
  for (int b = 0; b < nb; ++b)
    dcc_quantize_block(x + off + 32 * b, q + r * n + 32 * b, d + r * nb + b, sum + r * nb + b, 1);
}

static inline void dcc_quantize_q8_linear(const float* x, int8_t* q, float* d, int32_t* sum, int off, int n, int row) {
  const int64_t r = row, nb = n / 32;
  for (int b = 0; b < nb; ++b)
    dcc_quantize_block(x + off + 32 * b, q + r * n + 32 * b, d + r * nb + b, sum + r * nb + b, 0);
}

#if defined(DCC_DOT_U8S8)
static inline float dcc_hsum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}
static inline __m256i dcc_nibbles(const uint32_t* w) {
  const __m128i c = _mm_loadu_si128((const __m128i*)w), lo = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(c, 4), lo), _mm_and_si128(c, lo));
}
#endif

/* 4-bit codes, 4 words per block; zero: 8 (symmetric) or use m (asymmetric, m != 0) */
static inline float dcc_dot_q4(const uint32_t* q, const half* s, const half* m, const int8_t* xq, const float* xd,
                               const int32_t* xs, int nb, float zero) {
  float corr = 0.0f;
#if defined(DCC_DOT_U8S8)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int b = 0;
  for (; b + 1 < nb; b += 2) {
    const float s0 = (float)s[b] * xd[b], s1 = (float)s[b + 1] * xd[b + 1];
    const __m256i d0 = DCC_DOT_U8S8(dcc_nibbles(q + 4 * b), _mm256_loadu_si256((const __m256i*)(xq + 32 * b)));
    const __m256i d1 = DCC_DOT_U8S8(dcc_nibbles(q + 4 * b + 4), _mm256_loadu_si256((const __m256i*)(xq + 32 * b + 32)));
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_set1_ps(s0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_set1_ps(s1), acc1);
    corr += (m ? (float)m[b] * xd[b] : -zero * s0) * (float)xs[b];
    corr += (m ? (float)m[b + 1] * xd[b + 1] : -zero * s1) * (float)xs[b + 1];
  }
  for (; b < nb; ++b) {
    const float s0 = (float)s[b] * xd[b];
    const __m256i d0 = DCC_DOT_U8S8(dcc_nibbles(q + 4 * b), _mm256_loadu_si256((const __m256i*)(xq + 32 * b)));
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_set1_ps(s0), acc0);
    corr += (m ? (float)m[b] * xd[b] : -zero * s0) * (float)xs[b];
  }
  return dcc_hsum8(_mm256_add_ps(acc0, acc1)) + corr;
#else
  float acc = 0.0f;
  for (int b = 0; b < nb; ++b) {
    const uint8_t* c = (const uint8_t*)(q + 4 * b);
    int32_t dot = 0;
    for (int p = 0; p < 16; ++p) dot += (c[p] & 15) * xq[32 * b + p] + (c[p] >> 4) * xq[32 * b + 16 + p];
    const float s0 = (float)s[b] * xd[b];
    acc += s0 * (float)dot;
    corr += (m ? (float)m[b] * xd[b] : -zero * s0) * (float)xs[b];
  }
  return acc + corr;
#endif
}

/* 8-bit codes (w = (code - 128) * s), 8 words per block */
static inline float dcc_dot_q8(const uint32_t* q, const half* s, const int8_t* xq, const float* xd, const int32_t* xs,
                               int nb) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
  __m256 acc = _mm256_setzero_ps();
  float corr = 0.0f;
  for (int b = 0; b < nb; ++b) {
    const float s0 = (float)s[b] * xd[b];
    const __m256i d = DCC_DOT_U8S8(_mm256_loadu_si256((const __m256i*)(q + 8 * b)),
                                   _mm256_loadu_si256((const __m256i*)(xq + 32 * b)));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(s0), acc);
    corr -= 128.0f * s0 * (float)xs[b];
  }
  return dcc_hsum8(acc) + corr;
#elif defined(__AVX2__)
  /* signed codes (code ^ 0x80 = code - 128); |w| x sign(x, w) keeps vpmaddubsw's pair sums in int16 */
  __m256 acc = _mm256_setzero_ps();
  (void)xs;
  for (int b = 0; b < nb; ++b) {
    const __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(q + 8 * b)), _mm256_set1_epi8((char)0x80));
    const __m256i x = _mm256_loadu_si256((const __m256i*)(xq + 32 * b));
    const __m256i d = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)),
                                        _mm256_set1_epi16(1));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps((float)s[b] * xd[b]), acc);
  }
  return dcc_hsum8(acc);
#else
  float acc = 0.0f;
  for (int b = 0; b < nb; ++b) {
    const uint8_t* c = (const uint8_t*)(q + 8 * b);
    int32_t dot = 0;
    for (int p = 0; p < 32; ++p) dot += ((int)c[p] - 128) * xq[32 * b + p];
    acc += (float)s[b] * xd[b] * (float)dot;
  }
  (void)xs;
  return acc;
#endif
}

/* DCC_TILE rows t0.. of the activations (rows past `rows` repeat the last) against one weight row: the block's
codes are unpacked once and used DCC_TILE times */
#define DCC_TILE 8
static inline void dcc_tile_rows(const int8_t* xq, const float* xd, const int32_t* xs, int nb, int t0, int rows,
                                 const int8_t** xr, const float** dr, const int32_t** sr) {
  for (int t = 0; t < DCC_TILE; ++t) {
    const int64_t row = t0 + t < rows ? t0 + t : rows - 1;
    xr[t] = xq + row * nb * 32;
    dr[t] = xd + row * nb;
    sr[t] = xs + row * nb;
  }
}

/* 4-bit weights: m (asymmetric minimum) or zero (symmetric zero point) as in dcc_dot_q4 */
static inline void dcc_dot_q4_tile(float* out, const uint32_t* q, const half* s, const half* m, const int8_t* xq,
                                   const float* xd, const int32_t* xs, int nb, float zero, int t0, int rows) {
  const int8_t* xr[DCC_TILE];
  const float* dr[DCC_TILE];
  const int32_t* sr[DCC_TILE];
  float corr[DCC_TILE] = {0};
  dcc_tile_rows(xq, xd, xs, nb, t0, rows, xr, dr, sr);
#if defined(DCC_DOT_U8S8)
  __m256 acc[DCC_TILE];
  for (int t = 0; t < DCC_TILE; ++t) acc[t] = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const __m256i codes = dcc_nibbles(q + 4 * b);
    const float sw = (float)s[b], cw = m ? (float)m[b] : -zero * sw;
#pragma GCC unroll 8
    for (int t = 0; t < DCC_TILE; ++t) {
      const __m256i d = DCC_DOT_U8S8(codes, _mm256_loadu_si256((const __m256i*)(xr[t] + 32 * b)));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(sw * dr[t][b]), acc[t]);
      corr[t] += cw * dr[t][b] * (float)sr[t][b];
    }
  }
  for (int t = 0; t < DCC_TILE; ++t) out[t] = dcc_hsum8(acc[t]) + corr[t];
#else
  float acc[DCC_TILE] = {0};
  for (int b = 0; b < nb; ++b) {
    const uint8_t* c = (const uint8_t*)(q + 4 * b);
    const float sw = (float)s[b], cw = m ? (float)m[b] : -zero * sw;
    for (int t = 0; t < DCC_TILE; ++t) {
      int32_t dot = 0;
      for (int p = 0; p < 16; ++p) dot += (c[p] & 15) * xr[t][32 * b + p] + (c[p] >> 4) * xr[t][32 * b + 16 + p];
      acc[t] += sw * dr[t][b] * (float)dot;
      corr[t] += cw * dr[t][b] * (float)sr[t][b];
    }
  }
  for (int t = 0; t < DCC_TILE; ++t) out[t] = acc[t] + corr[t];
#endif
}

/* 8-bit weights, w = (code - 128) * s */
static inline void dcc_dot_q8_tile(float* out, const uint32_t* q, const half* s, const int8_t* xq, const float* xd,
                                   const int32_t* xs, int nb, int t0, int rows) {
  const int8_t* xr[DCC_TILE];
  const float* dr[DCC_TILE];
  const int32_t* sr[DCC_TILE];
  dcc_tile_rows(xq, xd, xs, nb, t0, rows, xr, dr, sr);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
  __m256 acc[DCC_TILE];
  float corr[DCC_TILE] = {0};
  for (int t = 0; t < DCC_TILE; ++t) acc[t] = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const __m256i codes = _mm256_loadu_si256((const __m256i*)(q + 8 * b));
    const float sw = (float)s[b];
#pragma GCC unroll 8
    for (int t = 0; t < DCC_TILE; ++t) {
      const __m256i d = DCC_DOT_U8S8(codes, _mm256_loadu_si256((const __m256i*)(xr[t] + 32 * b)));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(sw * dr[t][b]), acc[t]);
      corr[t] -= 128.0f * sw * dr[t][b] * (float)sr[t][b];
    }
  }
  for (int t = 0; t < DCC_TILE; ++t) out[t] = dcc_hsum8(acc[t]) + corr[t];
#elif defined(__AVX2__)
  __m256 acc[DCC_TILE];
  for (int t = 0; t < DCC_TILE; ++t) acc[t] = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(q + 8 * b)), _mm256_set1_epi8((char)0x80));
    const __m256i aw = _mm256_sign_epi8(w, w);
    const float sw = (float)s[b];
    for (int t = 0; t < DCC_TILE; ++t) {
      const __m256i x = _mm256_loadu_si256((const __m256i*)(xr[t] + 32 * b));
      const __m256i d = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(sw * dr[t][b]), acc[t]);
    }
  }
  for (int t = 0; t < DCC_TILE; ++t) out[t] = dcc_hsum8(acc[t]);
#else
  for (int t = 0; t < DCC_TILE; ++t) {
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

static inline void dcc_dot_q4_sym_q8_tile(float* acc, const uint32_t* q, const half* s, const int8_t* xq,
                                          const float* xd, const int32_t* xs, int r, int nb, int t0, int rows) {
  dcc_dot_q4_tile(acc, q + (int64_t)r * nb * 4, s + (int64_t)r * nb, 0, xq, xd, xs, nb, 8.0f, t0, rows);
}
static inline void dcc_dot_q4_asym_q8_tile(float* acc, const uint32_t* q, const half* s, const half* m,
                                           const int8_t* xq, const float* xd, const int32_t* xs, int r, int nb,
                                           int t0, int rows) {
  dcc_dot_q4_tile(acc, q + (int64_t)r * nb * 4, s + (int64_t)r * nb, m + (int64_t)r * nb, xq, xd, xs, nb, 0.0f, t0,
                  rows);
}
static inline void dcc_dot_q8_sym_q8_tile(float* acc, const uint32_t* q, const half* s, const int8_t* xq,
                                          const float* xd, const int32_t* xs, int r, int nb, int t0, int rows) {
  dcc_dot_q8_tile(acc, q + (int64_t)r * nb * 8, s + (int64_t)r * nb, xq, xd, xs, nb, t0, rows);
}

static inline void dcc_dot_q4_sym_q8(float* acc, const uint32_t* q, const half* s, const int8_t* xq, const float* xd,
                                     const int32_t* xs, int r, int nb) {
  acc[0] = dcc_dot_q4(q + (int64_t)r * nb * 4, s + (int64_t)r * nb, 0, xq, xd, xs, nb, 8.0f);
}
static inline void dcc_dot_q4_asym_q8(float* acc, const uint32_t* q, const half* s, const half* m, const int8_t* xq,
                                      const float* xd, const int32_t* xs, int r, int nb) {
  acc[0] = dcc_dot_q4(q + (int64_t)r * nb * 4, s + (int64_t)r * nb, m + (int64_t)r * nb, xq, xd, xs, nb, 0.0f);
}
static inline void dcc_dot_q8_sym_q8(float* acc, const uint32_t* q, const half* s, const int8_t* xq, const float* xd,
                                     const int32_t* xs, int r, int nb) {
  acc[0] = dcc_dot_q8(q + (int64_t)r * nb * 8, s + (int64_t)r * nb, xq, xd, xs, nb);
}

"""
