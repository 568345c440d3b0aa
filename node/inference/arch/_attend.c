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
        T rows of one session at positions [start, start+T), causal (in _attend_rows.c);
        attend_rows_kv16 over half caches
    isa() -> "avx512" | "avx2" | "c" (avx512: attend_rows' tiles; the decode kernels are AVX2's);
    set_isa("c" | "avx2" | the best) for tests and benches, never while a kernel runs
*/
#include "_attend.h"

typedef struct {
    const float *q;
    const void *k, *v;  /* float32, or IEEE half (uint16_t) when kv16 */
    float *out;
    int64_t nh, nkv, hd, cap, end;
    float scale;
    int kv16;
} att_t;


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
#ifdef _OPENMP
    int failed = 0;
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


#ifndef ATTEND_NO_PYTHON  /* the module (a C test harness builds the kernels above without it) */
/* The entry points take n integers (addresses, sizes), then a float, then (threaded ones) a
   thread count: into v[0..n), *f and v[n]. 1, or 0 with the Python error set. */
int at_parse_args(PyObject *const *args, Py_ssize_t nargs, int n, int threaded, const char *usage,
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
    if (!at_parse_args(args, nargs, 13, 1, kv16 ? "rope_decode_kv16(qk, vrow, cos, sin, k, v, out, n_heads, n_kv, "
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
    if (!at_parse_args(args, nargs, 9, 1,
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


/* to_f16(src, dst, n, 0.0): n float32 → half, rounded as the caches are written (for tests) */
static PyObject *py_to_f16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int64_t v[3];
    double unused;
    if (!at_parse_args(args, nargs, 3, 0, "to_f16(src, dst, n, 0.0)", v, &unused)) return NULL;
    if (!v[0] || !v[1] || v[2] < 0) {
        PyErr_SetString(PyExc_ValueError, "to_f16: null pointer or negative size");
        return NULL;
    }
    const float *src = (const float *)(intptr_t)v[0];
    uint16_t *dst = (uint16_t *)(intptr_t)v[1];
    for (int64_t i = 0; i < v[2]; i++) dst[i] = f2h(src[i]);
    Py_RETURN_NONE;
}

/* Row-wise helpers of any number of rows, every row computed alone (its bits do not depend on the
   other rows, their number or the threads): a prefill's rows as a decode step's. */
#define ROWS_PAR_MIN (1 << 16)  /* elements below which a second thread costs more than it saves */
static inline int rows_threads(int64_t rows, int64_t k, int threads) {
    return rows < 2 || rows * k < ROWS_PAR_MIN ? 1 : threads < 1 ? 1 : threads > rows ? (int)rows : threads;
}

static void rms_rows(const float *x, const float *w, float *out, int64_t rows, int64_t k, double eps, int threads) {
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(rows_threads(rows, k, threads)) schedule(static) if (rows_threads(rows, k, threads) > 1)
#endif
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
    int64_t v[6];
    double eps;
    if (!at_parse_args(args, nargs, 5, 1, "rms_norm_rows(x, w, out, rows, k, eps, threads)", v, &eps)) return NULL;
    const float *x = (const float *)(intptr_t)v[0], *w = (const float *)(intptr_t)v[1];
    float *out = (float *)(intptr_t)v[2];
    const int64_t rows = v[3], k = v[4];
    if (!x || !w || !out || rows <= 0 || k <= 0 || rows > (1LL << 40) / k) {
        PyErr_SetString(PyExc_ValueError, "rms_norm_rows: null pointer or empty shape");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rms_rows(x, w, out, rows, k, eps, (int)v[5]);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* silu(gate) · up row by row: gu [rows, 2f] (gate then up, as gate_up gives them) → out [rows, f].
   silu(g) = g · σ(g), σ from e = exp(−|g|) (an argument <= 0, exp_c's range): 1/(1+e) or e/(1+e). */
static inline float silu_c(float g) {
    const float e = exp_c(-fabsf(g));
    return g * (g >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e));
}

static void silu_row_c(const float *g, const float *u, float *o, int64_t f) {
    for (int64_t i = 0; i < f; i++) o[i] = silu_c(g[i]) * u[i];
}

#ifdef AT_X86
/* silu_row_c on 8 lanes, the same operations in the same order (exp_avx2 is exp_c's): the same bits */
__attribute__((target("avx2"))) static void silu_row_avx2(const float *g, const float *u, float *o, int64_t f) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= f; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 e = exp_avx2(_mm256_or_ps(gv, sign));  /* exp(−|g|) */
        const __m256 d = _mm256_add_ps(one, e);
        const __m256 sig = _mm256_blendv_ps(_mm256_div_ps(e, d), _mm256_div_ps(one, d), _mm256_cmp_ps(gv, zero, _CMP_GE_OQ));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + i)));
    }
    silu_row_c(g + i, u + i, o + i, f - i);
}
#endif

static void silu_mul(const float *gu, float *out, int64_t rows, int64_t f, int threads) {
    void (*row)(const float *, const float *, float *, int64_t) = silu_row_c;
#ifdef AT_X86
    if (strcmp(g_isa, "c")) row = silu_row_avx2;  /* every SIMD path here has AVX2 */
#endif
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(rows_threads(rows, f, threads)) schedule(static) if (rows_threads(rows, f, threads) > 1)
#endif
    for (int64_t r = 0; r < rows; r++) row(gu + r * 2 * f, gu + r * 2 * f + f, out + r * f, f);
}

static PyObject *py_silu_mul_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int64_t v[5];
    double unused;
    if (!at_parse_args(args, nargs, 4, 1, "silu_mul_rows(gu, out, rows, f, 0.0, threads)", v, &unused)) return NULL;
    const int64_t rows = v[2], f = v[3];
    if (!v[0] || !v[1] || rows <= 0 || f <= 0 || rows > (1LL << 40) / f) {
        PyErr_SetString(PyExc_ValueError, "silu_mul_rows: null pointer or empty shape");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    silu_mul((const float *)(intptr_t)v[0], (float *)(intptr_t)v[1], rows, f, (int)v[4]);
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
    if (!at_parse_args(args + 1, 9, 8, 0, "block_decode", v, &eps)) return NULL;
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
        rms_rows(x, (const float *)(intptr_t)d[D_ATTN_NORM], h, 1, H, eps, 1);
        if ((failed = g_gemm((const int8_t *)(intptr_t)d[D_QKV_W], (const float *)(intptr_t)d[D_QKV_S], nqkv, H, h, 1,
                             qkv, (const float *)(intptr_t)d[D_QKV_B], nt, NULL)))
            break;
        const float *qk = qkv;
        if (norms) {
            rms_rows(qkv, q_norm, qkn, nh, hd, eps, 1);
            rms_rows(qkv + nq, k_norm, qkn + nq, nkv, hd, eps, 1);
            qk = qkn;
        }
        if ((failed = rope_attend(qk, qkv + (nh + nkv) * hd, cs, sn, kc, vc, att, nh, nkv, hd, n_rot, cap, pos,
                                  (float)scale, threads, kv16)))
            break;
        if ((failed = g_gemm((const int8_t *)(intptr_t)d[D_OUT_W], (const float *)(intptr_t)d[D_OUT_S], H, nq, att, 1,
                             t, (const float *)(intptr_t)d[D_OUT_B], nt, NULL)))
            break;
        for (int64_t i = 0; i < H; i++) x2[i] = x[i] + t[i];
        rms_rows(x2, (const float *)(intptr_t)d[D_FFN_NORM], h, 1, H, eps, 1);
        if ((failed = g_gemm((const int8_t *)(intptr_t)d[D_GU_W], (const float *)(intptr_t)d[D_GU_S], 2 * f, H, h, 1,
                             gu, (const float *)(intptr_t)d[D_GU_B], nt, NULL)))
            break;
        silu_mul(gu, act, 1, f, 1);
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
    at_pick_tiles(g_isa);
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
    at_pick_tiles(g_isa);
    return PyModule_Create(&module);
}
#endif
