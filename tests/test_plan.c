/* SPDX-License-Identifier: MIT */
/* The memory plan: both placements (largest-first and the O(n log n) sweep over time) give
 * bit-identical results to each other on a GPT training step and an unrolled recurrence, the sweep
 * packs the GPT's buffers within 5% of the exact placement, and the planner's steps grow as
 * n log n, not n² (counted, not timed). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"
#include "graph/internal.h"

typedef struct {
    size_t plan_bytes;
    uint64_t steps;
    int nodes;
    double loss;
    cg_real *grads; /* every parameter's gradient, malloc'd */
} run;

static void set_alloc(const char *how) {
    if (how) setenv("CGRAD_PLAN_ALLOC", how, 1);
    else unsetenv("CGRAD_PLAN_ALLOC");
}

/* One forward and backward of a 2-layer GPT on a fixed batch, planned as `how` says. */
static run gpt_step(const char *how) {
    run r = {0};
    set_alloc(how);
    const cg_gpt_config cfg = {.vocab_size = 37, .n_positions = 16, .n_embd = 32, .n_layer = 2, .n_head = 4,
                               .layer_norm_epsilon = 1e-5, .dropout = 0.1};
    cg_params *ps = cg_params_new();
    cg_gpt *m = cg_gpt_new(&cfg, ps, 7);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    const int64_t shape[2] = {3, 16};
    cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, shape), *tg = cg_input(g, "targets", CG_INT32, 2, shape);
    cg_tensor *logits = m && g ? cg_gpt_logits(g, m, ids) : NULL;
    cg_tensor *loss = logits ? cg_cross_entropy(g, logits, tg, -100) : NULL;
    CHECK(loss != NULL, "gpt build: %s", cg_last_error());
    if (!loss) return r;
    int32_t v[48], t[48];
    for (int i = 0; i < 48; i++) v[i] = (i * 7 + 3) % 37, t[i] = (i * 5 + 1) % 37;
    cg_graph_set_rng(g, 11, 0);
    CHECK(cg_write_ids(ids, v) == CG_OK && cg_write_ids(tg, t) == CG_OK, "write: %s", cg_last_error());
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "step: %s", cg_last_error());
    r.plan_bytes = g->plan_bytes;
    r.steps = g->plan_steps;
    r.nodes = cg_graph_size(g);
    r.loss = cg_item(loss);
    const int64_t n = cg_params_numel(ps);
    r.grads = malloc((size_t)n * sizeof *r.grads);
    memcpy(r.grads, cg_params_grads(ps), (size_t)n * sizeof *r.grads);
    cg_graph_free(g);
    cg_gpt_free(m);
    cg_params_free(ps);
    set_alloc(NULL);
    return r;
}

/* h = tanh(h W^T + x_t) for about `nodes` nodes, its states summed into the loss, so every state
 * lives until backward: the case where the old all-pairs placement was quadratic. */
static run recurrence(int nodes, const char *how) {
    run r = {0};
    set_alloc(how);
    const int64_t sw[2] = {8, 8}, sx[2] = {1, 8};
    cg_params *ps = cg_params_new();
    cg_tensor *w = cg_params_add(ps, "w", 2, sw);
    cg_rng rng;
    cg_rng_seed(&rng, 3);
    cg_fill_normal(w, &rng, 0, 0.4);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *h = cg_input(g, "h0", CG_REAL, 2, sx), *loss = NULL;
    cg_real x[8];
    for (int i = 0; i < 8; i++) x[i] = (cg_real)(0.1 * (i - 4));
    cg_write(h, x);
    while (cg_graph_size(g) < nodes) {
        cg_tensor *xt = cg_input(g, "x", CG_REAL, 2, sx);
        cg_write(xt, x);
        h = cg_tanh(g, cg_add(g, cg_linear(g, h, w, NULL), xt));
        cg_tensor *s = cg_sum_all(g, h);
        loss = loss ? cg_add(g, loss, s) : s;
    }
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "recurrence: %s",
          cg_last_error());
    r.plan_bytes = g->plan_bytes;
    r.steps = g->plan_steps;
    r.nodes = cg_graph_size(g);
    r.loss = cg_item(loss);
    r.grads = malloc(64 * sizeof *r.grads);
    memcpy(r.grads, cg_params_grads(ps), 64 * sizeof *r.grads);
    cg_graph_free(g);
    cg_params_free(ps);
    set_alloc(NULL);
    return r;
}

static void same_results(const char *what, run a, run b, int64_t n) {
    CHECK(a.grads && b.grads, "%s: both runs finished", what);
    if (!a.grads || !b.grads) return;
    CHECK(memcmp(&a.loss, &b.loss, sizeof a.loss) == 0, "%s: loss %.17g vs %.17g", what, a.loss, b.loss);
    CHECK(memcmp(a.grads, b.grads, (size_t)n * sizeof *a.grads) == 0, "%s: gradients differ", what);
}

static void test_placements_agree_on_gpt(void) {
    run exact = gpt_step("largest-first"), sweep = gpt_step("sweep"), chosen = gpt_step(NULL);
    const int64_t n = 2 * 32 * 3 * 32; /* a prefix of the parameters is enough to see an overlap */
    same_results("gpt: sweep vs largest-first", exact, sweep, n);
    same_results("gpt: default vs largest-first", exact, chosen, n);
    CHECK(exact.plan_bytes > 0 && sweep.plan_bytes >= exact.plan_bytes / 2, "plan sizes %zu, %zu", exact.plan_bytes,
          sweep.plan_bytes);
    CHECK((double)sweep.plan_bytes <= 1.05 * (double)exact.plan_bytes, "sweep packs %zu bytes, exact %zu (> 5%% more)",
          sweep.plan_bytes, exact.plan_bytes);
    CHECK(chosen.plan_bytes == exact.plan_bytes, "a small graph gets the exact placement: %zu vs %zu",
          chosen.plan_bytes, exact.plan_bytes);
    free(exact.grads), free(sweep.grads), free(chosen.grads);
}

static void test_placements_agree_on_recurrence(void) {
    run exact = recurrence(3000, "largest-first"), chosen = recurrence(3000, NULL);
    same_results("recurrence: default (sweep) vs largest-first", exact, chosen, 64);
    CHECK(isfinite(exact.loss) && exact.loss != 0, "recurrence loss %g", exact.loss);
    free(exact.grads), free(chosen.grads);
}

/* Doubling the nodes must about double the steps (n log n gives a ratio near 2.1 at these sizes;
 * the old all-pairs placement gave 4). */
static void test_plan_steps_grow_n_log_n(void) {
    double prev = 0;
    const char *how = getenv("TEST_PLAN_ALLOC"); /* largest-first shows this test failing on the old placement */
    for (int nodes = 4000; nodes <= 32000; nodes *= 2) {
        run r = recurrence(nodes, how);
        const double per = (double)r.steps / ((double)r.nodes * log2((double)r.nodes));
        printf("%6d nodes: %9llu plan steps, %.2f per n log2 n, plan %zu bytes\n", r.nodes, (unsigned long long)r.steps,
               per, r.plan_bytes);
        CHECK(per < 16, "%d nodes: %llu plan steps, %.1f per n log2 n", r.nodes, (unsigned long long)r.steps, per);
        if (prev > 0)
            CHECK((double)r.steps / prev < 2.6, "%d nodes: steps grew %.2fx on doubling", r.nodes, (double)r.steps / prev);
        prev = (double)r.steps;
        free(r.grads);
    }
}

/* A residual chain h1 = h0 + h0*w1, h2 = h1 + w2*h1, h0 = 2x: each add is its first source's first
 * gradient writer, so h0, h1 and h2 share one gradient buffer and the adds copy nothing
 * (graph/plan.c). The gradients against hand values (exact in float), twice over reused memory;
 * a retained h1 keeps its own buffer and reads dL/dh1. */
static void test_residual_gradients_share_a_buffer(void) {
    enum { R = 3, C = 8 };
    for (int keep = 0; keep < 2; keep++) {
        cg_graph *g = cg_graph_new(CG_TRAIN);
        const int64_t sh[2] = {R, C};
        cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, sh)), *w1 = cg_input(g, "w1", CG_REAL, 2, sh),
                  *w2 = cg_input(g, "w2", CG_REAL, 2, sh), *r = cg_input(g, "r", CG_REAL, 2, sh);
        cg_tensor *h0 = cg_scale(g, x, 2), *h1 = cg_add(g, h0, cg_mul(g, h0, w1)), *h2 = cg_add(g, h1, cg_mul(g, w2, h1));
        cg_tensor *loss = cg_sum_all(g, cg_mul(g, h2, r));
        CHECK(loss != NULL, "%s", cg_last_error());
        if (keep) cg_retain(h1);
        for (int i = 0; i < R * C; i++) {
            cg_data(x)[i] = (cg_real)(i - 7);
            cg_data(w1)[i] = (cg_real)((i % 5) * 0.25);
            cg_data(w2)[i] = (cg_real)((i % 3) * 0.5 - 0.5);
        }
        for (int round = 0; round < 2; round++) {
            for (int i = 0; i < R * C; i++) cg_data(r)[i] = (cg_real)((i % 4) - 1 + 2 * round);
            CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
            int bad = 0;
            for (int i = 0; i < R * C; i++) {
                const double dh1 = cg_data(r)[i] * (1 + cg_data(w2)[i]), dx = 2 * dh1 * (1 + cg_data(w1)[i]);
                bad += cg_grad(x)[i] != (cg_real)dx;
                if (keep) bad += cg_grad(h1)[i] != (cg_real)dh1;
            }
            CHECK(bad == 0, "keep %d round %d: %d gradients differ from the hand values", keep, round, bad);
        }
        if (keep) CHECK(h1->grad != h2->grad && h0->grad != h1->grad, "a retained h1 shares its gradient buffer");
        else CHECK(h0->grad == h2->grad && h1->grad == h2->grad, "the residual chain's gradients are not one buffer");
        cg_graph_free(g);
    }
}


/* Large blocks (the plan, parameters, moments, packs) are 2 MB aligned and advised to use huge
 * pages: their mapping in /proc/self/smaps says THPeligible 1 wherever the kernel's THP setting is
 * not "never" (under "madvise" only advised memory is eligible); a small block keeps 64-byte alignment. */
static bool thp_eligible(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    bool in = false, yes = false;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) in = lo <= (uintptr_t)p && (uintptr_t)p < hi;
        else if (in && !strncmp(line, "THPeligible:", 12)) yes = atoi(line + 12) == 1;
    }
    if (f) fclose(f);
    return yes;
}

static void test_large_blocks_use_huge_pages(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char mode[128] = "";
    if (f) {
        if (!fgets(mode, sizeof mode, f)) mode[0] = 0;
        fclose(f);
    }
    const size_t big = 5 << 20;
    char *p = cgi_alloc_large(big), *q = cgi_alloc_large(4096);
    CHECK(p && q && (uintptr_t)p % (2 << 20) == 0 && (uintptr_t)q % CGI_ALIGN == 0, "large block %p, small %p", (void *)p,
          (void *)q);
    memset(p, 1, big);
    memset(q, 1, 4096);
    if (!strstr(mode, "[never]") && mode[0]) {
        CHECK(thp_eligible(p), "a 5 MB block is not eligible for huge pages (THP mode '%.40s')", mode);
    } else printf("test_plan: transparent huge pages are off here (%s): only alignment checked\n", mode[0] ? mode : "no THP");
    free(p);
    free(q);
}

/* Attention keeps only its lse rows and probabilities from forward to backward: each thread's
 * slot (score blocks, packed operands) is scratch of its forward alone and, again, of its backward
 * alone, so no slot is live at the start of backward; and a slot has room for the blocks these
 * shapes make (32 queries, 32 keys), not for BQ x BK ones. */
static void test_attention_slots_live_in_one_rule(void) {
    enum { B = 2, H = 2, T = 32, D = 16 };
    setenv("CGRAD_ATTN_PROBS", "keep", 1);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    const int64_t sh[4] = {B, H, T, D};
    cg_tensor *q = cg_requires_grad(cg_input(g, "q", CG_REAL, 4, sh)), *k = cg_requires_grad(cg_input(g, "k", CG_REAL, 4, sh)),
              *v = cg_requires_grad(cg_input(g, "v", CG_REAL, 4, sh)), *u = cg_input(g, "u", CG_REAL, 4, sh);
    cg_rng r;
    cg_rng_seed(&r, 5);
    cg_fill_uniform(q, &r, -1, 1), cg_fill_uniform(k, &r, -1, 1), cg_fill_uniform(v, &r, -1, 1), cg_fill_uniform(u, &r, -1, 1);
    cg_tensor *a1 = cg_sdpa(g, q, k, v, 0.25, true, NULL);
    cg_tensor *a2 = a1 ? cg_sdpa(g, a1, k, v, 0.25, true, NULL) : NULL;
    cg_tensor *loss = a2 ? cg_sum_all(g, cg_mul(g, a2, u)) : NULL;
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "attention: %s", cg_last_error());
    const cg_tensor *att[2] = {a1, a2};
    for (int i = 0; loss && i < 2; i++) {
        const cg_tensor *t = att[i];
        const size_t kept = (size_t)(B * H * T) * (1 + T) * sizeof(cg_real); /* lse and P */
        CHECK(t->aux_bytes == kept, "attention %d keeps %zu bytes from forward to backward, want %zu (lse and P)", i,
              t->aux_bytes, kept);
        CHECK(t->fwd_aux && t->bwd_aux && t->fwd_aux_bytes > 0 && t->bwd_aux_bytes > 0,
              "attention %d: forward's and backward's slots planned (%zu, %zu bytes)", i, t->fwd_aux_bytes,
              t->bwd_aux_bytes);
        /* two slots of 32 x 32 blocks and packed 32-row operands: well under one BQ x BK pair of blocks */
        CHECK(t->fwd_aux_bytes < (size_t)(2 * 128 * 256) * sizeof(cg_real), "attention %d: forward's slots %zu bytes", i,
              t->fwd_aux_bytes);
    }
    cg_graph_free(g);
    unsetenv("CGRAD_ATTN_PROBS");
}

int main(void) {
    cg_set_threads(2);
    test_large_blocks_use_huge_pages();
    test_placements_agree_on_gpt();
    test_placements_agree_on_recurrence();
    test_plan_steps_grow_n_log_n();
    test_residual_gradients_share_a_buffer();
    test_attention_slots_live_in_one_rule();
    TEST_END();
}
