/* One query row's attention over a KV cache (a decode step), float32 (caches float32 or half), in one call.

    out[h] = softmax(q[h] · K[g]ᵀ · scale) · V[g],   g = h / (n_heads / n_kv_heads)   (GQA)

over the first `end` positions of K, V: [n_kv, cap, head_dim] contiguous (a slice's KV session).
torch's fused CPU attention (scaled_dot_product_attention) costs ~40-50 µs a call for one query
on 2 threads, most of it set-up: on the 110M bench model (12 layers, 12 heads of 64, ~140
positions) that was 17 % of a decode step. Here it is a few µs.

Rounding: q·k sums in 8 lanes (lane j takes elements j, j+8, …), the lanes added pairwise as
((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), then the tail; the AVX2 path and the portable loop do the
same operations in the same order, so they give the same bits. Softmax in float32: p = exp(s −
max) (exp_c: Cephes' polynomial in plain arithmetic, 8 lanes at a time on AVX2, same bits), Σp
added in position order, out = (Σ p·v) / Σp. No fused multiply-adds (fp-contract off).

`rope_decode` is a whole decode step's attention in one call: the half-split rotation of the
step's Q and K heads (ggml's NeoX layout, as common.apply_rope: x·cos + swapped·sin, sin signed),
K and V appended to the caches at `pos`, then `decode` over positions [0, pos]. In Python the
rotation, the two cache writes and the attention call cost ~30 µs a layer on the 110M bench model,
most of it per-op overhead; here a few µs.

`rms_norm_rows` is RMSNorm row by row (the sum of squares in double, in element order; out = (x ·
w) · inv in float32), so a row's result does not depend on how many rows come with it: a decode
step's rows are the same bits alone and in a batch of sessions (torch's rms_norm is not, and
through numpy one row cost ~7 µs of call overhead against ~3 here).

Python API (pointers are addresses, e.g. tensor.data_ptr()):
    decode(q, k, v, out, n_heads, n_kv, head_dim, cap, end, scale, threads)
    rms_norm_rows(x, w, out, rows, k, eps)     out[r, i] = x[r, i] · w[i] / sqrt(mean(x[r]²) + eps)
    silu_mul_rows(gu, out, rows, f, 0.0)       out[r, i] = silu(gu[r, i]) · gu[r, f + i]
    block_decode(layout, x, y, k, v, cos, sin, cap, pos, eps, scale, threads)
        a block's decode step for one row on qgemm weights (layout: block.decode_layout's tuple)
    rope_decode(qk, vrow, cos, sin, k, v, out, n_heads, n_kv, head_dim, n_rot, cap, pos, scale, threads)
        qk: [n_heads + n_kv, head_dim] (Q heads then K heads, before rotation), vrow: [n_kv, head_dim],
        cos, sin: [n_rot] of the step's position; k, v: the caches [n_kv, cap, head_dim]
    decode_kv16, rope_decode_kv16, block_decode_kv16: the same over half (IEEE binary16) caches:
        K and V read exactly as floats (F16C on AVX2), the step's K and V rounded to nearest even
        as torch's float16 assignment rounds them, so every path writes and reads the same bits
    to_f16(src, dst, n, 0.0)                   that rounding, for tests
    attend_rows(q, q_stride, k, v, out, T, start, n_heads, n_kv, head_dim, cap, scale, threads)
        T rows of one session at positions [start, start+T), causal (see attend_rows below);
        attend_rows_kv16 over half caches
    isa() -> "avx512" | "avx2" | "c" (avx512: attend_rows' tiles; the decode kernels are AVX2's);
    set_isa("c" | "avx2" | the best) for tests and benches, never while a kernel runs
*/
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
#define AT_X86 1
#include <immintrin.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

#define PAR_MIN_MACS (1 << 15)  /* below this a second thread costs more than it saves */

typedef struct {
    const float *q;
    const void *k, *v;  /* float32, or IEEE half (uint16_t) when kv16 */
    float *out;
    int64_t nh, nkv, hd, cap, end;
    float scale;
    int kv16;
} att_t;

/* IEEE half <-> float32. half -> float is exact; float -> half rounds to nearest, ties to even
   (as torch's and F16C's conversions do: a cache written here or by torch holds the same bits),
   overflow to infinity, NaN stays NaN (its payload is not kept: every NaN is written 0x7e00, and
   "the same bits" holds for the numbers). A K or V value beyond 65504 is infinity in the cache,
   as in llama.cpp's f16 cache: that head's scores are NaN from then on. */
static inline float h2f(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0x1f) u = s | 0x7f800000u | (m << 13);
    else if (e) u = s | ((e + 112) << 23) | (m << 13);
    else if (!m) u = s;
    else {  /* subnormal: m · 2^-24, normalised */
        e = 113;
        while (!(m & 0x400)) { m <<= 1; e--; }
        u = s | (e << 23) | ((m & 0x3ff) << 13);
    }
    union { uint32_t u; float f; } c = {.u = u};
    return c.f;
}

static inline uint16_t f2h(float f) {
    union { float f; uint32_t u; } in = {.f = f};
    const union { uint32_t u; float f; } magic = {.u = (uint32_t)((127 - 15) + (23 - 10) + 1) << 23};
    const uint32_t sign = in.u & 0x80000000u;
    uint32_t o;
    in.u ^= sign;
    if (in.u >= (uint32_t)(127 + 16) << 23) o = in.u > 0x7f800000u ? 0x7e00 : 0x7c00;  /* NaN, inf, overflow */
    else if (in.u < (uint32_t)113 << 23) {  /* a half subnormal: the float add rounds it (to nearest even) */
        in.f += magic.f;
        o = in.u - magic.u;
    } else {  /* normal: rebias, round to nearest even on the 13 dropped bits (a carry may give inf) */
        const uint32_t odd = (in.u >> 13) & 1;
        in.u += ((uint32_t)(15 - 127) << 23) + 0xfff + odd;
        o = in.u >> 13;
    }
    return (uint16_t)(o | (sign >> 16));
}

/* element i of a K or V cache */
#define KV_AT(base, i, kv16) ((kv16) ? h2f(((const uint16_t *)(base))[i]) : ((const float *)(base))[i])

typedef void (*head_fn)(const att_t *a, int64_t h, float *scores);

static inline float lanes_sum(const float l[8]) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* a · b[off, off + n) of a K cache */
static inline __attribute__((always_inline)) float dot_c(const float *a, const void *b, int64_t off, int64_t n,
                                                         const int kv16) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) l[j] = l[j] + a[i + j] * KV_AT(b, off + i + j, kv16);
    float s = lanes_sum(l);
    for (; i < n; i++) s = s + a[i] * KV_AT(b, off + i, kv16);
    return s;
}

/* e^x for the softmax (x <= 0 there): Cephes' expf — x = n·ln2 + r, |r| <= ln2/2, a degree-7
   polynomial for e^r, times 2^n built in the exponent bits — in plain multiplies and adds, so the
   AVX2 lanes below (8 at a time) give the same bits as this loop. Within 2 ulp of expf; below
   -87.3 (where 2^n would be subnormal) it is 0, as the softmax needs. libm's expf one score at a
   time was most of a long context's attention (~10 ns each: 32 heads × 1000 positions × 16
   layers of a 1B model is 5 ms a token). */
#define EXP_LO (-87.33654f)
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO (-2.12194440e-4f)
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f
static inline float exp_c(float x) {
    if (x < EXP_LO) return 0.0f;
    const float n = rintf(x * LOG2E);
    float r = x - n * LN2_HI;
    r = r - n * LN2_LO;
    float y = EXP_P0;
    y = y * r + EXP_P1; y = y * r + EXP_P2; y = y * r + EXP_P3; y = y * r + EXP_P4; y = y * r + EXP_P5;
    y = y * (r * r) + r + 1.0f;
    if (n != n) return y;  /* a NaN stays NaN (y is NaN) */
    union { uint32_t u; float f; } two = {.u = (uint32_t)((int32_t)n + 127) << 23};  /* n in [-126, 0] here */
    return y * two.f;
}

/* scores → probabilities in place, exp(s - max); returns their sum, added in position order */
static inline float softmax(float *scores, int64_t end) {
    float m = -INFINITY;
    for (int64_t t = 0; t < end; t++) m = scores[t] > m ? scores[t] : m;
    float sum = 0.0f;
    for (int64_t t = 0; t < end; t++) {
        float p = exp_c(scores[t] - m);
        scores[t] = p;
        sum = sum + p;
    }
    return sum;
}

static inline __attribute__((always_inline)) void head_c_kv(const att_t *a, int64_t h, float *scores,
                                                             const int kv16) {
    const int64_t hd = a->hd, end = a->end, base = (h / (a->nh / a->nkv)) * a->cap * hd;
    const float *q = a->q + h * hd;
    for (int64_t t = 0; t < end; t++) scores[t] = dot_c(q, a->k, base + t * hd, hd, kv16) * a->scale;
    float *o = a->out + h * hd;
    float sum = softmax(scores, end);
    for (int64_t d = 0; d < hd; d++) o[d] = 0.0f;
    for (int64_t t = 0; t < end; t++) {
        const float p = scores[t];
        for (int64_t d = 0; d < hd; d++) o[d] = o[d] + p * KV_AT(a->v, base + t * hd + d, kv16);
    }
    for (int64_t d = 0; d < hd; d++) o[d] = o[d] / sum;
}

static void head_c(const att_t *a, int64_t h, float *scores) { head_c_kv(a, h, scores, 0); }
static void head_c16(const att_t *a, int64_t h, float *scores) { head_c_kv(a, h, scores, 1); }

#ifdef AT_X86
__attribute__((target("avx2"))) static inline float hsum_avx2(__m256 acc) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)); /* l0+l4 … l3+l7 */
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                                  /* (l0+l4)+(l2+l6), (l1+l5)+(l3+l7) */
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* exp_c on 8 lanes: the same operations in the same order */
__attribute__((target("avx2"))) static inline __m256 exp_avx2(__m256 x) {
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(LN2_HI)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(LN2_LO)));
    __m256 y = _mm256_set1_ps(EXP_P0);
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(EXP_P1));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(EXP_P2));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(EXP_P3));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(EXP_P4));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(EXP_P5));
    y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(y, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 nan_n = _mm256_cmp_ps(n, n, _CMP_UNORD_Q);
    const __m256 scaled = _mm256_blendv_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), y, nan_n);
    return _mm256_blendv_ps(scaled, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_LT_OQ));
}

__attribute__((target("avx2"))) static inline float softmax_avx2(float *scores, int64_t end) {
    float m = -INFINITY;
    for (int64_t t = 0; t < end; t++) m = scores[t] > m ? scores[t] : m;
    const __m256 m8 = _mm256_set1_ps(m);
    int64_t t = 0;
    for (; t + 8 <= end; t += 8)
        _mm256_storeu_ps(scores + t, exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(scores + t), m8)));
    for (; t < end; t++) scores[t] = exp_c(scores[t] - m);
    float sum = 0.0f;
    for (t = 0; t < end; t++) sum = sum + scores[t];
    return sum;
}

/* 8 elements of a K or V cache from element i of base */
#define LD8(base, i, kv16) ((kv16) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)(base) + (i)))) \
                                   : _mm256_loadu_ps((const float *)(base) + (i)))

__attribute__((target("avx2,f16c"))) static inline __attribute__((always_inline)) void
head_avx2_kv(const att_t *a, int64_t h, float *scores, const int kv16) {
    const int64_t hd = a->hd, end = a->end, hd8 = hd / 8 * 8, base = (h / (a->nh / a->nkv)) * a->cap * hd;
    const float *q = a->q + h * hd;
    const void *k = a->k, *v = a->v;
    int64_t t = 0;
    for (; t + 4 <= end; t += 4) {  /* four positions at once: four independent add chains */
        const int64_t k0 = base + t * hd, k1 = k0 + hd, k2 = k1 + hd, k3 = k2 + hd;
        __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
        for (int64_t i = 0; i < hd8; i += 8) {
            __m256 qi = _mm256_loadu_ps(q + i);
            c0 = _mm256_add_ps(c0, _mm256_mul_ps(qi, LD8(k, k0 + i, kv16)));
            c1 = _mm256_add_ps(c1, _mm256_mul_ps(qi, LD8(k, k1 + i, kv16)));
            c2 = _mm256_add_ps(c2, _mm256_mul_ps(qi, LD8(k, k2 + i, kv16)));
            c3 = _mm256_add_ps(c3, _mm256_mul_ps(qi, LD8(k, k3 + i, kv16)));
        }
        float s0 = hsum_avx2(c0), s1 = hsum_avx2(c1), s2 = hsum_avx2(c2), s3 = hsum_avx2(c3);
        for (int64_t i = hd8; i < hd; i++) {
            s0 = s0 + q[i] * KV_AT(k, k0 + i, kv16); s1 = s1 + q[i] * KV_AT(k, k1 + i, kv16);
            s2 = s2 + q[i] * KV_AT(k, k2 + i, kv16); s3 = s3 + q[i] * KV_AT(k, k3 + i, kv16);
        }
        scores[t] = s0 * a->scale; scores[t + 1] = s1 * a->scale;
        scores[t + 2] = s2 * a->scale; scores[t + 3] = s3 * a->scale;
    }
    for (; t < end; t++) {
        const int64_t kt = base + t * hd;
        __m256 c = _mm256_setzero_ps();
        for (int64_t i = 0; i < hd8; i += 8) c = _mm256_add_ps(c, _mm256_mul_ps(_mm256_loadu_ps(q + i), LD8(k, kt + i, kv16)));
        float st = hsum_avx2(c);
        for (int64_t i = hd8; i < hd; i++) st = st + q[i] * KV_AT(k, kt + i, kv16);
        scores[t] = st * a->scale;
    }
    float *o = a->out + h * hd;
    const float sum = softmax_avx2(scores, end);
    const __m256 sum8 = _mm256_set1_ps(sum);
    int64_t d = 0;
    for (; d + 32 <= hd; d += 32) {  /* 32 outputs in registers over every position */
        __m256 o0 = _mm256_setzero_ps(), o1 = o0, o2 = o0, o3 = o0;
        for (int64_t u = 0; u < end; u++) {
            const __m256 p = _mm256_set1_ps(scores[u]);
            const int64_t vr = base + u * hd + d;
            o0 = _mm256_add_ps(o0, _mm256_mul_ps(p, LD8(v, vr, kv16)));
            o1 = _mm256_add_ps(o1, _mm256_mul_ps(p, LD8(v, vr + 8, kv16)));
            o2 = _mm256_add_ps(o2, _mm256_mul_ps(p, LD8(v, vr + 16, kv16)));
            o3 = _mm256_add_ps(o3, _mm256_mul_ps(p, LD8(v, vr + 24, kv16)));
        }
        _mm256_storeu_ps(o + d, _mm256_div_ps(o0, sum8));
        _mm256_storeu_ps(o + d + 8, _mm256_div_ps(o1, sum8));
        _mm256_storeu_ps(o + d + 16, _mm256_div_ps(o2, sum8));
        _mm256_storeu_ps(o + d + 24, _mm256_div_ps(o3, sum8));
    }
    for (; d < hd; d++) {  /* the rest one output at a time, in the same order */
        float od = 0.0f;
        for (int64_t u = 0; u < end; u++) od = od + scores[u] * KV_AT(v, base + u * hd + d, kv16);
        o[d] = od / sum;
    }
}
__attribute__((target("avx2,f16c"))) static void head_avx2(const att_t *a, int64_t h, float *scores) {
    head_avx2_kv(a, h, scores, 0);
}
__attribute__((target("avx2,f16c"))) static void head_avx2_16(const att_t *a, int64_t h, float *scores) {
    head_avx2_kv(a, h, scores, 1);
}
#endif

static head_fn g_head = head_c, g_head16 = head_c16;  /* float32 caches, half caches */
static const char *g_isa = "c";

static void pick_isa(void) {
    g_head = head_c;
    g_head16 = head_c16;
    g_isa = "c";
#ifdef AT_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
        g_head = head_avx2;
        g_head16 = head_avx2_16;
        g_isa = __builtin_cpu_supports("avx512f") ? "avx512" : "avx2";  /* attend_rows' tiles */
    }
#endif
}

/* heads [h0, h1) with one scores buffer; 0 on success, -1 when it cannot be allocated */
static int heads(const att_t *a, head_fn fn, int64_t h0, int64_t h1) {
    float *scores = (float *)malloc((size_t)a->end * sizeof(float));
    if (!scores) return -1;
    for (int64_t h = h0; h < h1; h++) fn(a, h, scores);
    free(scores);
    return 0;
}

/* every head of a, on up to `threads` threads (fewer when the work is small); 0, or -1 when a
   scores buffer cannot be allocated */
static int attend(const att_t *a, long long threads) {
    int nt = threads < 1 ? 1 : threads > 1024 ? 1024 : (int)threads;
    if (a->nh * a->end * a->hd < PAR_MIN_MACS) nt = 1;
    if (nt > a->nh) nt = (int)a->nh;
    head_fn fn = a->kv16 ? g_head16 : g_head;
    int failed = 0;
#ifdef _OPENMP
    if (nt > 1) {
#pragma omp parallel num_threads(nt) reduction(| : failed)
        {
            int p = omp_get_thread_num(), parts = omp_get_num_threads();
            failed |= heads(a, fn, a->nh * p / parts, a->nh * (p + 1) / parts) != 0;
        }
        return failed ? -1 : 0;
    }
#endif
    return heads(a, fn, 0, a->nh);
}

/* one head's rotation (the first n_rot dims; the rest copied): out = x·cos + swapped·sin */
static inline void rope_head(const float *x, const float *cs, const float *sn, int64_t hd, int64_t n_rot, float *out) {
    const int64_t half = n_rot / 2;
    for (int64_t i = 0; i < n_rot; i++) {
        const float sw = i < half ? x[i + half] : x[i - half];
        out[i] = x[i] * cs[i] + sw * sn[i];
    }
    for (int64_t i = n_rot; i < hd; i++) out[i] = x[i];
}

/* The entry points take n integers (addresses, sizes), then a float, then (threaded ones) a
   thread count: into v[0..n), *f and v[n]. 1, or 0 with the Python error set. */
static int parse_args(PyObject *const *args, Py_ssize_t nargs, int n, int threaded, const char *usage,
                      int64_t *v, double *f) {
    if (nargs != n + 1 + threaded) {
        PyErr_SetString(PyExc_TypeError, usage);
        return 0;
    }
    for (int i = 0; i < n + threaded; i++) {
        long long x = PyLong_AsLongLong(args[i < n ? i : n + 1]);
        if (x == -1 && PyErr_Occurred()) return 0;
        v[i] = (int64_t)x;
    }
    *f = PyFloat_AsDouble(args[n]);
    return !(*f == -1.0 && PyErr_Occurred());
}

/* rope_decode's work (checked arguments, no GIL): 0, or -1 when a buffer cannot be had. The caches
   are float32, or half when kv16 (K rotated in float32, then rounded as torch rounds) */
static int rope_attend(const float *qk, const float *vrow, const float *cs, const float *sn, void *kc, void *vc,
                       float *out, int64_t nh, int64_t nkv, int64_t hd, int64_t n_rot, int64_t cap, int64_t pos,
                       float scale, long long threads, int kv16) {
    float *q = (float *)malloc((size_t)((nh + 1) * hd) * sizeof(float));
    if (!q) return -1;
    float *krow = q + nh * hd;
    for (int64_t h = 0; h < nh; h++) rope_head(qk + h * hd, cs, sn, hd, n_rot, q + h * hd);
    for (int64_t g = 0; g < nkv; g++) {
        const int64_t at = (g * cap + pos) * hd;
        if (kv16) {
            rope_head(qk + (nh + g) * hd, cs, sn, hd, n_rot, krow);
            uint16_t *k16 = (uint16_t *)kc + at, *v16 = (uint16_t *)vc + at;
            for (int64_t i = 0; i < hd; i++) {
                k16[i] = f2h(krow[i]);
                v16[i] = f2h(vrow[g * hd + i]);
            }
        } else {
            rope_head(qk + (nh + g) * hd, cs, sn, hd, n_rot, (float *)kc + at);
            memcpy((float *)vc + at, vrow + g * hd, (size_t)hd * sizeof(float));
        }
    }
    const att_t a = {q, kc, vc, out, nh, nkv, hd, cap, pos + 1, scale, kv16};
    const int failed = attend(&a, threads);
    free(q);
    return failed;
}

static PyObject *rope_decode_kv(PyObject *const *args, Py_ssize_t nargs, int kv16) {
    int64_t v[14];
    double scale;
    if (!parse_args(args, nargs, 13, 1, kv16 ? "rope_decode_kv16(qk, vrow, cos, sin, k, v, out, n_heads, n_kv, "
                                               "head_dim, n_rot, cap, pos, scale, threads)"
                                             : "rope_decode(qk, vrow, cos, sin, k, v, out, n_heads, n_kv, head_dim, "
                                               "n_rot, cap, pos, scale, threads)", v, &scale))
        return NULL;
    const long long threads = v[13];
    const float *qk = (const float *)(intptr_t)v[0], *vrow = (const float *)(intptr_t)v[1];
    const float *cs = (const float *)(intptr_t)v[2], *sn = (const float *)(intptr_t)v[3];
    void *kc = (void *)(intptr_t)v[4], *vc = (void *)(intptr_t)v[5];
    float *out = (float *)(intptr_t)v[6];
    const int64_t nh = v[7], nkv = v[8], hd = v[9], n_rot = v[10], cap = v[11], pos = v[12];
    if (!qk || !vrow || !cs || !sn || !kc || !vc || !out || nh <= 0 || nkv <= 0 || nh % nkv || hd <= 0
            || n_rot < 0 || n_rot > hd || n_rot % 2 || pos < 0 || pos >= cap || nh > (1 << 16) || hd > (1 << 16)
            || cap > (1LL << 30)) {
        PyErr_SetString(PyExc_ValueError, "rope_decode: null pointer, or shapes that do not fit "
                                          "(n_heads a multiple of n_kv, 0 <= pos < cap <= 2^30, an even "
                                          "n_rot <= head_dim, n_heads and head_dim <= 65536)");
        return NULL;
    }
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = rope_attend(qk, vrow, cs, sn, kc, vc, out, nh, nkv, hd, n_rot, cap, pos, (float)scale, threads, kv16);
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_rope_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return rope_decode_kv(args, nargs, 0);
}

static PyObject *py_rope_decode_kv16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return rope_decode_kv(args, nargs, 1);
}

static PyObject *decode_kv(PyObject *const *args, Py_ssize_t nargs, int kv16) {
    int64_t v[10];
    double scale;
    if (!parse_args(args, nargs, 9, 1,
                    kv16 ? "decode_kv16(q, k, v, out, n_heads, n_kv, head_dim, cap, end, scale, threads)"
                         : "decode(q, k, v, out, n_heads, n_kv, head_dim, cap, end, scale, threads)", v, &scale))
        return NULL;
    const long long threads = v[9];
    att_t a = {(const float *)(intptr_t)v[0], (const void *)(intptr_t)v[1], (const void *)(intptr_t)v[2],
               (float *)(intptr_t)v[3], v[4], v[5], v[6], v[7], v[8], (float)scale, kv16};
    if (!a.q || !a.k || !a.v || !a.out || a.nh <= 0 || a.nkv <= 0 || a.nh % a.nkv || a.hd <= 0 || a.end <= 0
            || a.end > a.cap || a.nh > (1 << 16) || a.hd > (1 << 16) || a.cap > (1LL << 30)) {
        PyErr_SetString(PyExc_ValueError, "decode: null pointer, or shapes that do not fit "
                                          "(n_heads a multiple of n_kv, 0 < end <= cap <= 2^30, "
                                          "n_heads and head_dim <= 65536)");
        return NULL;
    }
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = attend(&a, threads);
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return decode_kv(args, nargs, 0);
}

static PyObject *py_decode_kv16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return decode_kv(args, nargs, 1);
}

/* ---- several query rows of one session (a prefill chunk, a verify step): attend_rows ----

   out[t, h] = softmax(q[t, h] · K[g][0 .. start+t]ᵀ · scale) · V[g][0 .. start+t]   (causal, GQA)

for the T rows at positions [start, start+T) whose K and V are already in the caches. Before this,
such a step converted a half cache's [0, end) to float32 for torch's SDPA every layer (a 1B-shaped
layer, 5 rows at 4000 positions: ~5 ms against 1.6 on float32 caches).

Flash attention with the rows in the vector lanes: a tile is W folded rows of one KV head (row r
is position t = r / group of head g·group + r % group, so a tile's rows are near one another and
see nearly the same keys), its Q transposed to [head_dim][W] once; keys go by blocks of RK, a half
block converted to float32 once for up to TG tiles of the head that run together. Per block and tile: scores [RK][W] (every lane's dot product in
dimension order), the causal mask (a key past a lane's position is −inf), the online softmax
(m = max(m, s), corr = e^(m_old − m), p = e^(s − m), l = l·corr + Σp in key order) and
O[d][W] = O·corr + Σ p·v in key order. Then out = O / l.

Every lane computes its row alone, in an order that depends on neither the lane width, nor the
tile, nor the other rows, nor the threads: a masked key adds exactly nothing (its score is −inf,
so p = 0 in l, and it is left out of O even where V holds inf or NaN; a block of masked keys has
corr = 1) and blocks start at key 0. So the portable loop, AVX2 (8 lanes) and AVX-512 (16) give the same bits, a
row gives the same bits whatever rows come with it, and a half cache gives the bits a float32 cache
holding the same values gives. No fused multiply-adds, as above. Not the decode kernel's bits (its
dot products go by 8-lane partial sums and its softmax by one max over every position). */
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

/* attend_rows' tiles for g_isa (the decode kernels are AVX2's under "avx512" too) */
static void pick_tiles(void) {
    const tiles_t *t = &TILES_C;
#ifdef AT_X86
    if (!strcmp(g_isa, "avx2")) t = &TILES_AVX2;
    else if (!strcmp(g_isa, "avx512")) t = &TILES_AVX512;
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
    if (!parse_args(args, nargs, 11, 1,
                    kv16 ? "attend_rows_kv16(q, q_stride, k, v, out, T, start, n_heads, n_kv, head_dim, cap, scale, threads)"
                         : "attend_rows(q, q_stride, k, v, out, T, start, n_heads, n_kv, head_dim, cap, scale, threads)",
                    v, &scale))
        return NULL;
    const long long threads = v[11];
    rows_t a = {(const float *)(intptr_t)v[0], v[1], (const void *)(intptr_t)v[2], (const void *)(intptr_t)v[3],
                (float *)(intptr_t)v[4], v[5], v[6], v[7], v[8], v[9], v[10], (float)scale, kv16};
    if (!a.q || !a.k || !a.v || !a.out || a.nh <= 0 || a.nkv <= 0 || a.nh % a.nkv || a.hd <= 0 || a.T <= 0
            || a.nh > (1 << 16) || a.hd > (1 << 16) || a.T > (1 << 20) || a.cap > (1LL << 30)
            || a.start < 0 || a.start > a.cap - a.T || a.qs < a.nh * a.hd) {  /* (no sum that can overflow) */
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

static PyObject *py_attend_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return attend_rows_kv(args, nargs, 0);
}

static PyObject *py_attend_rows_kv16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return attend_rows_kv(args, nargs, 1);
}

/* to_f16(src, dst, n, 0.0): n float32 → half, rounded as the caches are written (for tests) */
static PyObject *py_to_f16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int64_t v[3];
    double unused;
    if (!parse_args(args, nargs, 3, 0, "to_f16(src, dst, n, 0.0)", v, &unused)) return NULL;
    if (!v[0] || !v[1] || v[2] < 0) {
        PyErr_SetString(PyExc_ValueError, "to_f16: null pointer or negative size");
        return NULL;
    }
    const float *src = (const float *)(intptr_t)v[0];
    uint16_t *dst = (uint16_t *)(intptr_t)v[1];
    for (int64_t i = 0; i < v[2]; i++) dst[i] = f2h(src[i]);
    Py_RETURN_NONE;
}

static void rms_rows(const float *x, const float *w, float *out, int64_t rows, int64_t k, double eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * k;
        float *o = out + r * k;
        double ss = 0.0;
        for (int64_t i = 0; i < k; i++) ss += (double)xr[i] * (double)xr[i];
        const float inv = (float)(1.0 / sqrt(ss / (double)k + eps));
        for (int64_t i = 0; i < k; i++) o[i] = (xr[i] * w[i]) * inv;
    }
}

static PyObject *py_rms_norm_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int64_t v[5];
    double eps;
    if (!parse_args(args, nargs, 5, 0, "rms_norm_rows(x, w, out, rows, k, eps)", v, &eps)) return NULL;
    const float *x = (const float *)(intptr_t)v[0], *w = (const float *)(intptr_t)v[1];
    float *out = (float *)(intptr_t)v[2];
    const int64_t rows = v[3], k = v[4];
    if (!x || !w || !out || rows <= 0 || k <= 0 || rows > (1LL << 40) / k) {
        PyErr_SetString(PyExc_ValueError, "rms_norm_rows: null pointer or empty shape");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rms_rows(x, w, out, rows, k, eps);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* silu(gate) · up row by row: gu [rows, 2f] (gate then up, as gate_up gives them) → out [rows, f].
   silu(g) = g · σ(g), σ from e = exp(−|g|) (an argument <= 0, exp_c's range): 1/(1+e) or e/(1+e). */
static inline float silu_c(float g) {
    const float e = exp_c(-fabsf(g));
    return g * (g >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e));
}

static void silu_mul(const float *gu, float *out, int64_t rows, int64_t f) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < f; i++) out[r * f + i] = silu_c(gu[r * 2 * f + i]) * gu[r * 2 * f + f + i];
}

static PyObject *py_silu_mul_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int64_t v[4];
    double unused;
    if (!parse_args(args, nargs, 4, 0, "silu_mul_rows(gu, out, rows, f, 0.0)", v, &unused)) return NULL;
    const int64_t rows = v[2], f = v[3];
    if (!v[0] || !v[1] || rows <= 0 || f <= 0 || rows > (1LL << 40) / f) {
        PyErr_SetString(PyExc_ValueError, "silu_mul_rows: null pointer or empty shape");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    silu_mul((const float *)(intptr_t)v[0], (float *)(intptr_t)v[1], rows, f);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ---- a whole block's decode step (one session's one row) in one call ----
   The same operations, in the same order, as block_forward_many's unfused path takes for rows of a
   decode step (rms_rows, qgemm's product through its `gemm_c_v1` capsule, rms_rows per Q/K head,
   rope_attend, a float add, silu_mul): the same bits, without ~60 µs a layer of Python between
   them (the 110M bench model's 12 layers: a fifth of its decode step). */
typedef int (*qgemm_gemm_fn)(const int8_t *, const float *, int64_t, int64_t, const float *, int64_t, float *,
                             const float *, int, const int32_t *);
static qgemm_gemm_fn g_gemm = NULL;

#define DESC_LEN 22  /* the block's layout, made once in Python (block.decode_layout) */
enum { D_ATTN_NORM, D_FFN_NORM, D_Q_NORM, D_K_NORM, D_QKV_W, D_QKV_S, D_QKV_B, D_OUT_W, D_OUT_S, D_OUT_B, D_GU_W,
       D_GU_S, D_GU_B, D_DN_W, D_DN_S, D_DN_B, D_H, D_NH, D_NKV, D_HD, D_FFN, D_NROT };

static PyObject *block_decode_kv(PyObject *const *args, Py_ssize_t nargs, int kv16) {
    if (nargs != 12 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != DESC_LEN) {
        PyErr_SetString(PyExc_TypeError, kv16 ? "block_decode_kv16(layout, x, y, k, v, cos, sin, cap, pos, eps, scale, "
                                                "threads)"
                                              : "block_decode(layout, x, y, k, v, cos, sin, cap, pos, eps, scale, threads)");
        return NULL;
    }
    int64_t d[DESC_LEN], v[8];
    for (int i = 0; i < DESC_LEN; i++) {
        long long x = PyLong_AsLongLong(PyTuple_GET_ITEM(args[0], i));
        if (x == -1 && PyErr_Occurred()) return NULL;
        d[i] = (int64_t)x;
    }
    double eps;
    if (!parse_args(args + 1, 9, 8, 0, "block_decode", v, &eps)) return NULL;
    const double scale = PyFloat_AsDouble(args[10]);
    if (scale == -1.0 && PyErr_Occurred()) return NULL;
    const long long threads = PyLong_AsLongLong(args[11]);
    if (threads == -1 && PyErr_Occurred()) return NULL;
    if (!g_gemm) {
        g_gemm = (qgemm_gemm_fn)PyCapsule_Import("node.inference.weights._qgemm.gemm_c_v1", 0);
        if (!g_gemm) return NULL;
    }
    const float *x = (const float *)(intptr_t)v[0], *cs = (const float *)(intptr_t)v[4];
    const float *sn = (const float *)(intptr_t)v[5];
    float *y = (float *)(intptr_t)v[1];
    void *kc = (void *)(intptr_t)v[2], *vc = (void *)(intptr_t)v[3];
    const int64_t cap = v[6], pos = v[7];
    const int64_t H = d[D_H], nh = d[D_NH], nkv = d[D_NKV], hd = d[D_HD], f = d[D_FFN], n_rot = d[D_NROT];
    const int norms = d[D_Q_NORM] != 0;
    if (!x || !y || !kc || !vc || !cs || !sn || !d[D_ATTN_NORM] || !d[D_FFN_NORM] || !d[D_QKV_W] || !d[D_OUT_W]
            || !d[D_GU_W] || !d[D_DN_W] || (norms && !d[D_K_NORM]) || H <= 0 || nh <= 0 || nkv <= 0 || nh % nkv
            || hd <= 0 || f <= 0 || n_rot <= 0 || n_rot > hd || n_rot % 2 || pos < 0 || pos >= cap
            || nh > (1 << 16) || hd > (1 << 16) || H > (1 << 20) || f > (1 << 22) || cap > (1LL << 30)) {
        PyErr_SetString(PyExc_ValueError, "block_decode: null pointer, or shapes that do not fit");
        return NULL;
    }
    const int64_t nq = nh * hd, nqkv = (nh + 2 * nkv) * hd;
    float *buf = (float *)malloc((size_t)(3 * H + nqkv + (nh + nkv) * hd + nq + 3 * f) * sizeof(float));
    if (!buf) return PyErr_NoMemory();
    float *h = buf, *qkv = h + H, *qkn = qkv + nqkv, *att = qkn + (nh + nkv) * hd, *x2 = att + nq, *t = x2 + H;
    float *gu = t + H, *act = gu + 2 * f;
    const float *q_norm = (const float *)(intptr_t)d[D_Q_NORM], *k_norm = (const float *)(intptr_t)d[D_K_NORM];
    const int nt = threads < 1 ? 1 : threads > 1024 ? 1024 : (int)threads;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    do {  /* a product that cannot get its buffers ends the step (MemoryError; y is not written) */
        rms_rows(x, (const float *)(intptr_t)d[D_ATTN_NORM], h, 1, H, eps);
        if ((failed = g_gemm((const int8_t *)(intptr_t)d[D_QKV_W], (const float *)(intptr_t)d[D_QKV_S], nqkv, H, h, 1,
                             qkv, (const float *)(intptr_t)d[D_QKV_B], nt, NULL)))
            break;
        const float *qk = qkv;
        if (norms) {
            rms_rows(qkv, q_norm, qkn, nh, hd, eps);
            rms_rows(qkv + nq, k_norm, qkn + nq, nkv, hd, eps);
            qk = qkn;
        }
        if ((failed = rope_attend(qk, qkv + (nh + nkv) * hd, cs, sn, kc, vc, att, nh, nkv, hd, n_rot, cap, pos,
                                  (float)scale, threads, kv16)))
            break;
        if ((failed = g_gemm((const int8_t *)(intptr_t)d[D_OUT_W], (const float *)(intptr_t)d[D_OUT_S], H, nq, att, 1,
                             t, (const float *)(intptr_t)d[D_OUT_B], nt, NULL)))
            break;
        for (int64_t i = 0; i < H; i++) x2[i] = x[i] + t[i];
        rms_rows(x2, (const float *)(intptr_t)d[D_FFN_NORM], h, 1, H, eps);
        if ((failed = g_gemm((const int8_t *)(intptr_t)d[D_GU_W], (const float *)(intptr_t)d[D_GU_S], 2 * f, H, h, 1,
                             gu, (const float *)(intptr_t)d[D_GU_B], nt, NULL)))
            break;
        silu_mul(gu, act, 1, f);
        if ((failed = g_gemm((const int8_t *)(intptr_t)d[D_DN_W], (const float *)(intptr_t)d[D_DN_S], H, f, act, 1, t,
                             (const float *)(intptr_t)d[D_DN_B], nt, NULL)))
            break;
        for (int64_t i = 0; i < H; i++) y[i] = x2[i] + t[i];
    } while (0);
    Py_END_ALLOW_THREADS
    free(buf);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_block_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return block_decode_kv(args, nargs, 0);
}

static PyObject *py_block_decode_kv16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return block_decode_kv(args, nargs, 1);
}

static PyObject *py_isa(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    return PyUnicode_FromString(g_isa);
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg) {
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    head_fn was_head = g_head, was_head16 = g_head16;
    const char *was_isa = g_isa;
    pick_isa();
    if (!strcmp(name, "c")) {
        g_head = head_c;
        g_head16 = head_c16;
        g_isa = "c";
    } else if (!strcmp(name, "avx2") && !strcmp(g_isa, "avx512")) {
        g_isa = "avx2";
    } else if (strcmp(name, g_isa)) {
        const char *best = g_isa;
        g_head = was_head;  /* a refused name changes nothing */
        g_head16 = was_head16;
        g_isa = was_isa;
        PyErr_Format(PyExc_ValueError, "isa %s is not available here (best: %s)", name, best);
        return NULL;
    }
    pick_tiles();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode", (PyCFunction)(void (*)(void))py_decode, METH_FASTCALL, "one query row's attention (see module doc)"},
    {"rope_decode", (PyCFunction)(void (*)(void))py_rope_decode, METH_FASTCALL,
     "a decode step's rotation, cache append and attention (see module doc)"},
    {"rms_norm_rows", (PyCFunction)(void (*)(void))py_rms_norm_rows, METH_FASTCALL, "RMSNorm row by row (see module doc)"},
    {"silu_mul_rows", (PyCFunction)(void (*)(void))py_silu_mul_rows, METH_FASTCALL, "silu(gate) * up row by row"},
    {"block_decode", (PyCFunction)(void (*)(void))py_block_decode, METH_FASTCALL, "a block's decode step (see above)"},
    {"decode_kv16", (PyCFunction)(void (*)(void))py_decode_kv16, METH_FASTCALL, "decode over half caches"},
    {"rope_decode_kv16", (PyCFunction)(void (*)(void))py_rope_decode_kv16, METH_FASTCALL, "rope_decode, half caches"},
    {"block_decode_kv16", (PyCFunction)(void (*)(void))py_block_decode_kv16, METH_FASTCALL, "block_decode, half caches"},
    {"attend_rows", (PyCFunction)(void (*)(void))py_attend_rows, METH_FASTCALL,
     "several query rows of one session, causal (see attend_rows)"},
    {"attend_rows_kv16", (PyCFunction)(void (*)(void))py_attend_rows_kv16, METH_FASTCALL, "attend_rows, half caches"},
    {"to_f16", (PyCFunction)(void (*)(void))py_to_f16, METH_FASTCALL, "float32 -> half as the caches are written"},
    {"isa", py_isa, METH_NOARGS, "the instruction set in use"},
    {"set_isa", py_set_isa, METH_O, "use the portable loop (\"c\") or the best one again"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_attend", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__attend(void) {
    pick_isa();
    pick_tiles();
    return PyModule_Create(&module);
}
