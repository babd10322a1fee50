/* GPT: gradients of the whole model against finite differences, generation with the key/value
 * cache equal to generation without it, and a learning sanity check. */
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

static void test_gradcheck(void) {
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
    cg_tensor *loss = cg_cross_entropy(g, cg_gpt_logits(g, m, ids), tg, -100);
    CHECK(loss != NULL, "%s", cg_last_error());
    const char *names[4] = {"wte.weight", "h.0.attn.c_attn.weight", "h.0.mlp.c_fc.bias", "ln_f.weight"};
    cg_tensor *in[4];
    for (int i = 0; i < 4; i++) in[i] = cg_params_find(ps, names[i]);
    cg_gradcheck_result res[4];
    cg_status st = cg_gradcheck(g, loss, 4, in, 0, res);
    CHECK(st == CG_OK, "%s", cg_last_error());
    for (int i = 0; i < 4 && st == CG_OK; i++)
        CHECK(res[i].max_rel_err <= CG_GRADCHECK_TOL, "%s: rel err %g abs %g", names[i], res[i].max_rel_err,
              res[i].max_abs_err);
    cg_graph_free(g);
    cg_gpt_free(m);
    cg_params_free(ps);
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
    test_gradcheck();
    test_cache();
    test_learns();
    TEST_END();
}
