/* Several query rows of one session (a prefill chunk, a verify step): attend_rows.

   out[t, h] = softmax(q[t, h] · K[g][0 .. start+t]ᵀ · scale) · V[g][0 .. start+t]   (causal, GQA)

for the T rows at positions [start, start+T) whose K and V are already in the caches. Before this,
such a step converted a half cache's [0, end) to float32 for torch's SDPA every layer (a 1B-shaped
layer, 5 rows at 4000 positions: ~5 ms against 1.6 on float32 caches).

Flash attention with the rows in the vector lanes: a tile is W folded rows of one KV head (row r
is position t = r / group of head g·group + r % group, so a tile's rows are near one another and
see nearly the same keys), its Q transposed to [head_dim][W] once; keys go by blocks of RK, a half
block converted to float32 once for up to TG tiles of the head that run together. Per block and
tile: scores [RK][W] (every lane's dot product in dimension order), the causal mask (a key past a
lane's position is −inf), the online softmax (m = max(m, s), corr = e^(m_old − m), p = e^(s − m),
l = l·corr + Σp in key order) and O[d][W] = O·corr + Σ p·v in key order. Then out = O / l.

Every lane computes its row alone, in an order that depends on neither the lane width, nor the
tile, nor the other rows, nor the threads: a masked key adds exactly nothing (its score is −inf,
so p = 0 in l, and it is left out of O even where V holds inf or NaN; a block of masked keys has
corr = 1) and blocks start at key 0. So the portable loop (8 lanes), AVX2 (8 or 16) and AVX-512
(16) give the same bits, a row gives the same bits whatever rows come with it, and a half cache
gives the bits a float32 cache holding the same values gives. No fused multiply-adds (see
_attend.c). Not the decode kernel's bits (its dot products go by 8-lane partial sums and its
softmax by one max over every position). */
#include "_attend.h"

#define RK 32

typedef struct {
    const float *q;   /* row t's Q heads at q + t * qs, head h at + h * hd (already rotated) */
    int64_t qs;
    const void *k, *v; /* the caches [n_kv, cap, hd], float32 or half (kv16) */
    float *out;       /* [T, nh * hd] */
    int64_t T, start, nh, nkv, hd, cap;
    float scale;
    int kv16;
} rows_t;

typedef void (*tile_fn)(const rows_t *a, int64_t g, int64_t r0, int nt, float *buf);  /* nt tiles from row r0 */

/* a tile's lanes: each one's position limit, its Q column, the tile's last key; m = −inf, l = 0 */
static inline int64_t tile_setup(const rows_t *a, int64_t g, int64_t r0, int W, float *QT, float *m, float *l,
                                 int64_t *lim, int64_t *lo) {
    const int64_t hd = a->hd, group = a->nh / a->nkv, nr = a->T * group;
    int64_t hi = 0;
    *lo = INT64_MAX;
    for (int j = 0; j < W; j++) {
        const int64_t r = r0 + j, t = r < nr ? r / group : 0;  /* a padding lane: zeros at position start */
        const float *qr = r < nr ? a->q + t * a->qs + (g * group + r % group) * hd : NULL;
        lim[j] = a->start + t;
        *lo = lim[j] < *lo ? lim[j] : *lo;
        hi = lim[j] > hi ? lim[j] : hi;
        for (int64_t c = 0; c < hd; c++) QT[c * W + j] = qr ? qr[c] : 0.0f;
        m[j] = -INFINITY;
        l[j] = 0.0f;
    }
    return hi;
}

/* keys kb + i past a lane's position: −inf */
static inline void tile_mask(float *S, int64_t kb, int nk, const int64_t *lim, int W) {
    for (int i = 0; i < nk; i++)
        for (int j = 0; j < W; j++)
            if (kb + i > lim[j]) S[i * W + j] = -INFINITY;
}

/* O += p·v for keys [i0, nk) of the block, lane by lane, leaving out each lane's keys past its
   position: a masked key adds nothing even where V holds inf or NaN (a half cache's V beyond
   65504), so a row's result never depends on the rows with it. The same operations in the same
   order as the vector PV steps (O = O + p·v, key by key) */
static inline __attribute__((always_inline)) void tile_pv_masked(float *OT, const float *P, const float *vp, int64_t hd,
                                                                  int64_t kb, int i0, int nk, const int64_t *lim,
                                                                  const int W) {
    for (int i = i0; i < nk; i++) {
        int32_t keep[16];  /* (W <= 16) this key's lanes; a select, so the lane loop vectorises */
        for (int j = 0; j < W; j++) keep[j] = kb + i <= lim[j];
        for (int64_t d = 0; d < hd; d++) {
            const float v = vp[i * hd + d];
            float *o = OT + d * W;
            const float *p = P + i * W;
            for (int j = 0; j < W; j++) {
                const float sum = o[j] + p[j] * v;
                o[j] = keep[j] ? sum : o[j];
            }
        }
    }
}

/* out rows from O / l */
static inline void tile_store(const rows_t *a, int64_t g, int64_t r0, int W, const float *OT, const float *l) {
    const int64_t hd = a->hd, group = a->nh / a->nkv, nr = a->T * group;
    for (int j = 0; j < W && r0 + j < nr; j++) {
        const int64_t r = r0 + j, t = r / group;
        float *o = a->out + t * a->nh * hd + (g * group + r % group) * hd;
        for (int64_t d = 0; d < hd; d++) o[d] = OT[d * W + j] / l[j];
    }
}

/* The tile: body shared by every instruction set; CVT(src, at, n, dst) turns n half values at
   element `at` into float32, SCORES/ONLINE/PV the block's three steps. */
#define TG 4  /* tiles of a KV head run together: each half block is converted once for all of them */
#define TILE_FLOATS(W, hd) (2 * (hd) * (W) + 3 * (W))  /* a tile's state: QT, OT, m, l, corr */

#define TILE_BODY(W, CVT, SCORES, ONLINE, PV)                                                              \
    const int64_t hd = a->hd, base = g * a->cap * hd;                                                      \
    float *S = buf, *Kf = S + RK * (W), *Vf = Kf + RK * hd, *state = Vf + RK * hd;                         \
    int64_t lim[TG][W], lo[TG], hi[TG], top = 0;                                                           \
    for (int u = 0; u < nt; u++) {                                                                         \
        float *QT = state + u * TILE_FLOATS(W, hd), *OT = QT + hd * (W), *m = OT + hd * (W), *l = m + (W);  \
        hi[u] = tile_setup(a, g, r0 + u * (W), (W), QT, m, l, lim[u], &lo[u]);                             \
        memset(OT, 0, (size_t)(hd * (W)) * sizeof(float));                                                 \
        top = hi[u] > top ? hi[u] : top;                                                                   \
    }                                                                                                      \
    for (int64_t kb = 0; kb <= top; kb += RK) {                                                            \
        const float *kp = Kf, *vp = Vf;                                                                    \
        if (a->kv16) {                                                                                     \
            const int64_t n = top + 1 - kb < RK ? top + 1 - kb : RK;                                       \
            CVT((const uint16_t *)a->k, base + kb * hd, n * hd, Kf);                                       \
            CVT((const uint16_t *)a->v, base + kb * hd, n * hd, Vf);                                       \
        } else {                                                                                           \
            kp = (const float *)a->k + base + kb * hd;                                                     \
            vp = (const float *)a->v + base + kb * hd;                                                     \
        }                                                                                                  \
        for (int u = 0; u < nt; u++) {                                                                     \
            if (kb > hi[u]) continue;  /* past this tile's last position */                                \
            float *QT = state + u * TILE_FLOATS(W, hd), *OT = QT + hd * (W), *m = OT + hd * (W);           \
            float *l = m + (W), *corr = l + (W);                                                           \
            const int nk = (int)(hi[u] + 1 - kb < RK ? hi[u] + 1 - kb : RK);                               \
            SCORES(QT, kp, hd, nk, a->scale, S);                                                           \
            if (kb + nk - 1 > lo[u]) tile_mask(S, kb, nk, lim[u], (W));                                    \
            ONLINE(S, nk, m, l, corr);                                                                     \
            /* keys every lane sees, then those past some lane's position one lane at a time */            \
            const int all = kb + nk - 1 > lo[u] ? (int)(lo[u] + 1 - kb > 0 ? lo[u] + 1 - kb : 0) : nk;     \
            PV(OT, S, vp, hd, all, corr);                                                                  \
            if (all < nk) tile_pv_masked(OT, S, vp, hd, kb, all, nk, lim[u], (W));                         \
        }                                                                                                  \
    }                                                                                                      \
    for (int u = 0; u < nt; u++) {                                                                         \
        float *OT = state + u * TILE_FLOATS(W, hd) + hd * (W);                                             \
        tile_store(a, g, r0 + u * (W), (W), OT, OT + hd * (W) + (W));                                      \
    }

#define WC 8  /* the portable loop's lanes (any width gives the same bits) */

static inline void cvt_c(const uint16_t *src, int64_t at, int64_t n, float *dst) {
    for (int64_t i = 0; i < n; i++) dst[i] = h2f(src[at + i]);
}

static inline void scores_c(const float *QT, const float *kp, int64_t hd, int nk, float scale, float *S) {
    for (int i = 0; i < nk; i++) {
        float acc[WC] = {0};
        for (int64_t c = 0; c < hd; c++) {
            const float kc = kp[i * hd + c];
            for (int j = 0; j < WC; j++) acc[j] = acc[j] + QT[c * WC + j] * kc;
        }
        for (int j = 0; j < WC; j++) S[i * WC + j] = acc[j] * scale;
    }
}

static inline void online_c(float *S, int nk, float *m, float *l, float *corr) {
    for (int j = 0; j < WC; j++) {
        float mx = m[j];
        for (int i = 0; i < nk; i++) mx = S[i * WC + j] > mx ? S[i * WC + j] : mx;
        corr[j] = exp_c(m[j] - mx);
        float sum = l[j] * corr[j];
        for (int i = 0; i < nk; i++) {
            const float p = exp_c(S[i * WC + j] - mx);
            S[i * WC + j] = p;
            sum = sum + p;
        }
        l[j] = sum;
        m[j] = mx;
    }
}

static inline void pv_c(float *OT, const float *P, const float *vp, int64_t hd, int nk, const float *corr) {
    for (int64_t d = 0; d < hd; d++) {
        float acc[WC];
        for (int j = 0; j < WC; j++) acc[j] = OT[d * WC + j] * corr[j];
        for (int i = 0; i < nk; i++) {
            const float v = vp[i * hd + d];
            for (int j = 0; j < WC; j++) acc[j] = acc[j] + P[i * WC + j] * v;
        }
        for (int j = 0; j < WC; j++) OT[d * WC + j] = acc[j];
    }
}

static void tile_c(const rows_t *a, int64_t g, int64_t r0, int nt, float *buf) {
    TILE_BODY(WC, cvt_c, scores_c, online_c, pv_c)
}

#ifdef AT_X86
__attribute__((target("avx2,f16c"))) static inline void cvt_avx2(const uint16_t *src, int64_t at, int64_t n, float *dst) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + at + i))));
    for (; i < n; i++) dst[i] = h2f(src[at + i]);
}

/* AVX2 over NV registers of 8 lanes (a tile of 8·NV rows): every key or value element broadcast
   from memory serves NV registers, so NV = 2 halves the loads per multiply-add */
#define AVX2_KEYS(NV) (8 / (NV))  /* keys in registers at a time: 8 accumulators */

__attribute__((target("avx2"))) static inline __attribute__((always_inline)) void
scores_avx2_n(const float *QT, const float *kp, int64_t hd, int nk, float scale, float *S, const int NV) {
    const int W = 8 * NV, KU = AVX2_KEYS(NV);
    const __m256 sc = _mm256_set1_ps(scale);
    int i = 0;
    for (; i + KU <= nk; i += KU) {
        const float *kk = kp + i * hd;
        __m256 acc[8];
        for (int u = 0; u < 8; u++) acc[u] = _mm256_setzero_ps();
        for (int64_t c = 0; c < hd; c++) {
            for (int v = 0; v < NV; v++) {
                const __m256 q = _mm256_loadu_ps(QT + c * W + 8 * v);
                for (int u = 0; u < KU; u++)
                    acc[u * NV + v] = _mm256_add_ps(acc[u * NV + v], _mm256_mul_ps(q, _mm256_set1_ps(kk[u * hd + c])));
            }
        }
        for (int u = 0; u < KU; u++)
            for (int v = 0; v < NV; v++) _mm256_storeu_ps(S + (i + u) * W + 8 * v, _mm256_mul_ps(acc[u * NV + v], sc));
    }
    for (; i < nk; i++) {
        const float *k0 = kp + i * hd;
        for (int v = 0; v < NV; v++) {
            __m256 a0 = _mm256_setzero_ps();
            for (int64_t c = 0; c < hd; c++)
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_loadu_ps(QT + c * W + 8 * v), _mm256_set1_ps(k0[c])));
            _mm256_storeu_ps(S + i * W + 8 * v, _mm256_mul_ps(a0, sc));
        }
    }
}

__attribute__((target("avx2"))) static inline __attribute__((always_inline)) void
online_avx2_n(float *S, int nk, float *m, float *l, float *corr, const int NV) {
    const int W = 8 * NV;
    for (int v = 0; v < NV; v++) {
        const __m256 m0 = _mm256_loadu_ps(m + 8 * v);
        __m256 mx = m0;
        for (int i = 0; i < nk; i++) mx = _mm256_max_ps(_mm256_loadu_ps(S + i * W + 8 * v), mx);  /* s > m ? s : m */
        const __m256 c = exp_avx2(_mm256_sub_ps(m0, mx));
        __m256 sum = _mm256_mul_ps(_mm256_loadu_ps(l + 8 * v), c);
        for (int i = 0; i < nk; i++) {
            const __m256 p = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(S + i * W + 8 * v), mx));
            _mm256_storeu_ps(S + i * W + 8 * v, p);
            sum = _mm256_add_ps(sum, p);
        }
        _mm256_storeu_ps(corr + 8 * v, c);
        _mm256_storeu_ps(l + 8 * v, sum);
        _mm256_storeu_ps(m + 8 * v, mx);
    }
}

/* O·corr + Σ p·v: 8 accumulators (8/NV dimensions × NV registers) over the block's keys */
__attribute__((target("avx2"))) static inline __attribute__((always_inline)) void
pv_avx2_n(float *OT, const float *P, const float *vp, int64_t hd, int nk, const float *corr, const int NV) {
    const int W = 8 * NV, DU = 8 / NV;
    __m256 c[2];
    for (int v = 0; v < NV; v++) c[v] = _mm256_loadu_ps(corr + 8 * v);
    int64_t d = 0;
    for (; d + DU <= hd; d += DU) {
        __m256 o[8];
        for (int u = 0; u < DU; u++)
            for (int v = 0; v < NV; v++) o[u * NV + v] = _mm256_mul_ps(_mm256_loadu_ps(OT + (d + u) * W + 8 * v), c[v]);
        for (int i = 0; i < nk; i++) {
            const float *vr = vp + i * hd + d;
            for (int v = 0; v < NV; v++) {
                const __m256 p = _mm256_loadu_ps(P + i * W + 8 * v);
                for (int u = 0; u < DU; u++)
                    o[u * NV + v] = _mm256_add_ps(o[u * NV + v], _mm256_mul_ps(p, _mm256_set1_ps(vr[u])));
            }
        }
        for (int u = 0; u < DU; u++)
            for (int v = 0; v < NV; v++) _mm256_storeu_ps(OT + (d + u) * W + 8 * v, o[u * NV + v]);
    }
    for (; d < hd; d++)
        for (int v = 0; v < NV; v++) {
            __m256 o = _mm256_mul_ps(_mm256_loadu_ps(OT + d * W + 8 * v), c[v]);
            for (int i = 0; i < nk; i++)
                o = _mm256_add_ps(o, _mm256_mul_ps(_mm256_loadu_ps(P + i * W + 8 * v), _mm256_set1_ps(vp[i * hd + d])));
            _mm256_storeu_ps(OT + d * W + 8 * v, o);
        }
}

#define SCORES_AVX2_1(QT, kp, hd, nk, sc, S) scores_avx2_n(QT, kp, hd, nk, sc, S, 1)
#define ONLINE_AVX2_1(S, nk, m, l, corr) online_avx2_n(S, nk, m, l, corr, 1)
#define PV_AVX2_1(OT, P, vp, hd, nk, corr) pv_avx2_n(OT, P, vp, hd, nk, corr, 1)
#define SCORES_AVX2_2(QT, kp, hd, nk, sc, S) scores_avx2_n(QT, kp, hd, nk, sc, S, 2)
#define ONLINE_AVX2_2(S, nk, m, l, corr) online_avx2_n(S, nk, m, l, corr, 2)
#define PV_AVX2_2(OT, P, vp, hd, nk, corr) pv_avx2_n(OT, P, vp, hd, nk, corr, 2)

__attribute__((target("avx2,f16c"))) static void tile_avx2(const rows_t *a, int64_t g, int64_t r0, int nt, float *buf) {
    TILE_BODY(8, cvt_avx2, SCORES_AVX2_1, ONLINE_AVX2_1, PV_AVX2_1)
}

/* 16 rows in two registers (AVX2's wide tile) */
__attribute__((target("avx2,f16c"))) static void tile_avx2_16(const rows_t *a, int64_t g, int64_t r0, int nt, float *buf) {
    TILE_BODY(16, cvt_avx2, SCORES_AVX2_2, ONLINE_AVX2_2, PV_AVX2_2)
}

/* exp_c on 16 lanes: the same operations in the same order */
__attribute__((target("avx512f"))) static inline __m512 exp_avx512(__m512 x) {
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(LN2_HI)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(LN2_LO)));
    __m512 y = _mm512_set1_ps(EXP_P0);
    y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(EXP_P1));
    y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(EXP_P2));
    y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(EXP_P3));
    y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(EXP_P4));
    y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(EXP_P5));
    y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(y, _mm512_mul_ps(r, r)), r), _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    const __mmask16 nan_n = _mm512_cmp_ps_mask(n, n, _CMP_UNORD_Q);
    const __m512 scaled = _mm512_mask_blend_ps(nan_n, _mm512_mul_ps(y, _mm512_castsi512_ps(e)), y);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_LO), _CMP_LT_OQ), scaled, _mm512_setzero_ps());
}

__attribute__((target("avx512f"))) static inline void cvt_avx512(const uint16_t *src, int64_t at, int64_t n, float *dst) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + at + i))));
    for (; i < n; i++) dst[i] = h2f(src[at + i]);
}

__attribute__((target("avx512f"))) static inline void scores_avx512(const float *QT, const float *kp, int64_t hd, int nk,
                                                             float scale, float *S) {
    const __m512 sc = _mm512_set1_ps(scale);
    int i = 0;
    for (; i + 8 <= nk; i += 8) {  /* eight keys at a time: eight add chains (an add's latency is 3-4 cycles) */
        const float *kk = kp + i * hd;
        __m512 acc[8];
        for (int u = 0; u < 8; u++) acc[u] = _mm512_setzero_ps();
        for (int64_t c = 0; c < hd; c++) {
            const __m512 q = _mm512_loadu_ps(QT + c * 16);
            for (int u = 0; u < 8; u++) acc[u] = _mm512_add_ps(acc[u], _mm512_mul_ps(q, _mm512_set1_ps(kk[u * hd + c])));
        }
        for (int u = 0; u < 8; u++) _mm512_storeu_ps(S + (i + u) * 16, _mm512_mul_ps(acc[u], sc));
    }
    for (; i < nk; i++) {
        const float *k0 = kp + i * hd;
        __m512 a0 = _mm512_setzero_ps();
        for (int64_t c = 0; c < hd; c++) a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_loadu_ps(QT + c * 16), _mm512_set1_ps(k0[c])));
        _mm512_storeu_ps(S + i * 16, _mm512_mul_ps(a0, sc));
    }
}

__attribute__((target("avx512f"))) static inline void online_avx512(float *S, int nk, float *m, float *l, float *corr) {
    const __m512 m0 = _mm512_loadu_ps(m);
    __m512 mx = m0;
    for (int i = 0; i < nk; i++) mx = _mm512_max_ps(_mm512_loadu_ps(S + i * 16), mx);
    const __m512 c = exp_avx512(_mm512_sub_ps(m0, mx));
    __m512 sum = _mm512_mul_ps(_mm512_loadu_ps(l), c);
    for (int i = 0; i < nk; i++) {
        const __m512 p = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(S + i * 16), mx));
        _mm512_storeu_ps(S + i * 16, p);
        sum = _mm512_add_ps(sum, p);
    }
    _mm512_storeu_ps(corr, c);
    _mm512_storeu_ps(l, sum);
    _mm512_storeu_ps(m, mx);
}

__attribute__((target("avx512f"))) static inline void pv_avx512(float *OT, const float *P, const float *vp, int64_t hd, int nk,
                                                              const float *corr) {
    const __m512 c = _mm512_loadu_ps(corr);
    int64_t d = 0;
    for (; d + 16 <= hd; d += 16) {
        __m512 o[16];
        for (int u = 0; u < 16; u++) o[u] = _mm512_mul_ps(_mm512_loadu_ps(OT + (d + u) * 16), c);
        for (int i = 0; i < nk; i++) {
            const __m512 p = _mm512_loadu_ps(P + i * 16);
            const float *v = vp + i * hd + d;
            for (int u = 0; u < 16; u++) o[u] = _mm512_add_ps(o[u], _mm512_mul_ps(p, _mm512_set1_ps(v[u])));
        }
        for (int u = 0; u < 16; u++) _mm512_storeu_ps(OT + (d + u) * 16, o[u]);
    }
    for (; d < hd; d++) {
        __m512 o = _mm512_mul_ps(_mm512_loadu_ps(OT + d * 16), c);
        for (int i = 0; i < nk; i++)
            o = _mm512_add_ps(o, _mm512_mul_ps(_mm512_loadu_ps(P + i * 16), _mm512_set1_ps(vp[i * hd + d])));
        _mm512_storeu_ps(OT + d * 16, o);
    }
}

__attribute__((target("avx512f"))) static void tile_avx512(const rows_t *a, int64_t g, int64_t r0, int nt, float *buf) {
    TILE_BODY(16, cvt_avx512, scores_avx512, online_avx512, pv_avx512)
}
#endif

/* attend_rows' tiles: `wide` of `w` lanes, and for a KV head's last rows when they fit `narrow`
   (same bits, fewer idle lanes: a 1B model's 5-row verify step is 20 rows a head). One pointer,
   read once per call: a set_isa between calls never pairs a tile with another's buffer size */
typedef struct {
    tile_fn wide, narrow;
    int w, narrow_w;
} tiles_t;

static const tiles_t TILES_C = {tile_c, tile_c, WC, WC};
#ifdef AT_X86
static const tiles_t TILES_AVX2 = {tile_avx2_16, tile_avx2, 16, 8};
static const tiles_t TILES_AVX512 = {tile_avx512, tile_avx2, 16, 8};
#endif
static const tiles_t *volatile g_tiles = &TILES_C;

/* attend_rows' tiles for instruction set `isa` (the decode kernels are AVX2's under "avx512" too) */
void at_pick_tiles(const char *isa) {
    const tiles_t *t = &TILES_C;
#ifdef AT_X86
    if (!strcmp(isa, "avx2")) t = &TILES_AVX2;
    else if (!strcmp(isa, "avx512")) t = &TILES_AVX512;
#endif
    g_tiles = t;
}

/* every tile of every KV head, on up to `threads` threads; 0, or -1 when a buffer cannot be had */
static int attend_rows(const rows_t *a, long long threads) {
    const tiles_t *ts = g_tiles;
    const tile_fn fn = ts->wide, narrow = ts->narrow;
    const int W = ts->w;
    const int64_t nr = a->T * a->nh / a->nkv, tiles = (nr + W - 1) / W;
    const int last_narrow = nr % W && nr % W <= ts->narrow_w;  /* a head's last tile on the narrow lanes */
    const int64_t wide = tiles - last_narrow, groups = (wide + TG - 1) / TG, per_head = groups + last_narrow;
    const int64_t n = a->nkv * per_head;  /* tasks: up to TG wide tiles of a head, or its narrow tile */
    const size_t floats = (size_t)(RK * W + 2 * RK * a->hd + TG * TILE_FLOATS(W, a->hd));
    int nth = threads < 1 ? 1 : threads > 1024 ? 1024 : (int)threads;
    if ((double)a->nh * (double)a->T * (double)(a->start + a->T) * (double)a->hd < PAR_MIN_MACS) nth = 1;
    if (nth > n) nth = (int)n;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nth) reduction(| : failed) if (nth > 1)
#endif
    {
        float *buf = (float *)malloc(floats * sizeof(float));
        if (!buf) failed = 1;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t i = 0; i < n; i++) {  /* the last tiles (latest positions, most keys) first */
            const int64_t g = (n - 1 - i) % a->nkv, j = (n - 1 - i) / a->nkv;
            if (!buf) continue;
            if (j < groups) {
                const int64_t t0 = j * TG;
                fn(a, g, t0 * W, (int)(wide - t0 < TG ? wide - t0 : TG), buf);
            } else {
                narrow(a, g, (tiles - 1) * W, 1, buf);
            }
        }
        free(buf);
    }
    return failed ? -1 : 0;
}

static PyObject *attend_rows_kv(PyObject *const *args, Py_ssize_t nargs, int kv16) {
    int64_t v[12];
    double scale;
    if (!at_parse_args(args, nargs, 11, 1,
                    kv16 ? "attend_rows_kv16(q, q_stride, k, v, out, T, start, n_heads, n_kv, head_dim, cap, scale, threads)"
                         : "attend_rows(q, q_stride, k, v, out, T, start, n_heads, n_kv, head_dim, cap, scale, threads)",
                    v, &scale))
        return NULL;
    const long long threads = v[11];
    rows_t a = {(const float *)(intptr_t)v[0], v[1], (const void *)(intptr_t)v[2], (const void *)(intptr_t)v[3],
                (float *)(intptr_t)v[4], v[5], v[6], v[7], v[8], v[9], v[10], (float)scale, kv16};
    if (!a.q || !a.k || !a.v || !a.out || a.nh <= 0 || a.nkv <= 0 || a.nh % a.nkv || a.hd <= 0 || a.T <= 0
            || a.nh > (1 << 16) || a.hd > (1 << 16) || a.T > (1 << 20) || a.cap > (1LL << 30)
            || a.cap < a.T || a.start < 0 || a.start > a.cap - a.T || a.qs < a.nh * a.hd) {  /* (no sum can overflow) */
        PyErr_SetString(PyExc_ValueError, "attend_rows: null pointer, or shapes that do not fit (n_heads a "
                                          "multiple of n_kv, 0 <= start < start + T <= cap <= 2^30, T <= 2^20, "
                                          "q_stride >= n_heads * head_dim, n_heads and head_dim <= 65536)");
        return NULL;
    }
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = attend_rows(&a, threads);
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyObject *py_attend_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return attend_rows_kv(args, nargs, 0);
}

PyObject *py_attend_rows_kv16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return attend_rows_kv(args, nargs, 1);
}
