/* SPDX-License-Identifier: MIT */
/* The checks of cg_sdpa_ex's inputs and options (ops/attention.c builds the node once they pass):
 * shapes of q, k, v (grouped-query heads), the key padding, the run-time past, a bias tensor and
 * T5's table, each failure a message naming the offending shapes or option. */
#include "ops/attention_internal.h"
#include "ops/ops.h"

/* A bias broadcastable to [B, Hq, Tq, Tk]: its strides read as that shape, 0 where broadcast. */
bool cgi_sdpa_bias_strides(const cg_tensor *bias, const int64_t *want, int64_t *st) {
    if (bias->ndim < 1 || bias->ndim > 4) return false;
    for (int i = 0; i < 4; i++) {
        const int j = i - (4 - bias->ndim);
        const int64_t n = j >= 0 ? bias->shape[j] : 1;
        if (n != 1 && n != want[i]) return false;
        st[i] = n == 1 ? 0 : bias->stride[j];
    }
    return true;
}

/* Each check in the order the constructor ran them, so the first failing one names the error. */
bool cgi_sdpa_opts_ok(cg_graph *g, cg_tensor *q, cg_tensor *k, cg_tensor *v, const cg_sdpa_opts *opts,
                      int64_t bias_st[4]) {
    if (!opts) {
        cgi_fail(CG_ERR_ARG, "[sdpa] opts is NULL");
        return false;
    }
    cg_tensor *key_padding = opts->key_padding, *bias = opts->bias, *table = opts->rel_bias, *past = opts->past,
              *in[3] = {q, k, v};
    if (!cgi_inputs_ok(g, "sdpa", 3, in) || (key_padding && !cgi_inputs_ok(g, "sdpa", 1, &key_padding)) ||
        (past && !cgi_inputs_ok(g, "sdpa", 1, &past)) ||
        (bias && !cgi_inputs_ok(g, "sdpa", 1, &bias)) || (table && !cgi_inputs_ok(g, "sdpa", 1, &table)))
        return false;
    for (int i = 0; i < 3; i++)
        if (!cgi_expect_real("sdpa", in[i], (const char *[]){"q", "k", "v"}[i])) return false;
    if ((bias && !cgi_expect_real("sdpa", bias, "bias")) || (table && !cgi_expect_real("sdpa", table, "rel_bias")))
        return false;
    bool ok = q->ndim == 4 && k->ndim == 4 && v->ndim == 4;
    /* grouped-query and multi-query attention: K and V have Hk heads, each shared by Hq / Hk queries */
    ok = ok && k->shape[0] == q->shape[0] && v->shape[0] == q->shape[0] && v->shape[1] == k->shape[1] &&
         k->shape[1] > 0 && q->shape[1] % k->shape[1] == 0;
    ok = ok && k->shape[3] == q->shape[3] && v->shape[3] == q->shape[3] && v->shape[2] == k->shape[2];
    if (!ok) {
        cgi_fail(CG_ERR_SHAPE,
                 "[sdpa] q%s k%s v%s must be [B, Hq, Tq, D], [B, Hk, Tk, D], [B, Hk, Tk, D] with Hk dividing Hq",
                 cgi_shp(q), cgi_shp(k), cgi_shp(v));
        return false;
    }
    const int64_t B = q->shape[0], hq = q->shape[1], tq = q->shape[2], tk = k->shape[2];
    if (opts->window < 0) {
        cgi_fail(CG_ERR_ARG, "[sdpa] q%s: window %lld must be >= 0 (0: none)", cgi_shp(q), (long long)opts->window);
        return false;
    }
    if (!(opts->dropout >= 0 && opts->dropout < 1)) {
        cgi_fail(CG_ERR_ARG, "[sdpa] q%s: dropout %g must be in [0, 1)", cgi_shp(q), opts->dropout);
        return false;
    }
    if (key_padding && (key_padding->dtype != CG_INT32 || key_padding->ndim != 2 ||
                        key_padding->shape[0] != B || key_padding->shape[1] != tk)) {
        cgi_fail(CG_ERR_SHAPE, "[sdpa] key_padding%s must be int32 [B, Tk] = [%lld, %lld]", cgi_shp(key_padding),
                 (long long)B, (long long)tk);
        return false;
    }
    if (past && (past->dtype != CG_INT32 || cgi_numel(past->ndim, past->shape) != 1 || key_padding || bias || table ||
                 opts->alibi || q->requires_grad || k->requires_grad || v->requires_grad)) {
        cgi_fail(CG_ERR_ARG,
                 "[sdpa] past%s must be one int32, and goes without key_padding, bias, rel_bias, alibi and gradients "
                 "(q%s k%s: a decode step)", cgi_shp(past), cgi_shp(q), cgi_shp(k));
        return false;
    }
    const int64_t want[4] = {B, hq, tq, tk}, max_distance = opts->rel_max_distance ? opts->rel_max_distance : 128;
    if (bias && !cgi_sdpa_bias_strides(bias, want, bias_st)) {
        cgi_fail(CG_ERR_SHAPE, "[sdpa] bias%s must broadcast to [B, Hq, Tq, Tk] = %s", cgi_shp(bias), cgi_dims(4, want));
        return false;
    }
    const int64_t nb = table && table->ndim == 2 ? table->shape[0] : 0, half = opts->causal ? nb : nb / 2;
    if (table && (table->ndim != 2 || table->shape[1] != hq || half < 2 || max_distance <= half / 2)) {
        cgi_fail(CG_ERR_SHAPE,
                 "[sdpa] rel_bias%s must be [num_buckets, Hq = %lld] with num_buckets >= %d, and max distance %lld "
                 "beyond its exact buckets",
                 cgi_shp(table), (long long)hq, opts->causal ? 2 : 4, (long long)max_distance);
        return false;
    }
    return true;
}
