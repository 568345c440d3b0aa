/* The attention kernels' portable loop built for aarch64 (run under qemu-user by
   tests/inference/test_kernels_aarch64.py), where half caches are read by the hardware's
   conversion (h2f) instead of bit by bit (h2f_bits):
   - h2f gives h2f_bits' float for every one of the 65536 halves that is a number (NaN for a NaN);
   - a decode step over half caches gives the same bits as over float32 caches holding the same
     values, on 1 and 2 threads, and is within 2e-6 of a float64 reference.
   The kernel's source is included whole, built without its Python module (ATTEND_NO_PYTHON). */
#include "_attend.c"
#include <stdio.h>

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }
static float frand(void) { return (float)((double)(next() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

static int check_halves(void) {
    int bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        const uint16_t h = (uint16_t)i;
        const float a = h2f(h), b = h2f_bits(h);
        if (((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff)) bad += !(a != a);  /* NaN: a NaN */
        else bad += memcmp(&a, &b, sizeof a) != 0;
    }
    printf("halves: %d of 65536 differ\n", bad);
    return bad != 0;
}

static int check_decode(int64_t nh, int64_t nkv, int64_t hd, int64_t end, int threads) {
    const int64_t cap = end + 3;
    float *q = malloc(nh * hd * 4), *k32 = malloc(nkv * cap * hd * 4), *v32 = malloc(nkv * cap * hd * 4);
    uint16_t *k16 = malloc(nkv * cap * hd * 2), *v16 = malloc(nkv * cap * hd * 2);
    float *o32 = malloc(nh * hd * 4), *o16 = malloc(nh * hd * 4);
    for (int64_t i = 0; i < nh * hd; i++) q[i] = frand();
    for (int64_t i = 0; i < nkv * cap * hd; i++) {  /* the same values in both caches */
        k16[i] = f2h(frand() * 2.0f); v16[i] = f2h(frand());
        k32[i] = h2f_bits(k16[i]); v32[i] = h2f_bits(v16[i]);
    }
    const float scale = 1.0f / sqrtf((float)hd);
    att_t a32 = {q, k32, v32, o32, nh, nkv, hd, cap, end, scale, 0}, a16 = {q, k16, v16, o16, nh, nkv, hd, cap, end, scale, 1};
    if (attend(&a32, threads) || attend(&a16, threads)) return 1;
    int same = memcmp(o32, o16, nh * hd * 4) == 0;
    double worst = 0.0;
    for (int64_t h = 0; h < nh; h++) {  /* float64 reference */
        const int64_t base = (h / (nh / nkv)) * cap * hd;
        double m = -1e300, *s = malloc(end * sizeof(double)), sum = 0.0;
        for (int64_t t = 0; t < end; t++) {
            double d = 0.0;
            for (int64_t i = 0; i < hd; i++) d += (double)q[h * hd + i] * k32[base + t * hd + i];
            s[t] = d * scale; m = s[t] > m ? s[t] : m;
        }
        for (int64_t t = 0; t < end; t++) { s[t] = exp(s[t] - m); sum += s[t]; }
        for (int64_t i = 0; i < hd; i++) {
            double o = 0.0;
            for (int64_t t = 0; t < end; t++) o += s[t] * v32[base + t * hd + i];
            double err = fabs(o / sum - o16[h * hd + i]);
            worst = err > worst ? err : worst;
        }
        free(s);
    }
    printf("decode nh=%lld nkv=%lld hd=%lld end=%lld threads=%d same_bits=%d max_err=%.2e\n", (long long)nh,
           (long long)nkv, (long long)hd, (long long)end, threads, same, worst);
    return !(same && worst < 2e-6);
}

int main(void) {
    pick_isa();
    int fails = check_halves();
    int64_t shapes[][4] = {{4, 2, 64, 1}, {8, 2, 64, 37}, {32, 8, 64, 300}, {6, 6, 80, 1000}, {14, 2, 128, 129}};
    for (int s = 0; s < 5; s++)
        for (int th = 1; th <= 2; th++) fails += check_decode(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], th);
    printf("isa=%s %s\n", g_isa, fails ? "FAIL" : "all exact");
    return fails != 0;
}
