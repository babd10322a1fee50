/* SPDX-License-Identifier: MIT */
/* bf16 mixed precision in the fused ops: the LM head (linear_cross_entropy) over several row chunks,
 * also on a weight mapped in half precision, and attention with its kept probabilities, and its q,
 * k and v, stored in bf16; each against references computed in double within the bounds of
 * tests/bf16_check.h. Skipped (77) where bf16 cannot run. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "../ops/bf16_internal.h"
#include "../optim/optim.h"
#include "bf16_check.h"
#include "check.h"

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


int main(void) {
    cg_set_threads(2);
    const char *why = cg_bf16_unavailable();
    if (why) return test_skip("test_bf16_fused", why);
    test_lce();
    test_lce_mapped();
    test_sdpa();
    test_qkv();
    TEST_END();
}
