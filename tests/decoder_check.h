/* SPDX-License-Identifier: MIT */
/* One check for every decoder's generation (GPT-2, LLaMA): with and without the KV cache, in four
 * sampling modes, the tokens are the same and sampling does not collapse to a constant; a request
 * past the context and a prompt id outside the vocabulary (13 must be one) fail. Also the gradient
 * copy and comparison the fused-head tests share. Include after
 * cgrad.h and check.h. */
#ifndef CGRAD_TEST_DECODER_CHECK_H
#define CGRAD_TEST_DECODER_CHECK_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A decoder's generate call on its model. */
typedef cg_status (*decoder_generate_fn)(const void *model, const int32_t *prompt, int64_t n_prompt, int64_t n_new,
                                         const cg_sampling *s, uint64_t seed, bool use_cache, int32_t *out);

/* The model's context must be under 100 tokens; what names the model in the error message. */
static void check_cached_generation(decoder_generate_fn gen, const void *m, const char *what) {
    int32_t prompt[5] = {1, 4, 2, 9, 3}, a[40], b[40];
    cg_sampling modes[4] = {{0, 0, 0}, {1.0, 0, 0}, {0.8, 5, 0}, {1.2, 0, 0.9}};
    for (int k = 0; k < 4; k++) {
        CHECK(gen(m, prompt, 5, 35, &modes[k], 42 + k, false, a) == CG_OK, "%s", cg_last_error());
        CHECK(gen(m, prompt, 5, 35, &modes[k], 42 + k, true, b) == CG_OK, "%s", cg_last_error());
        int same = 0, distinct = 0;
        for (int i = 0; i < 40; i++) same += a[i] == b[i];
        for (int i = 6; i < 40; i++) distinct += a[i] != a[i - 1];
        CHECK(same == 40, "mode %d: %d of 40 tokens equal with and without cache", k, same);
        CHECK(k == 0 || distinct > 5, "mode %d: sampling produced a near-constant sequence", k);
    }
    CHECK(gen(m, prompt, 5, 100, &modes[0], 1, true, a) == CG_ERR_ARG && strstr(cg_last_error(), what),
          "too long must fail naming %s: %s", what, cg_last_error());
    prompt[2] = 13;
    CHECK(gen(m, prompt, 5, 3, &modes[0], 1, true, a) == CG_ERR_RANGE, "bad prompt id must fail");
}
/* Every parameter's gradient after one forward and backward of loss from zeroed gradients, copied
 * (the caller frees it), their count in *span; frees g. */
static inline cg_real *backward_grads(cg_graph *g, cg_tensor *loss, cg_params *ps, int64_t *span) {
    *span = cg_params_span(ps);
    cg_real *grads = malloc((size_t)*span * sizeof *grads);
    cg_params_zero_grad(ps);
    CHECK(grads && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    if (grads) memcpy(grads, cg_params_grads(ps), (size_t)*span * sizeof *grads);
    cg_graph_free(g);
    return grads;
}

/* The fused head's gradients against the full logits' (n0 and n1 of them): the same sums in another
 * order, so they agree to rounding; what names the case. Frees both. */
static inline void check_same_grads(cg_real *fused, int64_t n1, cg_real *unfused, int64_t n0, const char *what) {
    CHECK(n0 == n1 && unfused && fused, "%s: same parameters", what);
    double d2 = 0, r2 = 0;
    for (int64_t i = 0; i < n0 && n0 == n1 && unfused && fused; i++) {
        const double d = (double)fused[i] - (double)unfused[i];
        d2 += d * d, r2 += (double)unfused[i] * unfused[i];
    }
    const double tol = sizeof(cg_real) == sizeof(double) ? 1e-13 : 1e-6;
    CHECK(r2 > 0 && sqrt(d2 / r2) <= tol, "%s: fused head's gradients against the full logits': relative %g", what,
          sqrt(d2 / r2));
    free(unfused);
    free(fused);
}

/* Logits of seq[0..n) through a cache (fwd, a cg_decoder_forward honouring kc->past): a prompt of p,
 * then one token per graph. With replay, the
 * tokens after the prompt run one decode graph built once, its position and cache length read at
 * each run from the int32 input kc->past; else (the path before replay) a graph is built per token.
 * With replay, *bytes gets the graph's memory after its first run (0 if replays grew it), and a length
 * past the cache must fail in append_into. */
static cg_real *decoder_cached_logits(cg_decoder_forward fwd, const void *m, const cg_decoder_info *info,
                                      const int32_t *seq, int64_t n, int64_t p, bool replay, size_t *bytes) {
    const int64_t v = info->vocab, hd = info->head_dim;
    const size_t per = (size_t)(info->layers * info->kv_heads * hd * n);
    cg_kv_cache kc = {.k = malloc(per * sizeof(cg_real)), .v = malloc(per * sizeof(cg_real)), .cap = n,
                      .heads = info->kv_heads, .head_dim = hd};
    cg_real *out = malloc((size_t)(n * v) * sizeof *out);
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *ids = NULL, *lg = NULL;
    for (int64_t at = 0; at < n;) {
        const int64_t t = at == 0 ? p : 1;
        if (at == 0 || !replay || !kc.past) {
            cg_graph_reset(g);
            ids = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){1, t});
            if (replay && at > 0) kc.past = cg_input(g, "past", CG_INT32, 2, (int64_t[]){1, 1});
            lg = fwd(g, m, ids, &kc);
            CHECK(lg != NULL, "at %lld: %s", (long long)at, cg_last_error());
            if (!lg) break;
        }
        memcpy(cg_idata(ids), seq + at, (size_t)t * sizeof(int32_t));
        if (kc.past) cg_idata(kc.past)[0] = (int32_t)kc.len;
        CHECK(cg_graph_forward(g) == CG_OK, "at %lld: %s", (long long)at, cg_last_error());
        memcpy(out + at * v, cg_data(lg), (size_t)(t * v) * sizeof *out);
        if (at == p && bytes) *bytes = cg_graph_bytes(g); /* the replayed graph after its first run */
        kc.len += t, at += t;
    }
    if (replay && kc.past) { /* a length past the cache's room: a status naming the op, no write out of bounds */
        cg_idata(kc.past)[0] = (int32_t)n;
        CHECK(cg_graph_forward(g) == CG_ERR_RANGE && strstr(cg_last_error(), "append_into"), "full cache: %s",
              cg_last_error());
        if (bytes && *bytes != cg_graph_bytes(g)) *bytes = 0; /* replays took more memory */
    }
    cg_graph_free(g);
    free(kc.k);
    free(kc.v);
    return out;
}

/* A decoder's logits over all of ids without a cache (cg_gpt_logits, cg_llama_logits). */
typedef cg_tensor *(*decoder_logits_fn)(cg_graph *g, const void *model, cg_tensor *ids);

/* On the sequence seq[i] = (7 i + 3) mod 13 of n tokens (prompt p): the replayed decode graph against
 * a graph per token (the same bits at every position) and the full forward's logits (to float
 * rounding); its memory must not grow with replays. */
static void check_decode_replay(cg_decoder_forward fwd, decoder_logits_fn logits, const void *m,
                                const cg_decoder_info *info, int64_t n, int64_t p) {
    const int64_t v = info->vocab;
    size_t bytes = 0;
    int32_t *seq = malloc((size_t)n * sizeof *seq);
    for (int64_t i = 0; i < n; i++) seq[i] = (int32_t)((i * 7 + 3) % 13);
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){1, n});
    memcpy(cg_idata(ids), seq, (size_t)n * sizeof *seq);
    cg_tensor *lg = logits(g, m, ids);
    CHECK(lg && cg_graph_forward(g) == CG_OK, "%s: %s", info->name, cg_last_error());
    const cg_real *full = lg ? cg_data(lg) : NULL;
    if (!full) {
        free(seq);
        cg_graph_free(g);
        return;
    }
    cg_real *built = decoder_cached_logits(fwd, m, info, seq, n, p, false, NULL);
    cg_real *replayed = decoder_cached_logits(fwd, m, info, seq, n, p, true, &bytes);
    int64_t differ = 0;
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n * v; i++) {
        differ += memcmp(&built[i], &replayed[i], sizeof(cg_real)) != 0;
        worst = fmax(worst, fabs((double)replayed[i] - full[i]));
        scale = fmax(scale, fabs((double)full[i]));
    }
    CHECK(differ == 0, "%s: %lld of %lld replayed logits differ in bits from per-token graphs", info->name,
          (long long)differ, (long long)(n * v));
    CHECK(worst <= 1e-5 * fmax(scale, 1), "%s: replayed logits differ from the full forward by %g (scale %g)",
          info->name, worst, scale);
    CHECK(bytes > 0, "%s: replaying the decode graph grew its memory", info->name);
    printf("%s decode replay: %lld positions, %lld logits differ in bits from per-token graphs, max |replayed - full| "
           "%.2e\n", info->name, (long long)n, (long long)differ, worst);
    free(built);
    free(replayed);
    free(seq);
    cg_graph_free(g);
}

/* The positions a decoder step may take (cg_kv_cache_start): within the context through a cache or
 * without one, the last position exactly; one past it fails naming limit (the config's field); a
 * replayed step (kc.past) of two tokens fails on its own message, not on the positions. */
static void check_step_positions(cg_decoder_forward fwd, decoder_logits_fn logits, const void *m,
                                 const cg_decoder_info *info, const char *limit) {
    const int64_t n = info->context, hd = info->head_dim;
    const size_t per = (size_t)(info->layers * info->kv_heads * hd * n);
    cg_kv_cache kc = {.k = calloc(per, sizeof(cg_real)), .v = calloc(per, sizeof(cg_real)), .cap = n,
                      .heads = info->kv_heads, .head_dim = hd};
    cg_graph *g = cg_graph_new(CG_EVAL);
    for (int through = 0; through < 2; through++) { /* without a cache: len 0 and n + 1 tokens */
        for (int64_t over = 0; over < 2; over++) {
            cg_graph_reset(g);
            kc.len = through ? n - 2 : 0;
            const int64_t t = (through ? 2 : n) + over;
            cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){1, t});
            cg_tensor *lg = through ? fwd(g, m, ids, &kc) : logits(g, m, ids);
            if (!over) CHECK(lg != NULL, "%s: %lld tokens after %lld must fit %lld: %s", info->name, (long long)t,
                             (long long)kc.len, (long long)n, cg_last_error());
            else CHECK(lg == NULL && strstr(cg_last_error(), "positions exceed") && strstr(cg_last_error(), limit),
                       "%s: %lld tokens after %lld must exceed %s: %s", info->name, (long long)t,
                       (long long)kc.len, limit, cg_last_error());
        }
    }
    cg_graph_reset(g);
    kc.len = 0;
    kc.past = cg_input(g, "past", CG_INT32, 2, (int64_t[]){1, 1});
    cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){1, 2});
    CHECK(fwd(g, m, ids, &kc) == NULL && strstr(cg_last_error(), "replayed decode step takes one token, not 2") &&
              !strstr(cg_last_error(), "exceed"),
          "%s: a replayed step of two tokens: %s", info->name, cg_last_error());
    cg_graph_free(g);
    free(kc.k);
    free(kc.v);
}

#endif
