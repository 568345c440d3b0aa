/* What the two halves of the `_attend` extension share: _attend.c (a decode step's attention, the
   row-wise norms, a block's decode step, the module) and _attend_rows.c (several rows of one
   session at once: attend_rows). The static inline helpers are compiled into each. */
#ifndef SWARM_ATTEND_H
#define SWARM_ATTEND_H

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif
#ifndef ATTEND_NO_PYTHON  /* a C test harness builds the kernels without the module */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#endif
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

/* IEEE half <-> float32. half -> float is exact; float -> half rounds to nearest, ties to even
   (as torch's and F16C's conversions do: a cache written here or by torch holds the same bits),
   overflow to infinity, NaN stays NaN (its payload is not kept: every NaN is written 0x7e00, and
   "the same bits" holds for the numbers). A K or V value beyond 65504 is infinity in the cache,
   as in llama.cpp's f16 cache: that head's scores are NaN from then on. h2f_bits is the portable
   conversion; h2f is it, or on ARM the hardware's (fcvt, which every AArch64 CPU has: the same
   float for every half that is a number, and which the compiler vectorizes), since reading a half
   cache is the portable decode loop's hot path (bit by bit it cost 10x a float32 cache's read). */
static inline float h2f_bits(uint16_t h) {
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

#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
static inline float h2f(uint16_t h) {
    __fp16 x;
    memcpy(&x, &h, sizeof x);
    return (float)x;
}
#else
#define h2f h2f_bits
#endif

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

#ifdef AT_X86
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
#endif

#ifndef ATTEND_NO_PYTHON
/* _attend.c */
/* The entry points take n integers (addresses, sizes), then a float, then (threaded ones) a
   thread count: into v[0..n), *f and v[n]. 1, or 0 with the Python error set. */
int at_parse_args(PyObject *const *args, Py_ssize_t nargs, int n, int threaded, const char *usage,
                      int64_t *v, double *f);

/* _attend_rows.c: the entry points, and the tile set for an instruction set ("c", "avx2", "avx512") */
PyObject *py_attend_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_attend_rows_kv16(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
#endif
void at_pick_tiles(const char *isa);

#endif
