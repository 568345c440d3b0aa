/* The x86 kernels of `_qgemm` (see _qgemm.c for the layout and the contract): AVX2, AVX-512BW and
   AVX-512 VNNI, each computing the same integers as the portable loop; chosen by cpuid in
   _qgemm.c. Compiled to nothing on other CPUs. */
#include "_qgemm.h"

#ifdef QG_X86
/* The same chunk of the next 4-row block (NR·KC = 128 bytes: two lines), one block ahead, into L2:
   the block's transfer from memory overlaps this block's products. Without it they did not overlap
   (a few tokens over a matrix larger than the caches cost the memory time plus the compute time:
   8 tokens over 8192 x 2048, 1.18 ms against 0.73 with it, AMD EPYC Zen 4, 2 threads); into L1
   (T0) it evicted the block in use and gained a third of that (older AMD cores treat T1 as T0).
   A prefetch never faults, so the last block's, past the end of the weights, is harmless; its
   address is made as an integer (a pointer past one-past-the-end would be undefined in C). The
   AVX2 prefill prefetches while widening, a whole token block ahead: with an L2 under the token
   block's 384 KB the lines may be gone by then (a wasted prefetch, no more). */
#define PREFETCH_NEXT_BLOCK(j, w)                                                                         \
    do {                                                                                                  \
        const uintptr_t next_ = (uintptr_t)(w) + (uintptr_t)(NR * (j)->kp);                               \
        _mm_prefetch((const char *)next_, _MM_HINT_T1);                                                   \
        _mm_prefetch((const char *)(next_ + 64), _MM_HINT_T1);                                            \
    } while (0)
__attribute__((target("avx2,fma")))
static inline int64_t hsum256(__m256i v) {
    __m256i s = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(v)),
                                 _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1)));
    __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return _mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1);
}

/* MR tokens x NR rows over the whole of k: each chunk's weights are widened once for MR tokens */
#define TILE_AVX2(MR)                                                                                     \
__attribute__((target("avx2,fma")))                                                                       \
static inline void tile_avx2_##MR(const job_t *j, const int8_t *b, int64_t t, int64_t n, int nr) {       \
    __m256i acc[MR][NR];                                                                                  \
    for (int m = 0; m < MR; m++) for (int r = 0; r < NR; r++) acc[m][r] = _mm256_setzero_si256();         \
    const int16_t *x0 = j->xq + t * j->kp;                                                                \
    for (int64_t c = 0; c < j->kp; c += KC) {                                                             \
        const int8_t *w = b + c * NR;                                                                     \
        if (MR > 1) PREFETCH_NEXT_BLOCK(j, w);  /* a lone token's row: the hardware streams it */        \
        for (int h = 0; h < KC; h += 16) {                                                                \
            __m256i v[NR];                                                                                \
            for (int r = 0; r < NR; r++)                                                                  \
                v[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + r * KC + h)));          \
            for (int m = 0; m < MR; m++) {                                                                \
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x0 + m * j->kp + c + h));               \
                for (int r = 0; r < NR; r++) acc[m][r] = _mm256_add_epi32(acc[m][r], _mm256_madd_epi16(v[r], xv)); \
            }                                                                                             \
        }                                                                                                 \
    }                                                                                                     \
    for (int m = 0; m < MR; m++) {                                                                        \
        int64_t s[NR] = {0};                                                                               \
        for (int r = 0; r < NR; r++) s[r] = hsum256(acc[m][r]);                                           \
        store_tile(j, t + m, n, nr, s);                                                                   \
    }                                                                                                     \
}
TILE_AVX2(1)
TILE_AVX2(2)

/* Prefill on AVX2: a block's 4 rows are widened to int16 once per token block (wb: [kp/16][NR][16]),
   so the 2-token tiles issue only loads, vpmaddwd and vpaddd; each widened chunk is loaded once
   into a register for both tokens, and the accumulation is said in asm (through the intrinsics
   GCC folded each weight load into both products, and moved or spilled accumulators). */
static inline __attribute__((always_inline, target("avx2")))
__m256i addd_inplace(__m256i acc, __m256i p) {
    __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(p));
    return acc;
}
static inline __attribute__((always_inline, target("avx2")))
__m256i in_register(__m256i v) {
    __asm__("" : "+x"(v));
    return v;
}
__attribute__((target("avx2,fma")))
static inline void widen_block(const job_t *j, const int8_t *b, int16_t *wb) {
    for (int64_t c = 0; c < j->kp; c += KC) {
        PREFETCH_NEXT_BLOCK(j, b + c * NR);  /* arrives while this block's token pairs run */
        for (int h = 0; h < KC; h += 16)
            for (int r = 0; r < NR; r++)
                _mm256_storeu_si256((__m256i *)(wb + ((c + h) / 16 * NR + r) * 16),
                                   _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + c * NR + r * KC + h))));
    }
}
#define KPANEL 2048  /* k per pass: a block's int16 panel (16 KB) and a token pair's (8 KB) stay in L1 */
__attribute__((target("avx2,fma")))
static inline void tile_avx2w_2(const job_t *j, const int16_t *wb, int64_t t, int64_t k0, int64_t k1,
                                int64_t s[2][NR]) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    const int16_t *x0 = j->xq + t * j->kp, *x1 = x0 + j->kp;
    wb += k0 / 16 * NR * 16;
    for (int64_t i = k0; i < k1; i += 16, wb += NR * 16) {
        const __m256i x = in_register(_mm256_loadu_si256((const __m256i *)(x0 + i)));
        const __m256i y = in_register(_mm256_loadu_si256((const __m256i *)(x1 + i)));
        __m256i v0 = in_register(_mm256_loadu_si256((const __m256i *)wb));
        __m256i v1 = in_register(_mm256_loadu_si256((const __m256i *)(wb + 16)));
        __m256i v2 = in_register(_mm256_loadu_si256((const __m256i *)(wb + 32)));
        __m256i v3 = in_register(_mm256_loadu_si256((const __m256i *)(wb + 48)));
        a0 = addd_inplace(a0, _mm256_madd_epi16(v0, x)); b0 = addd_inplace(b0, _mm256_madd_epi16(v0, y));
        a1 = addd_inplace(a1, _mm256_madd_epi16(v1, x)); b1 = addd_inplace(b1, _mm256_madd_epi16(v1, y));
        a2 = addd_inplace(a2, _mm256_madd_epi16(v2, x)); b2 = addd_inplace(b2, _mm256_madd_epi16(v2, y));
        a3 = addd_inplace(a3, _mm256_madd_epi16(v3, x)); b3 = addd_inplace(b3, _mm256_madd_epi16(v3, y));
    }
    s[0][0] += hsum256(a0); s[0][1] += hsum256(a1); s[0][2] += hsum256(a2); s[0][3] += hsum256(a3);
    s[1][0] += hsum256(b0); s[1][1] += hsum256(b1); s[1][2] += hsum256(b2); s[1][3] += hsum256(b3);
}

__attribute__((target("avx2,fma")))
QG_INTERNAL void qg_rows_avx2(const job_t *j, int64_t n0, int64_t n1) {
    const int64_t TB = token_block(j);
    /* for prefills: a block's rows as int16, and the token block's sums over the k panels (exact:
       integers, so the same bits as one pass) */
    int16_t *wb = NULL;
    int64_t (*acc)[NR] = NULL;
    if (j->t >= 8) {
        wb = (int16_t *)malloc((size_t)(NR * j->kp) * sizeof(int16_t));  /* (loads are unaligned: aligned_alloc is not everywhere) */
        acc = (int64_t (*)[NR])malloc((size_t)TB * sizeof *acc);
        if (!wb || !acc) { free(wb); free(acc); wb = NULL; acc = NULL; }  /* the plain tiles serve */
    }
    for (int64_t tb = 0; tb < j->t; tb += TB) {
        const int64_t te = tb + TB < j->t ? tb + TB : j->t;
        for (int64_t n = n0; n < n1; n += NR) {
            const int8_t *b = block_of(j, n);
            const int nr = n + NR <= j->n ? NR : (int)(j->n - n);
            int64_t t = tb;
            if (wb && te - tb >= 4) {
                const int64_t pairs_end = tb + (te - tb) / 2 * 2;
                widen_block(j, b, wb);
                memset(acc, 0, (size_t)(pairs_end - tb) * sizeof *acc);
                for (int64_t k0 = 0; k0 < j->kp; k0 += KPANEL) {
                    const int64_t k1 = k0 + KPANEL < j->kp ? k0 + KPANEL : j->kp;
                    for (int64_t u = tb; u < pairs_end; u += 2) tile_avx2w_2(j, wb, u, k0, k1, acc + (u - tb));
                }
                for (; t < pairs_end; t++) store_tile(j, t, n, nr, acc[t - tb]);
            }
            for (; t + 2 <= te; t += 2) tile_avx2_2(j, b, t, n, nr);
            for (; t < te; t++) tile_avx2_1(j, b, t, n, nr);
        }
    }
    free(wb);
    free(acc);
}

/* Explicit accumulators: with arrays GCC shuffles VNNI's destructive accumulators between
   registers (two moves per vpdpwssd, measured as half the throughput) */
#define HSUM512(v) _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(v)), \
                                                             _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v, 1))))
#define W512(r) _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w + (r) * KC)))
#define X512(m) _mm512_loadu_si512((const void *)(x0 + (m) * j->kp + c))
#define TILE_512(NAME, TARGET, MADD)                                                                      \
__attribute__((target(TARGET)))                                                                           \
static inline void NAME##_4(const job_t *j, const int8_t *b, int64_t t, int64_t n, int nr) {             \
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;   \
    __m512i c0 = a0, c1 = a0, c2 = a0, c3 = a0, d0 = a0, d1 = a0, d2 = a0, d3 = a0;                       \
    const int16_t *x0 = j->xq + t * j->kp;                                                                \
    for (int64_t c = 0; c < j->kp; c += KC) {                                                             \
        const int8_t *w = b + c * NR;                                                                     \
        PREFETCH_NEXT_BLOCK(j, w);                                                                        \
        __m512i v0 = W512(0), v1 = W512(1), v2 = W512(2), v3 = W512(3), xv;                               \
        xv = X512(0); a0 = MADD(a0, v0, xv); a1 = MADD(a1, v1, xv); a2 = MADD(a2, v2, xv); a3 = MADD(a3, v3, xv); \
        xv = X512(1); b0 = MADD(b0, v0, xv); b1 = MADD(b1, v1, xv); b2 = MADD(b2, v2, xv); b3 = MADD(b3, v3, xv); \
        xv = X512(2); c0 = MADD(c0, v0, xv); c1 = MADD(c1, v1, xv); c2 = MADD(c2, v2, xv); c3 = MADD(c3, v3, xv); \
        xv = X512(3); d0 = MADD(d0, v0, xv); d1 = MADD(d1, v1, xv); d2 = MADD(d2, v2, xv); d3 = MADD(d3, v3, xv); \
    }                                                                                                     \
    int64_t s0[NR] = {HSUM512(a0), HSUM512(a1), HSUM512(a2), \
                      HSUM512(a3)};                                                       \
    int64_t s1[NR] = {HSUM512(b0), HSUM512(b1), HSUM512(b2), \
                      HSUM512(b3)};                                                       \
    int64_t s2[NR] = {HSUM512(c0), HSUM512(c1), HSUM512(c2), \
                      HSUM512(c3)};                                                       \
    int64_t s3[NR] = {HSUM512(d0), HSUM512(d1), HSUM512(d2), \
                      HSUM512(d3)};                                                       \
    store_tile(j, t, n, nr, s0); store_tile(j, t + 1, n, nr, s1);                                         \
    store_tile(j, t + 2, n, nr, s2); store_tile(j, t + 3, n, nr, s3);                                     \
}                                                                                                         \
__attribute__((target(TARGET)))                                                                           \
static inline void NAME##_1(const job_t *j, const int8_t *b, int64_t t, int64_t n, int nr) {             \
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;                                       \
    const int16_t *x0 = j->xq + t * j->kp;                                                                \
    for (int64_t c = 0; c < j->kp; c += KC) {                                                             \
        const int8_t *w = b + c * NR;                                                                     \
        __m512i xv = X512(0);                                                                             \
        a0 = MADD(a0, W512(0), xv); a1 = MADD(a1, W512(1), xv); a2 = MADD(a2, W512(2), xv); a3 = MADD(a3, W512(3), xv); \
    }                                                                                                     \
    int64_t s0[NR] = {HSUM512(a0), HSUM512(a1), HSUM512(a2), \
                      HSUM512(a3)};                                                       \
    store_tile(j, t, n, nr, s0);                                                                          \
}

#define ROWS_512(NAME, TARGET, MADD)                                                                      \
TILE_512(NAME, TARGET, MADD)                                                                              \
__attribute__((target(TARGET)))                                                                           \
QG_INTERNAL void NAME(const job_t *j, int64_t n0, int64_t n1) {                                                \
    const int64_t TB = token_block(j);                                                                    \
    for (int64_t tb = 0; tb < j->t; tb += TB) {                                                           \
        const int64_t te = tb + TB < j->t ? tb + TB : j->t;                                               \
        for (int64_t n = n0; n < n1; n += NR) {                                                           \
            const int8_t *b = block_of(j, n);                                                             \
            const int nr = n + NR <= j->n ? NR : (int)(j->n - n);                                         \
            int64_t t = tb;                                                                               \
            for (; t + 4 <= te; t += 4) NAME##_4(j, b, t, n, nr);                                         \
            /* (the 1-token tiles do not prefetch: a lone decode row is streamed by the hardware, and  \
               with 2 or 3 tokens the prefetches cost more than they gave, measured) */             \
            for (; t < te; t++) NAME##_1(j, b, t, n, nr);                                                 \
        }                                                                                                 \
    }                                                                                                     \
}

#define MADD_BW(acc, a, b) _mm512_add_epi32(acc, _mm512_madd_epi16(a, b))
/* VNNI accumulates in place; through the intrinsic GCC copies each accumulator around it (two
   moves per vpdpwssd and a spill: a fifth of the instruction's rate), so it is said in asm */
static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vnni")))
__m512i dpwssd_inplace(__m512i acc, __m512i a, __m512i b) {
    __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}
#define MADD_VNNI(acc, a, b) dpwssd_inplace(acc, a, b)
ROWS_512(qg_rows_avx512, "avx512f,avx512bw", MADD_BW)
ROWS_512(qg_rows_avx512vnni, "avx512f,avx512bw,avx512vnni", MADD_VNNI)

/* 8-bit activations on VNNI: vpdpbusd multiplies unsigned bytes by signed ones, 4 products per
   lane (twice vpdpwssd's 2), so x is stored as x + 128 and each row's sum(w) · 128 is taken back
   off: sum((x + 128) · w) - 128 · sum(w) = sum(x · w), exactly (a lane's sum stays far inside
   int32). One zmm of the packed layout is two rows' 32-k chunks; x's 32 bytes are broadcast to
   both halves; a tile is 8 tokens x 4 rows (16 accumulators). */
static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vnni")))
__m512i dpbusd_inplace(__m512i acc, __m512i u, __m512i w) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(w));
    return acc;
}
__attribute__((target("avx512f,avx512bw,avx512vnni")))
static inline void a8_store(const job_t *j, int64_t t, int64_t n, int nr, __m512i r01, __m512i r23) {
    int64_t acc[NR] = {hsum256(_mm512_castsi512_si256(r01)), hsum256(_mm512_extracti64x4_epi64(r01, 1)),
                       hsum256(_mm512_castsi512_si256(r23)), hsum256(_mm512_extracti64x4_epi64(r23, 1))};
    for (int r = 0; r < nr; r++) acc[r] -= 128 * (int64_t)j->wsum[n + r];
    store_tile(j, t, n, nr, acc);
}
#define XB(m) _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x0 + (m) * j->kp + c)))
#define A8_STEP(m) xv = XB(m); p##m = dpbusd_inplace(p##m, xv, w01); q##m = dpbusd_inplace(q##m, xv, w23);
__attribute__((target("avx512f,avx512bw,avx512vnni")))
static inline void a8_tile_8(const job_t *j, const int8_t *b, int64_t t, int64_t n, int nr) {
    __m512i p0 = _mm512_setzero_si512(), p1 = p0, p2 = p0, p3 = p0, p4 = p0, p5 = p0, p6 = p0, p7 = p0;
    __m512i q0 = p0, q1 = p0, q2 = p0, q3 = p0, q4 = p0, q5 = p0, q6 = p0, q7 = p0;
    const uint8_t *x0 = j->xu + t * j->kp;
    for (int64_t c = 0; c < j->kp; c += KC) {
        const int8_t *w = b + c * NR;
        PREFETCH_NEXT_BLOCK(j, w);
        __m512i w01 = _mm512_loadu_si512((const void *)w), w23 = _mm512_loadu_si512((const void *)(w + 2 * KC)), xv;
        A8_STEP(0) A8_STEP(1) A8_STEP(2) A8_STEP(3) A8_STEP(4) A8_STEP(5) A8_STEP(6) A8_STEP(7)
    }
    a8_store(j, t, n, nr, p0, q0); a8_store(j, t + 1, n, nr, p1, q1);
    a8_store(j, t + 2, n, nr, p2, q2); a8_store(j, t + 3, n, nr, p3, q3);
    a8_store(j, t + 4, n, nr, p4, q4); a8_store(j, t + 5, n, nr, p5, q5);
    a8_store(j, t + 6, n, nr, p6, q6); a8_store(j, t + 7, n, nr, p7, q7);
}
__attribute__((target("avx512f,avx512bw,avx512vnni")))
static inline void a8_tile_1(const job_t *j, const int8_t *b, int64_t t, int64_t n, int nr) {
    __m512i p0 = _mm512_setzero_si512(), q0 = p0, xv;
    const uint8_t *x0 = j->xu + t * j->kp;
    for (int64_t c = 0; c < j->kp; c += KC) {
        const int8_t *w = b + c * NR;
        __m512i w01 = _mm512_loadu_si512((const void *)w), w23 = _mm512_loadu_si512((const void *)(w + 2 * KC));
        A8_STEP(0)
    }
    a8_store(j, t, n, nr, p0, q0);
}
__attribute__((target("avx512f,avx512bw,avx512vnni")))
QG_INTERNAL void qg_rows_vnni_a8(const job_t *j, int64_t n0, int64_t n1) {
    int64_t TB = TB_BYTES / j->kp / 8 * 8;  /* bytes per token row here */
    if (TB < 8) TB = 8;
    for (int64_t tb = 0; tb < j->t; tb += TB) {
        const int64_t te = tb + TB < j->t ? tb + TB : j->t;
        for (int64_t n = n0; n < n1; n += NR) {
            const int8_t *b = block_of(j, n);
            const int nr = n + NR <= j->n ? NR : (int)(j->n - n);
            int64_t t = tb;
            for (; t + 8 <= te; t += 8) a8_tile_8(j, b, t, n, nr);
            for (; t < te; t++) a8_tile_1(j, b, t, n, nr);
        }
    }
}

__attribute__((target("avx2,fma")))
QG_INTERNAL void qg_quantize_row_avx2(const float *xr, int64_t k, int64_t kp, float qmax, int16_t *q, float *xs) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), zero = _mm256_setzero_ps();
    __m256 mx = zero, poison = zero;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 v = _mm256_loadu_ps(xr + i);
        mx = _mm256_max_ps(mx, _mm256_and_ps(v, absmask));
        poison = _mm256_add_ps(poison, _mm256_mul_ps(v, zero));
    }
    float lanes[8], plane[8], m = 0.0f, p = 0.0f;
    _mm256_storeu_ps(lanes, mx);
    _mm256_storeu_ps(plane, poison);
    for (int l = 0; l < 8; l++) { m = lanes[l] > m ? lanes[l] : m; p += plane[l]; }
    for (int64_t r = i; r < k; r++) { float a = fabsf(xr[r]); m = a > m ? a : m; p += xr[r] * 0.0f; }
    float scale = m / qmax > 1e-30f ? m / qmax : 1.0f, inv = m / qmax > 1e-30f ? 1.0f / scale : 0.0f;
    if (p != 0.0f || p != p) { scale = NAN; inv = 0.0f; }
    const __m256 vinv = _mm256_set1_ps(inv);
    i = 0;
    for (; i + 16 <= k; i += 16) {  /* round half to even (MXCSR), as lrintf */
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xr + i), vinv));
        __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xr + i + 8), vinv));
        __m256i ab = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8);
        _mm256_storeu_si256((__m256i *)(q + i), ab);
    }
    for (; i < k; i++) q[i] = (int16_t)lrintf(xr[i] * inv);
    for (; i < kp; i++) q[i] = 0;
    *xs = scale;
}
#endif
