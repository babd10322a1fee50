/* SPDX-License-Identifier: MIT */
/* bf16 mixed precision: each product against references computed in double, within bounds derived
 * from bf16's 8-bit significand; a whole GPT step against fp32; fp32 untouched by the setting; a
 * parameter converted once per optimizer step. The products run as their own ctest entries
 * (test_bf16_products, test_bf16_onednn: see main), which report skipped without oneDNN or
 * avx512_bf16; test_bf16 itself tests the API, the refusal and the conversions everywhere.
 *
 * The bound: rounding a float to bf16 (8 significant bits, round to nearest even) has relative
 * error at most u = 2^-8, so a product of two rounded operands is off by at most (2u + u^2)|ab|.
 * Accumulating k such products (plus the bias) in float adds at most (k+1) 2^-24 sum|ab| in any
 * order. Per element, |c - c_exact| <= (2u + u^2 + (k+1) 2^-24 (1 + u)^2) sum_p |a_p||b_p| + |bias|
 * terms; against the exact product of the already-rounded operands only the float part remains. */
#define _DEFAULT_SOURCE /* syscall: AMX's permission */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../cgrad.h"
#include "../models/zoo.h"
#include "../ops/bf16_internal.h"
#include "../optim/optim.h"
#include "check.h"

static const double U = 1.0 / 256, U32 = 1.0 / 16777216;

static float bf(float f) { /* round to nearest even, as the hardware does */
    uint32_t x;
    memcpy(&x, &f, 4);
    x = (x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &x, 4);
    return f;
}

static void fill(float *v, int64_t n, cg_rng *r, double scale) {
    for (int64_t i = 0; i < n; i++) v[i] = (float)(scale * cg_rng_normal(r));
}

/* c[m,n] = a[m,k] b[k,n] (strides given) in double, with sum |a||b| into mag; rounded operands if round. */
static void ref_gemm(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b, int64_t rsb,
                     int64_t csb, bool round, double *c, double *mag) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0, g = 0;
            for (int64_t p = 0; p < k; p++) {
                double x = round ? bf(a[i * rsa + p * csa]) : a[i * rsa + p * csa];
                double y = round ? bf(b[p * rsb + j * csb]) : b[p * rsb + j * csb];
                s += x * y, g += fabs(x * y);
            }
            c[i * n + j] = s, mag[i * n + j] = g;
        }
}

/* got (plus `add`, a float term added exactly in double, may be NULL) against both references:
 * within the float bound of the rounded operands' product, within the full bound of the exact one.
 * Returns how many elements differ from fp32 (the products must really have been rounded). */
static int check_product(const char *what, int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa,
                         const float *b, int64_t rsb, int64_t csb, const float *add, const float *got, const float *fp32) {
    double *c = malloc((size_t)(m * n) * sizeof *c), *mag = malloc((size_t)(m * n) * sizeof *mag);
    double *c0 = malloc((size_t)(m * n) * sizeof *c0), *mag0 = malloc((size_t)(m * n) * sizeof *mag0);
    ref_gemm(m, n, k, a, rsa, csa, b, rsb, csb, true, c, mag);
    ref_gemm(m, n, k, a, rsa, csa, b, rsb, csb, false, c0, mag0);
    double worst_r = 0, worst_x = 0;
    int differ = 0;
    for (int64_t i = 0; i < m * n; i++) {
        const double extra = add ? fabs(add[i]) : 0, z = add ? add[i] : 0;
        const double tol_r = (double)(k + 1) * U32 * (mag[i] + extra) + 1e-30;
        const double tol_x = (2 * U + U * U + (double)(k + 1) * U32 * (1 + U) * (1 + U)) * mag0[i] +
                             (double)(k + 1) * U32 * extra + 1e-30;
        const double er = fabs(got[i] - (c[i] + z)) / tol_r, ex = fabs(got[i] - (c0[i] + z)) / tol_x;
        worst_r = er > worst_r ? er : worst_r;
        worst_x = ex > worst_x ? ex : worst_x;
        differ += got[i] != fp32[i];
    }
    CHECK(worst_r <= 1, "%s: against the rounded operands' exact product, error %.3g of the float bound", what, worst_r);
    CHECK(worst_x <= 1, "%s: against the exact product, error %.3g of the bf16 bound", what, worst_x);
    free(c), free(mag), free(c0), free(mag0);
    return differ;
}

/* ---- linear: y = x w^T + b with loss sum(y * r), so dY = r exactly ---- */

enum { LB = 3, LT = 37, LK = 70, LN = 50, LM = LB * LT };

typedef struct {
    float y[LM * LN], dx[LM * LK], dw[LN * LK], db[LN];
    size_t bwd_scratch; /* planned conversion scratch of the backward */
} lin_out;

/* w_t: the weight is stored [in, out] and used through a transpose (GPT-2's Conv1D). strided: the
 * bias is column 0 of a [out, 2] parameter (a view of stride 2, which oneDNN's bias argument cannot
 * take: the output is filled with it first). */
static void run_linear(cg_precision prec, bool w_t, bool retain, bool strided, const float *X, const float *W,
                       const float *B, const float *R, lin_out *o) {
    cg_params *ps = cg_params_new();
    int64_t sw[2] = {w_t ? LK : LN, w_t ? LN : LK}, sb[2] = {LN, 2};
    cg_tensor *w = cg_params_add(ps, "w", 2, sw), *b = cg_params_add(ps, "b", strided ? 2 : 1, sb);
    float wt[LN * LK], b2[2 * LN];
    for (int i = 0; i < LN; i++)
        for (int j = 0; j < LK; j++) wt[j * LN + i] = W[i * LK + j];
    for (int i = 0; i < LN; i++) b2[2 * i] = B[i], b2[2 * i + 1] = 100 + (float)i; /* column 1: never read */
    cg_write(w, w_t ? wt : W);
    cg_write(b, strided ? b2 : B);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, prec) == CG_OK, "%s", cg_last_error());
    int64_t sx[3] = {LB, LT, LK}, sy[3] = {LB, LT, LN};
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 3, sx)), *r = cg_input(g, "r", CG_REAL, 3, sy);
    cg_write(x, X);
    cg_write(r, R);
    cg_tensor *y = cg_linear(g, x, w_t ? cg_transpose(g, w, 0, 1) : w, strided ? cg_squeeze(g, cg_slice(g, b, 1, 0, 1), 1) : b);
    if (retain) cg_retain(y);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, y, r));
    o->bwd_scratch = y ? cgi_lp_scratch_bytes(y, true) : 0; /* as the plan sees it, before any storage */
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    if (retain) cg_read(y, o->y);
    cg_read_grad(x, o->dx);
    if (strided) {
        cg_read_grad(b, b2);
        for (int i = 0; i < LN; i++) o->db[i] = b2[2 * i];
    } else cg_read_grad(b, o->db);
    if (w_t) {
        cg_read_grad(w, wt);
        for (int i = 0; i < LN; i++)
            for (int j = 0; j < LK; j++) o->dw[i * LK + j] = wt[j * LN + i];
    } else cg_read_grad(w, o->dw);
    cg_graph_free(g);
    cg_params_free(ps);
}

static void test_linear(void) {
    static float X[LM * LK], W[LN * LK], B[LN], R[LM * LN], Bb[LM * LN];
    static lin_out f, h, hi;
    cg_rng rng;
    cg_rng_seed(&rng, 1);
    fill(X, LM * LK, &rng, 1), fill(W, LN * LK, &rng, 0.2), fill(B, LN, &rng, 0.5), fill(R, LM * LN, &rng, 1);
    for (int i = 0; i < LM * LN; i++) Bb[i] = B[i % LN]; /* the bias as added to each row */
    for (int w_t = 0; w_t < 3; w_t++) { /* 2: w as stored, the bias a strided view */
        const bool st = w_t == 2;
        run_linear(CG_FP32, w_t == 1, true, st, X, W, B, R, &f);
        run_linear(CG_BF16, w_t == 1, true, st, X, W, B, R, &h);
        /* y not retained: dY is turned into bf16 in place instead of into scratch, same numbers */
        run_linear(CG_BF16, w_t == 1, false, st, X, W, B, R, &hi);
        CHECK(!memcmp(hi.dx, h.dx, sizeof h.dx) && !memcmp(hi.dw, h.dw, sizeof h.dw) && !memcmp(hi.db, h.db, sizeof h.db),
              "linear%s: dY converted in place changed the gradients", w_t == 1 ? " (w transposed)" : st ? " (strided bias)" : "");
        /* the backward then plans scratch for x's conversion alone (W has its copy, dY is in place) */
        const size_t xb = LM * LK * 2;
        CHECK(hi.bwd_scratch == xb && h.bwd_scratch > xb, "linear: backward scratch %zu bytes (expected %zu), %zu retained",
              hi.bwd_scratch, xb, h.bwd_scratch);
        const char *tag = w_t == 1 ? " (w transposed)" : st ? " (strided bias)" : "";
        char what[64];
        int differ = 0;
        snprintf(what, sizeof what, "linear y%s", tag);
        differ += check_product(what, LM, LN, LK, X, LK, 1, W, 1, LK, Bb, h.y, f.y); /* y = x w^T: w^T is [k, n] */
        snprintf(what, sizeof what, "linear dx%s", tag);
        differ += check_product(what, LM, LK, LN, R, LN, 1, W, LK, 1, NULL, h.dx, f.dx);
        snprintf(what, sizeof what, "linear dw%s", tag);
        differ += check_product(what, LN, LK, LM, R, 1, LN, X, LK, 1, NULL, h.dw, f.dw);
        double worst = 0;
        for (int j = 0; j < LN; j++) worst = fmax(worst, fabs(h.db[j] - f.db[j]));
        CHECK(worst == 0, "linear db%s: the bias gradient is a float sum in both precisions, off by %g", tag, worst);
        CHECK(differ > LM, "linear%s: only %d elements differ from fp32: the products did not run in bf16", tag, differ);
    }
}

/* ---- activations stored in bf16: x -> linear -> act -> linear, with and without ---- */

enum { AM = 64, AK = 32, AH = 48, AN = 16 };

typedef struct {
    float dx[AM * AK], dw1[AH * AK], db1[AH], dw2[AN * AH];
    int lp_values;
} act_out;

static void run_act(int act, const float *X, const float *W1, const float *W2, const float *R, act_out *o) {
    cg_params *ps = cg_params_new();
    int64_t s1[2] = {AH, AK}, sb[1] = {AH}, s2[2] = {AN, AH}, sx[2] = {AM, AK}, sy[2] = {AM, AN};
    cg_tensor *w1 = cg_params_add(ps, "w1", 2, s1), *b1 = cg_params_add(ps, "b1", 1, sb), *w2 = cg_params_add(ps, "w2", 2, s2);
    cg_write(w1, W1), cg_write(b1, W1), cg_write(w2, W2);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, CG_BF16) == CG_OK, "%s", cg_last_error());
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, sx)), *r = cg_input(g, "r", CG_REAL, 2, sy);
    cg_write(x, X), cg_write(r, R);
    cg_tensor *h = cg_linear(g, x, w1, b1);
    h = act == 0 ? cg_relu(g, h) : act == 1 ? cg_gelu(g, h) : cg_gelu_tanh(g, h);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, cg_linear(g, h, w2, NULL), r));
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    cg_read_grad(x, o->dx), cg_read_grad(w1, o->dw1), cg_read_grad(b1, o->db1), cg_read_grad(w2, o->dw2);
    o->lp_values = 0;
    for (int i = 0; i < g->n; i++) o->lp_values += g->nodes[i]->lp_value;
    cg_graph_free(g);
    cg_params_free(ps);
}

static double gelu_ref(double x, int act) {
    return act == 1 ? 0.5 * x * (1 + erf(x / sqrt(2))) : 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

/* |got - want| <= bound elementwise: counts the elements outside into *bad, those that differ at all into *differ. */
static void within(const float *got, const float *want, const double *bound, int64_t n, int *bad, int *differ,
                   double *worst) {
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]);
        *bad += !(d <= bound[i]), *differ += d != 0;
        if (bound[i] > 0 && d / bound[i] > *worst) *worst = d / bound[i];
    }
}

/* A GELU's pre-activation stored in bf16 (the linear writes it once, rounded from its float sum
 * plus bias, ops/bf16.c) against the same run with it float (CGRAD_BF16_PREACT_OFF), per element.
 * With h the float pre-activation and h~ = bf16(h): |h~ - h| <= e|h|, e = u(1 + u) + 16 2^-24 (the
 * bias added in another order, and |h| taken from a double reference). Both runs share g = dL/dy =
 * R~ W2~ (the second linear's dX) and everything before h. With L1 = max|gelu'| = 1.129 and L2 =
 * max|gelu''| = 2 phi(0) = 0.798 (both forms, to 1e-4):
 *  - dpre = g gelu'(h~) moves by at most p = 0.8 e |g||h| (+ 16 2^-24 |dpre| for its float formula);
 *    db1 = sum_i dpre adds two float sums' (m+1) 2^-24 sum|dpre|;
 *  - dX = bf16(dpre) W1~ and dW1 = bf16(dpre)^T X~: the rounding to bf16 may go the other way, so
 *    each factor moves by p + 2u(1 + u)|dpre|, times |W1~| (|X~|), plus two float sums;
 *  - dW2 = R~^T bf16(gelu(h~)): each y moves by 1.13 e |h| + 2u(1 + u)|y|, times |R~|, plus two float
 *    sums. Magnitudes from double references on the bf16-rounded operands. */
static void check_preact(int act, const float *X, const float *W1, const float *W2, const float *R, const act_out *on,
                         const act_out *off) {
    static double h[AM * AH], g[AM * AH], dp[AM * AH], y[AM * AH], bnd[AH * AK > AM * AK ? AH * AK : AM * AK];
    const double e = U * (1 + U) + 16 * U32, r2 = 2 * U * (1 + U);
    for (int i = 0; i < AM; i++)
        for (int j = 0; j < AH; j++) {
            double s = W1[j], t = 0; /* b1 holds W1's first AH values, float */
            for (int p = 0; p < AK; p++) s += (double)bf(X[i * AK + p]) * bf(W1[j * AK + p]);
            for (int n = 0; n < AN; n++) t += (double)bf(R[i * AN + n]) * bf(W2[n * AH + j]);
            const double d = (gelu_ref(s + 1e-6, act) - gelu_ref(s - 1e-6, act)) / 2e-6;
            h[i * AH + j] = s, g[i * AH + j] = t, y[i * AH + j] = gelu_ref(s, act), dp[i * AH + j] = t * d;
        }
#define MOVE(ij) (0.8 * e * fabs(g[ij]) * fabs(h[ij]) + 16 * U32 * fabs(dp[ij]))
    int bad = 0, differ = 0;
    double worst = 0;
    for (int j = 0; j < AH; j++) { /* db1 */
        double b = 0, m = 0;
        for (int i = 0; i < AM; i++) b += MOVE(i * AH + j), m += fabs(dp[i * AH + j]);
        bnd[j] = b + 2 * (AM + 1) * U32 * m;
    }
    within(on->db1, off->db1, bnd, AH, &bad, &differ, &worst);
    for (int i = 0; i < AM; i++) /* dX */
        for (int k = 0; k < AK; k++) {
            double b = 0, m = 0;
            for (int j = 0; j < AH; j++) {
                const double w = fabs(bf(W1[j * AK + k]));
                b += (MOVE(i * AH + j) + r2 * fabs(dp[i * AH + j])) * w, m += fabs(dp[i * AH + j]) * w;
            }
            bnd[i * AK + k] = b + 2 * (AH + 1) * U32 * m * (1 + U);
        }
    within(on->dx, off->dx, bnd, AM * AK, &bad, &differ, &worst);
    for (int j = 0; j < AH; j++) /* dW1 */
        for (int k = 0; k < AK; k++) {
            double b = 0, m = 0;
            for (int i = 0; i < AM; i++) {
                const double x = fabs(bf(X[i * AK + k]));
                b += (MOVE(i * AH + j) + r2 * fabs(dp[i * AH + j])) * x, m += fabs(dp[i * AH + j]) * x;
            }
            bnd[j * AK + k] = b + 2 * (AM + 1) * U32 * m * (1 + U);
        }
    within(on->dw1, off->dw1, bnd, AH * AK, &bad, &differ, &worst);
    for (int n = 0; n < AN; n++) /* dW2 */
        for (int j = 0; j < AH; j++) {
            double b = 0, m = 0;
            for (int i = 0; i < AM; i++) {
                const double r = fabs(bf(R[i * AN + n])), yy = fabs(y[i * AH + j]);
                b += (1.13 * e * fabs(h[i * AH + j]) + r2 * yy) * r, m += yy * r;
            }
            bnd[n * AH + j] = b + 2 * (AM + 1) * U32 * m * (1 + U);
        }
    within(on->dw2, off->dw2, bnd, AN * AH, &bad, &differ, &worst);
#undef MOVE
    CHECK(bad == 0, "act %d: %d gradient elements with the bf16 pre-activation outside the bound (worst %.2f of it)",
          act, bad, worst);
    CHECK(differ > 50, "act %d: only %d gradient elements changed: the pre-activation was not rounded", act, differ);
}

/* ReLU, GELU and tanh-GELU write their value in bf16 when only a linear reads it: bit-identical
 * gradients to converting it at the product (GELU recomputes its output in backward, ReLU reads
 * the sign, which bf16 keeps). A GELU's input, when the GELU alone reads it, is stored in bf16 too
 * (check_preact); with that off the run is again bit-identical. */
static void test_activations(void) {
    static float X[AM * AK], W1[AH * AK], W2[AN * AH], R[AM * AN];
    static act_out on, pre, off;
    cg_rng rng;
    cg_rng_seed(&rng, 5);
    fill(X, AM * AK, &rng, 1), fill(W1, AH * AK, &rng, 0.3), fill(W2, AN * AH, &rng, 0.3), fill(R, AM * AN, &rng, 1);
    for (int act = 0; act < 3; act++) {
        run_act(act, X, W1, W2, R, &on);
        setenv("CGRAD_BF16_PREACT_OFF", "1", 1);
        run_act(act, X, W1, W2, R, &pre);
        unsetenv("CGRAD_BF16_PREACT_OFF");
        setenv("CGRAD_BF16_VALUES_OFF", "1", 1);
        run_act(act, X, W1, W2, R, &off);
        unsetenv("CGRAD_BF16_VALUES_OFF");
        CHECK(on.lp_values == (act ? 2 : 1) && pre.lp_values == 1 && off.lp_values == 0,
              "act %d: %d values in bf16 (expected %d), %d without the pre-activation, %d with them off", act,
              on.lp_values, act ? 2 : 1, pre.lp_values, off.lp_values);
        CHECK(!memcmp(&pre, &off, offsetof(act_out, lp_values)), "act %d: storing its value in bf16 changed the gradients",
              act);
        if (act) check_preact(act, X, W1, W2, R, &on, &pre);
        else CHECK(!memcmp(&on, &off, offsetof(act_out, lp_values)), "relu: its input was stored in bf16");
    }
}

/* SwiGLU read only by a linear (LLaMA's MLP: down(swiglu(gate x, up x))): its value is written in
 * bf16 (CGRAD_BF16_SWIGLU_OFF=1 keeps it float and the linear converts it, in forward and again
 * for dW), the same rounding of the same floats, so loss and gradients are the same bits. */
typedef struct {
    float dx[AM * AK], dg[AH * AK], du[AH * AK], dd[AN * AH];
    float loss;
    int swiglu_bf16;
} swiglu_out;

static void run_swiglu(const float *X, const float *WG, const float *WU, const float *WD, const float *R, swiglu_out *o) {
    cg_params *ps = cg_params_new();
    int64_t sh[2] = {AH, AK}, sd[2] = {AN, AH}, sx[2] = {AM, AK}, sy[2] = {AM, AN};
    cg_tensor *wg = cg_params_add(ps, "wg", 2, sh), *wu = cg_params_add(ps, "wu", 2, sh), *wd = cg_params_add(ps, "wd", 2, sd);
    cg_write(wg, WG), cg_write(wu, WU), cg_write(wd, WD);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, CG_BF16) == CG_OK, "%s", cg_last_error());
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, sx)), *r = cg_input(g, "r", CG_REAL, 2, sy);
    cg_write(x, X), cg_write(r, R);
    cg_tensor *h = cg_swiglu(g, cg_linear(g, x, wg, NULL), cg_linear(g, x, wu, NULL));
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, cg_linear(g, h, wd, NULL), r));
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    o->loss = (float)cg_item(loss);
    cg_read_grad(x, o->dx), cg_read_grad(wg, o->dg), cg_read_grad(wu, o->du), cg_read_grad(wd, o->dd);
    o->swiglu_bf16 = h->lp_value;
    cg_graph_free(g);
    cg_params_free(ps);
}

static void test_swiglu_value(void) {
    static float X[AM * AK], WG[AH * AK], WU[AH * AK], WD[AN * AH], R[AM * AN];
    static swiglu_out on, off;
    cg_rng rng;
    cg_rng_seed(&rng, 8);
    fill(X, AM * AK, &rng, 1), fill(WG, AH * AK, &rng, 0.3), fill(WU, AH * AK, &rng, 0.3), fill(WD, AN * AH, &rng, 0.3);
    fill(R, AM * AN, &rng, 1);
    run_swiglu(X, WG, WU, WD, R, &on);
    setenv("CGRAD_BF16_SWIGLU_OFF", "1", 1);
    run_swiglu(X, WG, WU, WD, R, &off);
    unsetenv("CGRAD_BF16_SWIGLU_OFF");
    CHECK(on.swiglu_bf16 && !off.swiglu_bf16, "swiglu stored in bf16: %d, with it off %d", on.swiglu_bf16, off.swiglu_bf16);
    CHECK(!memcmp(&on, &off, offsetof(swiglu_out, swiglu_bf16)), "swiglu in bf16 changed the loss or gradients (%.9g, %.9g)",
          on.loss, off.loss);
}

/* Out of memory for a weight's bf16 copy: a linear whose input exists only in bf16 (a ReLU's value
 * read by it alone) cannot fall back to its float product, which would read those bf16 bytes as
 * floats; forward reports it instead. The first linear, on a float input, still falls back. The
 * weights are frozen: a trained one has no copy (converted_per_use, ops/bf16.c). */
static void test_no_copy(void) {
    cg_params *ps = cg_params_new();
    int64_t s1[2] = {AH, AK}, s2[2] = {AN, AH}, sx[2] = {AM, AK};
    cg_tensor *w1 = cg_params_add(ps, "w1", 2, s1), *w2 = cg_params_add(ps, "w2", 2, s2);
    cg_param_set_trainable(w1, false), cg_param_set_trainable(w2, false);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, CG_BF16) == CG_OK, "%s", cg_last_error());
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, sx));
    cg_tensor *loss = cg_sum_all(g, cg_linear(g, cg_relu(g, cg_linear(g, x, w1, NULL)), w2, NULL));
    cgi_lp_fail_param_copy = true;
    const cg_status st = loss ? cg_graph_forward(g) : CG_ERR_ARG;
    cgi_lp_fail_param_copy = false;
    CHECK(st == CG_ERR_NOMEM && strstr(cg_last_error(), "[linear] bf16") && strstr(cg_last_error(), "w2") &&
              strstr(cg_last_error(), "[64,48]"),
          "forward without memory for w2's bf16 copy: status %d, '%s'", (int)st, cg_last_error());
    cg_graph_free(g);
    /* a linear whose value is stored in bf16 (GELU alone reads it) cannot write its float product there */
    g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, CG_BF16) == CG_OK, "%s", cg_last_error());
    x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, sx));
    loss = cg_sum_all(g, cg_linear(g, cg_gelu(g, cg_linear(g, x, w1, NULL)), w2, NULL));
    cgi_lp_fail_param_copy = true;
    const cg_status st2 = loss ? cg_graph_forward(g) : CG_ERR_ARG;
    cgi_lp_fail_param_copy = false;
    CHECK(st2 == CG_ERR_NOMEM && strstr(cg_last_error(), "w1") && strstr(cg_last_error(), "output [64,48]"),
          "forward without memory for w1's bf16 copy, its output in bf16: status %d, '%s'", (int)st2, cg_last_error());
    cg_graph_free(g);
    cg_params_free(ps);
}

/* ---- shadows: a post-LN block's LayerNorm output, read by linears and the residual add ---- */

/* rows: y's saved bytes (SM x AK x 2) stand well above the weights' conversion scratch in the plan */
enum { SM = 4 * AM };

typedef struct {
    float dx[SM * AK], dw1[AH * AK], dw2[AK * AH], dg[AK];
    float loss;
    int shadows;
    size_t plan;
} shadow_out;

/* x -> linear -> add x -> LayerNorm = y; y -> linear -> add y -> LayerNorm -> linear -> loss: y's
 * float is read in backward only by the second linear (the add reads nothing back, and the second
 * LayerNorm reads its own input), so y keeps a bf16 shadow for that linear's dW. */
static void run_shadow(const float *X, const float *W1, const float *W2, const float *R, shadow_out *o) {
    cg_params *ps = cg_params_new();
    int64_t s1[2] = {AK, AK}, s2[2] = {AH, AK}, sg[1] = {AK}, sx[2] = {SM, AK}, sy[2] = {SM, AH};
    cg_tensor *w1 = cg_params_add(ps, "w1", 2, s1), *w2 = cg_params_add(ps, "w2", 2, s2), *w3 = cg_params_add(ps, "w3", 2, s1);
    cg_tensor *g1 = cg_params_add(ps, "g1", 1, sg), *g2 = cg_params_add(ps, "g2", 1, sg);
    float ones[AK];
    for (int i = 0; i < AK; i++) ones[i] = 1 + 0.01f * (float)i;
    cg_write(w1, W1), cg_write(w3, W1), cg_write(w2, W2), cg_write(g1, ones), cg_write(g2, ones);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, CG_BF16) == CG_OK, "%s", cg_last_error());
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, sx)), *r = cg_input(g, "r", CG_REAL, 2, sy);
    cg_write(x, X), cg_write(r, R);
    cg_tensor *y = cg_layernorm(g, cg_add(g, x, cg_linear(g, x, w1, NULL)), g1, NULL, 1e-5);
    cg_tensor *z = cg_layernorm(g, cg_add(g, y, cg_linear(g, y, w3, NULL)), g2, NULL, 1e-5);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, cg_linear(g, z, w2, NULL), r));
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    o->loss = (float)cg_item(loss);
    cg_read_grad(x, o->dx), cg_read_grad(w1, o->dw1), cg_read_grad(w2, o->dw2), cg_read_grad(g1, o->dg);
    o->shadows = 0;
    for (int i = 0; i < g->n; i++) o->shadows += g->nodes[i]->lp_shadowed && g->nodes[i]->lp_shadow;
    o->plan = cg_graph_plan_bytes(g);
    cg_graph_free(g);
    cg_params_free(ps);
}

/* The shadowed run is bit-identical to converting at each product (the same rounding, made once),
 * and its plan is smaller: y's float no longer lives from forward to backward. */
static void test_shadows(void) {
    static float X[SM * AK], W1[AK * AK], W2[AH * AK], R[SM * AH];
    static shadow_out on, off;
    cg_rng rng;
    cg_rng_seed(&rng, 8);
    fill(X, SM * AK, &rng, 1), fill(W1, AK * AK, &rng, 0.3), fill(W2, AH * AK, &rng, 0.3), fill(R, SM * AH, &rng, 1);
    /* values kept: with the float remade in backward (regen) instead, y would keep no copy at all */
    setenv("CGRAD_REGEN", "0", 1);
    run_shadow(X, W1, W2, R, &on);
    setenv("CGRAD_BF16_VALUES_OFF", "1", 1);
    run_shadow(X, W1, W2, R, &off);
    unsetenv("CGRAD_BF16_VALUES_OFF");
    unsetenv("CGRAD_REGEN");
    /* only y: the sums are LayerNorm inputs, and z, read by one linear alone, is stored in bf16 */
    CHECK(on.shadows == 1 && off.shadows == 0, "shadows: %d (expected 1), %d with bf16 values off", on.shadows,
          off.shadows);
    CHECK(!memcmp(&on, &off, offsetof(shadow_out, shadows)), "the bf16 shadow changed the run (loss %.9g vs %.9g)",
          on.loss, off.loss);
    CHECK(on.plan < off.plan, "the shadowed plan (%zu bytes) is not smaller than the float one (%zu)", on.plan, off.plan);
}

/* ---- the fused LM head (linear_cross_entropy) with a bias, over several row chunks ---- */

enum { HR = 700, HD = 24, HV = 40 }; /* more rows than one 512-row chunk */

typedef struct {
    float loss, dx[HR * HD], dw[HV * HD], db[HV];
} lce_out;

static void run_lce(cg_precision prec, const float *X, const float *W, const float *B, const int32_t *T, lce_out *o) {
    cg_params *ps = cg_params_new();
    int64_t sw[2] = {HV, HD}, sb[1] = {HV}, sx[2] = {HR, HD}, st[1] = {HR};
    cg_tensor *w = cg_params_add(ps, "w", 2, sw), *b = cg_params_add(ps, "b", 1, sb);
    cg_write(w, W), cg_write(b, B);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, prec) == CG_OK, "%s", cg_last_error());
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, sx)), *t = cg_input(g, "t", CG_INT32, 1, st);
    cg_write(x, X);
    memcpy(cg_idata(t), T, sizeof(int32_t) * HR);
    cg_tensor *loss = cg_linear_cross_entropy(g, x, w, b, t, -100);
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    o->loss = (float)cg_item(loss);
    cg_read_grad(x, o->dx), cg_read_grad(w, o->dw), cg_read_grad(b, o->db);
    CHECK(cgi_lp_unplanned_bytes(g) == 0, "linear_cross_entropy held conversion scratch outside the plan");
    cg_graph_free(g);
    cg_params_free(ps);
}

/* The head's bound, from the products' one: a logit is off by at most
 * E_i = (2u + u^2 + (d+1) 2^-24 (1+u)^2) sum_p |x_ip||w_jp|, so each softmax probability moves by at
 * most p (e^{2E} - 1) and the mean loss by at most 2 max E. dlogits g (p - y) then differ from the
 * exact ones by g p (e^{2E} - 1), and are rounded to bf16 (u) before dX = dl W and dW = dl^T X, whose
 * own operand rounding and float sums add as in the products. db sums the float dlogits. */
static void test_lce(void) {
    static float X[HR * HD], W[HV * HD], B[HV];
    static int32_t T[HR];
    static lce_out f, h;
    cg_rng rng;
    cg_rng_seed(&rng, 4);
    fill(X, HR * HD, &rng, 1), fill(W, HV * HD, &rng, 0.5), fill(B, HV, &rng, 0.5);
    int n = 0;
    for (int i = 0; i < HR; i++) T[i] = i % 7 == 3 ? -100 : (i * 13 + 1) % HV, n += T[i] >= 0;
    run_lce(CG_FP32, X, W, B, T, &f);
    run_lce(CG_BF16, X, W, B, T, &h);
    double *p = malloc(sizeof(double) * HR * HV), *E = malloc(sizeof(double) * HR), Emax = 0, loss = 0;
    for (int i = 0; i < HR; i++) { /* exact softmax in double, and each row's logit error bound */
        double mx = -1e300, z[HV], sum = 0;
        E[i] = 0;
        for (int j = 0; j < HV; j++) {
            double acc = B[j], mag = 0;
            for (int q = 0; q < HD; q++) acc += (double)X[i * HD + q] * W[j * HD + q], mag += fabs((double)X[i * HD + q] * W[j * HD + q]);
            z[j] = acc, mx = fmax(mx, acc);
            E[i] = fmax(E[i], (2 * U + U * U + (HD + 2) * U32 * (1 + U) * (1 + U)) * mag + U32 * fabs(B[j]));
        }
        for (int j = 0; j < HV; j++) sum += exp(z[j] - mx);
        for (int j = 0; j < HV; j++) p[i * HV + j] = exp(z[j] - mx) / sum;
        if (T[i] >= 0) loss += log(sum) + mx - z[T[i]], Emax = fmax(Emax, E[i]);
    }
    loss /= n;
    CHECK(fabs(h.loss - loss) <= 2 * Emax + 1e-5 * fabs(loss), "lce loss: bf16 %.7f, exact %.7f, bound %.3g", h.loss, loss,
          2 * Emax);
    int bad = 0, differ = 0;
    const double g = 1.0 / n, fl = (HV + 2) * U32;
    for (int i = 0; i < HR; i++) /* dX = dl W */
        for (int q = 0; q < HD; q++) {
            double ex = 0, bound = 0;
            for (int j = 0; T[i] >= 0 && j < HV; j++) {
                const double dl = g * (p[i * HV + j] - (j == T[i])), dp = g * p[i * HV + j] * expm1(2 * E[i]);
                ex += dl * W[j * HD + q];
                bound += ((2 * U + U * U + fl) * (fabs(dl) + dp) + dp) * fabs(W[j * HD + q]);
            }
            bad += fabs(h.dx[i * HD + q] - ex) > bound * (1 + U) + 1e-12;
            differ += h.dx[i * HD + q] != f.dx[i * HD + q];
        }
    for (int j = 0; j < HV; j++) { /* dW = dl^T X and db = sum dl */
        double eb = 0, bb = 0;
        for (int q = 0; q < HD; q++) {
            double ex = 0, bound = 0;
            for (int i = 0; i < HR; i++) {
                if (T[i] < 0) continue;
                const double dl = g * (p[i * HV + j] - (j == T[i])), dp = g * p[i * HV + j] * expm1(2 * E[i]);
                ex += dl * X[i * HD + q];
                bound += ((2 * U + U * U + (HR + 2) * U32) * (fabs(dl) + dp) + dp) * fabs(X[i * HD + q]);
                if (q == 0) eb += dl, bb += dp + (HR + 2) * U32 * (fabs(dl) + dp);
            }
            bad += fabs(h.dw[j * HD + q] - ex) > bound * (1 + U) + 1e-12;
        }
        bad += fabs(h.db[j] - eb) > bb * (1 + U) + 1e-12;
    }
    CHECK(bad == 0, "lce: %d gradient elements outside their bf16 bounds", bad);
    CHECK(differ > HR, "lce: only %d dX elements differ from fp32: the products did not run in bf16", differ);
    free(p), free(E);
}

/* The fused LM head over a frozen head weight: mapped in bf16 (mapped != NULL) or a float parameter
 * holding the same values. The loss and dX into *loss and dx; the weight's storage after the step. */
static cg_map_dtype lce_head(const uint16_t *mapped, const float *W, const float *X, const int32_t *T, double *loss,
                           float *dx) {
    cg_params *ps = cg_params_new();
    cg_tensor *w = cg_params_add(ps, "head", 2, (int64_t[]){HV, HD});
    cg_write(w, W);
    cg_param_set_trainable(w, false);
    if (mapped) CHECK(cg_param_map(w, mapped, CG_MAP_BF16) == CG_OK, "%s", cg_last_error());
    CHECK(cg_params_compact(ps) == CG_OK, "%s", cg_last_error());
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, CG_BF16) == CG_OK, "%s", cg_last_error());
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, (int64_t[]){HR, HD}));
    cg_tensor *t = cg_input(g, "t", CG_INT32, 1, (int64_t[]){HR});
    cg_write(x, X);
    memcpy(cg_idata(t), T, sizeof(int32_t) * HR);
    cg_tensor *l = cg_linear_cross_entropy(g, x, w, NULL, t, -100);
    CHECK(l && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, l) == CG_OK, "%s", cg_last_error());
    *loss = cg_item(l);
    cg_read_grad(x, dx);
    const cg_map_dtype st = cg_param_storage(w);
    cg_graph_free(g);
    cg_params_free(ps);
    return st;
}

/* A bf16 graph's fused head reads a frozen weight mapped in bf16 as it is: no float copy (0.25 GiB
 * for a 32000 x 2048 head) and no bf16 copy remade after every optimizer step; the same loss and
 * dX, to the bit, as from a float weight holding the same values. */
static void test_lce_mapped(void) {
    static float X[HR * HD], W[HV * HD], dxm[HR * HD], dxf[HR * HD];
    static uint16_t Wb[HV * HD];
    static int32_t T[HR];
    cg_rng rng;
    cg_rng_seed(&rng, 9);
    fill(X, HR * HD, &rng, 1), fill(W, HV * HD, &rng, 0.5);
    for (int i = 0; i < HV * HD; i++) Wb[i] = cgi_to_bf16(W[i]), W[i] = cgi_from_bf16(Wb[i]);
    for (int i = 0; i < HR; i++) T[i] = (i * 7 + 2) % HV;
    double lm, lf;
    const cg_map_dtype st = lce_head(Wb, W, X, T, &lm, dxm);
    lce_head(NULL, W, X, T, &lf, dxf);
    CHECK(st == CG_MAP_BF16, "the mapped head was widened to float (storage %d)", (int)st);
    CHECK(lm == lf && !memcmp(dxm, dxf, sizeof dxm), "mapped head: loss %.9g against %.9g from float", lm, lf);
}

/* ---- matmul, batched and broadcast: c[2,3,20,25] = a[2,3,20,30] @ b[3,30,25] ---- */

static void run_matmul(cg_precision prec, const float *A, const float *Bm, const float *R, float *c, float *da, float *db) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, prec) == CG_OK, "%s", cg_last_error());
    int64_t sa[4] = {2, 3, 20, 30}, sb[3] = {3, 30, 25}, sc[4] = {2, 3, 20, 25};
    cg_tensor *a = cg_requires_grad(cg_input(g, "a", CG_REAL, 4, sa)), *b = cg_requires_grad(cg_input(g, "b", CG_REAL, 3, sb));
    cg_tensor *r = cg_input(g, "r", CG_REAL, 4, sc);
    cg_write(a, A), cg_write(b, Bm), cg_write(r, R);
    cg_tensor *y = cg_retain(cg_matmul(g, a, b));
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, y, r));
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    cg_read(y, c), cg_read_grad(a, da), cg_read_grad(b, db);
    cg_graph_free(g);
}

static void test_matmul(void) {
    enum { NA = 2 * 3 * 20 * 30, NB = 3 * 30 * 25, NC = 2 * 3 * 20 * 25 };
    static float A[NA], Bm[NB], R[NC], c[2][NC], da[2][NA], db[2][NB];
    cg_rng rng;
    cg_rng_seed(&rng, 2);
    fill(A, NA, &rng, 1), fill(Bm, NB, &rng, 1), fill(R, NC, &rng, 1);
    run_matmul(CG_FP32, A, Bm, R, c[0], da[0], db[0]);
    run_matmul(CG_BF16, A, Bm, R, c[1], da[1], db[1]);
    int differ = 0;
    for (int i = 0; i < 2; i++)
        for (int h = 0; h < 3; h++) {
            const int64_t ia = (i * 3 + h) * 600, ib = h * 750, ic = (i * 3 + h) * 500;
            differ += check_product("matmul c", 20, 25, 30, A + ia, 30, 1, Bm + ib, 25, 1, NULL, c[1] + ic, c[0] + ic);
            differ += check_product("matmul da", 20, 30, 25, R + ic, 25, 1, Bm + ib, 1, 25, NULL, da[1] + ia, da[0] + ia);
        }
    /* db sums over the broadcast batch: a sum of two products, each within its bound */
    for (int h = 0; h < 3; h++) {
        double worst = 0;
        for (int e = 0; e < 750; e++) {
            double c0[1], mag0[1], t = 0, m = 0;
            for (int i = 0; i < 2; i++) {
                const int64_t ia = (i * 3 + h) * 600 + e / 25, ic = (i * 3 + h) * 500 + e % 25;
                ref_gemm(1, 1, 20, A + ia, 0, 30, R + ic, 25, 0, false, c0, mag0);
                t += c0[0], m += mag0[0];
            }
            const double tol = (2 * U + U * U + 42 * U32 * (1 + U) * (1 + U)) * m + 1e-30;
            worst = fmax(worst, fabs(db[1][h * 750 + e] - t) / tol);
        }
        CHECK(worst <= 1, "matmul db[%d] (summed over the broadcast batch): error %.3g of the bf16 bound", h, worst);
    }
    CHECK(differ > 100, "matmul: only %d elements differ from fp32: the products did not run in bf16", differ);
}

/* ---- fused attention: the kept probabilities stored in bf16 ---- */

enum { SB = 2, SH = 3, SD = 16, ST = 40 }; /* T = 40 runs the packed path; T = 8 the BLIS one */

typedef struct {
    float o[SB * SH * ST * SD], dq[SB * SH * ST * SD], dk[SB * SH * ST * SD], dv[SB * SH * ST * SD];
    size_t aux, plan;
} sdpa_out;

static void run_sdpa_drop(cg_precision prec, int64_t nb, int64_t nh, int64_t t, int64_t nd, bool causal, double drop,
                          const float *Q, const float *K, const float *V, const float *R, sdpa_out *o) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, prec) == CG_OK, "%s", cg_last_error());
    int64_t sh[4] = {nb, nh, t, nd};
    cg_tensor *q = cg_requires_grad(cg_input(g, "q", CG_REAL, 4, sh)), *k = cg_requires_grad(cg_input(g, "k", CG_REAL, 4, sh));
    cg_tensor *v = cg_requires_grad(cg_input(g, "v", CG_REAL, 4, sh)), *r = cg_input(g, "r", CG_REAL, 4, sh);
    cg_write(q, Q), cg_write(k, K), cg_write(v, V), cg_write(r, R);
    const cg_sdpa_opts so = {.scale = 0.25, .causal = causal, .dropout = drop};
    cg_tensor *a = cg_retain(cg_sdpa_ex(g, q, k, v, &so));
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, a, r));
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    cg_read(a, o->o), cg_read_grad(q, o->dq), cg_read_grad(k, o->dk), cg_read_grad(v, o->dv);
    o->aux = a->aux_bytes, o->plan = cg_graph_plan_bytes(g);
    cg_graph_free(g);
}

static void run_sdpa(cg_precision prec, int64_t t, bool causal, double drop, const float *Q, const float *K, const float *V,
                     const float *R, sdpa_out *o) {
    run_sdpa_drop(prec, SB, SH, t, SD, causal, drop, Q, K, V, R, o);
}

/* Backward reads P~ = P (1 + d), |d| <= u, where fp32 reads P; dP = dO V^T and D = rowsum(dO O) are
 * the same floats in both runs, so per element: dV differs by at most u sum_i P_ij |dO_ie|, and
 * dS = P (dP - D) by at most u P_ij |dP_ij - D_i| (+ its float multiply, 2^-24 per run), carried
 * into dQ = scale dS K and dK = scale dS^T Q as u scale sum P |dP - D| |K| (or |Q|). Each run's float
 * accumulation of k terms adds (k+1) 2^-24 of the same magnitude, twice (both runs round). The
 * magnitudes come from a double reference, with |dP - D| widened by the float error of dP and D
 * ((D+2) 2^-24 of sum|dO||V| + sum|dO||O|), since the runs share that float, not the double. With
 * dropout (mask M, 0 or keep = 1 / (1 - p), the same draws in both runs) dV reads M P~ and dS =
 * P~ (M dP - D): the same bounds with P|dO| and |dP| scaled by keep. */
static void check_sdpa(int64_t t, bool causal, double drop, const float *Q, const float *K, const float *V, const float *R,
                       const sdpa_out *lp, const sdpa_out *fp) {
    const double sc = 0.25, g = 2 * (double)(t + 2) / 16777216, tq = U + U32 * 2 * (1 + U) + g, keep = 1 / (1 - drop);
    double worst[3] = {0}, *P = malloc((size_t)(t * t) * sizeof *P), *M = malloc((size_t)(t * t) * sizeof *M);
    double *O = malloc((size_t)(t * SD) * sizeof *O);
    int differ = 0;
    for (int64_t bh = 0; bh < SB * SH; bh++) {
        const float *q = Q + bh * t * SD, *k = K + bh * t * SD, *v = V + bh * t * SD, *r = R + bh * t * SD;
        for (int64_t i = 0; i < t; i++) {
            double mx = -INFINITY, l = 0;
            for (int64_t j = 0; j < t; j++) {
                double s = 0;
                for (int64_t e = 0; e < SD; e++) s += (double)q[i * SD + e] * k[j * SD + e];
                P[i * t + j] = causal && j > i ? -INFINITY : s * sc;
                mx = fmax(mx, P[i * t + j]);
            }
            for (int64_t j = 0; j < t; j++) l += (P[i * t + j] = exp(P[i * t + j] - mx));
            for (int64_t j = 0; j < t; j++) P[i * t + j] /= l;
            double di = 0, dimag = 0;
            for (int64_t e = 0; e < SD; e++) {
                double oe = 0;
                for (int64_t j = 0; j < t; j++) oe += P[i * t + j] * v[j * SD + e];
                O[i * SD + e] = oe, di += r[i * SD + e] * oe, dimag += fabs(r[i * SD + e] * oe);
            }
            for (int64_t j = 0; j < t; j++) {
                double dp = 0, dpmag = 0;
                for (int64_t e = 0; e < SD; e++) dp += (double)r[i * SD + e] * v[j * SD + e], dpmag += fabs((double)r[i * SD + e] * v[j * SD + e]);
                M[i * t + j] = drop > 0 ? P[i * t + j] * (keep * dpmag + dimag) * (1 + (SD + 2) * U32)
                                        : P[i * t + j] * (fabs(dp - di) + (SD + 2) * U32 * (dpmag + dimag));
            }
        }
        const int64_t at = bh * t * SD;
        for (int64_t i = 0; i < t; i++)
            for (int64_t e = 0; e < SD; e++) {
                double mv = 0, mq = 0, mk = 0;
                for (int64_t j = 0; j < t; j++) {
                    mv += keep * P[j * t + i] * fabs(r[j * SD + e]);
                    mq += sc * M[i * t + j] * fabs(k[j * SD + e]);
                    mk += sc * M[j * t + i] * fabs(q[j * SD + e]);
                }
                const int64_t x = at + i * SD + e;
                worst[0] = fmax(worst[0], fabs(lp->dv[x] - fp->dv[x]) / ((U + g) * mv + 1e-30));
                worst[1] = fmax(worst[1], fabs(lp->dq[x] - fp->dq[x]) / (tq * mq + 1e-30));
                worst[2] = fmax(worst[2], fabs(lp->dk[x] - fp->dk[x]) / (tq * mk + 1e-30));
                differ += lp->dv[x] != fp->dv[x];
            }
    }
    const char *nm[3] = {"dV", "dQ", "dK"};
    for (int i = 0; i < 3; i++)
        CHECK(worst[i] <= 1, "sdpa T=%lld%s dropout %g: %s off fp32 by %.3g of the bound from P's bf16 rounding",
              (long long)t, causal ? " causal" : "", drop, nm[i], worst[i]);
    CHECK(differ > 50, "sdpa T=%lld: only %d dV elements differ from fp32: P was not stored in bf16", (long long)t, differ);
    /* forward runs on the float block: the output is fp32's bit for bit */
    CHECK(!memcmp(lp->o, fp->o, (size_t)(SB * SH * t * SD) * sizeof(float)), "sdpa T=%lld: the bf16 graph's output changed",
          (long long)t);
    /* the store is half size: B H T T floats become bf16 */
    const size_t saved = (size_t)(SB * SH * t * t) * 2;
    CHECK(fp->aux - lp->aux == saved, "sdpa T=%lld: aux %zu -> %zu bytes, expected %zu less", (long long)t, fp->aux, lp->aux,
          saved);
    CHECK(fp->plan >= lp->plan + saved, "sdpa T=%lld: plan %zu -> %zu bytes, expected at least %zu less", (long long)t,
          fp->plan, lp->plan, saved);
    free(P), free(M), free(O);
}

static void test_sdpa(void) {
    enum { N = SB * SH * ST * SD };
    static float Q[N], K[N], V[N], R[N];
    static sdpa_out fp, lp;
    cg_rng rng;
    cg_rng_seed(&rng, 12);
    fill(Q, N, &rng, 1), fill(K, N, &rng, 1), fill(V, N, &rng, 1), fill(R, N, &rng, 1);
    const struct { int64_t t; bool causal; double drop; } cases[4] = {{ST, true, 0}, {8, false, 0}, {ST, true, 0.2}, {8, false, 0.2}};
    setenv("CGRAD_ATTN_PROBS", "keep", 1); /* the kept store (backward remaking P rounds it as the store does) */
    for (int c = 0; c < 4; c++) {
        run_sdpa(CG_FP32, cases[c].t, cases[c].causal, cases[c].drop, Q, K, V, R, &fp);
        run_sdpa(CG_BF16, cases[c].t, cases[c].causal, cases[c].drop, Q, K, V, R, &lp);
        check_sdpa(cases[c].t, cases[c].causal, cases[c].drop, Q, K, V, R, &lp, &fp);
    }
    unsetenv("CGRAD_ATTN_PROBS");
}

/* ---- q, k, v stored in bf16: a linear whose value only attention reads ---- */

enum { QB = 2, QH = 3, QD = 16, QC = QH * QD, QK = 32, QT = 40 };

typedef struct {
    float o[QB * QH * QT * QD], db[3 * QC];
    float y[QB * QT * 3 * QC];     /* the linear's value: float (off), or widened from its bf16 store (on) */
    int lp_values;
    size_t plan;
} qkv_out;

/* x [QB, T, QK] -> linear(W, b) -> split into q, k, v -> heads -> attention (retained) -> sum(a r).
 * Only the bias is a parameter, so its gradient (column sums of dY = [dq dk dv]) shows backward. */
static void run_qkv(bool on, bool retain, int64_t t, bool causal, const float *X, const float *W, const float *B,
                    const float *R, qkv_out *o) {
    if (!on) setenv("CGRAD_BF16_QKV_OFF", "1", 1);
    cg_params *ps = cg_params_new();
    cg_tensor *b = cg_params_add(ps, "b", 1, (int64_t[]){3 * QC});
    cg_write(b, B);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, CG_BF16) == CG_OK, "%s", cg_last_error());
    cg_tensor *x = cg_input(g, "x", CG_REAL, 3, (int64_t[]){QB, t, QK}), *w = cg_input(g, "w", CG_REAL, 2, (int64_t[]){3 * QC, QK});
    cg_tensor *r = cg_input(g, "r", CG_REAL, 4, (int64_t[]){QB, QH, t, QD});
    cg_write(x, X), cg_write(w, W), cg_write(r, R);
    cg_tensor *y = cg_linear(g, x, w, b), *qkv[3];
    if (retain) cg_retain(y);
    CHECK(cg_split(g, y, -1, 3, NULL, qkv) == CG_OK, "%s", cg_last_error());
    const cg_sdpa_opts so = {.scale = 0.25, .causal = causal};
    cg_tensor *a = cg_retain(cg_sdpa_ex(g, cg_split_heads(g, qkv[0], QH), cg_split_heads(g, qkv[1], QH),
                                        cg_split_heads(g, qkv[2], QH), &so));
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, a, r));
    CHECK(loss && cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
    const int64_t ny = QB * t * 3 * QC;
    if (y->lp_value)
        for (int64_t i = 0; i < ny; i++) o->y[i] = cgi_from_bf16(((const cgi_bf16 *)y->data)[i]);
    else memcpy(o->y, y->data, (size_t)ny * sizeof(float));
    CHECK(cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    cg_read(a, o->o), cg_read_grad(b, o->db);
    o->lp_values = 0;
    for (int i = 0; i < g->n; i++) o->lp_values += g->nodes[i]->lp_value;
    o->plan = cg_graph_plan_bytes(g);
    cg_graph_free(g);
    cg_params_free(ps);
    unsetenv("CGRAD_BF16_QKV_OFF");
}

/* Stored in bf16, y~ is bf16 of the float sum plus bias that the float run stores: off by at most
 * u(1 + u)|y| (+ (K + 2) 2^-24 of sum|x||w| + |b|, should the bias go in another order). Attention
 * then computes on y~'s values exactly as on float inputs holding them: its output must be
 * bit-identical to a bf16 graph whose q, k, v inputs are y~ (widened), and the bias gradient
 * (column sums of that graph's dq, dk, dv, which the stored run's attention also makes) within
 * the float summation's (BT + 1) 2^-24 sum|dY| of the double sum. */
static void test_qkv(void) {
    enum { NX = QB * QT * QK, NW = 3 * QC * QK, NR = QB * QH * QT * QD };
    static float X[NX], W[NW], B[3 * QC], R[NR], Q[NR], K[NR], V[NR], dY[QB * QT * 3 * QC];
    static qkv_out on, off, off2;
    static sdpa_out ref;
    cg_rng rng;
    cg_rng_seed(&rng, 21);
    fill(X, NX, &rng, 1), fill(W, NW, &rng, 0.2), fill(B, 3 * QC, &rng, 0.1), fill(R, NR, &rng, 1);
    const struct { int64_t t; bool causal; } cases[2] = {{QT, true}, {8, false}}; /* the packed path; BLIS's */
    for (int c = 0; c < 2; c++) {
        const int64_t t = cases[c].t, ny = QB * t * 3 * QC;
        run_qkv(true, false, t, cases[c].causal, X, W, B, R, &on);
        run_qkv(false, true, t, cases[c].causal, X, W, B, R, &off);
        run_qkv(false, false, t, cases[c].causal, X, W, B, R, &off2);
        CHECK(on.lp_values == off2.lp_values + 1, "qkv T=%lld: %d bf16 values, %d with q/k/v off (expected one more)",
              (long long)t, on.lp_values, off2.lp_values);
        CHECK(on.plan < off2.plan, "qkv T=%lld: plan %zu bytes with q/k/v in bf16, %zu without", (long long)t, on.plan, off2.plan);
        int bad = 0, rounded = 0;
        for (int64_t i = 0; i < ny; i++) {
            const int64_t row = i / (3 * QC), col = i % (3 * QC);
            double mag = fabs(B[col]);
            for (int64_t p = 0; p < QK; p++) mag += fabs((double)X[row * QK + p] * W[col * QK + p]);
            const double bound = U * (1 + U) * fabs(off.y[i]) + (QK + 2) * U32 * mag;
            bad += fabs((double)on.y[i] - off.y[i]) > bound;
            rounded += on.y[i] != off.y[i];
        }
        CHECK(bad == 0, "qkv T=%lld: %d stored elements off the float value by more than their rounding", (long long)t, bad);
        CHECK(rounded > ny / 2, "qkv T=%lld: only %d of %lld elements rounded: not stored in bf16", (long long)t, rounded,
              (long long)ny);
        /* the reference: q, k, v as [B, H, T, D] inputs holding the stored values */
        for (int64_t bb = 0; bb < QB; bb++)
            for (int64_t h = 0; h < QH; h++)
                for (int64_t i = 0; i < t; i++)
                    for (int64_t e = 0; e < QD; e++) {
                        const int64_t at = ((bb * QH + h) * t + i) * QD + e, yr = (bb * t + i) * 3 * QC + h * QD + e;
                        Q[at] = on.y[yr], K[at] = on.y[yr + QC], V[at] = on.y[yr + 2 * QC];
                    }
        run_sdpa_drop(CG_BF16, QB, QH, t, QD, cases[c].causal, 0, Q, K, V, R, &ref);
        CHECK(!memcmp(on.o, ref.o, (size_t)(QB * QH * t * QD) * sizeof(float)),
              "qkv T=%lld: attention on the bf16 store differs from attention on its values", (long long)t);
        for (int64_t bb = 0; bb < QB; bb++)
            for (int64_t h = 0; h < QH; h++)
                for (int64_t i = 0; i < t; i++)
                    for (int64_t e = 0; e < QD; e++) {
                        const int64_t at = ((bb * QH + h) * t + i) * QD + e, yr = (bb * t + i) * 3 * QC + h * QD + e;
                        dY[yr] = ref.dq[at], dY[yr + QC] = ref.dk[at], dY[yr + 2 * QC] = ref.dv[at];
                    }
        double worst = 0;
        for (int64_t col = 0; col < 3 * QC; col++) {
            double s = 0, mag = 0;
            for (int64_t row = 0; row < QB * t; row++) s += dY[row * 3 * QC + col], mag += fabs(dY[row * 3 * QC + col]);
            worst = fmax(worst, fabs(on.db[col] - s) / ((double)(QB * t + 1) * U32 * mag + 1e-30));
        }
        CHECK(worst <= 1, "qkv T=%lld: bias gradient off the sums of attention's dq, dk, dv by %.3g of the bound",
              (long long)t, worst);
    }
}

/* ---- a whole GPT step (linear, attention, the fused LM head, AdamW) against fp32 ---- */

static const char *gpt_json = "{\"vocab_size\": 96, \"n_positions\": 32, \"n_embd\": 64, \"n_layer\": 2, \"n_head\": 4}";
enum { GB = 4, GT = 32 };

typedef struct {
    double loss[3];
    float *grads, *values;
    int64_t span;
    int64_t conversions[3];
    int lp_values;     /* values the plan stored in bf16 */
    int recomputed;    /* nodes backward recomputes */
    size_t unplanned;  /* conversion scratch held outside the plan */
} gpt_run;

static bool gpt_ckpt; /* run_gpt with gradient checkpointing */

/* Three training steps; prec < 0 leaves the graph's precision unset. */
static void run_gpt(int prec, gpt_run *o) {
    cg_params *ps = cg_params_new();
    cg_model *m = cg_model_new(CG_ARCH_GPT2, gpt_json, 0.0, ps, 99);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    if (prec >= 0) CHECK(cg_graph_set_precision(g, (cg_precision)prec) == CG_OK, "%s", cg_last_error());
    cg_graph_set_checkpointing(g, gpt_ckpt);
    cg_model_graph mg;
    CHECK(m && g && cg_model_build(g, m, GB, GT, 0, &mg) == CG_OK, "%s", cg_last_error());
    int32_t *ids = cg_idata(cg_model_graph_input(&mg, "input_ids")), *tg = cg_idata(cg_model_graph_input(&mg, "targets"));
    for (int i = 0; i < GB * GT; i++) ids[i] = (i * 37 + 5) % 96, tg[i] = (i * 11 + 3) % 96;
    cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
    cg_optim *opt = cg_optim_new(ps, &oc);
    o->span = cg_params_span(ps);
    for (int s = 0; s < 3; s++) {
        const int64_t before = cgi_lp_param_conversions;
        cg_params_zero_grad(ps);
        CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, mg.loss) == CG_OK, "%s", cg_last_error());
        o->loss[s] = cg_item(mg.loss);
        if (s == 0) {
            o->lp_values = o->recomputed = 0;
            for (int i = 0; i < g->n; i++) o->lp_values += g->nodes[i]->lp_value, o->recomputed += g->nodes[i]->recompute;
            o->unplanned = cgi_lp_unplanned_bytes(g);
            o->grads = malloc((size_t)o->span * sizeof(float));
            memcpy(o->grads, cg_params_grads(ps), (size_t)o->span * sizeof(float));
        }
        /* a second pass without a step reads the same bf16 copies: no conversion */
        const int64_t mid = cgi_lp_param_conversions;
        CHECK(cg_graph_forward(g) == CG_OK && cg_item(mg.loss) == o->loss[s], "a repeated forward changed the loss");
        CHECK(cgi_lp_param_conversions == mid, "a forward without an optimizer step converted %lld parameters again",
              (long long)(cgi_lp_param_conversions - mid));
        o->conversions[s] = mid - before;
        cg_optim_step(opt, 1e-3);
    }
    o->values = malloc((size_t)o->span * sizeof(float));
    memcpy(o->values, cg_params_values(ps), (size_t)o->span * sizeof(float));
    cg_optim_free(opt);
    cg_graph_free(g);
    cg_model_free(m);
    cg_params_free(ps);
}

/* The product kernels test_gpt_step forces in turn: the fp32 units' in `products`, oneDNN's in `onednn`. */
static int gpt_kernel_first = 2, gpt_kernel_last = 2;

/* Frozen weights keep bf16 copies, made once: with every weight but one frozen (a fine-tune of a
 * few layers), an optimizer step remakes none of them, and cg_params_touch, which may follow any
 * change, remakes them all. The trainable one, read by a linear of a training step, has no copy:
 * it is converted into the linear's planned scratch at each read, so no bf16 weight of the step
 * lies outside the plan. */
static void test_frozen_copies(void) {
    cg_params *ps = cg_params_new();
    cg_model *m = cg_model_new(CG_ARCH_GPT2, gpt_json, 0.0, ps, 99);
    for (int i = 0; m && i < cg_params_count(ps); i++)
        cg_param_set_trainable(cg_params_at(ps, i), !strcmp(cg_name(cg_params_at(ps, i)), "h.1.mlp.c_fc.weight"));
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_model_graph mg;
    CHECK(m && g && cg_graph_set_precision(g, CG_BF16) == CG_OK && cg_model_build(g, m, GB, GT, 0, &mg) == CG_OK, "%s",
          cg_last_error());
    int32_t *ids = cg_idata(cg_model_graph_input(&mg, "input_ids")), *tg = cg_idata(cg_model_graph_input(&mg, "targets"));
    for (int i = 0; i < GB * GT; i++) ids[i] = (i * 37 + 5) % 96, tg[i] = (i * 11 + 3) % 96;
    cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
    cg_optim *opt = cg_optim_new(ps, &oc);
    int64_t conv[4];
    for (int s = 0; s < 4; s++) {
        if (s == 3) cg_params_touch(ps);
        const int64_t before = cgi_lp_param_conversions;
        cg_params_zero_grad(ps);
        CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, mg.loss) == CG_OK, "%s", cg_last_error());
        conv[s] = cgi_lp_param_conversions - before;
        cg_optim_step(opt, 1e-3);
    }
    CHECK(conv[0] > 2 && conv[1] == 0 && conv[2] == 0 && conv[3] == conv[0],
          "bf16 copies made: %lld at the first step, then %lld and %lld after optimizer steps (want 0: the trainable "
          "weight is converted in the plan), %lld after cg_params_touch (want all again)", (long long)conv[0],
          (long long)conv[1], (long long)conv[2], (long long)conv[3]);
    cg_tensor *fc = NULL;
    for (int i = 0; i < cg_params_count(ps); i++)
        if (!strcmp(cg_name(cg_params_at(ps, i)), "h.1.mlp.c_fc.weight")) fc = cg_params_at(ps, i);
    CHECK(fc && !fc->root->lp && cgi_lp_unplanned_bytes(g) == 0, "the trainable weight has a bf16 copy, or %zu bytes of "
          "conversion scratch lie outside the plan", cgi_lp_unplanned_bytes(g));
    cg_optim_free(opt);
    cg_graph_free(g);
    cg_model_free(m);
    cg_params_free(ps);
}

static void test_gpt_step(bool bf16_ok) {
    gpt_run unset, fp, back, lp;
    run_gpt(-1, &unset);
    run_gpt(CG_FP32, &fp);
    /* dropping the setting gives fp32 bit for bit, whatever new graphs default to */
    if (bf16_ok) cg_set_precision(CG_BF16);
    run_gpt(CG_FP32, &back);
    cg_set_precision(CG_FP32);
    CHECK(!memcmp(unset.loss, fp.loss, sizeof fp.loss) && !memcmp(unset.values, fp.values, (size_t)fp.span * 4) &&
              !memcmp(back.values, fp.values, (size_t)fp.span * 4) && !memcmp(back.grads, fp.grads, (size_t)fp.span * 4),
          "fp32 set explicitly (or after a bf16 default) is not bit-identical to the unset default");
    CHECK(fp.conversions[0] == 0, "an fp32 graph converted %lld parameters to bf16", (long long)fp.conversions[0]);
    if (bf16_ok) {
        run_gpt(CG_BF16, &lp);
        /* The loss is a mean of log-softmax terms; each logit is off by at most ~2u sum|x||w| per
         * product, and a perturbation e of the logits moves log-softmax by at most 2 max|e|. Through
         * two blocks of products the logit error stays a few u of the logits' scale (~1 at init), so
         * the loss is held within 8u = 2^-5 nats absolute, the gradient within 8u relative (norm). */
        for (int s = 0; s < 3; s++)
            CHECK(fabs(lp.loss[s] - fp.loss[s]) <= 8 * U, "gpt step %d: bf16 loss %.6f vs fp32 %.6f", s, lp.loss[s],
                  fp.loss[s]);
        double dn = 0, nn = 0;
        for (int64_t i = 0; i < fp.span; i++) dn += pow(lp.grads[i] - fp.grads[i], 2), nn += pow(fp.grads[i], 2);
        CHECK(sqrt(dn) <= 8 * U * sqrt(nn), "gpt gradients: |bf16 - fp32| / |fp32| = %.3g > %.3g", sqrt(dn / nn), 8 * U);
        CHECK(lp.loss[0] != fp.loss[0] || dn > 0, "the bf16 step equals fp32 exactly: the products did not run in bf16");
        /* the same step forced onto each product kernel: both within the same bounds of fp32 */
        for (int kn = gpt_kernel_first; kn <= gpt_kernel_last; kn++) {
            if (kn == 1 && !cgi_lp_product(1, 1, 1, 1, (const cgi_bf16[]){0x3f80}, 1, 1, (const cgi_bf16[]){0x3f80}, 1,
                                           1, 1, 0, (float[]){0}, 1, 1, NULL, false))
                continue; /* no oneDNN kernel on this CPU */
            gpt_run fk;
            cgi_lp_force_kernel = kn;
            run_gpt(CG_BF16, &fk);
            cgi_lp_force_kernel = 0;
            double dk = 0;
            for (int64_t i = 0; i < fp.span; i++) dk += pow(fk.grads[i] - fp.grads[i], 2);
            for (int s = 0; s < 3; s++)
                CHECK(fabs(fk.loss[s] - fp.loss[s]) <= 8 * U, "gpt step %d on kernel %d: bf16 loss %.6f vs fp32 %.6f", s,
                      kn, fk.loss[s], fp.loss[s]);
            CHECK(sqrt(dk) <= 8 * U * sqrt(nn) && dk > 0, "gpt gradients on kernel %d: |bf16 - fp32| / |fp32| = %.3g", kn,
                  sqrt(dk / nn));
            free(fk.grads), free(fk.values);
        }
        /* weights: the copies are made once per optimizer step, not once per use */
        for (int s = 0; s < 3; s++)
            CHECK(lp.conversions[s] > 0 && lp.conversions[s] == lp.conversions[0],
                  "step %d converted %lld parameters (step 0: %lld)", s, (long long)lp.conversions[s],
                  (long long)lp.conversions[0]);
        /* conversion scratch is planned: nothing is held for the graph's life */
        CHECK(lp.unplanned == 0, "a planned bf16 graph holds %zu bytes of conversion scratch", lp.unplanned);
        CHECK(fp.lp_values == 0 && back.lp_values == 0, "an fp32 graph stored values in bf16");
        /* The values read only by linears (per block the two LayerNorm outputs and the GELU's; ln_f's
         * is read by the head fused with the loss, and stays float) are written in bf16 by the ops that make them: the same numbers
         * the linear would have converted, and GELU's backward recomputes its output in float, so
         * the whole run is bit-identical to converting them at the product. The FC pre-activation
         * GELU reads (one per block, 9 values in all) is a rounding of its own: the run above holds
         * it to fp32 within the same 8u, and test_activations per element; without it
         * (CGRAD_BF16_PREACT_OFF) the run is bit-identical to converting at the product. */
        gpt_run conv, pre, qkv;
        setenv("CGRAD_BF16_VALUES_OFF", "1", 1);
        run_gpt(CG_BF16, &conv);
        unsetenv("CGRAD_BF16_VALUES_OFF");
        setenv("CGRAD_BF16_QKV_OFF", "1", 1);
        run_gpt(CG_BF16, &qkv);
        setenv("CGRAD_BF16_PREACT_OFF", "1", 1);
        run_gpt(CG_BF16, &pre);
        unsetenv("CGRAD_BF16_PREACT_OFF");
        unsetenv("CGRAD_BF16_QKV_OFF");
        /* and each block's c_attn output (q, k, v), read only by attention: 10 in all */
        CHECK(lp.lp_values == 10 && qkv.lp_values == 8 && pre.lp_values == 6 && conv.lp_values == 0,
              "bf16-stored values: %d (expected 10), %d without q/k/v (8), %d without the pre-activations either (6), "
              "%d with them off", lp.lp_values, qkv.lp_values, pre.lp_values, conv.lp_values);
        CHECK(memcmp(lp.grads, qkv.grads, (size_t)lp.span * 4), "q, k, v in bf16 changed nothing");
        free(qkv.grads), free(qkv.values);
        CHECK(!memcmp(pre.loss, conv.loss, sizeof pre.loss) && !memcmp(pre.grads, conv.grads, (size_t)pre.span * 4) &&
                  !memcmp(pre.values, conv.values, (size_t)pre.span * 4),
              "values stored in bf16 changed the run (loss %.9g vs %.9g)", pre.loss[2], conv.loss[2]);
        CHECK(memcmp(lp.grads, pre.grads, (size_t)lp.span * 4), "the bf16 pre-activations changed nothing");
        free(pre.grads), free(pre.values);
        /* the reference loops that stand in when oneDNN refuses a bf16-stored operand: same products,
         * float accumulation in another order, so within the same bounds of fp32 */
        gpt_run ref;
        cgi_lp_force_ref = true;
        run_gpt(CG_BF16, &ref);
        cgi_lp_force_ref = false;
        double dr = 0;
        for (int64_t i = 0; i < fp.span; i++) dr += pow(ref.grads[i] - fp.grads[i], 2);
        CHECK(fabs(ref.loss[0] - fp.loss[0]) <= 8 * U && sqrt(dr) <= 8 * U * sqrt(nn),
              "reference bf16 loops: loss %.6f vs fp32 %.6f, gradient error %.3g", ref.loss[0], fp.loss[0], sqrt(dr / nn));
        CHECK(fabs(ref.loss[0] - lp.loss[0]) <= 1e-4, "reference bf16 loops: loss %.6f vs oneDNN %.6f", ref.loss[0],
              lp.loss[0]);
        /* with gradient checkpointing the recomputed products convert into their own planned scratch
         * (swapped in with the recompute buffers) and store the same bf16 values: the same run */
        gpt_run ck;
        gpt_ckpt = true;
        run_gpt(CG_BF16, &ck);
        gpt_ckpt = false;
        CHECK(ck.recomputed > 0 && ck.unplanned == 0 && ck.lp_values == lp.lp_values,
              "checkpointed bf16: %d nodes recomputed, %zu unplanned bytes, %d bf16 values", ck.recomputed, ck.unplanned,
              ck.lp_values);
        CHECK(!memcmp(ck.loss, lp.loss, sizeof lp.loss) && !memcmp(ck.grads, lp.grads, (size_t)lp.span * 4) &&
                  !memcmp(ck.values, lp.values, (size_t)lp.span * 4),
              "checkpointed bf16 run differs (loss %.9g vs %.9g)", ck.loss[2], lp.loss[2]);
        free(ck.grads), free(ck.values);
        free(conv.grads), free(conv.values), free(ref.grads), free(ref.values);
        free(lp.grads), free(lp.values);
    }
    free(unset.grads), free(unset.values), free(fp.grads), free(fp.values), free(back.grads), free(back.values);
}

/* Whether /proc/cpuinfo's first flags line lists `flag` (false where there is no such file). */
static bool cpuinfo_flag(const char *flag) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    bool found = false;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5)) {
            for (char *w = strtok(strchr(line, ':') ? strchr(line, ':') + 1 : line, " \t\n"); w && !found;
                 w = strtok(NULL, " \t\n"))
                found = !strcmp(w, flag);
            break;
        }
    if (f) fclose(f);
    return found;
}

/* Whether Linux grants this process AMX's tile data (arch_prctl ARCH_REQ_XCOMP_PERM, 18). */
static bool amx_permitted(void) {
#if defined(__linux__) && defined(__x86_64__)
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return false;
#endif
}

/* ---- the product kernels themselves (oneDNN's; the fp32 units with widened operands) ---- */

/* One product on kernel `which` (1 oneDNN, 2 fp32 units) against the exact product of the bf16
 * operands in double: C = alpha A B (+ bias) + beta C0, C float or bf16. The operands are exactly
 * bf16 values, so the only error allowed is the float accumulation's, (k + 2) 2^-24 of the
 * magnitudes (|alpha| sum|a||b| + |bias| + |beta c0|), plus, for a bf16 C, its one rounding (u of
 * the value): a wrong widening (a lost or shifted bit) is off by far more. Returns false when the
 * kernel cannot run here. */
static bool kernel_case(int which, int threads, int64_t m, int64_t n, int64_t k, bool ta, bool tb, int64_t pad, float alpha,
                        float beta, bool bias, bool c16, float *out, int64_t nout) {
    const int64_t rsa = ta ? 1 : k + pad, csa = ta ? m + pad : 1, rsb = tb ? 1 : n + pad, csb = tb ? k + pad : 1;
    const int64_t na = ta ? (k ? (k - 1) * csa + m : 0) : (m - 1) * rsa + k, nb = tb ? (n - 1) * csb + k : (k ? (k - 1) * rsb + n : 0);
    cgi_bf16 *a = calloc((size_t)na + 1, sizeof *a), *b = calloc((size_t)nb + 1, sizeof *b);
    float *c = malloc((size_t)(m * n) * sizeof *c), *c0 = malloc((size_t)(m * n) * sizeof *c0), *bv = malloc((size_t)n * sizeof *bv);
    cgi_bf16 *h = malloc((size_t)(m * n) * sizeof *h);
    cg_rng rng;
    cg_rng_seed(&rng, (uint64_t)(m * 131 + n * 7 + k));
    for (int64_t i = 0; i < na; i++) a[i] = cgi_to_bf16((float)cg_rng_normal(&rng));
    for (int64_t i = 0; i < nb; i++) b[i] = cgi_to_bf16((float)cg_rng_normal(&rng));
    fill(c0, m * n, &rng, 1);
    fill(bv, n, &rng, 1);
    memcpy(c, c0, (size_t)(m * n) * sizeof *c);
    cg_set_threads(threads);
    const bool ran = cgi_lp_product(which, m, n, k, a, rsa, csa, b, rsb, csb, alpha, beta, c16 ? (void *)h : c, n, 1,
                                    bias ? bv : NULL, c16);
    cg_set_threads(2);
    if (ran) {
        double worst = 0;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0, g = 0;
                for (int64_t p = 0; p < k; p++) {
                    const double x = cgi_from_bf16(a[i * rsa + p * csa]) * (double)cgi_from_bf16(b[p * rsb + j * csb]);
                    s += x, g += fabs(x);
                }
                const double b0 = bias ? bv[j] : 0, cc = c16 ? 0 : beta * (double)c0[i * n + j];
                const double want = alpha * s + b0 + cc;
                const double got = c16 ? cgi_from_bf16(h[i * n + j]) : c[i * n + j];
                const double tol = (double)(k + 2) * U32 * (fabs(alpha) * g + fabs(b0) + fabs(cc)) * (1 + U) +
                                   (c16 ? U * fabs(want) * (1 + U) : 0) + 1e-30;
                const double e = fabs(got - want) / tol;
                worst = e > worst ? e : worst;
                if (out && i * n + j < nout) out[i * n + j] = (float)got;
            }
        CHECK(worst <= 1, "kernel %d, %d thread(s), [%lld,%lld]x[%lld,%lld]%s%s pad %lld, alpha %g beta %g%s%s: error %.3g of "
              "the float bound", which, threads, (long long)m, (long long)k, (long long)k, (long long)n, ta ? " A^T" : "",
              tb ? " B^T" : "", (long long)pad, alpha, beta, bias ? " bias" : "", c16 ? " bf16 C" : "", worst);
    }
    free(a), free(b), free(c), free(c0), free(bv), free(h);
    return ran;
}

/* The products of kernels first..last (1 oneDNN's, 2 the fp32 units'); returns how many of kernel
 * first's ran (0: this CPU cannot run it). */
static int test_kernels(int first, int last) {
    static const int64_t dims[][3] = {{1, 1, 1},   {1, 70, 33},  {37, 1, 19},  {5, 13, 0},   {13, 45, 7},
                                      {37, 50, 70}, {64, 96, 513}, {100, 33, 1030}, {256, 384, 192},
                                      {1, 600, 40}, {530, 1, 24}}; /* one token's products, longer than a LINE */
    enum { ND = sizeof dims / sizeof *dims };
    int ran[3] = {0};
    for (int which = first; which <= last; which++)
        for (int d = 0; d < ND; d++)
            for (int v = 0; v < 6; v++) {
                const int64_t m = dims[d][0], n = dims[d][1], k = dims[d][2];
                const bool ta = v & 1, tb = v & 2, c16 = v == 4 && k > 0, bias = v >= 3 && k > 0;
                const float alpha = v == 1 ? -1.25f : v == 2 ? 0.5f : 1, beta = v == 0 || v == 2 ? 1 : 0;
                ran[which] += kernel_case(which, 1, m, n, k, ta, tb, v == 5 ? 3 : 0, alpha, beta, bias, c16, NULL, 0);
            }
    if (last == 2) CHECK(ran[2] == ND * 6, "the fp32-units kernel refused %d of %d products", ND * 6 - ran[2], ND * 6);
    if (!ran[first]) return 0;
    /* determinism: run to run, and (fp32 units: pieces cut along C's rows or columns only, every
     * element summed over k in one order) one thread against two */
    enum { DM = 256, DN = 384, DK = 192 };
    float *r[4];
    for (int i = 0; i < 4; i++) r[i] = malloc((size_t)(DM * DN) * sizeof(float));
    for (int which = first; which <= last; which++) {
        bool ok = kernel_case(which, 2, DM, DN, DK, false, true, 0, 1, 0, true, false, r[0], DM * DN);
        ok = ok && kernel_case(which, 2, DM, DN, DK, false, true, 0, 1, 0, true, false, r[1], DM * DN);
        ok = ok && kernel_case(which, 1, DM, DN, DK, false, true, 0, 1, 0, true, false, r[2], DM * DN);
        ok = ok && kernel_case(which, 1, DM, DN, DK, false, true, 0, 1, 0, true, false, r[3], DM * DN);
        if (!ok) continue;
        CHECK(!memcmp(r[0], r[1], (size_t)(DM * DN) * 4) && !memcmp(r[2], r[3], (size_t)(DM * DN) * 4),
              "kernel %d: two runs of the same product differ", which);
        if (which == 2) CHECK(!memcmp(r[0], r[2], (size_t)(DM * DN) * 4), "fp32 units: one thread and two differ");
    }
    for (int i = 0; i < 4; i++) free(r[i]);
    if (last != 2) return ran[first];
    /* the choice is shown and coherent */
    const char *kn = cg_bf16_kernel();
    CHECK(kn && (!strcmp(kn, "onednn") || !strcmp(kn, "fp32")) && cg_bf16_kernel_why()[0], "bf16 kernel '%s' (%s)",
          kn ? kn : "(null)", cg_bf16_kernel_why());
    const double ratio = cg_bf16_dot_ratio(), amx = cg_bf16_amx_ratio();
    const double best = isfinite(amx) && amx > ratio ? amx : ratio;
    if (!getenv("CGRAD_BF16_GEMM") && isfinite(best))
        CHECK(!strcmp(kn, best < 1 ? "fp32" : "onednn"), "kernel %s chosen with measured ratios of %.2f (vdpbf16ps) and "
              "%.2f (AMX)", kn, ratio, amx);
    /* AMX is measured exactly where Linux lists it (/proc/cpuinfo) and grants the process its tiles
     * (the measurement runs beside vdpbf16ps's, so only on a CPU listed with avx512_bf16 too) */
    const bool listed = cpuinfo_flag("amx_bf16") && cpuinfo_flag("amx_tile") && cpuinfo_flag("avx512_bf16");
    CHECK(listed ? !amx_permitted() || isfinite(amx) : !isfinite(amx),
          "AMX %s in /proc/cpuinfo but its measured rate is %.2f of the FMA's", listed ? "listed" : "not listed", amx);
    printf("test_bf16: bf16 kernel %s (%s, vdpbf16ps / FMA %.2f, AMX / FMA %.2f)\n", kn, cg_bf16_kernel_why(), ratio, amx);
    /* a product runs on the kernel chosen, but one row or column of C (a token's products, bound by
     * memory) on the fp32 units' line path: the same bits as that kernel forced */
    static const int64_t routed[][3] = {{1, 600, 40}, {1, 70, 33}, {530, 1, 24}, {37, 50, 70}, {256, 384, 192}};
    for (int d = 0; d < 5; d++) {
        const int64_t m = routed[d][0], n = routed[d][1], k = routed[d][2];
        const int expect = m == 1 || n == 1 || !strcmp(kn, "fp32") ? 2 : 1;
        float *got = malloc((size_t)(m * n) * sizeof *got), *want = malloc((size_t)(m * n) * sizeof *want);
        if (kernel_case(3, 1, m, n, k, false, true, 0, 1, 0, true, false, got, m * n) &&
            kernel_case(expect, 1, m, n, k, false, true, 0, 1, 0, true, false, want, m * n))
            CHECK(!memcmp(got, want, (size_t)(m * n) * sizeof *got), "[%lld,%lld]x[%lld,%lld] did not run on %s",
                  (long long)m, (long long)k, (long long)k, (long long)n, expect == 2 ? "the fp32 units" : "oneDNN");
        free(got), free(want);
    }
    return ran[first];
}

/* In-place conversion of float rows to bf16 rows at the same starts: every element as cgi_to_bf16
 * makes it, for row lengths around the block size. */
static void test_inplace(void) {
    cg_rng rng;
    cg_rng_seed(&rng, 3);
    for (int64_t n = 1; n <= 200; n += 13) {
        enum { M = 5 };
        float *x = malloc((size_t)(M * n) * sizeof *x), *ref = malloc((size_t)(M * n) * sizeof *ref);
        fill(x, M * n, &rng, 3);
        memcpy(ref, x, (size_t)(M * n) * sizeof *x);
        cgi_lp_to_bf16_inplace(x, M, n);
        int bad = 0;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < n; j++) {
                cgi_bf16 h;
                memcpy(&h, (char *)(x + i * n) + j * 2, 2);
                bad += h != cgi_to_bf16(ref[i * n + j]);
            }
        CHECK(bad == 0, "in-place bf16 rows of %lld: %d elements wrong", (long long)n, bad);
        free(x), free(ref);
    }
}

static void test_api(const char *why) {
    cg_precision p;
    CHECK(cg_precision_parse("bf16", &p) == CG_OK && p == CG_BF16 && cg_precision_parse("fp32", &p) == CG_OK &&
              p == CG_FP32 && cg_precision_parse("fp16", &p) == CG_ERR_ARG && strstr(cg_last_error(), "fp16"),
          "parse: %s", cg_last_error());
    CHECK(cg_graph_set_precision(NULL, CG_BF16) == CG_ERR_ARG, "NULL graph accepted");
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_precision(g) == CG_FP32 && cg_default_precision() == CG_FP32, "the default is not fp32");
    CHECK(cg_graph_set_precision(g, (cg_precision)7) == CG_ERR_ARG, "precision 7 accepted");
    cg_status s = cg_graph_set_precision(g, CG_BF16);
    if (why) CHECK(s == CG_ERR_STATE && strstr(cg_last_error(), why) && cg_graph_precision(g) == CG_FP32,
                   "bf16 without support: status %d, '%s'", s, cg_last_error());
    else CHECK(s == CG_OK && cg_graph_precision(g) == CG_BF16, "%s", cg_last_error());
    cg_graph_free(g);
}

/* Three ctest entries: test_bf16 (what runs everywhere: the API, refusals, conversions, fp32 steps),
 * test_bf16_products (`test_bf16 products`: needs oneDNN) and test_bf16_onednn (`test_bf16 onednn`:
 * oneDNN's own kernel, needs avx512_bf16); the last two report skipped where they cannot run. */
int main(int argc, char **argv) {
    cg_set_threads(2);
    const char *why = cg_bf16_unavailable(), *part = test_part(argc, argv);
    if (!strcmp(part, "onednn")) {
        if (why) return test_skip("test_bf16 onednn", why);
        if (!test_kernels(1, 1)) return test_skip("test_bf16 onednn", "this CPU lacks avx512_bf16");
        gpt_kernel_first = gpt_kernel_last = 1;
        test_gpt_step(true);
        TEST_END();
    }
    if (!strcmp(part, "products")) {
        if (why) return test_skip("test_bf16 products", why);
        test_kernels(2, 2);
        test_linear();
        test_matmul();
        test_lce();
        test_lce_mapped();
        test_activations();
        test_swiglu_value();
        test_no_copy();
        test_shadows();
        test_sdpa();
        test_qkv();
        test_frozen_copies();
        test_gpt_step(true);
        TEST_END();
    }
    test_api(why);
    test_inplace();
    test_gpt_step(false);
    TEST_END();
}
