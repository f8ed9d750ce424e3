"""The cpu target's interleaved 4-bit weights (quantization/group.py InterleavedScheme: 16 outputs per group, word
16 * j + l holding output l's codes of quad j and j + 4; with fifth bits, GGUF's Q5_0 / Q5_1: gguf_blocks.py
InterleavedQ5) against 16-bit activations (int16 codes, linear order),
which calibration gives the linears whose 8-bit rounding costs too much (deploycc/calibrate.py). The 8-bit kernels
of the same layout are in c_intrin.py (dcc_x16_rows).

AVX2: per block and half (8 outputs), each quad's 8 outputs x 4 codes are widened to int16 in two registers (outputs
0-3 and 4-7) and multiplied with the quad's 4 activations broadcast (`vpmaddwd`), the 8 quads summed in int32
(|sum| <= 8 * 2 * 15 * 32767 < 2^31); one `vphaddd` and a lane permutation then put output l's sum in lane l, so the
scales apply as vectors and no horizontal sum is left. Plain C elsewhere.
"""

X16_16BIT = r"""
static inline __attribute__((always_inline)) void dcc_x16_rows16(
    float* out, int ldo, const uint32_t* q, const uint32_t* qh, const half* s, const half* m, float zero,
    const int16_t* const* xr, const float* const* dr, const float* const* sr, int nb, int R) {
#if defined(__AVX2__)
  __m256 acc[DCC_TILE][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i nib = _mm256_set1_epi8(15), order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  for (int b = 0; b < nb; ++b) {
    const uint32_t* pb = q + 64 * b;
    for (int h = 0; h < 2; ++h) {
      __m256i lo[DCC_TILE], hi[DCC_TILE];  /* int32 pair sums of outputs 8h..8h+3 and 8h+4..8h+7 */
      for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        const __m256i p = _mm256_loadu_si256((const __m256i*)(pb + 16 * (j & 3) + 8 * h));
        __m256i c = _mm256_and_si256(j < 4 ? p : _mm256_srli_epi16(p, 4), nib);
        if (qh)
          c = _mm256_or_si256(c, dcc_bits16(dcc_x16_fifth((const uint8_t*)(qh + 16 * b) + 16 * (j & 3) + 8 * h),
                                            j < 4 ? 0x08040201 : (int)0x80402010));
        const __m256i c0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(c));
        const __m256i c1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(c, 1));
        for (int r = 0; r < R; ++r) {
          int64_t x4;
          __builtin_memcpy(&x4, xr[r] + 32 * b + 4 * j, 8);
          const __m256i xb = _mm256_set1_epi64x(x4);
          lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(c0, xb));
          hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(c1, xb));
        }
      }
      const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + 16 * b + 8 * h)));
      const __m256 cv = m ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(m + 16 * b + 8 * h)))
                          : _mm256_mul_ps(dv, _mm256_set1_ps(-zero));
      for (int r = 0; r < R; ++r) {
        const __m256i sums = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(lo[r], hi[r]), order);
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(dv, _mm256_set1_ps(dr[r][b])), acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(cv, _mm256_set1_ps(sr[r][b]), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(out + (int64_t)r * ldo, acc[r][0]);
    _mm256_storeu_ps(out + (int64_t)r * ldo + 8, acc[r][1]);
  }
#else
  for (int r = 0; r < R; ++r) {
    for (int l = 0; l < 16; ++l) {
      float a = 0.0f;
      for (int b = 0; b < nb; ++b) {
        const uint32_t* pb = q + 64 * b;
        int32_t dot = 0;
        for (int k = 0; k < 32; ++k)
          dot += (int32_t)dcc_x16_code(pb, qh ? (const uint8_t*)(qh + 16 * b) : 0, l, k) * xr[r][32 * b + k];
        const float sc = (float)s[16 * b + l];
        a += sc * dr[r][b] * (float)dot + (m ? (float)m[16 * b + l] : -zero * sc) * sr[r][b];
      }
      out[(int64_t)r * ldo + l] = a;
    }
  }
#endif
}

static inline void dcc_dot_x16_16(float* acc, const uint32_t* q, const uint32_t* qh, const half* s, const half* m,
                                  float zero, const int16_t* xq, const float* xd, const float* xsd, int g, int nb) {
  const int16_t* xr[1] = {xq};
  const float* dr[1] = {xd};
  const float* sr[1] = {xsd};
  const int64_t at = (int64_t)g * nb;
  dcc_x16_rows16(acc, 16, q + at * 64, qh ? qh + at * 16 : 0, s + at * 16, m ? m + at * 16 : 0, zero, xr, dr, sr, nb,
                 1);
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
  dcc_x16_rows16(acc, 16, q + at * 64, qh ? qh + at * 16 : 0, s + at * 16, m ? m + at * 16 : 0, zero, xr, dr, sr, nb, R)
  DCC_TILE_RESIDUE(DCC_X16_ROWS)
#undef DCC_X16_ROWS
}

/* entry points, as the 8-bit ones (c_intrin.py DCC_X16_FORMATS) */
DCC_X16_FORMATS(16, int16_t, dcc_dot_x16_16)
"""
