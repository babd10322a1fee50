/* SPDX-License-Identifier: MIT */
/* The optimizer inside backward (cg_optim_attach, cg_optim_backward_step): the same parameters and
 * moments, bit for bit, as cg_graph_backward then cg_optim_step, on the zoo's models with dropout,
 * checkpointing, decay groups and a parameter the loss does not reach; the calls it refuses; and the
 * plan holding one layer's weight gradient at a time. */
#include <string.h>

#include "../cgrad.h"
#include "../graph/internal.h"
#include "check.h"

static const char *GPT = "{\"vocab_size\": 61, \"n_positions\": 16, \"n_embd\": 32, \"n_layer\": 2, \"n_head\": 2}";
static const char *ENCDEC = "{\"src_vocab_size\": 37, \"tgt_vocab_size\": 41, \"d_model\": 32, \"n_head\": 4, "
                            "\"num_encoder_layers\": 2, \"num_decoder_layers\": 2, \"dim_feedforward\": 64, \"max_len\": 32, "
                            "\"pad_id\": 0, \"bos_id\": 1, \"eos_id\": 2}";

static void fill_ids(cg_tensor *t, uint64_t *s, int32_t lo, int32_t hi) {
    int32_t *d = cg_idata(t);
    for (int64_t i = 0; i < cg_numel(t); i++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        d[i] = lo + (int32_t)((*s >> 33) % (uint64_t)(hi - lo));
    }
}

typedef struct {
    cg_params *ps;
    cg_model *m;
    cg_graph *g;
    cg_model_graph mg;
    cg_optim *o;
    cg_tensor *extra; /* trainable, in the set, read by no node */
} run;

static bool make_run(run *r, cg_arch arch, const char *json, bool checkpoint, cg_optim_kind kind, bool fused) {
    memset(r, 0, sizeof *r);
    r->ps = cg_params_new();
    r->m = cg_model_new(arch, json, 0.1, r->ps, 7);
    if (!r->m) return false;
    r->extra = cg_params_add(r->ps, "extra.weight", 2, (int64_t[]){3, 5});
    for (int i = 0; i < 15; i++) cg_data(r->extra)[i] = (cg_real)(0.1 * i - 0.7);
    r->g = cg_graph_new(CG_TRAIN);
    const bool encdec = arch == CG_ARCH_ENCDEC;
    if (cg_model_build(r->g, r->m, 3, 8, encdec ? 6 : 0, &r->mg)) return false;
    cg_graph_set_checkpointing(r->g, checkpoint);
    cg_optim_config oc = cg_optim_defaults(kind);
    if (kind == CG_OPT_SGD) oc.momentum = 0.9, oc.weight_decay = 0.01;
    r->o = cg_optim_new(r->ps, &oc);
    if (!r->o) return false;
    cg_optim_decay_matrices_only(r->o, false);
    return !fused || cg_optim_attach(r->o, r->g) == CG_OK;
}

static void fill_batch(run *r, cg_arch arch, int step) {
    uint64_t s = 1000 + (uint64_t)step;
    if (arch == CG_ARCH_ENCDEC) {
        fill_ids(cg_model_graph_input(&r->mg, "src"), &s, 3, 37);
        int32_t *mask = cg_idata(cg_model_graph_input(&r->mg, "src_mask"));
        for (int64_t i = 0; i < cg_numel(cg_model_graph_input(&r->mg, "src_mask")); i++) mask[i] = i % 6 != 5;
        fill_ids(cg_model_graph_input(&r->mg, "tgt_in"), &s, 3, 41);
        fill_ids(cg_model_graph_input(&r->mg, "tgt_out"), &s, 3, 41);
    } else {
        fill_ids(cg_model_graph_input(&r->mg, "input_ids"), &s, 0, 61);
        fill_ids(cg_model_graph_input(&r->mg, "targets"), &s, 0, 61);
    }
}

static void free_run(run *r) {
    cg_optim_free(r->o);
    cg_graph_free(r->g);
    cg_model_free(r->m);
    cg_params_free(r->ps);
}

static void same_bits(const char *what, cg_arch arch, const char *json, bool checkpoint, cg_optim_kind kind) {
    run a, b;
    const bool ok = make_run(&a, arch, json, checkpoint, kind, false) && make_run(&b, arch, json, checkpoint, kind, true);
    CHECK(ok, "%s: %s", what, cg_last_error());
    if (!ok) return;
    const double lr[3] = {1e-2, 5e-3, 2e-2};
    double la = 0, lb = 0;
    for (int s = 0; s < 3; s++) {
        fill_batch(&a, arch, s);
        fill_batch(&b, arch, s);
        cg_params_zero_grad(a.ps);
        cg_status st = cg_graph_forward(a.g);
        if (!st) st = cg_graph_backward(a.g, a.mg.loss);
        if (!st) st = cg_optim_step(a.o, lr[s]);
        CHECK(st == CG_OK, "%s separate step %d: %s", what, s, cg_last_error());
        st = cg_graph_forward(b.g);
        if (!st) st = cg_optim_backward_step(b.o, b.g, b.mg.loss, lr[s]);
        CHECK(st == CG_OK, "%s fused step %d: %s", what, s, cg_last_error());
        la = cg_item(a.mg.loss), lb = cg_item(b.mg.loss);
        CHECK(la == lb, "%s step %d: loss %.9g separate, %.9g fused", what, s, la, lb);
    }
    const int64_t span = cg_params_span(a.ps);
    CHECK(cg_optim_steps(a.o) == 3 && cg_optim_steps(b.o) == 3, "%s: %lld and %lld steps", what,
          (long long)cg_optim_steps(a.o), (long long)cg_optim_steps(b.o));
    CHECK(memcmp(cg_params_values(a.ps), cg_params_values(b.ps), (size_t)span * sizeof(cg_real)) == 0,
          "%s: parameters differ after 3 steps", what);
    if (cg_optim_moment1(a.o))
        CHECK(memcmp(cg_optim_moment1(a.o), cg_optim_moment1(b.o), (size_t)span * sizeof(cg_real)) == 0,
              "%s: first moments differ", what);
    if (cg_optim_moment2(a.o))
        CHECK(memcmp(cg_optim_moment2(a.o), cg_optim_moment2(b.o), (size_t)span * sizeof(cg_real)) == 0,
              "%s: second moments differ", what);
    /* the parameter nothing reads still decays (AdamW) and its moments follow a zero gradient */
    CHECK(kind != CG_OPT_ADAMW || cg_data(b.extra)[1] != (cg_real)(0.1 - 0.7), "%s: the unread parameter was not updated",
          what);
    free_run(&a);
    free_run(&b);
}

static void test_refusals(void) {
    run r;
    CHECK(make_run(&r, CG_ARCH_GPT2, GPT, false, CG_OPT_ADAMW, true), "%s", cg_last_error());
    fill_batch(&r, CG_ARCH_GPT2, 0);
    CHECK(cg_graph_forward(r.g) == CG_OK, "%s", cg_last_error());
    CHECK(cg_graph_backward(r.g, r.mg.loss) == CG_ERR_STATE && strstr(cg_last_error(), "cg_optim_backward_step"),
          "plain backward on an attached graph: %s", cg_last_error());
    CHECK(cg_optim_step(r.o, 1e-3) == CG_ERR_STATE && strstr(cg_last_error(), "attached"), "separate step: %s",
          cg_last_error());
    CHECK(cg_optim_backward_step(r.o, r.g, r.mg.loss, -1) == CG_ERR_ARG, "negative lr accepted");
    CHECK(cg_optim_backward_step(r.o, r.g, r.mg.loss, 1e-3) == CG_OK, "%s", cg_last_error());
    CHECK(cg_optim_backward_step(r.o, r.g, r.mg.loss, 1e-3) == CG_ERR_STATE, "a second backward without a forward ran");
    cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
    cg_optim *other = cg_optim_new(r.ps, &oc);
    CHECK(cg_optim_attach(other, r.g) == CG_ERR_STATE, "two optimizers attached to one graph");
    CHECK(cg_optim_backward_step(other, r.g, r.mg.loss, 1e-3) == CG_ERR_STATE, "a step through an unattached optimizer");
    CHECK(cg_optim_shard(other, 0, 16) == CG_OK, "%s", cg_last_error());
    cg_graph *g2 = cg_graph_new(CG_TRAIN);
    CHECK(cg_optim_attach(other, g2) == CG_ERR_STATE && strstr(cg_last_error(), "sharded"), "sharded attach: %s",
          cg_last_error());
    cg_graph_free(g2);
    cg_optim_free(other);
    /* detached, the graph plans the set's gradients again and steps apart */
    CHECK(cg_optim_attach(r.o, NULL) == CG_OK, "%s", cg_last_error());
    cg_params_zero_grad(r.ps);
    CHECK(cg_graph_forward(r.g) == CG_OK && cg_graph_backward(r.g, r.mg.loss) == CG_OK && cg_optim_step(r.o, 1e-3) == CG_OK,
          "after detaching: %s", cg_last_error());
    free_run(&r);
}

/* An MLP of L square layers: apart, the plan holds no weight gradient (the set's block holds all L);
 * attached, it holds each while backward passes its layer, one at a time, so the plan grows by one
 * layer's weight gradient, not L. */
static void test_plan_bound(void) {
    enum { L = 4, D = 256, B = 8 };
    size_t plan[2];
    for (int fused = 0; fused < 2; fused++) {
        cg_params *ps = cg_params_new();
        cg_tensor *w[L];
        cg_rng r;
        cg_rng_seed(&r, 3);
        for (int l = 0; l < L; l++) {
            char name[16];
            snprintf(name, sizeof name, "w%d", l);
            w[l] = cg_params_add(ps, name, 2, (int64_t[]){D, D});
            for (int64_t i = 0; i < D * D; i++) cg_data(w[l])[i] = (cg_real)(0.05 * (cg_rng_uniform(&r) - 0.5));
        }
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){B, D});
        for (int64_t i = 0; i < B * D; i++) cg_data(x)[i] = (cg_real)(i % 7) - 3;
        cg_tensor *h = x;
        for (int l = 0; l < L; l++) h = cg_tanh(g, cg_linear(g, h, w[l], NULL));
        cg_tensor *loss = cg_mean_all(g, h);
        cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
        cg_optim *o = cg_optim_new(ps, &oc);
        if (fused) CHECK(cg_optim_attach(o, g) == CG_OK, "%s", cg_last_error());
        CHECK(cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
        plan[fused] = cg_graph_plan_bytes(g);
        cg_status st = fused ? cg_optim_backward_step(o, g, loss, 1e-3) : cg_graph_backward(g, loss);
        if (!fused && !st) st = cg_optim_step(o, 1e-3);
        CHECK(st == CG_OK, "%s", cg_last_error());
        cg_optim_free(o);
        cg_graph_free(g);
        cg_params_free(ps);
    }
    const size_t wgrad = (size_t)D * D * sizeof(cg_real);
    CHECK(plan[1] <= plan[0] + wgrad, "attached plan %zu bytes, apart %zu: more than one weight gradient (%zu) more",
          plan[1], plan[0], wgrad);
    CHECK(plan[1] >= plan[0] + wgrad / 2, "attached plan %zu bytes, apart %zu: holds no weight gradient", plan[1], plan[0]);
}

int main(void) {
    same_bits("gpt adamw", CG_ARCH_GPT2, GPT, false, CG_OPT_ADAMW);
    same_bits("gpt adamw checkpointed", CG_ARCH_GPT2, GPT, true, CG_OPT_ADAMW);
    same_bits("gpt sgd momentum", CG_ARCH_GPT2, GPT, false, CG_OPT_SGD);
    same_bits("encdec adamw", CG_ARCH_ENCDEC, ENCDEC, false, CG_OPT_ADAMW);
    same_bits("encdec adam checkpointed", CG_ARCH_ENCDEC, ENCDEC, true, CG_OPT_ADAM);
    test_refusals();
    test_plan_bound();
    TEST_END();
}
