/* The slice engine's own int8 matrix product: y[T, N] = (x[T, K] · W[N, K]ᵀ) · s[N] + b[N].

W: int8 per output row with float32 scales s, in a blocked layout (pack(): [n/NR][kp/KC][NR][KC],
one contiguous stream per 4 rows, zero padded). That layout is what the weight cache stores and
what runs: no prepack, so a cached load is a file mapping. x: float32, quantized here per row
(token) to int16 with the largest magnitude that cannot overflow an int32 lane (K/8 products per
lane: 32767 for K ≤ 4120, fewer steps beyond; a row's lanes are summed in int64), so activations
keep 13–15 bits, finer than fbgemm's 7, and need no residual pass. The price: int16 products run
at half the rate of int8 ones (vpmaddwd / vpdpwssd against vpmaddubsw / vpdpbusd), which long
prefills feel; decode is bound by reading the weights and gains from the single packed stream.
So a caller may ask for 8-bit activations (per token, ±127 steps) for a long prefill's less
sensitive matrices: on VNNI they run through vpdpbusd over the same packed weights (qg_rows_vnni_a8),
elsewhere through the 16-bit kernels with the same integers (the same results, no faster).

Kernels: AVX-512BW (+VNNI's vpdpwssd when present) and AVX2 (in _qgemm_x86.c), chosen at run time
by cpuid, and a portable C loop written for the compiler to vectorize (here; what ARM runs). GCC /
clang; another compiler builds the C loop only. Threads: OpenMP, sharing
torch's runtime (see run()). Every entry point releases the GIL.

Python API (all pointers are addresses, e.g. tensor.data_ptr()):
    gemm(w, s, n, k, x, t, y, bias, threads[, wsum])   bias 0 = none; w packed by pack();
                                                       wsum = row_sums(w): 8-bit activations
    pack(q, n, k, out), packed_size(n, k), row_sums(w, n, k, out)
    gemm_c_v1: a capsule of the C function behind gemm (qgemm_gemm_fn), for other extensions
    isa() -> "avx512vnni" | "avx512" | "avx2" | "c"
    set_isa(name)                              for tests and the bench: force a slower path
*/
#include "_qgemm.h"

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


/* ---- the path in use ---- */
static range_fn g_rows = rows_c;
static const char *g_isa = "c";

static void pick_isa(void) {
#ifdef QG_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni")) {
        g_rows = qg_rows_avx512vnni; g_isa = "avx512vnni"; return;
    }
    if (__builtin_cpu_supports("avx512bw")) { g_rows = qg_rows_avx512; g_isa = "avx512"; return; }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) { g_rows = qg_rows_avx2; g_isa = "avx2"; return; }
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


static void quantize(const float *x, int64_t t, int64_t k, int64_t kp, float qmax, int16_t *xq, float *xs,
                     int threads) {
    void (*row)(const float *, int64_t, int64_t, float, int16_t *, float *) = quantize_row_c;
#ifdef QG_X86
    if (g_rows != rows_c) row = qg_quantize_row_avx2;  /* every SIMD path here has AVX2 */
#endif
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(t >= 8 ? threads : 1) schedule(static)
#endif
    for (int64_t r = 0; r < t; r++) row(x + r * k, k, kp, qmax, xq + r * kp, xs + r);
}

/* The product itself, callable without the GIL (py_gemm, and other extensions through the
   `gemm_c_v1` capsule: the slice engine's fused decode step). 0, or -1 when a buffer cannot be had. */
static int qgemm_gemm(const int8_t *w, const float *s, int64_t n, int64_t k, const float *x, int64_t t, float *y,
                      const float *bias, int threads, const int32_t *wsum) {
    const int a8 = wsum != NULL;
    const int64_t kp = (k + KC - 1) / KC * KC;
    range_fn rows = g_rows;
#ifdef QG_X86
    if (a8 && g_rows == qg_rows_avx512vnni) rows = qg_rows_vnni_a8;
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

#ifndef QGEMM_NO_PYTHON  /* the module (a C test harness builds the kernels without Python) */
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
    range_fn fns[] = {qg_rows_avx512vnni, qg_rows_avx512, qg_rows_avx2, rows_c};
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
#endif
