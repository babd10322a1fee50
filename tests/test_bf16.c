/* SPDX-License-Identifier: MIT */
/* bf16 mixed precision: a whole GPT step against fp32; fp32 untouched by the setting; a parameter
 * converted once per optimizer step; the product kernels themselves against the exact product of
 * bf16 operands, within the bounds of tests/bf16_check.h. The products run as their own ctest
 * entries (test_bf16_products, test_bf16_onednn: see main), which report skipped without oneDNN or
 * avx512_bf16; test_bf16 itself tests the API, the refusal and the conversions everywhere. The ops'
 * bf16 products are tested op by op in test_bf16_ops.c and test_bf16_fused.c. */
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
#include "bf16_check.h"
#include "check.h"

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

/* The bf16 step's variants against the run lp (fp: the fp32 run, nn: its squared gradient norm):
 * values stored in bf16 or converted at the product, the reference loops, checkpointing. */
static void test_gpt_variants(const gpt_run *fp, const gpt_run *lp, double nn) {
    /* The values read only by linears (per block the two LayerNorm outputs and the GELU's; ln_f's
     * is read by the head fused with the loss, and stays float) are written in bf16 by the ops that make them: the same numbers
     * the linear would have converted, and GELU's backward recomputes its output in float, so
     * the whole run is bit-identical to converting them at the product. The FC pre-activation
     * GELU reads (one per block, 9 values in all) is a rounding of its own: the run above holds
     * it to fp32 within the same 8u, and test_activations (test_bf16_ops.c) per element; without it
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
    CHECK(lp->lp_values == 10 && qkv.lp_values == 8 && pre.lp_values == 6 && conv.lp_values == 0,
          "bf16-stored values: %d (expected 10), %d without q/k/v (8), %d without the pre-activations either (6), "
          "%d with them off", lp->lp_values, qkv.lp_values, pre.lp_values, conv.lp_values);
    CHECK(memcmp(lp->grads, qkv.grads, (size_t)lp->span * 4), "q, k, v in bf16 changed nothing");
    free(qkv.grads), free(qkv.values);
    CHECK(!memcmp(pre.loss, conv.loss, sizeof pre.loss) && !memcmp(pre.grads, conv.grads, (size_t)pre.span * 4) &&
              !memcmp(pre.values, conv.values, (size_t)pre.span * 4),
          "values stored in bf16 changed the run (loss %.9g vs %.9g)", pre.loss[2], conv.loss[2]);
    CHECK(memcmp(lp->grads, pre.grads, (size_t)lp->span * 4), "the bf16 pre-activations changed nothing");
    free(pre.grads), free(pre.values);
    /* the reference loops that stand in when oneDNN refuses a bf16-stored operand: same products,
     * float accumulation in another order, so within the same bounds of fp32 */
    gpt_run ref;
    cgi_lp_force_ref = true;
    run_gpt(CG_BF16, &ref);
    cgi_lp_force_ref = false;
    double dr = 0;
    for (int64_t i = 0; i < fp->span; i++) dr += pow(ref.grads[i] - fp->grads[i], 2);
    CHECK(fabs(ref.loss[0] - fp->loss[0]) <= 8 * U && sqrt(dr) <= 8 * U * sqrt(nn),
          "reference bf16 loops: loss %.6f vs fp32 %.6f, gradient error %.3g", ref.loss[0], fp->loss[0], sqrt(dr / nn));
    CHECK(fabs(ref.loss[0] - lp->loss[0]) <= 1e-4, "reference bf16 loops: loss %.6f vs oneDNN %.6f", ref.loss[0],
          lp->loss[0]);
    /* with gradient checkpointing the recomputed products convert into their own planned scratch
     * (swapped in with the recompute buffers) and store the same bf16 values: the same run */
    gpt_run ck;
    gpt_ckpt = true;
    run_gpt(CG_BF16, &ck);
    gpt_ckpt = false;
    CHECK(ck.recomputed > 0 && ck.unplanned == 0 && ck.lp_values == lp->lp_values,
          "checkpointed bf16: %d nodes recomputed, %zu unplanned bytes, %d bf16 values", ck.recomputed, ck.unplanned,
          ck.lp_values);
    CHECK(!memcmp(ck.loss, lp->loss, sizeof lp->loss) && !memcmp(ck.grads, lp->grads, (size_t)lp->span * 4) &&
              !memcmp(ck.values, lp->values, (size_t)lp->span * 4),
          "checkpointed bf16 run differs (loss %.9g vs %.9g)", ck.loss[2], lp->loss[2]);
    free(ck.grads), free(ck.values);
    free(conv.grads), free(conv.values), free(ref.grads), free(ref.values);
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
        test_gpt_variants(&fp, &lp, nn);
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
        test_frozen_copies();
        test_gpt_step(true);
        TEST_END();
    }
    test_api(why);
    test_inplace();
    test_gpt_step(false);
    TEST_END();
}
