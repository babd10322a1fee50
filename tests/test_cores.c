/* SPDX-License-Identifier: MIT */
/* The cores guard (graph/cores.c): its decisions on hand-made run times and delays; the runs that
 * feed it; and the premise it rests on, that training gives the same bits whichever runs are on one
 * thread and which on two (a GPT, a BERT, an encoder-decoder and a llama, three AdamW steps each,
 * switched run by run, against one thread and against two, and on two threads with every run one
 * thread team span, CGRAD_TEAM_LARGE). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"
#include "graph/internal.h"

enum { W = CGI_CORES_WINDOW };

/* n runs into g, each of `seconds` with run delay `delay` a thread (as a share of it), work 1 */
static void feed(cgi_cores_guard *g, int n, double seconds, double delay) {
    for (int i = 0; i < n; i++) cgi_cores_feed(g, seconds, delay * seconds, 1);
}

/* A guard past its first two runs, which it does not time (they touch the graph's memory first). */
static cgi_cores_guard fresh(void) {
    cgi_cores_guard g = {0};
    feed(&g, 2, 5.0, 0.9);
    g.runs_all = 0;
    return g;
}

static void test_idle_machine_keeps_every_thread(void) {
    cgi_cores_guard g = {0};
    feed(&g, 1, 3.0, 0.9);
    feed(&g, 1, 3.0, 0.9);
    CHECK(g.phase == CGI_CORES_WATCH && g.filled[0] == 0, "the first runs counted: %d", g.filled[0]);
    g = fresh();
    feed(&g, 500, 0.6, 0.03); /* the wakes: a few percent at most */
    feed(&g, 10, 0.6, 0.12);  /* below an eighth */
    CHECK(!cgi_cores_one(&g) && g.switches == 0, "phase %d, %lld probes", g.phase, g.switches);
    /* one contended run alone is not enough */
    feed(&g, 1, 0.6, 0.9);
    feed(&g, 1, 0.6, 0.0);
    feed(&g, 1, 0.6, 0.9);
    CHECK(g.phase == CGI_CORES_WATCH, "phase %d after single contended runs", g.phase);
    CHECK(g.runs_all == 513 && g.runs_one == 0, "%lld / %lld runs", g.runs_all, g.runs_one);
}

static void test_busy_machine_holds_one_thread(void) {
    cgi_cores_guard g = fresh();
    feed(&g, 1, 1.15, 0.9); /* contended from the first run: the window of every thread fills first */
    CHECK(g.phase == CGI_CORES_WATCH, "probed with %d runs timed", g.filled[0]);
    feed(&g, W - 1, 1.15, 0.9);
    CHECK(g.phase == CGI_CORES_PROBE && cgi_cores_one(&g), "phase %d after %d contended runs", g.phase, W);
    /* the probe: one settling run (not timed, however slow), then the window */
    feed(&g, 1, 9.0, 0);
    feed(&g, W - 1, 1.10, 0);
    CHECK(g.phase == CGI_CORES_PROBE, "decided before the window was full");
    feed(&g, 1, 1.10, 0);
    CHECK(g.phase == CGI_CORES_HOLD && g.hold_len == 16, "phase %d, hold %d", g.phase, g.hold_len);
    /* held: then every thread again, still slower: held twice as long */
    feed(&g, 15, 1.10, 0);
    CHECK(g.phase == CGI_CORES_HOLD, "left the hold early");
    feed(&g, 1, 1.10, 0);
    CHECK(g.phase == CGI_CORES_RETRY && !cgi_cores_one(&g), "phase %d after the hold", g.phase);
    feed(&g, 1 + W, 1.12, 0.9);
    CHECK(g.phase == CGI_CORES_HOLD && g.hold_len == 32, "phase %d, hold %d", g.phase, g.hold_len);
    /* a tie within 2% stays on one thread */
    feed(&g, 32, 1.10, 0);
    feed(&g, 1 + W, 1.09, 0.5);
    CHECK(g.phase == CGI_CORES_HOLD && g.hold_len == 64, "a 1%% win for every thread: phase %d", g.phase);
    /* the other process left: every thread wins by far, and the watch begins again */
    feed(&g, 64, 1.10, 0);
    feed(&g, 1 + W, 0.60, 0.02);
    CHECK(g.phase == CGI_CORES_WATCH && !cgi_cores_one(&g) && g.quiet == 16, "phase %d, quiet %d", g.phase, g.quiet);
    CHECK(g.runs_one == 1 + W + 16 + 32 + 64, "%lld runs on one thread", g.runs_one);
}

/* Contended, but two threads still win (three runnable threads on two cores, one session): the
 * guard keeps them, and probes less and less often. */
static void test_shared_cores_keep_every_thread(void) {
    cgi_cores_guard g = fresh();
    feed(&g, W, 0.8, 0.5);
    CHECK(g.phase == CGI_CORES_PROBE, "phase %d", g.phase);
    feed(&g, 1 + W, 1.0, 0.3);
    CHECK(g.phase == CGI_CORES_WATCH && g.quiet == 16, "phase %d, quiet %d", g.phase, g.quiet);
    feed(&g, 16, 0.8, 0.5); /* the watch rests */
    CHECK(g.phase == CGI_CORES_WATCH, "probed while resting");
    feed(&g, 2, 0.8, 0.5);
    CHECK(g.phase == CGI_CORES_PROBE, "phase %d after the rest", g.phase);
    feed(&g, 1 + W, 1.0, 0.3);
    CHECK(g.phase == CGI_CORES_WATCH && g.quiet == 32, "quiet %d: not doubled", g.quiet);
}

/* ---- the runs that feed the process's guard ---- */

static cg_status linear_run(int64_t rows) {
    cg_params *ps = cg_params_new();
    const int64_t sx[2] = {rows, 64}, sw[2] = {64, 64};
    cg_tensor *w = cg_params_add(ps, "w", 2, sw);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, sx);
    cg_rng r;
    cg_rng_seed(&r, 3);
    cg_fill_normal(x, &r, 0, 1), cg_fill_normal(w, &r, 0, 0.1);
    cg_tensor *loss = cg_mean_all(g, cg_linear(g, x, w, NULL));
    cg_status st = cg_graph_forward(g);
    if (!st) st = cg_graph_backward(g, loss);
    cg_graph_free(g);
    cg_params_free(ps);
    return st;
}

static void test_runs_feed_the_guard(void) {
    long long all0, one0, p0, all1, one1, p1;
    cgi_cores_set_mode(1);
    cg_set_threads(2);
    cgi_cores_counts(&all0, &one0, &p0);
    CHECK(linear_run(256) == CG_OK, "%s", cg_last_error());
    cgi_cores_counts(&all1, &one1, &p1);
    /* CGRAD_RUN_PAR_MIN=0 here: forward and backward are both large runs */
    CHECK(all1 - all0 == 2 && one1 == one0, "%lld runs on every thread, %lld on one", all1 - all0, one1 - one0);
    cg_set_threads(1); /* nothing to decide */
    CHECK(linear_run(256) == CG_OK, "%s", cg_last_error());
    cgi_cores_counts(&all0, &one0, &p0);
    CHECK(all0 == all1 && one0 == one1, "a one-thread run was timed");
    cg_set_threads(2);
    cgi_cores_set_mode(0);
    cgi_cores_counts(&all0, &one0, &p0);
    CHECK(linear_run(256) == CG_OK, "%s", cg_last_error());
    cgi_cores_counts(&all1, &one1, &p1);
    CHECK(all1 == all0, "timed with the guard off");
    cgi_cores_set_mode(1);
    cgi_cores_force(1); /* held on one thread: outside runs too (the optimizer) */
    CHECK(cgi_nthreads() == 1 && cgi_run_threads(1e12) == 1, "%d / %d threads", cgi_nthreads(), cgi_run_threads(1e12));
    cgi_cores_force(0);
    CHECK(cgi_nthreads() == 2 && cgi_run_threads(1e12) == 2, "%d / %d threads", cgi_nthreads(), cgi_run_threads(1e12));
    cgi_cores_force(-1);
    cgi_cores_set_mode(0);
}

/* ---- the premise: the same bits at any thread count, run by run ---- */

typedef struct {
    cg_arch arch;
    const char *name, *json;
    int64_t batch, t;
    cg_precision precision;
} model_case;

static const model_case cases[] = {
    {CG_ARCH_GPT2, "gpt2", "{\"vocab_size\": 256, \"n_positions\": 64, \"n_embd\": 128, \"n_layer\": 2, \"n_head\": 4}", 8, 64, CG_FP32},
    {CG_ARCH_BERT, "bert",
     "{\"vocab_size\": 512, \"hidden_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
     "\"intermediate_size\": 512, \"max_position_embeddings\": 64, \"type_vocab_size\": 2}", 8, 64, CG_FP32},
    {CG_ARCH_ENCDEC, "encdec",
     "{\"src_vocab_size\": 300, \"tgt_vocab_size\": 300, \"d_model\": 128, \"n_head\": 4, \"num_encoder_layers\": 2, "
     "\"num_decoder_layers\": 2, \"dim_feedforward\": 512, \"max_len\": 64, \"pad_id\": 0, \"bos_id\": 1, \"eos_id\": 2}", 8, 32, CG_FP32},
    {CG_ARCH_LLAMA, "llama",
     "{\"vocab_size\": 256, \"hidden_size\": 128, \"intermediate_size\": 344, \"num_hidden_layers\": 2, "
     "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 64}", 8, 64, CG_FP32},
    {CG_ARCH_GPT2, "gpt2 bf16", "{\"vocab_size\": 256, \"n_positions\": 64, \"n_embd\": 128, \"n_layer\": 2, \"n_head\": 4}", 8,
     64, CG_BF16},
};

static int threads_seen[3]; /* kernels that ran on 1 and on 2 threads (index), in the switched training */

static void note(cg_tensor *param, void *ctx) {
    (void)param, (void)ctx;
    const int n = cgi_nthreads();
    if (n >= 1 && n <= 2) threads_seen[n]++;
}

static void fill_ids(cg_tensor *t, cg_rng *r, int32_t lo, int32_t hi) {
    if (!t) return;
    int32_t *d = cg_idata(t);
    for (int64_t i = 0; i < cg_numel(t); i++) d[i] = lo + (int32_t)(cg_rng_next(r) % (uint64_t)(hi - lo));
}

/* How train runs its steps: as they come; switched, the forward, the backward and the update
 * alternating between one thread and two; or each forward and backward one thread team span
 * (CGRAD_TEAM_LARGE: the helpers take the pieces of every op that shares them), with the update
 * inside backward (cg_optim_attach), where each parameter's update is shared too. */
enum { PLAIN, SWITCHED, TEAM };

/* Three AdamW steps of the case; the parameters' bytes, concatenated, in *out (*bytes long). */
static void train(const model_case *c, int threads, int how, unsigned char **out, size_t *bytes) {
    const bool switched = how == SWITCHED;
    cg_set_threads(threads);
    if (how == TEAM) cgi_set_team_large(1), cgi_team_wait_for_helpers(true);
    cg_params *ps = cg_params_new();
    cg_model *m = cg_model_new(c->arch, c->json, 0.0, ps, 99);
    CHECK(m != NULL, "%s: %s", c->name, cg_last_error());
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, c->precision) == CG_OK, "%s: %s", c->name, cg_last_error());
    cg_model_graph mg;
    CHECK(cg_model_build(g, m, c->batch, c->t, c->t, &mg) == CG_OK, "%s: %s", c->name, cg_last_error());
    cg_rng r;
    cg_rng_seed(&r, 5);
    for (int i = 0; i < mg.n_inputs; i++) {
        cg_tensor *in = mg.inputs[i];
        if (cg_tensor_dtype(in) != CG_INT32) {
            cg_fill_uniform(in, &r, 1, 1); /* masks: nothing masked */
            continue;
        }
        fill_ids(in, &r, 3, c->arch == CG_ARCH_BERT ? 512 : c->arch == CG_ARCH_ENCDEC ? 300 : 256);
    }
    if (c->arch == CG_ARCH_BERT) { /* labels: a quarter of the positions, -100 elsewhere; segment and NSP ids 0/1 */
        int32_t *lb = cg_idata(cg_model_graph_input(&mg, "labels"));
        for (int64_t i = 0; i < c->batch * c->t; i++) lb[i] = i % 4 ? -100 : lb[i];
        fill_ids(cg_model_graph_input(&mg, "token_type_ids"), &r, 0, 2);
        fill_ids(cg_model_graph_input(&mg, "next_sentence_label"), &r, 0, 2);
    }
    if (how != TEAM) cg_graph_on_grad_ready(g, note, NULL); /* a team's attached optimizer takes the reports */
    cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
    oc.lr = 1e-3;
    cg_optim *opt = cg_optim_new(ps, &oc);
    if (how == TEAM) CHECK(cg_optim_attach(opt, g) == CG_OK, "%s: %s", c->name, cg_last_error());
    cgi_team_counts before, after;
    cgi_team_stats(&before);
    for (int step = 0; step < 3; step++) {
        cg_params_zero_grad(ps);
        if (switched) cgi_cores_force(step % 2);
        cg_status st = cg_graph_forward(g);
        if (switched) cgi_cores_force(1 - step % 2);
        if (how == TEAM) {
            if (!st) st = cg_optim_backward_step(opt, g, mg.loss, oc.lr);
        } else {
            if (!st) st = cg_graph_backward(g, mg.loss);
            if (switched) cgi_cores_force(step % 2);
            if (!st) st = cg_optim_step(opt, oc.lr);
        }
        CHECK(st == CG_OK, "%s step %d: %s", c->name, step, cg_last_error());
    }
    cgi_team_stats(&after);
    if (how == TEAM && c->precision == CG_BF16) /* its products run on oneDNN's threads: no span */
        CHECK(after.runs_with_helpers == before.runs_with_helpers, "%s: a bf16 run in a team span", c->name);
    else if (how == TEAM) {
        CHECK(after.runs_with_helpers - before.runs_with_helpers == 6 && after.runs_without == before.runs_without,
              "%s: %lld of 6 runs in a team with helpers, %lld without", c->name,
              after.runs_with_helpers - before.runs_with_helpers, after.runs_without - before.runs_without);
        CHECK(after.helper_pieces > before.helper_pieces, "%s: the helpers took none of %lld pieces", c->name,
              after.pieces - before.pieces);
    } else CHECK(after.runs_with_helpers == before.runs_with_helpers, "%s: a team span without CGRAD_TEAM_LARGE", c->name);
    cgi_set_team_large(0), cgi_team_wait_for_helpers(false);
    cgi_cores_force(-1);
    *bytes = 0;
    for (int i = 0; i < cg_params_count(ps); i++) *bytes += (size_t)cg_numel(cg_params_at(ps, i)) * sizeof(cg_real);
    *out = malloc(*bytes);
    size_t at = 0;
    for (int i = 0; i < cg_params_count(ps); i++) {
        cg_tensor *p = cg_params_at(ps, i);
        const size_t n = (size_t)cg_numel(p) * sizeof(cg_real);
        memcpy(*out + at, cg_data(p), n);
        at += n;
    }
    cg_optim_free(opt);
    cg_graph_free(g);
    cg_model_free(m);
    cg_params_free(ps);
}

static void test_switches_keep_the_bits(bool bf16) {
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const model_case *c = &cases[k];
        if ((c->precision == CG_BF16) != bf16) continue;
        unsigned char *one, *two, *mixed, *team;
        size_t n1, n2, nm, nt;
        train(c, 1, PLAIN, &one, &n1);
        train(c, 2, PLAIN, &two, &n2);
        threads_seen[1] = threads_seen[2] = 0;
        train(c, 2, SWITCHED, &mixed, &nm);
        CHECK(threads_seen[1] > 0 && threads_seen[2] > 0, "%s: switched training ran %d kernels on one thread, %d on two",
              c->name, threads_seen[1], threads_seen[2]);
        train(c, 2, TEAM, &team, &nt);
        CHECK(n1 == n2 && n1 == nm && n1 == nt && n1 > 0, "%s: sizes", c->name);
        CHECK(n1 == n2 && !memcmp(one, two, n1), "%s: one thread and two differ", c->name);
        CHECK(n1 == nm && !memcmp(one, mixed, n1), "%s: switched between one thread and two differs", c->name);
        CHECK(n1 == nt && !memcmp(one, team, n1), "%s: two threads in one team span a run differ from one thread", c->name);
        free(one), free(two), free(mixed), free(team);
    }
    cg_set_threads(0);
}

/* `test_cores bf16` (its own ctest entry, skipped without bf16 support): the bf16 model cases. */
int main(int argc, char **argv) {
    if (!strcmp(test_part(argc, argv), "bf16")) {
        if (cg_bf16_unavailable()) return test_skip("test_cores bf16", cg_bf16_unavailable());
        test_switches_keep_the_bits(true);
        TEST_END();
    }
    test_idle_machine_keeps_every_thread();
    test_busy_machine_holds_one_thread();
    test_shared_cores_keep_every_thread();
    test_runs_feed_the_guard();
    test_switches_keep_the_bits(false);
    TEST_END();
}
