/* SPDX-License-Identifier: MIT */
/* Which kernel runs a bf16 graph's products, decided once per process: oneDNN's (vdpbf16ps or AMX
 * tiles) or the fp32 FMA units, from the CPU's features and the measured peak rates of each
 * instruction it has; and the public queries that report the choice. Only in a build with oneDNN
 * (ops/bf16.c holds the stubs of the others). */
#define _DEFAULT_SOURCE /* syscall: AMX's permission (arch_prctl) */
#include <stdlib.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"

#if defined(CGRAD_DNNL) && !defined(CGRAD_DOUBLE)
#include <cpuid.h>
#include "ops/bf16_engine.h"

static const char *unavailable; /* decided once */
static bool decided;

/* avx512_bf16: CPUID leaf 7, sub-leaf 1, EAX bit 5. oneDNN would emulate it on plain AVX-512 at
 * a fraction of the speed, so without it oneDNN is never used (the products run on the fp32 units). */
bool cgi_lp_cpu_has_bf16(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
    return (a >> 5) & 1;
}

/* ---- which kernel runs the products: oneDNN's bf16 one, or the fp32 units ---- */

/* A bf16 product can run on oneDNN's matmul (vdpbf16ps, or AMX tiles where the CPU has them and
 * the OS allows them), or on the fp32 FMA units with the operands widened to float as they are
 * packed (cgi_gemm_bf16: exact, the values stay stored in bf16). On Zen 4/5 and Cooper Lake
 * vdpbf16ps does twice an FMA's flops at the FMA's rate; on some Xeons it issues at a quarter of
 * it (half the fp32 peak); AMX's tdpbf16ps does 16 x 16 x 32 products per instruction, which
 * oneDNN runs at 2.8x the fp32 units' GEMM on a Xeon with AMX. So the choice is measured, once per
 * process, when bf16 is first asked for: register-only loops of each instruction the CPU has
 * (cgi_lp_peaks), interleaved, seven repetitions each in thread CPU time, the ratio of the best
 * bf16 rate's median to the FMA's (~6 ms). Below 1 the fp32 units win; the machines seen give
 * 0.49, about 2 (vdpbf16ps at full rate) or above 10 (AMX), far from the threshold. */
int cgi_lp_kernel = K_FP32;
int cgi_lp_force_kernel;

static double kernel_ratio = NAN, amx_ratio = NAN;
static const char *kernel_why = "";

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
enum { PEAK_ACC = 24, PEAK_ROUNDS = 1 << 15, PEAK_REPS = 7, AMX_ROUNDS = 1 << 13 };

/* AMX with bf16 products: CPUID leaf 7 EDX bits 22 (AMX-BF16) and 24 (AMX-TILE), the OS saving
 * the tile state (XCR0 bits 17 and 18), and Linux's per-process permission for it (arch_prctl
 * ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, which oneDNN requests too). A guest may hide it;
 * without all three a tile instruction faults, so none runs. */
static bool amx_usable(void) {
    unsigned a, b, c, d, lo, hi;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 22 & 1) || !(d >> 24 & 1) || !__get_cpuid(1, &a, &b, &c, &d) ||
        !(c >> 27 & 1)) /* OSXSAVE: xgetbv may run */
        return false;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 }; /* asking again is harmless */
    return (lo >> 17 & 3) == 3 && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

static double thread_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* flops per second of PEAK_ROUNDS rounds of PEAK_ACC independent vdpbf16ps (16 lanes, 2 products) */
__attribute__((target("avx512f,avx512bf16"))) static double peak_bf16(void) {
    __m512 acc[PEAK_ACC];
    for (int i = 0; i < PEAK_ACC; i++) acc[i] = _mm512_setzero_ps();
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3f00);
    const double t = thread_s();
    for (long r = 0; r < PEAK_ROUNDS; r++) {
#pragma GCC unroll 24
        for (int i = 0; i < PEAK_ACC; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
        __asm__ volatile("" : "+v"(a), "+v"(b)); /* keeps the loop from being folded */
    }
    const double dt = thread_s() - t;
    float s = 0;
    for (int i = 0; i < PEAK_ACC; i++) s += _mm512_reduce_add_ps(acc[i]);
    __asm__ volatile("" ::"x"(s));
    return (double)PEAK_ROUNDS * PEAK_ACC * 64 / dt;
}

/* the same for vfmadd231ps (16 lanes, 1 product) */
__attribute__((target("avx512f"))) static double peak_fp32(void) {
    __m512 acc[PEAK_ACC];
    for (int i = 0; i < PEAK_ACC; i++) acc[i] = _mm512_setzero_ps();
    __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.5f);
    const double t = thread_s();
    for (long r = 0; r < PEAK_ROUNDS; r++) {
#pragma GCC unroll 24
        for (int i = 0; i < PEAK_ACC; i++) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
        __asm__ volatile("" : "+v"(a), "+v"(b));
    }
    const double dt = thread_s() - t;
    float s = 0;
    for (int i = 0; i < PEAK_ACC; i++) s += _mm512_reduce_add_ps(acc[i]);
    __asm__ volatile("" ::"x"(s));
    return (double)PEAK_ROUNDS * PEAK_ACC * 32 / dt;
}

/* the same for tdpbf16ps: AMX_ROUNDS rounds of 4 independent tile products, each 16 x 16 outputs
 * over 32 bf16 pairs (16384 flops); tiles 0-3 accumulate, 4-7 hold the operands */
__attribute__((target("amx-tile,amx-bf16"))) static double peak_amx(void) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg = {.palette = 1};
    for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
    cgi_bf16 ones[16 * 32] __attribute__((aligned(64)));
    float out[16 * 16] __attribute__((aligned(64)));
    for (int i = 0; i < 16 * 32; i++) ones[i] = 0x3f80;
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ones, 64);
    _tile_loadd(5, ones, 64);
    _tile_loadd(6, ones, 64);
    _tile_loadd(7, ones, 64);
    const double t = thread_s();
    for (long r = 0; r < AMX_ROUNDS; r++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    const double dt = thread_s() - t;
    _tile_stored(0, out, 64);
    _tile_release();
    __asm__ volatile("" ::"m"(out));
    return (double)AMX_ROUNDS * 4 * 16384 / dt;
}

static int cmp_double(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(double *v) {
    qsort(v, PEAK_REPS, sizeof *v, cmp_double);
    return v[PEAK_REPS / 2];
}

/* Medians of interleaved runs, after one of each untimed (the AVX-512 units may be powered down
 * until used; the first tile instruction makes the kernel enlarge the thread's saved state): the
 * FMA's, vdpbf16ps's (NaN without avx512_bf16) and tdpbf16ps's (NaN where AMX is not usable) */
void cgi_lp_peaks(double *fp32, double *bf16, double *amx) {
    double f[PEAK_REPS], h[PEAK_REPS], x[PEAK_REPS];
    *fp32 = *bf16 = *amx = NAN;
    if (!cgi_lp_cpu_has_bf16()) return;
    const bool tiles = amx_usable();
    peak_fp32(), peak_bf16();
    if (tiles) peak_amx();
    for (int r = 0; r < PEAK_REPS; r++) f[r] = peak_fp32(), h[r] = peak_bf16(), x[r] = tiles ? peak_amx() : NAN;
    *fp32 = median(f), *bf16 = median(h);
    if (tiles) *amx = median(x);
}
#else
static bool amx_usable(void) { return false; }
void cgi_lp_peaks(double *fp32, double *bf16, double *amx) { *fp32 = *bf16 = *amx = NAN; }
#endif

/* kernel_ratio = vdpbf16ps rate / fp32 FMA rate, amx_ratio = tdpbf16ps rate / fp32 FMA rate */
static void measure_ratios(void) {
    double f, h, x;
    cgi_lp_peaks(&f, &h, &x);
    kernel_ratio = h / f, amx_ratio = x / f;
}

/* Sets kernel, kernel_ratio and kernel_why; returns why bf16 cannot run, or NULL. */
static const char *decide_kernel(void) {
    const bool has = cgi_lp_cpu_has_bf16();
    const char *env = getenv("CGRAD_BF16_GEMM");
    if (has) measure_ratios();
    if (env && *env) {
        if (!strcmp(env, "onednn")) {
            cgi_lp_kernel = K_ONEDNN, kernel_why = "CGRAD_BF16_GEMM=onednn";
            if (!has) return "CGRAD_BF16_GEMM=onednn, but this CPU lacks avx512_bf16 (see the flags in /proc/cpuinfo); "
                             "unset it to run bf16 on the fp32 units";
        } else if (!strcmp(env, "fp32"))
            cgi_lp_kernel = K_FP32, kernel_why = "CGRAD_BF16_GEMM=fp32";
        else
            return "CGRAD_BF16_GEMM must be onednn or fp32";
    } else if (!has)
        cgi_lp_kernel = K_FP32, kernel_why = "this CPU lacks avx512_bf16";
    else if (amx_ratio >= 1)
        cgi_lp_kernel = K_ONEDNN, kernel_why = "AMX tiles faster than the fp32 FMA (measured)";
    else if (kernel_ratio < 1)
        cgi_lp_kernel = K_FP32, kernel_why = isfinite(amx_ratio) ? "vdpbf16ps and AMX tiles slower than the fp32 FMA (measured)"
                                                          : "vdpbf16ps slower than the fp32 FMA (measured)";
    else
        cgi_lp_kernel = K_ONEDNN, kernel_why = "vdpbf16ps faster than the fp32 FMA (measured)";
    return NULL;
}

/* No oneDNN call here: `cgrad bench` asks in a parent process that must stay fork-safe. */
const char *cg_bf16_unavailable(void) {
#pragma omp critical(cgi_lp_engine)
    if (!decided) {
        decided = true;
        if (getenv("CGRAD_BF16_DISABLE") && atoi(getenv("CGRAD_BF16_DISABLE")))
            unavailable = "disabled by CGRAD_BF16_DISABLE";
        else
            unavailable = decide_kernel();
    }
    return unavailable;
}

const char *cg_bf16_kernel(void) {
    if (cg_bf16_unavailable()) return NULL;
    return cgi_lp_kernel == K_ONEDNN ? "onednn" : "fp32";
}
double cg_bf16_dot_ratio(void) {
    cg_bf16_unavailable();
    return kernel_ratio;
}
double cg_bf16_amx_ratio(void) {
    cg_bf16_unavailable();
    return amx_ratio;
}
const char *cg_bf16_kernel_why(void) {
    cg_bf16_unavailable();
    return kernel_why;
}

#endif
