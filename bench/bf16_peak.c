/* Peak of vdpbf16ps against vfmadd231ps on one core: a register-only loop of 24 independent
 * accumulators each, timed in thread CPU time (a busy machine's preemption does not count), five
 * repetitions. The README's "Mixed precision (bf16)" quotes it: on a CPU where the ratio is below 1,
 * AVX-512 BF16 cannot make a compute-bound product faster than fp32.
 *
 *   cc -O2 bench/bf16_peak.c -o /tmp/bf16_peak && /tmp/bf16_peak */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

enum { ACC = 24 };

static double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* GFLOP/s of n rounds of ACC vdpbf16ps: 16 lanes x 2 products x 2 flops each. */
__attribute__((target("avx512f,avx512bf16"))) static double bf16_gflops(long n) {
    __m512 acc[ACC];
    for (int i = 0; i < ACC; i++) acc[i] = _mm512_setzero_ps();
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3f00);
    double t = cpu_s();
    for (long r = 0; r < n; r++) {
#pragma GCC unroll 24
        for (int i = 0; i < ACC; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
        __asm__ volatile("" : "+v"(a), "+v"(b)); /* keeps the loop from being folded */
    }
    t = cpu_s() - t;
    float s = 0;
    for (int i = 0; i < ACC; i++) s += _mm512_reduce_add_ps(acc[i]);
    if (s == 1) puts("");
    return (double)n * ACC * 64 / t / 1e9;
}

/* GFLOP/s of n rounds of ACC vfmadd231ps: 16 lanes x 2 flops. */
__attribute__((target("avx512f"))) static double fp32_gflops(long n) {
    __m512 acc[ACC];
    for (int i = 0; i < ACC; i++) acc[i] = _mm512_setzero_ps();
    __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.5f);
    double t = cpu_s();
    for (long r = 0; r < n; r++) {
#pragma GCC unroll 24
        for (int i = 0; i < ACC; i++) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
        __asm__ volatile("" : "+v"(a), "+v"(b));
    }
    t = cpu_s() - t;
    float s = 0;
    for (int i = 0; i < ACC; i++) s += _mm512_reduce_add_ps(acc[i]);
    if (s == 1) puts("");
    return (double)n * ACC * 32 / t / 1e9;
}

int main(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) {
        printf("bf16_peak: this CPU lacks avx512f or avx512_bf16: nothing to measure\n");
        return 0;
    }
    for (int k = 0; k < 5; k++) {
        const double f = fp32_gflops(20000000), h = bf16_gflops(20000000);
        printf("fp32 vfmadd231ps %.1f GFLOP/s   bf16 vdpbf16ps %.1f GFLOP/s   ratio %.2f\n", f, h, h / f);
    }
    return 0;
}
