/* qgemm's portable loop built for another CPU (aarch64, run under qemu-user by
   tests/inference/test_kernels_aarch64.py): the product of every shape below, on 1 and 2 threads,
   must be the exact integer product, scaled as store_tile() scales it, bit for bit. The kernel's
   source is included whole, built without its Python module (QGEMM_NO_PYTHON). */
#include "_qgemm.c"
#include <stdio.h>

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }
static float frand(void) { return (float)((double)(next() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

static int check(int64_t n, int64_t k, int64_t t, int threads, int extreme) {
    int64_t kp = (k + KC - 1) / KC * KC, blocks = (n + NR - 1) / NR;
    int8_t *q = malloc(n * k), *packed = calloc(blocks * NR * kp, 1);
    float *s = malloc(n * 4), *x = malloc(t * k * 4), *y = malloc(t * n * 4), *bias = malloc(n * 4);
    for (int64_t i = 0; i < n * k; i++)  /* extreme: every weight at ±127 (row 0 all +), every input at full scale */
        q[i] = extreme ? (int8_t)(i < k || next() % 2 ? 127 : -127) : (int8_t)((int)(next() % 255) - 127);
    for (int64_t i = 0; i < n; i++) { s[i] = 0.01f + frand() * 0.001f; bias[i] = frand(); }
    for (int64_t i = 0; i < t * k; i++) x[i] = extreme ? 3.0f : frand() * 3.0f;
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t c = 0; c < kp; c += KC)
            for (int r = 0; r < NR; r++) {
                int64_t row = b * NR + r, len = k - c < KC ? k - c : KC;
                if (row < n) memcpy(packed + b * NR * kp + c * NR + r * KC, q + row * k + c, (size_t)len);
            }
    if (qgemm_gemm(packed, s, n, k, x, t, y, bias, threads, NULL) != 0) return 1;
    int16_t *xq = calloc(t * kp, 2); float *xs = malloc(t * 4);
    quantize(x, t, k, kp, qmax_for(k), xq, xs, 1);
    int bad = 0;
    for (int64_t tt = 0; tt < t; tt++)
        for (int64_t r = 0; r < n; r++) {
            int64_t acc = 0;
            for (int64_t i = 0; i < k; i++) acc += (int64_t)q[r * k + i] * xq[tt * kp + i];
            float v = (float)acc * s[r] * xs[tt] + bias[r];
            if (memcmp(&v, &y[tt * n + r], 4) != 0) bad++;
        }
    printf("isa=%s n=%lld k=%lld t=%lld threads=%d extreme=%d mismatches=%d\n", g_isa, (long long)n,
           (long long)k, (long long)t, threads, extreme, bad);
    return bad != 0;
}

int main(void) {
    pick_isa();
    int64_t shapes[][2] = {{64, 64}, {37, 45}, {130, 300}, {1, 1}, {259, 1027}, {6, 14336}};
    int64_t ts[] = {1, 2, 3, 5, 9, 33};
    int fails = 0;
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++)
            for (int th = 1; th <= 2; th++) fails += check(shapes[a][0], shapes[a][1], ts[b], th, 0);
    for (int b = 0; b < 6; b++) fails += check(6, 14336, ts[b], 2, 1);
    printf("%s\n", fails ? "FAIL" : "all exact");
    return fails != 0;
}
