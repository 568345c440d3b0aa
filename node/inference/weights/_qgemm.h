/* What the two files of the `_qgemm` extension share: _qgemm.c (the portable loop, the dispatch,
   threads, activation quantization and the module) and _qgemm_x86.c (the AVX2, AVX-512 and VNNI
   kernels; empty elsewhere). The static inline helpers are compiled into each. */
#ifndef SWARM_QGEMM_H
#define SWARM_QGEMM_H

/* Every path rounds as the portable loop does: no fused multiply-adds made from v * s + b */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif
#ifndef QGEMM_NO_PYTHON
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#endif
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

#if defined(__GNUC__) || defined(__clang__)
#define QG_INTERNAL __attribute__((visibility("hidden")))  /* shared by the two files, not exported */
#else
#define QG_INTERNAL
#endif

#ifdef QG_X86
/* _qgemm_x86.c: a range of output rows [n0, n1) on each instruction set, and AVX2's quantizer */
QG_INTERNAL void qg_rows_avx2(const job_t *j, int64_t n0, int64_t n1);
QG_INTERNAL void qg_rows_avx512(const job_t *j, int64_t n0, int64_t n1);
QG_INTERNAL void qg_rows_avx512vnni(const job_t *j, int64_t n0, int64_t n1);
QG_INTERNAL void qg_rows_vnni_a8(const job_t *j, int64_t n0, int64_t n1);
QG_INTERNAL void qg_quantize_row_avx2(const float *xr, int64_t k, int64_t kp, float qmax, int16_t *q, float *xs);
#endif

#endif
