"""The cpu target's kernels for 8-bit weights interleaved in 16s (quantization/group.py InterleavedScheme with bits=8:
per block of 32 columns, word 16 j + l holds output l's 4 signed values of columns 4 j .. 4 j + 3, j < 8; GGUF
Q8_0's bytes and our q8f16_0, rearranged), one output per SIMD lane as in c_x16.py, 8- and 16-bit activations.

8-bit activations, AVX2 (and the AVX-512 builds, which compile the same code): per quad, llama.cpp's sign trick,
`vpmaddubsw(|w|, sign(x, w))` (|pair| <= 2 * 128 * 127 < 2^15), then `vpmaddwd` by ones into int32; |w| is taken
once per block for every activation row of a tile. 16-bit activations, AVX2: each quad's bytes sign-extended in
place to int16 (bytes 0 and 2 of a word by a shift pair, bytes 1 and 3 by one arithmetic shift) and multiplied with
the matching activation pairs (x0, x2) and (x1, x3) broadcast (`vpmaddwd`; |block sum| <= 32 * 128 * 32767 < 2^31),
the activations put in that order once per block and row (c_x16.py dcc_x16_pairs16, dcc_x16_dot16). Output l's sum
lands in lane l, so there is no horizontal sum and no permutation. Plain C elsewhere. Entry points as c_x16.py's
(DCC_X16_ENTRIES)."""

X16_Q8 = r"""
/* output l's value k of block b: a signed byte */
#define DCC_X16Q8_AT(q, b, l, k) (((const int8_t*)((q) + 128 * (b)))[4 * (16 * ((k) >> 2) + (l)) + ((k) & 3)])
#define DCC_X16Q8_PLAIN                                                                                            \
  for (int r = 0; r < R; ++r) {                                                                                    \
    for (int l = 0; l < 16; ++l) {                                                                                 \
      float a = 0.0f;                                                                                              \
      for (int b = 0; b < nb; ++b) {                                                                               \
        int32_t dot = 0;                                                                                           \
        for (int k = 0; k < 32; ++k) dot += (int32_t)DCC_X16Q8_AT(q, b, l, k) * xr[r][32 * b + k];                \
        a += (float)s[16 * b + l] * dr[r][b] * (float)dot;                                                         \
      }                                                                                                            \
      out[(int64_t)r * ldo + l] = a;                                                                               \
    }                                                                                                              \
  }

#if defined(__AVX2__)
/* dcc_x16q8_rows's AVX2 pass over the blocks for outputs 8 h0 .. 8 h1 - 1 (DCC_X16_HALVES) */
static inline __attribute__((always_inline)) void dcc_x16q8_rows_h(
    float* out, int ldo, const uint32_t* q, const half* s, const int8_t* const* xr, const float* const* dr, int nb,
    int R, int h0, int h1) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[DCC_TILE][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const uint32_t* pb = q + 128 * b;
    for (int h = h0; h < h1; ++h) {
      __m256i a[DCC_TILE];
      for (int j = 0; j < 8; ++j) {
        const __m256i w = _mm256_loadu_si256((const __m256i*)(pb + 16 * j + 8 * h));
        const __m256i aw = _mm256_sign_epi8(w, w);  /* |w|, read as unsigned (-128 -> 128) */
        for (int r = 0; r < R; ++r) {
          const __m256i x = _mm256_set1_epi32(((const int32_t*)(xr[r] + 32 * b))[j]);
          const __m256i d = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), ones);
          a[r] = j ? _mm256_add_epi32(a[r], d) : d;
          DCC_KEEP(a[r]);
        }
      }
      const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + 16 * b + 8 * h)));
      for (int r = 0; r < R; ++r)
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[r]), _mm256_mul_ps(dv, _mm256_set1_ps(dr[r][b])), acc[r][h]);
    }
  }
  dcc_x16_store(out, ldo, acc, R, h0, h1);
}
#endif
static inline __attribute__((always_inline)) void dcc_x16q8_rows(float* out, int ldo, const uint32_t* q,
                                                                 const half* s, const int8_t* const* xr,
                                                                 const float* const* dr, int nb, int R) {
#if defined(__AVX2__)
  DCC_X16_HALVES(dcc_x16q8_rows_h, out, ldo, q, s, xr, dr, nb, R);
#else
  DCC_X16Q8_PLAIN
#endif
}

static inline __attribute__((always_inline)) void dcc_x16q8_rows16(float* out, int ldo, const uint32_t* q,
                                                                   const half* s, const int16_t* const* xr,
                                                                   const float* const* dr, int nb, int R) {
#if defined(__AVX2__)
  __m256 acc[DCC_TILE][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const uint32_t* pb = q + 128 * b;
    int32_t xp[DCC_TILE][16];  /* row r's activation pairs (c_x16.py dcc_x16_pairs16, dcc_x16_dot16) */
    for (int r = 0; r < R; ++r) dcc_x16_pairs16(xr[r] + 32 * b, xp[r]);
    for (int h = 0; h < 2; ++h) {
      __m256i a[DCC_TILE];
      for (int r = 0; r < R; ++r) a[r] = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {  /* quad j's bytes 0 and 2 (e) and 1 and 3 (o) of each output, as int16 */
        const __m256i w = _mm256_loadu_si256((const __m256i*)(pb + 16 * j + 8 * h));
        const __m256i e = _mm256_srai_epi16(_mm256_slli_epi16(w, 8), 8), o = _mm256_srai_epi16(w, 8);
        for (int r = 0; r < R; ++r) {
          a[r] = _mm256_add_epi32(a[r], dcc_x16_dot16(e, o, xp[r] + 2 * j));
          DCC_KEEP(a[r]);
        }
      }
      const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + 16 * b + 8 * h)));
      for (int r = 0; r < R; ++r)
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[r]), _mm256_mul_ps(dv, _mm256_set1_ps(dr[r][b])), acc[r][h]);
    }
  }
  dcc_x16_store(out, ldo, acc, R, 0, 2);
#else
  DCC_X16Q8_PLAIN
#endif
}

/* IMPL and IMPL_tile of DCC_X16_ENTRIES (c_x16.py) for either activation width: no fifth bits, no minimum, no zero
   point (signed values), no code sums */
#define DCC_X16Q8_IMPL(NAME, XT, TILE_ROWS)                                                                         \
  static inline void NAME(float* acc, const uint32_t* q, const uint32_t* qh, const half* s, const half* m,         \
                          float zero, const XT* xq, const float* xd, const float* xsd, int g, int nb) {            \
    const XT* xr[1] = {xq};                                                                                         \
    const float* dr[1] = {xd};                                                                                      \
    const int64_t at = (int64_t)g * nb;                                                                             \
    (void)qh, (void)m, (void)zero, (void)xsd;                                                                       \
    DCC_X16Q8_ROWS_##XT(1);                                                                                         \
  }                                                                                                                 \
  static inline void NAME##_tile(float* acc, const uint32_t* q, const uint32_t* qh, const half* s, const half* m,  \
                                 float zero, const XT* xq, const float* xd, const float* xsd, int g, int nb,       \
                                 int t0, int rows) {                                                                \
    const XT* xr[DCC_TILE];                                                                                         \
    const float* dr[DCC_TILE];                                                                                      \
    const float* sr[DCC_TILE];                                                                                      \
    TILE_ROWS(xq, xd, xsd, nb, t0, rows, xr, dr, sr);                                                               \
    const int64_t at = (int64_t)g * nb;                                                                             \
    (void)qh, (void)m, (void)zero;                                                                                  \
    DCC_TILE_RESIDUE(DCC_X16Q8_ROWS_##XT)                                                                           \
  }
#define DCC_X16Q8_ROWS_int8_t(R) dcc_x16q8_rows(acc, 16, q + at * 128, s + at * 16, xr, dr, nb, R)
#define DCC_X16Q8_ROWS_int16_t(R) dcc_x16q8_rows16(acc, 16, q + at * 128, s + at * 16, xr, dr, nb, R)
DCC_X16Q8_IMPL(dcc_dot_x16q8, int8_t, dcc_tile_rows)
DCC_X16Q8_IMPL(dcc_dot_x16q8_16, int16_t, dcc_tile_rows16)
DCC_X16_ENTRIES(q8_sym, 8, int8_t, dcc_dot_x16q8, DCC_NONE, 0, DCC_NONE, 0, 0.0f)
DCC_X16_ENTRIES(q8_sym, 16, int16_t, dcc_dot_x16q8_16, DCC_NONE, 0, DCC_NONE, 0, 0.0f)
"""
