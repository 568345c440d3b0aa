/* The slice engine's own int8 matrix product: y[T, N] = (x[T, K] · W[N, K]ᵀ) · s[N] + b[N].

W: int8 per output row with float32 scales s, in a blocked layout (pack(): [n/NR][kp/KC][NR][KC],
one contiguous stream per 4 rows, zero padded). That layout is what the weight cache stores and
what runs: no prepack, so a cached load is a file mapping. x: float32, quantized here per row
(token) to int16 with the largest magnitude that cannot overflow an int32 lane (K/8 products per
lane: 32767 for K ≤ 4120, fewer steps beyond; a row's lanes are summed in int64), so activations
keep 13–15 bits, finer than fbgemm's 8, and need no residual pass. The price: int16 products run
at half the rate of int8 ones (vpmaddwd / vpdpwssd against vpmaddubsw / vpdpbusd), which long
prefills feel; decode is bound by reading the weights and gains from the single packed stream.
So a caller may ask for 8-bit activations (per token, ±127 steps) for a long prefill's less
sensitive matrices: on VNNI they run through vpdpbusd over the same packed weights (rows_vnni_a8),
elsewhere through the 16-bit kernels with the same integers (the same results, no faster).

Kernels: AVX-512BW (+VNNI's vpdpwssd when present) and AVX2, chosen at run time by cpuid, and a
portable C loop written for the compiler to vectorize (what ARM runs; GCC / clang; another compiler
builds the C loop only). Threads: OpenMP, sharing
torch's runtime (see run()). Every entry point releases the GIL.

Python API (all pointers are addresses, e.g. tensor.data_ptr()):
    gemm(w, s, n, k, x, t, y, bias, threads[, wsum])   bias 0 = none; w packed by pack();
                                                       wsum = row_sums(w): 8-bit activations
    pack(q, n, k, out), packed_size(n, k), row_sums(w, n, k, out)
    gemm_c_v1: a capsule of the C function behind gemm (qgemm_gemm_fn), for other extensions
    isa() -> "avx512vnni" | "avx512" | "avx2" | "c"
    set_isa(name)                              for tests and the bench: force a slower path
*/
/* Every path rounds as the portable loop does: no fused multiply-adds made from v * s + b */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QG_X86 1
#include <immintrin.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

#define NR 4      /* output rows per micro tile */
#define KC 32     /* k per chunk of a packed block */
#define TB_BYTES (384 * 1024)  /* a token block's int16 rows stay in L2 while all of W streams by once */

typedef struct {
    const int8_t *w;    /* packed: [n/NR blocks][kp/KC chunks][NR rows][KC] (see pack()) */
    const float *s;
    const float *bias;
    int64_t n, k, kp;   /* kp: k rounded up to KC (zeros beyond k, in W and in xq) */
    const int16_t *xq;  /* [t, kp] */
    const float *xs;    /* [t] */
    int64_t t;
    float *y;
    const uint8_t *xu;  /* 8-bit mode on VNNI: xq + 128 as bytes, [t, kp] */
    const int32_t *wsum; /* 8-bit mode on VNNI: each row's sum of weights (row_sums()) */
} job_t;

typedef void (*range_fn)(const job_t *, int64_t n0, int64_t n1);

static inline const int8_t *block_of(const job_t *j, int64_t n) { return j->w + (n / NR) * NR * j->kp; }

/* acc: a row's whole sum, reduced from the lanes in int64 (each lane fits int32 by the activations'
   range; their total may not: K · 127 · qmax reaches 2^34 for K = 14336) */
static inline void store_tile(const job_t *j, int64_t t, int64_t n, int nr, const int64_t *acc) {
    for (int r = 0; r < nr; r++) {
        float v = (float)acc[r] * j->s[n + r] * j->xs[t];
        j->y[t * j->n + n + r] = j->bias ? v + j->bias[n + r] : v;
    }
}

static inline int64_t token_block(const job_t *j) {  /* a multiple of 4 tokens (the tiles), at least 4 */
    int64_t tb = TB_BYTES / (2 * j->kp) / 4 * 4;
    return tb < 4 ? 4 : tb;
}

/* ---- portable C ---- */
/* MR tokens by a block's NR rows: a chunk's 32 products fit int32 (|x| ≤ 32767, |w| ≤ 127), so each
   is a plain int32 dot product that the compiler vectorizes (SSE2's pmaddwd, NEON's smull/smlal),
   and each weight chunk, loaded once, serves MR tokens */
#define TILE_C(MR)                                                                                        \
static inline void tile_c_##MR(const job_t *j, const int8_t *b, int64_t t, int64_t n, int nr) {          \
    int64_t acc[MR][NR] = {{0}};                                                                          \
    const int16_t *x = j->xq + t * j->kp;                                                                 \
    for (int64_t c = 0; c < j->kp; c += KC)                                                               \
        for (int r = 0; r < NR; r++) {                                                                    \
            const int8_t *w = b + c * NR + r * KC;                                                        \
            int32_t s[MR] = {0};                                                                          \
            for (int i = 0; i < KC; i++)                                                                  \
                for (int m = 0; m < MR; m++) s[m] += (int32_t)w[i] * x[m * j->kp + c + i];                \
            for (int m = 0; m < MR; m++) acc[m][r] += s[m];                                               \
        }                                                                                                 \
    for (int m = 0; m < MR; m++) store_tile(j, t + m, n, nr, acc[m]);                                     \
}
TILE_C(1)
TILE_C(4)

static void rows_c(const job_t *j, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n += NR) {
        const int8_t *b = block_of(j, n);
        const int nr = n + NR <= j->n ? NR : (int)(j->n - n);
        int64_t t = 0;
        for (; t + 4 <= j->t; t += 4) tile_c_4(j, b, t, n, nr);
        for (; t < j->t; t++) tile_c_1(j, b, t, n, nr);
    }
}

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
static void rows_avx2(const job_t *j, int64_t n0, int64_t n1) {
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
static void NAME(const job_t *j, int64_t n0, int64_t n1) {                                                \
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
ROWS_512(rows_avx512, "avx512f,avx512bw", MADD_BW)
ROWS_512(rows_avx512vnni, "avx512f,avx512bw,avx512vnni", MADD_VNNI)

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
static void rows_vnni_a8(const job_t *j, int64_t n0, int64_t n1) {
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
#endif

/* ---- the path in use ---- */
static range_fn g_rows = rows_c;
static const char *g_isa = "c";

static void pick_isa(void) {
#ifdef QG_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni")) {
        g_rows = rows_avx512vnni; g_isa = "avx512vnni"; return;
    }
    if (__builtin_cpu_supports("avx512bw")) { g_rows = rows_avx512; g_isa = "avx512"; return; }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) { g_rows = rows_avx2; g_isa = "avx2"; return; }
#endif
    g_rows = rows_c; g_isa = "c";
}

/* ---- threads: OpenMP, so that the runtime is the one torch already loaded (its wheel ships
   libgomp.so.1, and a second library of that name is not loaded): one pool, no two sets of threads
   spinning against each other on a small machine ---- */
static void run(const job_t *j, range_fn rows, int threads) {
    int64_t blocks = (j->n + NR - 1) / NR;
    if (threads < 1) threads = 1;
    if (threads > blocks) threads = (int)blocks;
#ifdef _OPENMP
    if (threads > 1) {
#pragma omp parallel num_threads(threads)
        {
            int p = omp_get_thread_num(), parts = omp_get_num_threads();
            int64_t b0 = blocks * p / parts * NR, b1 = blocks * (p + 1) / parts * NR;
            if (b1 > j->n) b1 = j->n;
            if (b0 < b1) rows(j, b0, b1);
        }
        return;
    }
#endif
    rows(j, 0, j->n);
}

/* x rows → int16 with per-row scales; the largest step count whose K/8-product lane sums fit int32.
   A row holding a NaN or an infinity gets a NaN scale: its outputs are NaN, as a float product's
   would be (not finite garbage from converting NaN to an integer). */
static float qmax_for(int64_t k) {
    double lanes = (double)((k + 7) / 8 + 1);
    double qmax = floor(2147483647.0 / (127.0 * lanes));
    return (float)(qmax > 32767.0 ? 32767.0 : qmax);
}

static void quantize_row_c(const float *xr, int64_t k, int64_t kp, float qmax, int16_t *q, float *xs) {
    float m = 0.0f, poison = 0.0f;
    for (int64_t i = 0; i < k; i++) {
        float a = fabsf(xr[i]);
        m = a > m ? a : m;
        poison += xr[i] * 0.0f;  /* NaN when any element is NaN or infinite */
    }
    float scale = m / qmax > 1e-30f ? m / qmax : 1.0f, inv = m / qmax > 1e-30f ? 1.0f / scale : 0.0f;
    if (poison != 0.0f || m != m) { scale = NAN; inv = 0.0f; }  /* (a row below 1e-30 · qmax is zero) */
    for (int64_t i = 0; i < k; i++) q[i] = (int16_t)lrintf(xr[i] * inv);
    for (int64_t i = k; i < kp; i++) q[i] = 0;
    *xs = scale;
}

#ifdef QG_X86
__attribute__((target("avx2,fma")))
static void quantize_row_avx2(const float *xr, int64_t k, int64_t kp, float qmax, int16_t *q, float *xs) {
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

static void quantize(const float *x, int64_t t, int64_t k, int64_t kp, float qmax, int16_t *xq, float *xs,
                     int threads) {
    void (*row)(const float *, int64_t, int64_t, float, int16_t *, float *) = quantize_row_c;
#ifdef QG_X86
    if (g_rows != rows_c) row = quantize_row_avx2;  /* every SIMD path here has AVX2 */
#endif
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(t >= 8 ? threads : 1) schedule(static)
#endif
    for (int64_t r = 0; r < t; r++) row(x + r * k, k, kp, qmax, xq + r * kp, xs + r);
}

/* The entry points take integers only (addresses, sizes, counts): `want` of them into v[]. */
static int int_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *usage, int64_t *v) {
    if (nargs != want) {
        PyErr_SetString(PyExc_TypeError, usage);
        return 0;
    }
    for (Py_ssize_t i = 0; i < want; i++) {
        long long x = PyLong_AsLongLong(args[i]);
        if (x == -1 && PyErr_Occurred()) return 0;
        v[i] = (int64_t)x;
    }
    return 1;
}

/* gemm(w, s, n, k, x, t, y, bias, threads[, wsum]): with wsum (row_sums() of w; 0 = none),
   activations take 8 bits (per token, ±127 steps) instead of 13–15: on VNNI through vpdpbusd at
   twice the rate; elsewhere the same integers through the 16-bit kernels (identical results) */
/* The product itself, callable without the GIL (py_gemm, and other extensions through the
   `gemm_c_v1` capsule: the slice engine's fused decode step). 0, or -1 when a buffer cannot be had. */
static int qgemm_gemm(const int8_t *w, const float *s, int64_t n, int64_t k, const float *x, int64_t t, float *y,
                      const float *bias, int threads, const int32_t *wsum) {
    const int a8 = wsum != NULL;
    const int64_t kp = (k + KC - 1) / KC * KC;
    range_fn rows = g_rows;
#ifdef QG_X86
    if (a8 && g_rows == rows_avx512vnni) rows = rows_vnni_a8;
#endif
    int16_t *xq = (int16_t *)malloc((size_t)(t * kp) * sizeof(int16_t));  /* the kernels load unaligned */
    float *xs = (float *)malloc((size_t)t * sizeof(float));
    uint8_t *xu = rows != g_rows ? (uint8_t *)malloc((size_t)(t * kp)) : NULL;
    if (!xq || !xs || (rows != g_rows && !xu)) {
        free(xq); free(xs); free(xu);
        return -1;
    }
    job_t j = {w, s, bias, n, k, kp, xq, xs, t, y, xu, wsum};
    threads = threads < 1 ? 1 : threads > 1024 ? 1024 : threads;
    quantize(x, t, k, kp, a8 ? 127.0f : qmax_for(k), xq, xs, threads);
    if (xu)
        for (int64_t i = 0; i < t * kp; i++) xu[i] = (uint8_t)(xq[i] + 128);
    run(&j, rows, threads);
    free(xq);
    free(xs);
    free(xu);
    return 0;
}

static PyObject *py_gemm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int64_t v[10] = {0};
    if (!int_args(args, nargs, nargs == 10 ? 10 : 9, "gemm(w, s, n, k, x, t, y, bias, threads[, wsum])", v))
        return NULL;
    int64_t n = v[2], k = v[3], t = v[5];
    if (!v[0] || !v[1] || !v[4] || !v[6] || n <= 0 || k <= 0 || t <= 0) {
        PyErr_SetString(PyExc_ValueError, "gemm: null pointer or empty shape");
        return NULL;
    }
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = qgemm_gemm((const int8_t *)(intptr_t)v[0], (const float *)(intptr_t)v[1], n, k,
                        (const float *)(intptr_t)v[4], t, (float *)(intptr_t)v[6], (const float *)(intptr_t)v[7],
                        v[8] < 1 ? 1 : v[8] > 1024 ? 1024 : (int)v[8], (const int32_t *)(intptr_t)v[9]);
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* row_sums(w, n, k, out): each row's sum of its int8 weights (int32 [n]) from the packed layout */
static PyObject *py_row_sums(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int64_t v[4];
    if (!int_args(args, nargs, 4, "row_sums(w, n, k, out)", v)) return NULL;
    const int8_t *w = (const int8_t *)(intptr_t)v[0];
    int32_t *out = (int32_t *)(intptr_t)v[3];
    int64_t n = v[1], k = v[2], kp = (k + KC - 1) / KC * KC;
    if (!w || !out || n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "row_sums: null pointer or empty shape");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    for (int64_t row = 0; row < n; row++) {
        const int8_t *b = w + (row / NR) * NR * kp + (row % NR) * KC;
        int32_t sum = 0;
        for (int64_t c = 0; c < kp; c += KC)
            for (int i = 0; i < KC; i++) sum += b[c * NR + i];
        out[row] = sum;
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* pack(q, n, k, out): int8 rows [n, k] → the blocked layout gemm reads ([n/NR][kp/KC][NR][KC], zeros
   padding rows to NR and k to KC); out holds packed_size(n, k) bytes */
static PyObject *py_pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int64_t v[4];
    if (!int_args(args, nargs, 4, "pack(q, n, k, out)", v)) return NULL;
    const int8_t *q = (const int8_t *)(intptr_t)v[0];
    int8_t *out = (int8_t *)(intptr_t)v[3];
    int64_t n = v[1], k = v[2], kp = (k + KC - 1) / KC * KC, blocks = (n + NR - 1) / NR;
    if (!q || !out || n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "pack: null pointer or empty shape");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t c = 0; c < kp; c += KC)
            for (int r = 0; r < NR; r++) {
                int8_t *dst = out + b * NR * kp + c * NR + r * KC;
                int64_t row = b * NR + r, len = k - c < KC ? k - c : KC;
                if (row < n) {
                    memcpy(dst, q + row * k + c, (size_t)len);
                    if (len < KC) memset(dst + len, 0, (size_t)(KC - len));
                } else {
                    memset(dst, 0, KC);
                }
            }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_packed_size(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int64_t v[2];
    if (!int_args(args, nargs, 2, "packed_size(n, k)", v)) return NULL;
    int64_t n = v[0], k = v[1];
    if (n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "packed_size: empty shape");
        return NULL;
    }
    return PyLong_FromLongLong((long long)(((n + NR - 1) / NR * NR) * ((k + KC - 1) / KC * KC)));
}

/* ---- conversion at load (the first load of a slice is mostly these two passes) ---- */

static float half_to_float(uint16_t h) {  /* exact: every f16 is a float32 */
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000 | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* dequant_q8_0(raw, blocks, out, threads): GGML Q8_0 (34-byte blocks: f16 scale, 32 int8) → float32,
   value · scale in float32 as numpy computes it */
static PyObject *py_dequant_q8_0(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int64_t v[4];
    if (!int_args(args, nargs, 4, "dequant_q8_0(raw, blocks, out, threads)", v)) return NULL;
    const uint8_t *raw = (const uint8_t *)(intptr_t)v[0];
    float *out = (float *)(intptr_t)v[2];
    int64_t blocks = v[1];
    int threads = v[3] < 1 ? 1 : v[3] > 1024 ? 1024 : (int)v[3];
    if (!raw || !out || blocks <= 0) {
        PyErr_SetString(PyExc_ValueError, "dequant_q8_0: null pointer or no blocks");
        return NULL;
    }
    (void)threads;
    Py_BEGIN_ALLOW_THREADS
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *blk = raw + b * 34;
        float d = half_to_float((uint16_t)(blk[0] | (blk[1] << 8)));
        const int8_t *q = (const int8_t *)(blk + 2);
        float *o = out + b * 32;
        for (int i = 0; i < 32; i++) o[i] = (float)q[i] * d;
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* quantize_rows(w, n, k, q, s, threads): symmetric int8 per row exactly as quantize_rows_int8 does
   in torch (s = max|w| / 127 clamped to 1e-12; q = clamp(round_half_even(w / s), -127, 127)) */
static PyObject *py_quantize_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int64_t v[6];
    if (!int_args(args, nargs, 6, "quantize_rows(w, n, k, q, s, threads)", v)) return NULL;
    const float *w = (const float *)(intptr_t)v[0];
    int8_t *q = (int8_t *)(intptr_t)v[3];
    float *sc = (float *)(intptr_t)v[4];
    int64_t n = v[1], k = v[2];
    int threads = v[5] < 1 ? 1 : v[5] > 1024 ? 1024 : (int)v[5];
    if (!w || !q || !sc || n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "quantize_rows: null pointer or empty shape");
        return NULL;
    }
    (void)threads;
    Py_BEGIN_ALLOW_THREADS
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t r = 0; r < n; r++) {
        const float *wr = w + r * k;
        float m = 0.0f, poison = 0.0f;
        for (int64_t i = 0; i < k; i++) { float a = fabsf(wr[i]); m = a > m ? a : m; poison += wr[i] * 0.0f; }
        if (poison != 0.0f || poison != poison) {  /* a NaN or infinite weight: a NaN row, defined */
            memset(q + r * k, 0, (size_t)k);
            sc[r] = NAN;
            continue;
        }
        float s = m / 127.0f;
        if (!(s >= 1e-12f)) s = 1e-12f;
        int8_t *qr = q + r * k;
        for (int64_t i = 0; i < k; i++) {
            float x = rintf(wr[i] / s);
            qr[i] = (int8_t)(x > 127.0f ? 127.0f : x < -127.0f ? -127.0f : x);
        }
        sc[r] = s;
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_isa(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    return PyUnicode_FromString(g_isa);
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg) {
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    pick_isa();
    const char *best = g_isa;
    static const char *order[] = {"avx512vnni", "avx512", "avx2", "c"};
    int bi = 0, ni = -1;
    for (int i = 0; i < 4; i++) { if (!strcmp(order[i], best)) bi = i; if (!strcmp(order[i], name)) ni = i; }
    if (ni < 0 || ni < bi) {
        PyErr_Format(PyExc_ValueError, "isa %s is not available here (best: %s)", name, best);
        return NULL;
    }
#ifdef QG_X86
    range_fn fns[] = {rows_avx512vnni, rows_avx512, rows_avx2, rows_c};
    g_rows = fns[ni];
#endif
    g_isa = order[ni];
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"gemm", (PyCFunction)(void (*)(void))py_gemm, METH_FASTCALL, "y = (x @ W.T) * s + bias (see module doc)"},
    {"row_sums", (PyCFunction)(void (*)(void))py_row_sums, METH_FASTCALL, "each packed row's sum of weights"},
    {"pack", (PyCFunction)(void (*)(void))py_pack, METH_FASTCALL, "int8 rows -> the packed layout gemm reads"},
    {"packed_size", (PyCFunction)(void (*)(void))py_packed_size, METH_FASTCALL, "bytes of a packed [n, k] matrix"},
    {"dequant_q8_0", (PyCFunction)(void (*)(void))py_dequant_q8_0, METH_FASTCALL, "GGML Q8_0 blocks -> float32"},
    {"quantize_rows", (PyCFunction)(void (*)(void))py_quantize_rows, METH_FASTCALL, "float32 rows -> int8 + scales"},
    {"isa", py_isa, METH_NOARGS, "the instruction set of the kernel in use"},
    {"set_isa", py_set_isa, METH_O, "use the kernel of a given (slower) instruction set"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_qgemm", NULL, -1, methods, NULL, NULL, NULL, NULL};

typedef int (*qgemm_gemm_fn)(const int8_t *, const float *, int64_t, int64_t, const float *, int64_t, float *,
                             const float *, int, const int32_t *);

PyMODINIT_FUNC PyInit__qgemm(void) {
    pick_isa();
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    /* qgemm_gemm for other extensions (PyCapsule_Import("node.inference.weights._qgemm.gemm_c_v1"));
       a changed signature is another name (_v2), so an extension built for the old one finds none */
    PyObject *cap = PyCapsule_New((void *)(qgemm_gemm_fn)qgemm_gemm, "node.inference.weights._qgemm.gemm_c_v1", NULL);
    if (!cap || PyModule_AddObject(m, "gemm_c_v1", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
