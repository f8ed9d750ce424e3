"""The cpu target's kernels for weights interleaved in 16s (quantization/group.py InterleavedScheme: 16 outputs per
group, word 16 * j + l holding output l's codes of quad j and j + 4; with fifth bits, GGUF's Q5_0 / Q5_1:
gguf_stored.py InterleavedQ5; the K-quants: InterleavedK, InterleavedQ6), one output per SIMD lane, so no horizontal
sums; 8- and 16-bit activations.

8-bit, AVX-512 VNNI: per block, 8 `vpdpbusd` of 16 outputs' 4 codes by 4 activation bytes broadcast. AVX2: two 8-lane
halves; each half's quads go through `vpmaddubsw` and are added as int16 before `vpmaddwd`.
16-bit (the linears calibration gives int16 codes, deploycc/calibrate.py), AVX2: each quad's codes are taken to int16
in place, the codes at bytes 0 and 2 of each output's word in one register and those at bytes 1 and 3 in another (a
shift and a mask each, no widening across lanes), and multiplied (`vpmaddwd`) with the activation pairs (x0, x2) and
(x1, x3) broadcast, put in that order once per block and row (dcc_x16_pairs16); the 8 quads summed in int32
(|sum| <= 32 * 31 * 32767 < 2^31) land with output l's sum in lane l. Plain C elsewhere. The source follows
c_intrin.py's (dcc_tile_rows, the residue dispatch).
"""

X16 = r"""
/* code k of output l in one interleaved block: the low nibble, and with fifth bits (GGUF Q5_0 / Q5_1 interleaved,
   quantization/gguf_blocks.py InterleavedQ5) bit 4 from byte 16 (j % 4) + l of the block's 64 bytes of them */
static inline uint32_t dcc_x16_code(const uint32_t* pb, const uint8_t* hb, int l, int k) {
  const int j = k >> 2;
  uint32_t c = (pb[16 * (j & 3) + l] >> (8 * (k & 3) + 4 * (j >> 2))) & 15u;
  if (hb) c |= ((hb[16 * (j & 3) + l] >> ((k & 3) + 4 * (j >> 2))) & 1u) << 4;
  return c;
}
#if defined(__AVX2__)
/* an empty asm the value passes through: an accumulator's sums then happen in the written order, one at a time,
   where gcc would otherwise reassociate a row's unrolled sums into a tree and spill the products it holds for it */
#define DCC_KEEP(v) __asm__("" : "+x"(v))
/* the 8-lane halves (outputs 8h .. 8h + 7) each pass over a group's blocks takes, through FN_h(ARGS..., h0, h1): for
   one activation row (decode) both, so each weight byte is read once; for a tile one per pass, so a half's R
   accumulators and sums stay in registers (with both halves in one pass gcc keeps every activation broadcast for the
   other half and spills them). Constant bounds: with a loop over passes gcc kept the accumulators in memory. */
#define DCC_X16_HALVES(FN, ...) do {                                                                                   \
    if (R == 1) FN(__VA_ARGS__, 0, 2);                                                                              \
    else { FN(__VA_ARGS__, 0, 1); FN(__VA_ARGS__, 1, 2); }                                                          \
  } while (0)
/* 8 outputs' bytes of fifth bits, each repeated over its output's 4 code bytes */
static inline __m256i dcc_x16_fifth(const uint8_t* hb) {
  int64_t v;
  __builtin_memcpy(&v, hb, 8);
  return _mm256_shuffle_epi8(_mm256_set1_epi64x(v), _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
                                                                     4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7));
}
/* 8-lane halves h0 .. h1 - 1 of R rows' 16 outputs */
static inline __attribute__((always_inline)) void dcc_x16_store(float* out, int ldo, __m256 (*acc)[2], int R, int h0,
                                                                int h1) {
  for (int r = 0; r < R; ++r)
    for (int h = h0; h < h1; ++h) _mm256_storeu_ps(out + (int64_t)r * ldo + 8 * h, acc[r][h]);
}
/* 16 in each byte whose bit (the byte's position in `mask4`'s 4 bytes) is set */
static inline __m256i dcc_bits16(__m256i v, int mask4) {
  const __m256i m = _mm256_set1_epi32(mask4);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, m), m), _mm256_set1_epi8(16));
}
/* word j of block b, outputs 8h .. 8h + 7: quad j's codes (c0) and quad j + 4's (c1) as bytes, with fifth bits (qh,
   GGUF Q5_0 / Q5_1) added as 16s */
static inline __attribute__((always_inline)) void dcc_x16_word(const uint32_t* pb, const uint32_t* qh, int b, int j,
                                                               int h, __m256i* c0, __m256i* c1) {
  const __m256i nib = _mm256_set1_epi8(15);
  const __m256i p = _mm256_loadu_si256((const __m256i*)(pb + 16 * j + 8 * h));
  *c0 = _mm256_and_si256(p, nib);
  *c1 = _mm256_and_si256(_mm256_srli_epi16(p, 4), nib);
  if (qh) {
    const __m256i hv = dcc_x16_fifth((const uint8_t*)(qh + 16 * b) + 16 * j + 8 * h);
    *c0 = _mm256_or_si256(*c0, dcc_bits16(hv, 0x08040201));
    *c1 = _mm256_or_si256(*c1, dcc_bits16(hv, (int)0x80402010));
  }
}
/* a block's 32 int16 activations as 16 int32 pairs, (x[4 j], x[4 j + 2]) and (x[4 j + 1], x[4 j + 3]) for quad j:
   what vpmaddwd multiplies with a quad's codes taken in place from its bytes 0 and 2, and 1 and 3 */
static inline void dcc_x16_pairs16(const int16_t* x, int32_t* xp) {
  const __m256i pairs = _mm256_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15,
                                         0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15);
  _mm256_storeu_si256((__m256i*)xp, _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i*)x), pairs));
  _mm256_storeu_si256((__m256i*)(xp + 8), _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i*)(x + 16)), pairs));
}
/* one quad's int32 sums for 8 outputs: its codes at bytes 0 and 2 (e) and 1 and 3 (o) as int16, times the quad's
   activation pairs x2[0] = (x0, x2) and x2[1] = (x1, x3) of dcc_x16_pairs16 */
static inline __attribute__((always_inline)) __m256i dcc_x16_dot16(__m256i e, __m256i o, const int32_t* x2) {
  return _mm256_add_epi32(_mm256_madd_epi16(e, _mm256_set1_epi32(x2[0])), _mm256_madd_epi16(o, _mm256_set1_epi32(x2[1])));
}
#endif

/* K-quant scales (quantization/gguf_stored.py InterleavedK): a super-block's 12 planes of 16 lanes' packed 6-bit
   scales and minimums -> o[32 s + l] the scale and o[32 s + 16 + l] the minimum of sub-block s, lane l (ggml's
   get_scale_min_k4, 16 lanes at a time) */
static inline void dcc_k_unpack(const uint8_t* p, uint8_t* o) {
#if defined(__AVX2__)
  __m128i P[12];
  for (int i = 0; i < 12; ++i) P[i] = _mm_loadu_si128((const __m128i*)(p + 16 * i));
  const __m128i m63 = _mm_set1_epi8(63), m15 = _mm_set1_epi8(15), m3 = _mm_set1_epi8(3);
  for (int j = 0; j < 4; ++j) {
    _mm_storeu_si128((__m128i*)(o + 32 * j), _mm_and_si128(P[j], m63));
    _mm_storeu_si128((__m128i*)(o + 32 * j + 16), _mm_and_si128(P[j + 4], m63));
    const __m128i top_s = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(P[j], 6), m3), 4);
    const __m128i top_m = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(P[j + 4], 6), m3), 4);
    _mm_storeu_si128((__m128i*)(o + 32 * (j + 4)), _mm_or_si128(_mm_and_si128(P[j + 8], m15), top_s));
    _mm_storeu_si128((__m128i*)(o + 32 * (j + 4) + 16),
                     _mm_or_si128(_mm_and_si128(_mm_srli_epi16(P[j + 8], 4), m15), top_m));
  }
#else
  for (int l = 0; l < 16; ++l)
    for (int j = 0; j < 4; ++j) {
      o[32 * j + l] = p[16 * j + l] & 63;
      o[32 * j + 16 + l] = p[16 * (j + 4) + l] & 63;
      o[32 * (j + 4) + l] = (p[16 * (j + 8) + l] & 15) | ((p[16 * j + l] >> 6) << 4);
      o[32 * (j + 4) + 16 + l] = (p[16 * (j + 8) + l] >> 4) | ((p[16 * (j + 4) + l] >> 6) << 4);
    }
#endif
}
#if defined(__AVX2__)
/* lanes 8h .. 8h + 7 of block b's weight scale and minimum term: the f16 s and m (or -zero * s) of the interleaved
   formats, or a K-quant's d * sc and -(dmin * mn), kb its super-block's unpacked sub-block bytes (dcc_k_unpack) */
static inline void dcc_x16_scales(const half* s, const half* m, const uint8_t* kb, float zero, int b, int h,
                                  __m256* dv, __m256* cv) {
  if (kb) {
    const int at = 16 * (b >> 3) + 8 * h;
    const uint8_t* sb = kb + 32 * (b & 7) + 8 * h;
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)sb)));
    const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(sb + 16))));
    *dv = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + at))), sc);
    *cv = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(m + at))), mn));
    return;
  }
  *dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + 16 * b + 8 * h)));
  *cv = m ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(m + 16 * b + 8 * h))) : _mm256_mul_ps(*dv, _mm256_set1_ps(-zero));
}
#endif

/* plain C, for either activation width (xr's element type differs, the code does not) */
#define DCC_X16_PLAIN                                                                                              \
  uint8_t kb[256];                                                                                                 \
  for (int r = 0; r < R; ++r) {                                                                                    \
    for (int l = 0; l < 16; ++l) {                                                                                 \
      float a = 0.0f;                                                                                              \
      for (int b = 0; b < nb; ++b) {                                                                               \
        const uint32_t* pb = q + 64 * b;                                                                           \
        if (ks && (b & 7) == 0) dcc_k_unpack(ks + 192 * (b >> 3), kb);                                             \
        int32_t dot = 0;                                                                                           \
        for (int k = 0; k < 32; ++k)                                                                               \
          dot += (int32_t)dcc_x16_code(pb, qh ? (const uint8_t*)(qh + 16 * b) : 0, l, k) * xr[r][32 * b + k];    \
        const float sc = ks ? (float)s[16 * (b >> 3) + l] * (float)kb[32 * (b & 7) + l] : (float)s[16 * b + l];     \
        const float mn = ks ? -((float)m[16 * (b >> 3) + l] * (float)kb[32 * (b & 7) + 16 + l])                    \
                            : (m ? (float)m[16 * b + l] : -zero * sc);                                              \
        a += sc * dr[r][b] * (float)dot + mn * sr[r][b];                                                           \
      }                                                                                                            \
      out[(int64_t)r * ldo + l] = a;                                                                               \
    }                                                                                                              \
  }

/* interleaved 4-bit weights (quantization/group.py InterleavedScheme): R activation rows (activations in
   linear order) against the 16 outputs of one interleaved group, one output per lane: per block, 8
   vpdpbusd of 16 outputs' 4 codes by 4 activation bytes broadcast, then the block's scales as vectors;
   out[r * ldo + l] for output l of the group. No horizontal sums. */
#if defined(__AVX2__)
/* dcc_x16_rows's AVX2 pass over the blocks for outputs 8 h0 .. 8 h1 - 1 (DCC_X16_HALVES) */
static inline __attribute__((always_inline)) void dcc_x16_rows_h(
    float* out, int ldo, const uint32_t* q, const uint32_t* qh, const half* s, const half* m, const uint8_t* ks,
    float zero, const int8_t* const* xr, const float* const* dr, const float* const* sr, int nb, int R, int h0,
    int h1) {
  /* per block and word j, the codes of quads j and j + 4 go through vpmaddubsw and are added as int16: without fifth
     bits all 8 quads (|pair sum| <= 2 * 15 * 127, eight of them < 2^15) before one vpmaddwd into int32; 5-bit codes
     (2 * 31 * 127) into int32 per word */
  const __m256i ones = _mm256_set1_epi16(1);
  uint8_t kb[256];
  __m256 acc[DCC_TILE][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const uint32_t* pb = q + 64 * b;
    if (ks && (b & 7) == 0) dcc_k_unpack(ks + 192 * (b >> 3), kb);
    for (int h = h0; h < h1; ++h) {
      __m256i a[DCC_TILE];
      for (int j = 0; j < 4; ++j) {
        __m256i c0, c1;
        dcc_x16_word(pb, qh, b, j, h, &c0, &c1);
        for (int r = 0; r < R; ++r) {
          const int32_t* x = (const int32_t*)(xr[r] + 32 * b);
          const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(c0, _mm256_set1_epi32(x[j])),
                                               _mm256_maddubs_epi16(c1, _mm256_set1_epi32(x[j + 4])));
          if (qh) a[r] = j ? _mm256_add_epi32(a[r], _mm256_madd_epi16(s16, ones)) : _mm256_madd_epi16(s16, ones);
          else a[r] = j ? _mm256_add_epi16(a[r], s16) : s16;
          DCC_KEEP(a[r]);
        }
      }
      __m256 dv, cv;
      dcc_x16_scales(s, m, ks ? kb : 0, zero, b, h, &dv, &cv);
      for (int r = 0; r < R; ++r) {
        const __m256 dot = _mm256_cvtepi32_ps(qh ? a[r] : _mm256_madd_epi16(a[r], ones));
        acc[r][h] = _mm256_fmadd_ps(dot, _mm256_mul_ps(dv, _mm256_set1_ps(dr[r][b])), acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(cv, _mm256_set1_ps(sr[r][b]), acc[r][h]);
      }
    }
  }
  dcc_x16_store(out, ldo, acc, R, h0, h1);
}
#endif
static inline __attribute__((always_inline)) void dcc_x16_rows(
    float* out, int ldo, const uint32_t* q, const uint32_t* qh, const half* s, const half* m, const uint8_t* ks,
    float zero, const int8_t* const* xr, const float* const* dr, const float* const* sr, int nb, int R) {
#if defined(DCC_ZMM)
  if (!qh) {  /* the 4-bit formats through 512-bit vpdpbusd; the 5-bit ones take the AVX2 path below */
  __m512 acc[DCC_TILE];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i lo = _mm512_set1_epi8(15);
  uint8_t kb[256];
  for (int b = 0; b < nb; ++b) {
    const uint32_t* pb = q + 64 * b;
    if (ks && (b & 7) == 0) dcc_k_unpack(ks + 192 * (b >> 3), kb);
    __m512i c[8];
    for (int j = 0; j < 4; ++j) {
      const __m512i p = _mm512_loadu_si512(pb + 16 * j);
      c[j] = _mm512_and_si512(p, lo);
      c[j + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), lo);
    }
    __m512 dv, cv;
    if (ks) {  /* a K-quant: d * sc and -(dmin * mn) of the block's sub-block */
      const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(kb + 32 * (b & 7)))));
      const __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(kb + 32 * (b & 7) + 16))));
      dv = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(s + 16 * (b >> 3)))), sc);
      cv = _mm512_sub_ps(_mm512_setzero_ps(),
                         _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(m + 16 * (b >> 3)))), mn));
    } else {
      dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(s + 16 * b)));
      cv = m ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(m + 16 * b))) : _mm512_mul_ps(dv, _mm512_set1_ps(-zero));
    }
    for (int r = 0; r < R; ++r) {
      const int32_t* x = (const int32_t*)(xr[r] + 32 * b);
      __m512i a = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j) a = _mm512_dpbusd_epi32(a, c[j], _mm512_set1_epi32(x[j]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(dv, _mm512_set1_ps(dr[r][b])), acc[r]);
      acc[r] = _mm512_fmadd_ps(cv, _mm512_set1_ps(sr[r][b]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + (int64_t)r * ldo, acc[r]);
  return;
  }
#endif
#if defined(__AVX2__)
  DCC_X16_HALVES(dcc_x16_rows_h, out, ldo, q, qh, s, m, ks, zero, xr, dr, sr, nb, R);
#else
  DCC_X16_PLAIN
#endif
}

static inline void dcc_dot_x16(float* acc, const uint32_t* q, const uint32_t* qh, const half* s, const half* m,
                               float zero, const int8_t* xq, const float* xd, const float* xsd, int g, int nb) {
  const int8_t* xr[1] = {xq};
  const float* dr[1] = {xd};
  const float* sr[1] = {xsd};
  const int64_t at = (int64_t)g * nb;
  dcc_x16_rows(acc, 16, q + at * 64, qh ? qh + at * 16 : 0, s + at * 16, m ? m + at * 16 : 0, 0, zero, xr, dr, sr, nb,
               1);
}

static inline void dcc_dot_x16_tile(float* acc, const uint32_t* q, const uint32_t* qh, const half* s, const half* m,
                                    float zero, const int8_t* xq, const float* xd, const float* xsd, int g, int nb,
                                    int t0, int rows) {
  const int8_t* xr[DCC_TILE];
  const float* dr[DCC_TILE];
  const float* sr[DCC_TILE];
  dcc_tile_rows(xq, xd, xsd, nb, t0, rows, xr, dr, sr);
  const int64_t at = (int64_t)g * nb;
#define DCC_X16_ROWS(R) \
  dcc_x16_rows(acc, 16, q + at * 64, qh ? qh + at * 16 : 0, s + at * 16, m ? m + at * 16 : 0, 0, zero, xr, dr, sr, nb, R)
  DCC_TILE_RESIDUE(DCC_X16_ROWS)
#undef DCC_X16_ROWS
}

/* entry points: acc[16] (or acc[DCC_TILE * 16], row-major) for interleaved group g; q5: GGUF Q5_0 / Q5_1. One
   macro for both activation widths: IMPL is dcc_dot_x16 (int8 codes) or dcc_dot_x16_16 (int16, c_x16.py). */
#define DCC_X16_ENTRIES(NAME, BITS, XT, IMPL, QH_ARG, QH, M_ARG, M, ZERO)                                             \
  static inline void dcc_dot_##NAME##_x16_q##BITS(float* acc, const uint32_t* q, QH_ARG const half* s, M_ARG          \
                                                  const XT* xq, const float* xd, const float* xsd, int g, int nb) {    \
    IMPL(acc, q, QH, s, M, ZERO, xq, xd, xsd, g, nb);                                                                 \
  }                                                                                                                   \
  static inline void dcc_dot_##NAME##_x16_q##BITS##_tile(float* acc, const uint32_t* q, QH_ARG const half* s, M_ARG   \
                                                         const XT* xq, const float* xd, const float* xsd, int g,      \
                                                         int nb, int t0, int rows) {                                  \
    IMPL##_tile(acc, q, QH, s, M, ZERO, xq, xd, xsd, g, nb, t0, rows);                                                \
  }
#define DCC_NONE
#define DCC_COMMA ,
#define DCC_X16_FORMATS(BITS, XT, IMPL)                                                                               \
  DCC_X16_ENTRIES(q4_sym, BITS, XT, IMPL, DCC_NONE, 0, DCC_NONE, 0, 8.0f)                                             \
  DCC_X16_ENTRIES(q4_asym, BITS, XT, IMPL, DCC_NONE, 0, const half* m DCC_COMMA, m, 0.0f)                             \
  DCC_X16_ENTRIES(q5_sym, BITS, XT, IMPL, const uint32_t* qh DCC_COMMA, qh, DCC_NONE, 0, 16.0f)                       \
  DCC_X16_ENTRIES(q5_asym, BITS, XT, IMPL, const uint32_t* qh DCC_COMMA, qh, const half* m DCC_COMMA, m, 0.0f)
DCC_X16_FORMATS(8, int8_t, dcc_dot_x16)

static inline __attribute__((always_inline)) void dcc_x16_rows16(
    float* out, int ldo, const uint32_t* q, const uint32_t* qh, const half* s, const half* m, const uint8_t* ks,
    float zero, const int16_t* const* xr, const float* const* dr, const float* const* sr, int nb, int R) {
#if defined(__AVX2__)
  __m256 acc[DCC_TILE][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi16(255);
  uint8_t kb[256];
  for (int b = 0; b < nb; ++b) {
    const uint32_t* pb = q + 64 * b;
    if (ks && (b & 7) == 0) dcc_k_unpack(ks + 192 * (b >> 3), kb);
    int32_t xp[DCC_TILE][16];
    for (int r = 0; r < R; ++r) dcc_x16_pairs16(xr[r] + 32 * b, xp[r]);
    for (int h = 0; h < 2; ++h) {
      __m256i a[DCC_TILE];  /* per row: the int32 sums of outputs 8h .. 8h + 7 */
      for (int r = 0; r < R; ++r) a[r] = _mm256_setzero_si256();
      for (int j = 0; j < 4; ++j) {  /* the word of quads j and j + 4: their codes 0 and 2 (e), 1 and 3 (o) as int16 */
        /* the codes as bytes (dcc_x16_word), then split into int16 halves */
        __m256i c0, c1;
        dcc_x16_word(pb, qh, b, j, h, &c0, &c1);
        const __m256i e0 = _mm256_and_si256(c0, low), o0 = _mm256_srli_epi16(c0, 8);
        const __m256i e1 = _mm256_and_si256(c1, low), o1 = _mm256_srli_epi16(c1, 8);
        /* quad j's pairs at 2 j, quad j + 4's at 2 j + 8; written out rather than through dcc_x16_dot16, which gcc
           schedules 1.6x slower here in prefill (benchmarks/x16_kernels.py, Zen 3) though it is the same arithmetic */
        for (int r = 0; r < R; ++r) {
          const int32_t* x = xp[r];
          a[r] = _mm256_add_epi32(a[r], _mm256_add_epi32(_mm256_madd_epi16(e0, _mm256_set1_epi32(x[2 * j])),
                                                         _mm256_madd_epi16(o0, _mm256_set1_epi32(x[2 * j + 1]))));
          DCC_KEEP(a[r]);
          a[r] = _mm256_add_epi32(a[r], _mm256_add_epi32(_mm256_madd_epi16(e1, _mm256_set1_epi32(x[2 * j + 8])),
                                                         _mm256_madd_epi16(o1, _mm256_set1_epi32(x[2 * j + 9]))));
          DCC_KEEP(a[r]);
        }
      }
      __m256 dv, cv;
      dcc_x16_scales(s, m, ks ? kb : 0, zero, b, h, &dv, &cv);
      for (int r = 0; r < R; ++r) {
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[r]), _mm256_mul_ps(dv, _mm256_set1_ps(dr[r][b])), acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(cv, _mm256_set1_ps(sr[r][b]), acc[r][h]);
      }
    }
  }
  dcc_x16_store(out, ldo, acc, R, 0, 2);
#else
  DCC_X16_PLAIN
#endif
}

static inline void dcc_dot_x16_16(float* acc, const uint32_t* q, const uint32_t* qh, const half* s, const half* m,
                                  float zero, const int16_t* xq, const float* xd, const float* xsd, int g, int nb) {
  const int16_t* xr[1] = {xq};
  const float* dr[1] = {xd};
  const float* sr[1] = {xsd};
  const int64_t at = (int64_t)g * nb;
  dcc_x16_rows16(acc, 16, q + at * 64, qh ? qh + at * 16 : 0, s + at * 16, m ? m + at * 16 : 0, 0, zero, xr, dr, sr,
                 nb, 1);
}
static inline void dcc_dot_x16_16_tile(float* acc, const uint32_t* q, const uint32_t* qh, const half* s,
                                       const half* m, float zero, const int16_t* xq, const float* xd, const float* xsd,
                                       int g, int nb, int t0, int rows) {
  const int16_t* xr[DCC_TILE];
  const float* dr[DCC_TILE];
  const float* sr[DCC_TILE];
  dcc_tile_rows16(xq, xd, xsd, nb, t0, rows, xr, dr, sr);
  const int64_t at = (int64_t)g * nb;
#define DCC_X16_ROWS(R) \
  dcc_x16_rows16(acc, 16, q + at * 64, qh ? qh + at * 16 : 0, s + at * 16, m ? m + at * 16 : 0, 0, zero, xr, dr, sr, nb, R)
  DCC_TILE_RESIDUE(DCC_X16_ROWS)
#undef DCC_X16_ROWS
}

/* entry points, as the 8-bit ones (DCC_X16_FORMATS above) */
DCC_X16_FORMATS(16, int16_t, dcc_dot_x16_16)

/* K-quants interleaved (quantization/gguf_stored.py InterleavedK): codes and fifth bits as above, sub [N/16, K/256,
   48] the 12 planes of packed 6-bit scales and minimums, s / m [N/16, K/256, 16] d and dmin. XT, TILE_ROWS: the
   activation width's element type and tile-row gatherer; DCC_XK_ROWS_<BITS> calls its rows function, DCC_XK_QH
   the fifth bits (0 for Q4_K). */
#define DCC_XK_ENTRIES(NAME, BITS, XT, TILE_ROWS, QH_ARG)                                                           \
  static inline void dcc_dot_##NAME##_x16_q##BITS(float* acc, const uint32_t* q, QH_ARG const uint32_t* sub,        \
                                                  const half* s, const half* m, const XT* xq, const float* xd,        \
                                                  const float* xsd, int g, int nb) {                                  \
    const XT* xr[1] = {xq};                                                                                         \
    const float* dr[1] = {xd};                                                                                      \
    const float* sr[1] = {xsd};                                                                                     \
    const int64_t at = (int64_t)g * nb;                                                                             \
    DCC_XK_ROWS_##BITS(1);                                                                                          \
  }                                                                                                                 \
  static inline void dcc_dot_##NAME##_x16_q##BITS##_tile(float* acc, const uint32_t* q, QH_ARG const uint32_t* sub, \
                                                         const half* s, const half* m, const XT* xq, const float* xd, \
                                                         const float* xsd, int g, int nb, int t0, int rows) {         \
    const XT* xr[DCC_TILE];                                                                                         \
    const float* dr[DCC_TILE];                                                                                      \
    const float* sr[DCC_TILE];                                                                                      \
    TILE_ROWS(xq, xd, xsd, nb, t0, rows, xr, dr, sr);                                                               \
    const int64_t at = (int64_t)g * nb;                                                                             \
    DCC_TILE_RESIDUE(DCC_XK_ROWS_##BITS)                                                                            \
  }
#define DCC_XK_ROWS(ROWS, QH, R) \
  ROWS(acc, 16, q + at * 64, QH, s + at * 2, m + at * 2, (const uint8_t*)(sub + at * 6), 0.0f, xr, dr, sr, nb, R)
#define DCC_XK_ROWS_8(R) DCC_XK_ROWS(dcc_x16_rows, DCC_XK_QH, R)
#define DCC_XK_ROWS_16(R) DCC_XK_ROWS(dcc_x16_rows16, DCC_XK_QH, R)
#define DCC_XK_QH 0
DCC_XK_ENTRIES(q4_k, 8, int8_t, dcc_tile_rows, DCC_NONE)
DCC_XK_ENTRIES(q4_k, 16, int16_t, dcc_tile_rows16, DCC_NONE)
#undef DCC_XK_QH
#define DCC_XK_QH (qh + at * 16)
DCC_XK_ENTRIES(q5_k, 8, int8_t, dcc_tile_rows, const uint32_t* qh DCC_COMMA)
DCC_XK_ENTRIES(q5_k, 16, int16_t, dcc_tile_rows16, const uint32_t* qh DCC_COMMA)
#undef DCC_XK_QH
/* Q6_K interleaved (quantization/gguf_stored.py InterleavedQ6): low nibbles as above, qh [N/16, K/32, 32] the top two
   bits (word 16 k + l, byte i, bits 2 m: value 4 (4 k + m) + i of output l), sc [N/16, K/256, 256] the int8 scales
   (byte 16 s + l: output l's of sub-block s), s [N/16, K/256, 16] d. w = d * sc * (q6 - 32): per sub-block of 16 the
   integer dot of the unsigned 6-bit codes, scaled by sc, less 32 * sc * (the activations' code sum of those 16,
   xsd: two d * sum per block, quantize_q{8,16}_k). 8-bit, AVX2: vpmaddubsw per quad (|pair| <= 2 * 63 * 127), two
   quads added in int16, then vpmaddwd by the sub-block's scale as an int16 pair, so one int32 sum per block. */
static inline uint32_t dcc_x16_code6(const uint32_t* pb, const uint32_t* hb, int l, int k) {
  const int j = k >> 2, i = k & 3;
  return ((pb[16 * (j & 3) + l] >> (8 * i + 4 * (j >> 2))) & 15u) |
         (((hb[16 * (j >> 2) + l] >> (8 * i + 2 * (j & 3))) & 3u) << 4);
}
#define DCC_X16_PLAIN_Q6                                                                                            \
  for (int r = 0; r < R; ++r) {                                                                                    \
    for (int l = 0; l < 16; ++l) {                                                                                 \
      float a = 0.0f;                                                                                              \
      for (int b = 0; b < nb; ++b) {                                                                               \
        const int8_t* scb = sc + 256 * (b >> 3) + 32 * (b & 7);                                                    \
        const float d = (float)s[16 * (b >> 3) + l];                                                               \
        for (int hv = 0; hv < 2; ++hv) {                                                                           \
          int32_t dot = 0;                                                                                         \
          for (int k = 16 * hv; k < 16 * hv + 16; ++k)                                                             \
            dot += (int32_t)dcc_x16_code6(q + 64 * b, qh + 32 * b, l, k) * xr[r][32 * b + k];                     \
          const float w = d * (float)scb[16 * hv + l];                                                             \
          a += w * dr[r][b] * (float)dot - 32.0f * w * sr[r][2 * b + hv];                                          \
        }                                                                                                          \
      }                                                                                                            \
      out[(int64_t)r * ldo + l] = a;                                                                               \
    }                                                                                                              \
  }
#if defined(__AVX2__)
/* the 8 quads' 6-bit codes of outputs 8h .. 8h + 7 in one block: quad j's and j + 4's nibbles share word 16 j + l,
   their top bits are bits 2 j of words l and 16 + l */
static inline void dcc_q6_codes(const uint32_t* pb, const uint32_t* hb, int h, __m256i* c) {
  const __m256i nib = _mm256_set1_epi8(15), top = _mm256_set1_epi8(0x30);
  const __m256i H0 = _mm256_loadu_si256((const __m256i*)(hb + 8 * h));
  const __m256i H1 = _mm256_loadu_si256((const __m256i*)(hb + 16 + 8 * h));
  for (int j = 0; j < 4; ++j) {
    const __m256i p = _mm256_loadu_si256((const __m256i*)(pb + 16 * j + 8 * h));
    const __m256i t0 = j == 3 ? _mm256_srli_epi16(H0, 2) : _mm256_slli_epi16(H0, 4 - 2 * j);
    const __m256i t1 = j == 3 ? _mm256_srli_epi16(H1, 2) : _mm256_slli_epi16(H1, 4 - 2 * j);
    c[j] = _mm256_or_si256(_mm256_and_si256(p, nib), _mm256_and_si256(t0, top));
    c[j + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(p, 4), nib), _mm256_and_si256(t1, top));
  }
}
#endif
#if defined(__AVX2__)
/* dcc_x16_rows_q6's AVX2 pass over the blocks for outputs 8 h0 .. 8 h1 - 1 (DCC_X16_HALVES) */
static inline __attribute__((always_inline)) void dcc_x16_rows_q6_h(
    float* out, int ldo, const uint32_t* q, const uint32_t* qh, const int8_t* sc, const half* s,
    const int8_t* const* xr, const float* const* dr, const float* const* sr, int nb, int R, int h0, int h1) {
  /* quads 2 k and 2 k + 1 summed as int16 (|sum| <= 2 * 2 * 63 * 127 < 2^15), then vpmaddwd by their sub-block's
     scale */
  const __m256i low16 = _mm256_set1_epi32(0xFFFF);
  __m256 acc[DCC_TILE][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const uint32_t* pb = q + 64 * b;
    const uint32_t* hb = qh + 32 * b;
    const int8_t* scb = sc + 256 * (b >> 3) + 32 * (b & 7);
    for (int h = h0; h < h1; ++h) {
      __m256i c[8];
      dcc_q6_codes(pb, hb, h, c);
      const __m256i w0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(scb + 8 * h)));
      const __m256i w1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(scb + 16 + 8 * h)));
      const __m256i p0 = _mm256_or_si256(_mm256_and_si256(w0, low16), _mm256_slli_epi32(w0, 16));  /* sc, sc */
      const __m256i p1 = _mm256_or_si256(_mm256_and_si256(w1, low16), _mm256_slli_epi32(w1, 16));
      __m256i a[DCC_TILE];
      for (int k = 0; k < 4; ++k)
        for (int r = 0; r < R; ++r) {
          const int32_t* x = (const int32_t*)(xr[r] + 32 * b);
          const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(c[2 * k], _mm256_set1_epi32(x[2 * k])),
                                               _mm256_maddubs_epi16(c[2 * k + 1], _mm256_set1_epi32(x[2 * k + 1])));
          const __m256i s32 = _mm256_madd_epi16(s16, k < 2 ? p0 : p1);
          a[r] = k ? _mm256_add_epi32(a[r], s32) : s32;
          DCC_KEEP(a[r]);
        }
      const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + 16 * (b >> 3) + 8 * h)));
      const __m256 f0 = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(w0)), f1 = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(w1));
      for (int r = 0; r < R; ++r) {
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[r]), _mm256_mul_ps(dv, _mm256_set1_ps(dr[r][b])), acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(f0, _mm256_set1_ps(-32.0f * sr[r][2 * b]), acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(f1, _mm256_set1_ps(-32.0f * sr[r][2 * b + 1]), acc[r][h]);
      }
    }
  }
  dcc_x16_store(out, ldo, acc, R, h0, h1);
}
#endif
static inline __attribute__((always_inline)) void dcc_x16_rows_q6(
    float* out, int ldo, const uint32_t* q, const uint32_t* qh, const int8_t* sc, const half* s,
    const int8_t* const* xr, const float* const* dr, const float* const* sr, int nb, int R) {
#if defined(__AVX2__)
  DCC_X16_HALVES(dcc_x16_rows_q6_h, out, ldo, q, qh, sc, s, xr, dr, sr, nb, R);
#else
  DCC_X16_PLAIN_Q6
#endif
}
/* 16-bit activations, AVX2: each quad's 6-bit codes taken to int16 in place (bytes 0 and 2, 1 and 3) and multiplied
   with the activation pairs (vpmaddwd), as dcc_x16_rows16 does; the sub-blocks' sums scaled apart in float */
static inline __attribute__((always_inline)) void dcc_x16_rows16_q6(
    float* out, int ldo, const uint32_t* q, const uint32_t* qh, const int8_t* sc, const half* s,
    const int16_t* const* xr, const float* const* dr, const float* const* sr, int nb, int R) {
#if defined(__AVX2__)
  __m256 acc[DCC_TILE][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi16(255);
  for (int b = 0; b < nb; ++b) {
    const uint32_t* pb = q + 64 * b;
    const uint32_t* hb = qh + 32 * b;
    const int8_t* scb = sc + 256 * (b >> 3) + 32 * (b & 7);
    int32_t xp[DCC_TILE][16];
    for (int r = 0; r < R; ++r) dcc_x16_pairs16(xr[r] + 32 * b, xp[r]);
    for (int h = 0; h < 2; ++h) {
      __m256i c[8];
      dcc_q6_codes(pb, hb, h, c);
      __m256i a[DCC_TILE][2];  /* per row, the two sub-blocks' int32 sums (|sum| <= 16 * 63 * 32767), scaled apart */
      for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {  /* bytes 0 and 2, and 1 and 3, of each output's quad as int16 */
        const __m256i e = _mm256_and_si256(c[j], low), o = _mm256_srli_epi16(c[j], 8);
        for (int r = 0; r < R; ++r) a[r][j >> 2] = _mm256_add_epi32(a[r][j >> 2], dcc_x16_dot16(e, o, xp[r] + 2 * j));
      }
      const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + 16 * (b >> 3) + 8 * h)));
      const __m128i w0 = _mm_loadl_epi64((const __m128i*)(scb + 8 * h)), w1 = _mm_loadl_epi64((const __m128i*)(scb + 16 + 8 * h));
      const __m256 f0 = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(w0)));
      const __m256 f1 = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(w1)));
      for (int r = 0; r < R; ++r) {
        const __m256 dx = _mm256_set1_ps(dr[r][b]);
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[r][0]), _mm256_mul_ps(f0, dx), acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[r][1]), _mm256_mul_ps(f1, dx), acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(f0, _mm256_set1_ps(-32.0f * sr[r][2 * b]), acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(f1, _mm256_set1_ps(-32.0f * sr[r][2 * b + 1]), acc[r][h]);
      }
    }
  }
  dcc_x16_store(out, ldo, acc, R, 0, 2);
#else
  DCC_X16_PLAIN_Q6
#endif
}
/* entry points: q [N/16, K/32, 64], qh [.., 32], sub [N/16, K/256, 64] words, s [N/16, K/256, 16]; xsd two per block */
#define DCC_Q6_ENTRIES(BITS, XT, ROWS, TILE_ROWS)                                                                  \
  static inline void dcc_dot_q6_k_x16_q##BITS(float* acc, const uint32_t* q, const uint32_t* qh,                   \
                                              const uint32_t* sub, const half* s, const XT* xq, const float* xd,  \
                                              const float* xsd, int g, int nb) {                                  \
    const XT* xr[1] = {xq};                                                                                         \
    const float* dr[1] = {xd};                                                                                      \
    const float* sr[1] = {xsd};                                                                                     \
    const int64_t at = (int64_t)g * nb;                                                                             \
    ROWS(acc, 16, q + at * 64, qh + at * 32, (const int8_t*)(sub + at * 8), s + at * 2, xr, dr, sr, nb, 1);        \
  }                                                                                                                 \
  static inline void dcc_dot_q6_k_x16_q##BITS##_tile(float* acc, const uint32_t* q, const uint32_t* qh,            \
                                                     const uint32_t* sub, const half* s, const XT* xq,              \
                                                     const float* xd, const float* xsd, int g, int nb, int t0,      \
                                                     int rows) {                                                    \
    const XT* xr[DCC_TILE];                                                                                         \
    const float* dr[DCC_TILE];                                                                                      \
    const float* sr[DCC_TILE];                                                                                      \
    TILE_ROWS(xq, xd, xsd, nb, t0, rows, xr, dr, sr);                                                               \
    for (int t = 0; t < DCC_TILE; ++t) sr[t] = xsd + (sr[t] - xsd) * 2;  /* two sums per block */                  \
    const int64_t at = (int64_t)g * nb;                                                                             \
    DCC_TILE_RESIDUE(DCC_Q6_ROWS_##BITS)                                                                            \
  }
#define DCC_Q6_ROWS_8(R) \
  dcc_x16_rows_q6(acc, 16, q + at * 64, qh + at * 32, (const int8_t*)(sub + at * 8), s + at * 2, xr, dr, sr, nb, R)
#define DCC_Q6_ROWS_16(R) \
  dcc_x16_rows16_q6(acc, 16, q + at * 64, qh + at * 32, (const int8_t*)(sub + at * 8), s + at * 2, xr, dr, sr, nb, R)
DCC_Q6_ENTRIES(8, int8_t, dcc_x16_rows_q6, dcc_tile_rows)
DCC_Q6_ENTRIES(16, int16_t, dcc_x16_rows16_q6, dcc_tile_rows16)
"""
