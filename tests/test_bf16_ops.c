/* SPDX-License-Identifier: MIT */
/* bf16 mixed precision, op by op: linear (plain, transposed, strided), matmul (batched, broadcast),
 * the activations and SwiGLU whose values are stored in bf16, a parameter read through its bf16 copy
 * with no other copy, and a post-LN block's bf16 shadows; each product against references computed
 * in double within the bounds of tests/bf16_check.h. Skipped (77) where bf16 cannot run. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "../ops/bf16_internal.h"
#include "../optim/optim.h"
#include "bf16_check.h"
#include "check.h"

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
 * for dW), the same rounding of the same floats, so loss and gradients are the same bits. Its
 * inputs, gate and up, are stored in bf16 too (check_swiglu_preact). */
typedef struct {
    float dx[AM * AK], dg[AH * AK], du[AH * AK], dd[AN * AH];
    float loss;
    int swiglu_bf16, lp_values;
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
    o->lp_values = 0;
    for (int i = 0; i < g->n; i++) o->lp_values += g->nodes[i]->lp_value;
    cg_graph_free(g);
    cg_params_free(ps);
}

static inline double silu_ref(double x) { return x / (1 + exp(-x)); }

/* Gate and up stored in bf16 (the linears write them once, rounded from their float sums; SwiGLU
 * reads them back) against the same run with them float (CGRAD_BF16_PREACT_OFF), per element. With
 * g and u the float values, |g~ - g| <= dg = U(1 + U)|g| + 2(AK + 1) 2^-24 sum|x~ wg~| (the sums may
 * be made in another order), and du alike. Both runs share dh = R~ Wd~ (the down linear's dX). With
 * |silu'| <= 1.1 and |silu''| <= 0.5:
 *  - dgate = dh u silu'(g) moves by at most |dh| (1.1 du + 0.5 (|u| + du) dg), dup = dh silu(g) by
 *    |dh| 1.1 dg, each plus 16 2^-24 of itself for its float formula;
 *  - dX, dWg and dWu take them rounded to bf16, which may go the other way: each term moves by that
 *    plus 2U(1 + U) of itself, times |Wg~|, |Wu~| or |X~|, plus two float sums;
 *  - dWd = R~^T h, h = bf16(silu(g) u): each h moves by 1.1 dg (|u| + du) + |silu(g)| du + 2U(1 + U)|h|,
 *    times |R~|, plus two float sums. Magnitudes from double references on the bf16-rounded operands. */
static void check_swiglu_preact(const float *X, const float *WG, const float *WU, const float *WD, const float *R,
                                const swiglu_out *on, const swiglu_out *off) {
    static double ag[AM * AH], au[AM * AH], mg[AM * AH], mu[AM * AH], mh[AM * AH], hh[AM * AH];
    static double bnd[AH * AK > AM * AK ? AH * AK : AM * AK];
    const double r2 = 2 * U * (1 + U);
    for (int i = 0; i < AM; i++)
        for (int j = 0; j < AH; j++) {
            double g = 0, u = 0, sg = 0, su = 0, t = 0;
            for (int k = 0; k < AK; k++) {
                const double x = bf(X[i * AK + k]), a = bf(WG[j * AK + k]), b = bf(WU[j * AK + k]);
                g += x * a, u += x * b, sg += fabs(x * a), su += fabs(x * b);
            }
            for (int n = 0; n < AN; n++) t += (double)bf(R[i * AN + n]) * bf(WD[n * AH + j]);
            const double eg = U * (1 + U) * fabs(g) + 2 * (AK + 1) * U32 * sg, eu = U * (1 + U) * fabs(u) + 2 * (AK + 1) * U32 * su;
            const double s = 1 / (1 + exp(-g)), d1 = s * (1 + g * (1 - s));
            const double vg = t * u * d1, vu = t * silu_ref(g); /* dgate, dup */
            hh[i * AH + j] = silu_ref(g) * u;
            ag[i * AH + j] = fabs(vg), au[i * AH + j] = fabs(vu);
            mg[i * AH + j] = fabs(t) * (1.1 * eu + 0.5 * (fabs(u) + eu) * eg) + 16 * U32 * fabs(vg) + r2 * fabs(vg);
            mu[i * AH + j] = fabs(t) * 1.1 * eg + 16 * U32 * fabs(vu) + r2 * fabs(vu);
            mh[i * AH + j] = 1.1 * eg * (fabs(u) + eu) + fabs(silu_ref(g)) * eu + r2 * fabs(hh[i * AH + j]);
        }
    int bad = 0, differ = 0;
    double worst = 0;
    for (int i = 0; i < AM; i++) /* dX = dgate Wg~ + dup Wu~ */
        for (int k = 0; k < AK; k++) {
            double b = 0, m = 0;
            for (int j = 0; j < AH; j++) {
                const double wg = fabs(bf(WG[j * AK + k])), wu = fabs(bf(WU[j * AK + k]));
                b += mg[i * AH + j] * wg + mu[i * AH + j] * wu, m += ag[i * AH + j] * wg + au[i * AH + j] * wu;
            }
            bnd[i * AK + k] = b + 4 * (AH + 1) * U32 * m * (1 + U);
        }
    within(on->dx, off->dx, bnd, AM * AK, &bad, &differ, &worst);
    for (int w = 0; w < 2; w++) { /* dWg, dWu = (dgate, dup)^T X~ */
        const double *mv = w ? mu : mg, *av = w ? au : ag;
        for (int j = 0; j < AH; j++)
            for (int k = 0; k < AK; k++) {
                double b = 0, m = 0;
                for (int i = 0; i < AM; i++) {
                    const double x = fabs(bf(X[i * AK + k]));
                    b += mv[i * AH + j] * x, m += av[i * AH + j] * x;
                }
                bnd[j * AK + k] = b + 2 * (AM + 1) * U32 * m * (1 + U);
            }
        within(w ? on->du : on->dg, w ? off->du : off->dg, bnd, AH * AK, &bad, &differ, &worst);
    }
    for (int n = 0; n < AN; n++) /* dWd = R~^T h */
        for (int j = 0; j < AH; j++) {
            double b = 0, m = 0;
            for (int i = 0; i < AM; i++) {
                const double r = fabs(bf(R[i * AN + n]));
                b += mh[i * AH + j] * r, m += fabs(hh[i * AH + j]) * r;
            }
            bnd[n * AH + j] = b + 2 * (AM + 1) * U32 * m * (1 + U);
        }
    within(on->dd, off->dd, bnd, AN * AH, &bad, &differ, &worst);
    CHECK(bad == 0, "swiglu: %d gradient elements with gate and up in bf16 outside the bound (worst %.2f of it)", bad, worst);
    CHECK(differ > 50, "swiglu: only %d gradient elements changed: gate and up were not rounded", differ);
}

static void test_swiglu_value(void) {
    static float X[AM * AK], WG[AH * AK], WU[AH * AK], WD[AN * AH], R[AM * AN];
    static swiglu_out on, off, pre;
    cg_rng rng;
    cg_rng_seed(&rng, 8);
    fill(X, AM * AK, &rng, 1), fill(WG, AH * AK, &rng, 0.3), fill(WU, AH * AK, &rng, 0.3), fill(WD, AN * AH, &rng, 0.3);
    fill(R, AM * AN, &rng, 1);
    run_swiglu(X, WG, WU, WD, R, &pre); /* gate, up and SwiGLU's value in bf16 */
    setenv("CGRAD_BF16_PREACT_OFF", "1", 1); /* gate and up float: SwiGLU's own value alone */
    run_swiglu(X, WG, WU, WD, R, &on);
    setenv("CGRAD_BF16_SWIGLU_OFF", "1", 1);
    run_swiglu(X, WG, WU, WD, R, &off);
    unsetenv("CGRAD_BF16_SWIGLU_OFF");
    unsetenv("CGRAD_BF16_PREACT_OFF");
    CHECK(on.swiglu_bf16 && !off.swiglu_bf16, "swiglu stored in bf16: %d, with it off %d", on.swiglu_bf16, off.swiglu_bf16);
    CHECK(!memcmp(&on, &off, offsetof(swiglu_out, swiglu_bf16)), "swiglu in bf16 changed the loss or gradients (%.9g, %.9g)",
          on.loss, off.loss);
    CHECK(pre.lp_values == 3 && on.lp_values == 1, "%d values in bf16 with gate and up (expected 3), %d without (1)",
          pre.lp_values, on.lp_values);
    check_swiglu_preact(X, WG, WU, WD, R, &pre, &on);
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


int main(void) {
    cg_set_threads(2);
    const char *why = cg_bf16_unavailable();
    if (why) return test_skip("test_bf16_ops", why);
    test_linear();
    test_matmul();
    test_activations();
    test_swiglu_value();
    test_no_copy();
    test_shadows();
    TEST_END();
}
