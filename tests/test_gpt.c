/* SPDX-License-Identifier: MIT */
/* GPT: gradients of the whole model against finite differences, generation with the key/value
 * cache equal to generation without it, and a learning sanity check. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "../models/gpt.h"
#include "check.h"
#include "decoder_check.h"

static cg_gpt_config tiny(void) {
    cg_gpt_config c = {.vocab_size = 13, .n_positions = 48, .n_embd = 16, .n_layer = 2, .n_head = 4,
                       .layer_norm_epsilon = 1e-5};
    return c;
}

/* fused: the tied head fused with its loss (cg_gpt_loss), else cross_entropy over the full logits.
 * Returns every parameter's gradient from one more backward (malloc'd, *span reals). */
static cg_real *test_gradcheck(bool fused, int64_t *span) {
    cg_gpt_config c = tiny();
    c.n_embd = 8;
    c.n_head = 2;
    c.n_layer = 1;
    cg_params *ps = cg_params_new();
    cg_gpt *m = cg_gpt_new(&c, ps, 7);
    CHECK(m != NULL, "%s", cg_last_error());
    /* Larger weights than GPT-2's init so every path carries signal. */
    cg_rng r;
    cg_rng_seed(&r, 3);
    for (int i = 0; i < cg_params_count(ps); i++) {
        cg_tensor *p = cg_params_at(ps, i);
        if (cg_ndim(p) == 2) cg_fill_normal(p, &r, 0, 0.3);
        else cg_fill_normal(p, &r, 0.5, 0.2);
    }
    cg_graph *g = cg_graph_new(CG_TRAIN);
    int64_t s[2] = {2, 5};
    cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, s), *tg = cg_input(g, "targets", CG_INT32, 2, s);
    for (int i = 0; i < 10; i++) {
        cg_idata(ids)[i] = (i * 7 + 3) % 13;
        cg_idata(tg)[i] = i == 4 ? -100 : (i * 5 + 1) % 13;
    }
    cg_tensor *loss = fused ? cg_gpt_loss(g, m, ids, tg, -100) : cg_cross_entropy(g, cg_gpt_logits(g, m, ids), tg, -100);
    CHECK(loss != NULL, "%s", cg_last_error());
    const char *names[4] = {"wte.weight", "h.0.attn.c_attn.weight", "h.0.mlp.c_fc.bias", "ln_f.weight"};
    cg_tensor *in[4];
    for (int i = 0; i < 4; i++) in[i] = cg_params_find(ps, names[i]);
    cg_gradcheck_result res[4];
    cg_status st = cg_gradcheck(g, loss, 4, in, 0, res);
    CHECK(st == CG_OK, "%s", cg_last_error());
    for (int i = 0; i < 4 && st == CG_OK; i++)
        CHECK(res[i].max_rel_err <= CG_GRADCHECK_TOL, "%s%s: rel err %g abs %g", fused ? "fused head, " : "", names[i],
              res[i].max_rel_err, res[i].max_abs_err);
    cg_real *grads = backward_grads(g, loss, ps, span);
    cg_gpt_free(m);
    cg_params_free(ps);
    return grads;
}

/* The fused head against the full logits: each passes the finite differences, and their gradients
 * agree to rounding (the same sums in another order; the tied wte gets both the head's and the
 * embedding's share). */
static void test_fused_head(void) {
    int64_t n0, n1;
    cg_real *unfused = test_gradcheck(false, &n0), *fused = test_gradcheck(true, &n1);
    check_same_grads(fused, n1, unfused, n0, "gpt");
}

/* cg_gpt_generate through the shared decoder check's signature. */
static cg_status generate(const void *m, const int32_t *prompt, int64_t n_prompt, int64_t n_new, const cg_sampling *s,
                         uint64_t seed, bool use_cache, int32_t *out) {
    return cg_gpt_generate(m, prompt, n_prompt, n_new, s, seed, use_cache, out);
}

static void test_cache(void) {
    cg_gpt_config c = tiny();
    cg_params *ps = cg_params_new();
    cg_gpt *m = cg_gpt_new(&c, ps, 11);
    cg_rng r;
    cg_rng_seed(&r, 5);
    for (int i = 0; i < cg_params_count(ps); i++) { /* spread the logits so sampling has choices */
        cg_tensor *p = cg_params_at(ps, i);
        if (cg_ndim(p) == 2) cg_fill_normal(p, &r, 0, 0.2);
    }
    check_cached_generation(generate, m, "gpt generate");
    cg_gpt_free(m);
    cg_params_free(ps);
}

/* GPT's cached forward in cg_decoder_forward's signature, and what the shared checks need of it. */
static cg_tensor *gpt_cached(cg_graph *g, const void *m, cg_tensor *ids, cg_kv_cache *kc) {
    return cg_gpt_logits_cached(g, m, ids, kc);
}
static cg_tensor *gpt_full(cg_graph *g, const void *m, cg_tensor *ids) { return cg_gpt_logits(g, m, ids); }

static cg_decoder_info gpt_info(const cg_gpt_config *c) {
    return (cg_decoder_info){"gpt", c->vocab_size, c->n_positions, c->n_layer, c->n_head, c->n_embd / c->n_head, true};
}

/* The replayed decode graph gives, at every position, the very bits of a graph built for that token,
 * and the logits of one full forward over the whole sequence (to float rounding). The position
 * matters: wpe's rows and the attended keys differ at each, so a replay stuck at one fails. N past
 * 256 crosses the attention's single key block (kept probabilities) into its online softmax. */
static void test_decode_replay(int64_t N, int64_t P) {
    cg_gpt_config c = tiny();
    c.n_positions = N + 8;
    cg_params *ps = cg_params_new();
    cg_gpt *m = cg_gpt_new(&c, ps, 11);
    cg_rng r;
    cg_rng_seed(&r, 6);
    for (int i = 0; i < cg_params_count(ps); i++) cg_fill_normal(cg_params_at(ps, i), &r, 0, 0.3);
    const cg_decoder_info info = gpt_info(&c);
    check_decode_replay(gpt_cached, gpt_full, m, &info, N, P);
    check_step_positions(gpt_cached, gpt_full, m, &info, "n_positions");
    /* past must be one int32 and goes without gradients */
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *q = cg_input(g, "q", CG_REAL, 4, (int64_t[]){1, 2, 1, 4}), *k = cg_input(g, "k", CG_REAL, 4, (int64_t[]){1, 2, 6, 4});
    cg_tensor *bad = cg_input(g, "past", CG_REAL, 1, (int64_t[]){1});
    cg_sdpa_opts o = {.scale = 0.5, .causal = true, .past = bad};
    CHECK(cg_sdpa_ex(g, q, k, k, &o) == NULL && strstr(cg_last_error(), "[sdpa] past"), "a real past: %s",
          cg_last_error());
    cg_graph_free(g);
    cg_gpt_free(m);
    cg_params_free(ps);
}

/* Generation through the replayed decode graph gives the same tokens on one thread and on two
 * (a thread team shares the products' pieces, cut the same way on any count). */
static void test_generate_threads(void) {
    cg_gpt_config c = tiny();
    cg_params *ps = cg_params_new();
    cg_gpt *m = cg_gpt_new(&c, ps, 12);
    cg_rng r;
    cg_rng_seed(&r, 7);
    for (int i = 0; i < cg_params_count(ps); i++) cg_fill_normal(cg_params_at(ps, i), &r, 0, 0.3);
    const int32_t prompt[3] = {2, 7, 1};
    int32_t a[40], b[40];
    const cg_sampling s = {0.9, 0, 0};
    const int was = cg_threads();
    cg_set_threads(1);
    CHECK(cg_gpt_generate(m, prompt, 3, 37, &s, 9, true, a) == CG_OK, "%s", cg_last_error());
    cg_set_threads(2);
    CHECK(cg_gpt_generate(m, prompt, 3, 37, &s, 9, true, b) == CG_OK, "%s", cg_last_error());
    cg_set_threads(was);
    CHECK(memcmp(a, b, sizeof a) == 0, "tokens differ between one thread and two");
    cg_gpt_free(m);
    cg_params_free(ps);
}

/* A forward whose build number fail_at (0: the first graph) fails as an out-of-memory arena would. */
typedef struct {
    const cg_gpt *m;
    int builds, fail_at;
} failing_model;

static cg_tensor *failing_forward(cg_graph *g, const void *model, cg_tensor *ids, cg_kv_cache *cache) {
    failing_model *f = (failing_model *)model;
    if (f->builds++ == f->fail_at) {
        cg_set_error(CG_ERR_NOMEM, "[test arena] cannot allocate 4096 bytes");
        return NULL;
    }
    return cache ? cg_gpt_logits_cached(g, f->m, ids, cache) : cg_gpt_logits(g, f->m, ids);
}

/* When building a step's graph fails, generation returns the failing op's status (and keeps its
 * message), not a generic shape error: for the prompt's graph, the replayed decode graph (the second
 * build) and a graph per token without the cache. */
static void test_generate_build_status(void) {
    cg_gpt_config c = tiny();
    cg_params *ps = cg_params_new();
    cg_gpt *m = cg_gpt_new(&c, ps, 12);
    const cg_decoder_info info = gpt_info(&c);
    const int32_t prompt[3] = {2, 7, 1};
    int32_t out[10];
    const struct { int fail_at; bool cache; } cases[4] = {{0, true}, {1, true}, {0, false}, {2, false}};
    for (int i = 0; i < 4; i++) {
        failing_model f = {m, 0, cases[i].fail_at};
        const cg_status st = cg_decoder_generate(failing_forward, &f, &info, prompt, 3, 7, NULL, 1, cases[i].cache, out);
        CHECK(st == CG_ERR_NOMEM && strstr(cg_last_error(), "[test arena]"),
              "build %d (cache %d) failed: generate returned %s (%s)", cases[i].fail_at, cases[i].cache,
              cg_status_name(st), cg_last_error());
    }
    failing_model ok = {m, 0, -1};
    CHECK(cg_decoder_generate(failing_forward, &ok, &info, prompt, 3, 7, NULL, 1, true, out) == CG_OK && ok.builds == 2,
          "no failure: %s, %d builds (want the prompt's and one decode graph)", cg_last_error(), ok.builds);
    cg_gpt_free(m);
    cg_params_free(ps);
}

static int by_value_then_id(const void *a, const void *b) {
    const double *x = a, *y = b; /* {value, id} */
    return x[0] != y[0] ? (x[0] < y[0] ? 1 : -1) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* Top-k sampling draws only from the k best logits, ties ranked by the lower id, and from each of
 * them: checks the order cg_sample sorts its candidates in (many ties here) against qsort's. */
static void test_sample_order(void) {
    enum { V = 300, DRAWS = 3000 };
    cg_real logits[V];
    double ranked[V][2];
    for (int i = 0; i < V; i++) {
        logits[i] = (cg_real)((i * 37) % 11) * 0.01f; /* 11 distinct values, ~27 ties each */
        ranked[i][0] = logits[i], ranked[i][1] = i;
    }
    qsort(ranked, V, sizeof ranked[0], by_value_then_id);
    cg_rng r;
    cg_rng_seed(&r, 3);
    const int ks[3] = {1, 5, 40};
    for (int j = 0; j < 3; j++) {
        const cg_sampling s = {1.0, ks[j], 0};
        int seen[V] = {0}, outside = 0, missed = 0;
        for (int d = 0; d < DRAWS; d++) seen[cg_sample(logits, V, &s, &r)]++;
        for (int i = 0; i < V; i++) {
            bool in = false;
            for (int q = 0; q < ks[j]; q++) in = in || (int)ranked[q][1] == i;
            outside += !in && seen[i];
            missed += in && !seen[i];
        }
        CHECK(outside == 0 && missed == 0, "top_k %d: %d ids drawn outside the top k, %d in it never drawn", ks[j],
              outside, missed);
    }
}

static void test_learns(void) {
    /* A repeating sequence is learnable: 60 SGD steps must cut the loss well below log(V). */
    cg_gpt_config c = tiny();
    cg_params *ps = cg_params_new();
    cg_gpt *m = cg_gpt_new(&c, ps, 1);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    int64_t s[2] = {4, 12};
    cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, s), *tg = cg_input(g, "targets", CG_INT32, 2, s);
    for (int i = 0; i < 48; i++) {
        cg_idata(ids)[i] = (i % 12) % 5;
        cg_idata(tg)[i] = (i % 12 + 1) % 5;
    }
    cg_tensor *loss = cg_cross_entropy(g, cg_gpt_logits(g, m, ids), tg, -100);
    double first = 0, last = 0;
    for (int step = 0; step < 60; step++) {
        cg_params_zero_grad(ps);
        if (cg_graph_forward(g) || cg_graph_backward(g, loss)) break;
        if (step == 0) first = cg_item(loss);
        last = cg_item(loss);
        for (int i = 0; i < cg_params_count(ps); i++) {
            cg_tensor *p = cg_params_at(ps, i);
            for (int64_t j = 0; j < cg_numel(p); j++) cg_data(p)[j] -= 0.5f * cg_grad(p)[j];
        }
    }
    CHECK_NEAR(first, log(13.0), 0.1);
    CHECK(last < 0.5, "loss %g -> %g after 60 steps", first, last);
    cg_graph_free(g);
    cg_gpt_free(m);
    cg_params_free(ps);
}

int main(void) {
    test_fused_head();
    test_cache();
    test_decode_replay(40, 5);
    test_decode_replay(272, 250);
    test_generate_threads();
    test_generate_build_status();
    test_sample_order();
    test_learns();
    TEST_END();
}
