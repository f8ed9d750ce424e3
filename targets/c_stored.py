"""The cpu target's intrinsics for GGUF formats kept as their stored bytes (quantization/gguf_blocks.py StoredScheme:
Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS), which schedule/qgemv.py tensorizes into.

One engine serves every format. A format's *decoder* turns run j of a weight row (values 32j .. 32j+31, in order)
into 32 codes, two scales and two minimums (one per half of 16, as the K-quants' sub-blocks of 16 need), so that

    w[32j + l] = sc[l / 16] * code[l] + mn[l / 16]

exactly as the format defines it: codes are unsigned (0..63, the zero point folded into mn: Q5_0's -16 d, Q3_K's
-4 d sc, Q6_K's -32 d sc) except IQ4's, which are the signed values of its non-linear grid. The decoders are plain
C loops of constant trip count that gcc vectorises (-O3), with a `pshufb` grid lookup for IQ4 on AVX2. The engine
then dots the 32 codes with the run's activation codes (linear order; AVX-512 VNNI / AVX-VNNI `vpdpbusd`, AVX2
`vpmaddubsw` + `vpmaddwd`, signed codes through the sign trick; 16-bit activations through `vpmaddwd`), scales the
two halves' int32 sums by sc * d_x and adds mn * (d_x * the half's code sum): the activations of these formats are
quantized with a d * sum per 16 (`quantize_q8_k`, `quantize_q16_k`), two per block of 32.

The entry points (one per format and activation width, decode and the prefill tile) are generated from LAYOUTS,
which say how many words each packed parameter has per block.
"""
from __future__ import annotations

ENGINE = r"""
/* ---- GGUF formats kept as stored (targets/c_stored.py) ---- */
/* activations in linear order, d per 32 and d * (code sum) per 16: two per block (the K-quants' sub-blocks of 16) */
#define DCC_QUANTIZE_K(BITS, XT, BLOCKFN)                                                                            \
  static inline void dcc_quantize_q##BITS##_k(const float* x, XT* q, float* d, float* dsum, int off, int n, int row) { \
    const int64_t r = row, nb = n / 32;                                                                               \
    for (int b = 0; b < nb; ++b) {                                                                                    \
      float s32;                                                                                                      \
      XT* qb = q + r * n + 32 * b;                                                                                    \
      BLOCKFN(x + off + 32 * b, qb, d + r * nb + b, &s32, 0);                                                         \
      int32_t s0 = 0, s1 = 0;                                                                                         \
      for (int i = 0; i < 16; ++i) s0 += qb[i], s1 += qb[16 + i];                                                     \
      dsum[2 * (r * nb + b)] = d[r * nb + b] * (float)s0;                                                             \
      dsum[2 * (r * nb + b) + 1] = d[r * nb + b] * (float)s1;                                                         \
    }                                                                                                                 \
  }
DCC_QUANTIZE_K(8, int8_t, dcc_quantize_block)
DCC_QUANTIZE_K(16, int16_t, dcc_quantize_block16)

/* one weight row of a stored format: each packed parameter's bytes (or f16 values) for that row */
typedef struct { const uint8_t *w, *h, *sub; const half *d, *m; } dcc_gg_row;

static const int8_t dcc_iq4_grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* ---- each format's scales and minimums of run j (scalar: a few per 32 weights) ---- */
static inline void dcc_sc_q5_0(const dcc_gg_row* p, int j, float* sc, float* mn) {
  const float d = (float)p->d[j];
  sc[0] = sc[1] = d;
  mn[0] = mn[1] = -16.0f * d;
}
static inline void dcc_sc_q5_1(const dcc_gg_row* p, int j, float* sc, float* mn) {
  sc[0] = sc[1] = (float)p->d[j];
  mn[0] = mn[1] = (float)p->m[j];
}
static inline void dcc_sc_iq4_nl(const dcc_gg_row* p, int j, float* sc, float* mn) {
  sc[0] = sc[1] = (float)p->d[j];
  mn[0] = mn[1] = 0.0f;
}
static inline void dcc_sc_q2_k(const dcc_gg_row* p, int j, float* sc, float* mn) {
  const int blk = j >> 3, jj = j & 7;
  const uint8_t* s = p->sub + 16 * blk + 2 * jj;
  const float d = (float)p->d[blk], dmin = (float)p->m[blk];
  for (int h = 0; h < 2; ++h) sc[h] = d * (float)(s[h] & 15), mn[h] = -(dmin * (float)(s[h] >> 4));
}
static inline void dcc_sc_q3_k(const dcc_gg_row* p, int j, float* sc, float* mn) {
  const int blk = j >> 3, jj = j & 7;
  const uint8_t* sb = p->sub + 12 * blk;
  const float d = (float)p->d[blk];
  for (int h = 0; h < 2; ++h) {
    const int s = 2 * jj + h;
    const int ls = ((sb[s & 7] >> (4 * (s >> 3))) & 15) | (((sb[8 + (s & 3)] >> (2 * (s >> 2))) & 3) << 4);
    sc[h] = d * (float)(ls - 32);
    mn[h] = -4.0f * sc[h];
  }
}
/* Q4_K/Q5_K: the 6-bit scale and min of sub-block s (ggml's get_scale_min_k4) */
static inline void dcc_sc_q4_k(const dcc_gg_row* p, int j, float* sc, float* mn) {
  const int blk = j >> 3, s = j & 7;
  const uint8_t* q = p->sub + 12 * blk;
  int a, b;
  if (s < 4) {
    a = q[s] & 63, b = q[s + 4] & 63;
  } else {
    a = (q[s + 4] & 15) | ((q[s - 4] >> 6) << 4);
    b = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
  }
  sc[0] = sc[1] = (float)p->d[blk] * (float)a;
  mn[0] = mn[1] = -((float)p->m[blk] * (float)b);
}
#define dcc_sc_q5_k dcc_sc_q4_k
static inline void dcc_sc_q6_k(const dcc_gg_row* p, int j, float* sc, float* mn) {
  const int blk = j >> 3, jj = j & 7;
  const int8_t* s = (const int8_t*)(p->sub + 16 * blk + 2 * jj);
  const float d = (float)p->d[blk];
  for (int h = 0; h < 2; ++h) sc[h] = d * (float)s[h], mn[h] = -32.0f * sc[h];
}
static inline void dcc_sc_iq4_xs(const dcc_gg_row* p, int j, float* sc, float* mn) {
  const int blk = j >> 3, ib = j & 7;
  const uint8_t* sb = p->sub + 8 * blk;
  const int ls = ((sb[2 + (ib >> 1)] >> (4 * (ib & 1))) & 15) | (((sb[ib >> 2] >> (2 * (ib & 3))) & 3) << 4);
  sc[0] = sc[1] = (float)p->d[blk] * (float)(ls - 32);
  mn[0] = mn[1] = 0.0f;
}

/* ---- each format's 32 codes of run j, in order: a vector on AVX2, else an array ---- */
#if defined(__AVX2__)
typedef __m256i dcc_codes;
static inline __m256i dcc_lohi(const uint8_t* qs) {  /* 16 bytes of nibbles: low nibbles, then high */
  const __m128i b = _mm_loadu_si128((const __m128i*)qs), m = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}
static inline __m256i dcc_field(const uint8_t* q, int shift, int mask) {  /* (32 bytes >> shift) & mask */
  return _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i*)q), _mm_cvtsi32_si128(shift)),
                          _mm256_set1_epi8((char)mask));
}
static inline __m256i dcc_bit4(uint32_t bits) {  /* byte l: 16 where bit l of `bits` is set, else 0 */
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel), _mm256_set1_epi8(16));
}
static inline __m256i dcc_iq4(const uint8_t* qs) {
  const __m128i grid = _mm_loadu_si128((const __m128i*)dcc_iq4_grid);
  return _mm256_shuffle_epi8(_mm256_set_m128i(grid, grid), dcc_lohi(qs));
}
static inline __m256i dcc_codes_q5_0(const dcc_gg_row* p, int j) {
  uint32_t qh;
  __builtin_memcpy(&qh, p->h + 4 * j, 4);
  return _mm256_or_si256(dcc_lohi(p->w + 16 * j), dcc_bit4(qh));
}
static inline __m256i dcc_codes_q2_k(const dcc_gg_row* p, int j) {
  const int blk = j >> 3, jj = j & 7;
  return dcc_field(p->w + 64 * blk + 32 * (jj >> 2), 2 * (jj & 3), 3);
}
static inline __m256i dcc_codes_q3_k(const dcc_gg_row* p, int j) {
  const int blk = j >> 3, jj = j & 7, n = jj >> 2, jm = jj & 3;
  const __m256i hb = _mm256_slli_epi16(dcc_field(p->h + 32 * blk, 4 * n + jm, 1), 2);
  return _mm256_or_si256(dcc_field(p->w + 64 * blk + 32 * n, 2 * jm, 3), hb);
}
static inline __m256i dcc_codes_q4_k(const dcc_gg_row* p, int j) {
  const int blk = j >> 3, s = j & 7;
  return dcc_field(p->w + 128 * blk + 32 * (s >> 1), 4 * (s & 1), 15);
}
static inline __m256i dcc_codes_q5_k(const dcc_gg_row* p, int j) {
  const int blk = j >> 3, s = j & 7;
  return _mm256_or_si256(dcc_codes_q4_k(p, j), _mm256_slli_epi16(dcc_field(p->h + 32 * blk, s, 1), 4));
}
static inline __m256i dcc_codes_q6_k(const dcc_gg_row* p, int j) {
  const int blk = j >> 3, jj = j & 7, hv = jj >> 2, q = jj & 3;
  const __m256i lo = dcc_field(p->w + 128 * blk + 64 * hv + 32 * (q & 1), 4 * (q >> 1), 15);
  return _mm256_or_si256(lo, _mm256_slli_epi16(dcc_field(p->h + 64 * blk + 32 * hv, 2 * q, 3), 4));
}
#else
typedef struct { uint8_t c[32]; } dcc_codes;
static inline dcc_codes dcc_codes_q5_0(const dcc_gg_row* p, int j) {
  dcc_codes r;
  const uint8_t* qs = p->w + 16 * j;
  uint32_t qh;
  __builtin_memcpy(&qh, p->h + 4 * j, 4);
  for (int l = 0; l < 16; ++l) {
    r.c[l] = (qs[l] & 15) | (((qh >> l) & 1) << 4);
    r.c[16 + l] = (qs[l] >> 4) | (((qh >> (16 + l)) & 1) << 4);
  }
  return r;
}
static inline dcc_codes dcc_iq4(const uint8_t* qs) {
  dcc_codes r;
  for (int l = 0; l < 16; ++l) r.c[l] = (uint8_t)dcc_iq4_grid[qs[l] & 15], r.c[16 + l] = (uint8_t)dcc_iq4_grid[qs[l] >> 4];
  return r;
}
static inline dcc_codes dcc_codes_q2_k(const dcc_gg_row* p, int j) {
  dcc_codes r;
  const int blk = j >> 3, jj = j & 7, sh = 2 * (jj & 3);
  const uint8_t* qs = p->w + 64 * blk + 32 * (jj >> 2);
  for (int l = 0; l < 32; ++l) r.c[l] = (qs[l] >> sh) & 3;
  return r;
}
static inline dcc_codes dcc_codes_q3_k(const dcc_gg_row* p, int j) {
  dcc_codes r;
  const int blk = j >> 3, jj = j & 7, n = jj >> 2, jm = jj & 3, sh = 2 * jm, hb = 4 * n + jm;
  const uint8_t *qs = p->w + 64 * blk + 32 * n, *hm = p->h + 32 * blk;
  for (int l = 0; l < 32; ++l) r.c[l] = ((qs[l] >> sh) & 3) | (((hm[l] >> hb) & 1) << 2);
  return r;
}
static inline dcc_codes dcc_codes_q4_k(const dcc_gg_row* p, int j) {
  dcc_codes r;
  const int blk = j >> 3, s = j & 7, sh = 4 * (s & 1);
  const uint8_t* qs = p->w + 128 * blk + 32 * (s >> 1);
  for (int l = 0; l < 32; ++l) r.c[l] = (qs[l] >> sh) & 15;
  return r;
}
static inline dcc_codes dcc_codes_q5_k(const dcc_gg_row* p, int j) {
  dcc_codes r = dcc_codes_q4_k(p, j);
  const int blk = j >> 3, s = j & 7;
  const uint8_t* qh = p->h + 32 * blk;
  for (int l = 0; l < 32; ++l) r.c[l] |= ((qh[l] >> s) & 1) << 4;
  return r;
}
static inline dcc_codes dcc_codes_q6_k(const dcc_gg_row* p, int j) {
  dcc_codes r;
  const int blk = j >> 3, jj = j & 7, hv = jj >> 2, q = jj & 3, sl = 4 * (q >> 1), sh = 2 * q;
  const uint8_t *ql = p->w + 128 * blk + 64 * hv + 32 * (q & 1), *qh = p->h + 64 * blk + 32 * hv;
  for (int l = 0; l < 32; ++l) r.c[l] = ((ql[l] >> sl) & 15) | (((qh[l] >> sh) & 3) << 4);
  return r;
}
#endif
#define dcc_codes_q5_1 dcc_codes_q5_0
static inline dcc_codes dcc_codes_iq4_nl(const dcc_gg_row* p, int j) { return dcc_iq4(p->w + 16 * j); }
static inline dcc_codes dcc_codes_iq4_xs(const dcc_gg_row* p, int j) { return dcc_iq4(p->w + 128 * (j >> 3) + 16 * (j & 7)); }

/* R activation rows (tile rows t0.., as dcc_tile_rows) against one weight row of `nr` runs; signed: IQ4's codes */
#define DCC_GG_ROWS(T, SIGNED)                                                                                     \
  static inline __attribute__((always_inline)) void dcc_gg_rows_##T(float* out, const dcc_gg_row* w,             \
      const int8_t* xq, const float* xd, const float* xsd, int nr, int t0, int rows, int R) {                     \
    const int8_t* xr[DCC_TILE];                                                                                    \
    const float* dr[DCC_TILE];                                                                                     \
    const float* sr[DCC_TILE];                                                                                     \
    dcc_tile_rows(xq, xd, xsd, nr, t0, rows, xr, dr, sr);                                                          \
    for (int t = 0; t < R; ++t) sr[t] = xsd + (sr[t] - xsd) * 2, out[t] = 0.0f;                                   \
    DCC_GG_LOOP8(T, SIGNED)                                                                                        \
  }
#define DCC_GG_ROWS16(T, SIGNED)                                                                                   \
  static inline __attribute__((always_inline)) void dcc_gg_rows16_##T(float* out, const dcc_gg_row* w,           \
      const int16_t* xq, const float* xd, const float* xsd, int nr, int t0, int rows, int R) {                    \
    const int16_t* xr[DCC_TILE];                                                                                   \
    const float* dr[DCC_TILE];                                                                                     \
    const float* sr[DCC_TILE];                                                                                     \
    dcc_tile_rows16(xq, xd, xsd, nr, t0, rows, xr, dr, sr);                                                        \
    for (int t = 0; t < R; ++t) sr[t] = xsd + (sr[t] - xsd) * 2, out[t] = 0.0f;                                   \
    DCC_GG_LOOP16(T, SIGNED)                                                                                       \
  }

/* Runs two at a time into two sets of accumulators (vector sums, and the scalar minimum terms), so that a decode
   row (R = 1) is not one chain of dependent FMAs (5 cycles each on Zen) but two. */
#define DCC_GG_PAIRS(STEP, T, SIGNED)                                                                                       \
  __m256 acc[2][DCC_TILE];                                                                                         \
  float corr[2][DCC_TILE];                                                                                         \
  for (int t = 0; t < R; ++t) acc[0][t] = acc[1][t] = _mm256_setzero_ps(), corr[0][t] = corr[1][t] = 0.0f;        \
  int j = 0;                                                                                                       \
  for (; j + 1 < nr; j += 2) {                                                                                     \
    STEP(T, SIGNED, j, 0)                                                                                          \
    STEP(T, SIGNED, j + 1, 1)                                                                                      \
  }                                                                                                                \
  if (j < nr) STEP(T, SIGNED, j, 0)                                                                                \
  for (int t = 0; t < R; ++t) out[t] += dcc_hsum8(_mm256_add_ps(acc[0][t], acc[1][t])) + corr[0][t] + corr[1][t];

#if defined(DCC_DOT_U8S8)
#define DCC_GG_STEP8(T, SIGNED, J, A)                                                                              \
  {                                                                                                                \
    float sc[2], mn[2];                                                                                            \
    dcc_sc_##T(w, J, sc, mn);                                                                                      \
    __m256i cv = dcc_codes_##T(w, J);                                                                              \
    const __m256i sg = cv;                                                                                         \
    if (SIGNED) cv = _mm256_sign_epi8(cv, cv);                                                                     \
    const __m256 sv = _mm256_set_m128(_mm_set1_ps(sc[1]), _mm_set1_ps(sc[0]));                                     \
    for (int t = 0; t < R; ++t) {                                                                                  \
      __m256i x = _mm256_loadu_si256((const __m256i*)(xr[t] + 32 * (J)));                                         \
      if (SIGNED) x = _mm256_sign_epi8(x, sg);                                                                     \
      acc[A][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DCC_DOT_U8S8(cv, x)),                                         \
                                  _mm256_mul_ps(sv, _mm256_set1_ps(dr[t][J])), acc[A][t]);                         \
      if (!SIGNED) corr[A][t] += mn[0] * sr[t][2 * (J)] + mn[1] * sr[t][2 * (J) + 1];                              \
    }                                                                                                              \
  }
#define DCC_GG_LOOP8(T, SIGNED) DCC_GG_PAIRS(DCC_GG_STEP8, T, SIGNED)
#else
#define DCC_GG_LOOP8(T, SIGNED) DCC_GG_SCALAR(T, SIGNED)
#endif

#if defined(__AVX2__)
/* 16-bit activations: the halves' int32 sums apart where the format has a scale per 16 (two), else added first */
#define DCC_GG_STEP16(T, SIGNED, J, A)                                                                             \
  {                                                                                                                \
    float sc[2], mn[2];                                                                                            \
    dcc_sc_##T(w, J, sc, mn);                                                                                      \
    const __m256i cv = dcc_codes_##T(w, J);                                                                        \
    const __m128i c0 = _mm256_castsi256_si128(cv), c1 = _mm256_extracti128_si256(cv, 1);                           \
    const __m256i lo = SIGNED ? _mm256_cvtepi8_epi16(c0) : _mm256_cvtepu8_epi16(c0);                               \
    const __m256i hi = SIGNED ? _mm256_cvtepi8_epi16(c1) : _mm256_cvtepu8_epi16(c1);                               \
    for (int t = 0; t < R; ++t) {                                                                                  \
      const __m256i a = _mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i*)(xr[t] + 32 * (J))));            \
      const __m256i b = _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i*)(xr[t] + 32 * (J) + 16)));       \
      const __m256 dx = _mm256_set1_ps(dr[t][J]);                                                                  \
      if (DCC_GG_HALVES_##T) {                                                                                     \
        acc[A][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), _mm256_mul_ps(_mm256_set1_ps(sc[0]), dx), acc[A][t]);   \
        acc[A][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(b), _mm256_mul_ps(_mm256_set1_ps(sc[1]), dx), acc[A][t]);   \
      } else {                                                                                                     \
        acc[A][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(a, b)),                                    \
                                    _mm256_mul_ps(_mm256_set1_ps(sc[0]), dx), acc[A][t]);                          \
      }                                                                                                            \
      if (!SIGNED) corr[A][t] += mn[0] * sr[t][2 * (J)] + mn[1] * sr[t][2 * (J) + 1];                              \
    }                                                                                                              \
  }
#define DCC_GG_LOOP16(T, SIGNED) DCC_GG_PAIRS(DCC_GG_STEP16, T, SIGNED)
#else
#define DCC_GG_LOOP16(T, SIGNED) DCC_GG_SCALAR(T, SIGNED)
#endif

/* plain C: the same sums, in the same halves */
#define DCC_GG_SCALAR(T, SIGNED)                                                                                   \
  for (int j = 0; j < nr; ++j) {                                                                                   \
    float sc[2], mn[2];                                                                                            \
    dcc_sc_##T(w, j, sc, mn);                                                                                      \
    const dcc_codes cs = dcc_codes_##T(w, j);                                                                      \
    const uint8_t* c = (const uint8_t*)&cs;                                                                        \
    for (int t = 0; t < R; ++t) {                                                                                  \
      for (int h = 0; h < 2; ++h) {                                                                                \
        int32_t dot = 0;                                                                                           \
        for (int l = 16 * h; l < 16 * h + 16; ++l) dot += (SIGNED ? (int32_t)(int8_t)c[l] : (int32_t)c[l]) * xr[t][32 * j + l]; \
        out[t] += sc[h] * dr[t][j] * (float)dot + mn[h] * sr[t][2 * j + h];                                       \
      }                                                                                                            \
    }                                                                                                              \
  }
"""

# qtype -> (decoder suffix, signed codes)
DECODERS = {"Q5_0": False, "Q5_1": False, "IQ4_NL": True, "Q2_K": False, "Q3_K": False, "Q4_K": False,
            "Q5_K": False, "Q6_K": False, "IQ4_XS": True}
FIELD_PTR = {"q_weight": "w", "q_high": "h", "q_sub": "sub", "q_scale": "d", "q_min": "m"}


def _entries(qtype: str) -> str:
    """dcc_dot_gguf_<t>_q{8,16}[_tile]: the kernels' entry points for one format, from its layout."""
    from deploycc.quantization.gguf_stored import LAYOUTS, PARAM_ORDER

    block, _, fields = LAYOUTS[qtype]
    fields = sorted(fields, key=lambda f: PARAM_ORDER.index(f[0]))
    t = qtype.lower()
    params = ", ".join(f"const half* {f[0]}" if f[3] == "f16" else f"const uint32_t* {f[0]}" for f in fields)
    runs = block // 32  # runs of 32 per block
    init = []
    for name, _, size, kind in fields:
        ptr = FIELD_PTR[name]
        if kind == "f16":
            init.append(f".{ptr} = {name} + (int64_t)r * (nr / {runs})")
        else:
            init.append(f".{ptr} = (const uint8_t*)({name} + (int64_t)r * (nr / {runs}) * {-(-size // 4)})")
    row = "const dcc_gg_row w = {" + ", ".join(init) + "};"
    halves = int(qtype in ("Q2_K", "Q3_K", "Q6_K"))  # a scale per 16 values: the halves' sums scaled apart
    signed = int(DECODERS[qtype])
    out = [f"#define DCC_GG_HALVES_{t} {halves}", f"DCC_GG_ROWS({t}, {signed})", f"DCC_GG_ROWS16({t}, {signed})"]
    for bits, xt in ((8, "int8_t"), (16, "int16_t")):
        rows = "dcc_gg_rows_" if bits == 8 else "dcc_gg_rows16_"
        head = f"float* acc, {params}, const {xt}* xq, const float* xd, const float* xsd, int r, int nr"
        out.append(f"static inline void dcc_dot_gguf_{t}_q{bits}({head}) {{\n  {row}\n"
                   f"  {rows}{t}(acc, &w, xq, xd, xsd, nr, 0, 1, 1);\n}}")
        out.append(f"static inline void dcc_dot_gguf_{t}_q{bits}_tile({head}, int t0, int rows) {{\n  {row}\n"
                   f"#define DCC_ROWS(R) {rows}{t}(acc, &w, xq, xd, xsd, nr, t0, rows, R)\n"
                   f"  DCC_TILE_RESIDUE(DCC_ROWS)\n#undef DCC_ROWS\n}}")
    return "\n".join(out)


STORED_INTRINSICS = ENGINE + "\n".join(_entries(q) for q in DECODERS) + "\n"
