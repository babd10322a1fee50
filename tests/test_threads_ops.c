/* SPDX-License-Identifier: MIT */
/* Ops shared across a two-thread team (graph/team.c): embedding's gather and scatter, reductions,
 * bias gradients, losses and optimizer updates cut into pieces that the helpers take, each giving
 * one thread's bits; the guided cuts of a team's matrix products; pieces nested in pieces. The
 * team's own machinery and the per-run thread decision are tested in test_threads.c. */
#include <omp.h>
#include <stdatomic.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <stdint.h>
#include <unistd.h>

#include "../cgrad.h"
#include "check.h"
#include "graph/internal.h"
#include "team_check.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

/* Runs `runs` on ctx in a two-thread team until a helper took one of the op's pieces (at most 50
 * times), with `clear(ctx)` before and `check(ctx)` after each run; the op's pieces are those beyond
 * the ones of `plain`, the same graph without the op under test. */
static void shared_in_team(const char *what, cg_status (*runs)(void *), void *plain, void *ctx, void (*clear)(void *),
                           void (*check)(void *)) {
    cgi_team_set_guard(CGI_TEAM_GUARD_ON);
    cgi_team_wait_for_helpers(true); /* else a loaded machine may keep the helpers switched out */
    cg_set_threads(2);
    cgi_team_counts before;
    cgi_team_stats(&before);
    CHECK(cg_run_with_team(runs, plain) == CG_OK, "%s", cg_last_error());
    const long long others = team_delta(&before).pieces;
    long long pieces = 0, helped = 0;
    for (int attempt = 0; attempt < 50 && helped == 0; attempt++) {
        cgi_team_stats(&before);
        clear(ctx);
        CHECK(cg_run_with_team(runs, ctx) == CG_OK, "%s", cg_last_error());
        const cgi_team_counts d = team_delta(&before);
        pieces = d.pieces - others, helped = d.helper_pieces;
        check(ctx);
    }
    CHECK(pieces > 0 && helped > 0, "%s shared %lld pieces in a team (the helpers took %lld)", what, pieces, helped);
    cgi_team_set_guard(CGI_TEAM_GUARD_AUTO);
    cgi_team_wait_for_helpers(false);
    cg_set_threads(0);
}

/* Embedding's gather (by rows) and gradient scatter (by columns, repeated ids included) in a team:
 * the helpers take ranges of both, and the values are the table's rows and, element by element,
 * the upstream rows added in order from zero, as a plain loop computes them. */
enum { EV = 50, ED = 96, EN = 1200 };
typedef struct {
    cg_real *y, *dw;
    bool plain; /* the same graph with a parameter [EN, ED] in the embedding's place */
} embed_case;

static cg_status embed_runs(void *ctx) {
    embed_case *e = ctx;
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_params *ps = cg_params_new();
    cg_tensor *w = cg_params_add(ps, "w", 2, S(EV, ED));
    cg_tensor *ids = cg_input(g, "ids", CG_INT32, 1, S(EN));
    cg_tensor *u = cg_input(g, "u", CG_REAL, 2, S(EN, ED)); /* the upstream gradient, as mul's */
    for (int64_t i = 0; i < EV * ED; i++) cg_data(w)[i] = (cg_real)sin(0.37 * (double)i);
    for (int64_t i = 0; i < EN; i++) cg_idata(ids)[i] = (int32_t)((i * 7 + i / 13) % EV);
    for (int64_t i = 0; i < EN * ED; i++) cg_data(u)[i] = (cg_real)cos(0.011 * (double)i);
    cg_tensor *y = e->plain ? cg_params_add(ps, "y", 2, S(EN, ED)) : cg_retain(cg_embedding(g, w, ids));
    cg_tensor *l = cg_sum_all(g, cg_mul(g, y, u));
    cg_params_zero_grad(ps);
    cg_status st = l ? cg_graph_forward(g) : CG_ERR_NOMEM;
    if (!st) st = cg_graph_backward(g, l);
    if (!st && !e->plain) memcpy(e->y, cg_data(y), sizeof(cg_real) * EN * ED), cg_read_grad(w, e->dw);
    cg_graph_free(g);
    cg_params_free(ps);
    return st;
}

static cg_real embed_want_dw[EV * ED];

static void embed_clear(void *ctx) {
    embed_case *e = ctx;
    memset(e->y, 0, EN * ED * sizeof *e->y), memset(e->dw, 0, EV * ED * sizeof *e->dw);
}

static void embed_check(void *ctx) {
    const embed_case *e = ctx;
    bool rows_ok = true;
    for (int64_t i = 0; i < EN && rows_ok; i++)
        for (int64_t j = 0; j < ED; j++) {
            const int64_t k = (i * 7 + i / 13) % EV;
            rows_ok = rows_ok && e->y[i * ED + j] == (cg_real)sin(0.37 * (double)(k * ED + j));
        }
    CHECK(rows_ok, "embedding's rows in a team are not the table's");
    CHECK(!memcmp(e->dw, embed_want_dw, sizeof embed_want_dw), "embedding's gradient in a team differs from the ordered sums");
}

static void test_team_embedding(void) {
    static cg_real y[EN * ED], dw[EV * ED];
    embed_case e = {y, dw, false}, plain = {y, dw, true};
    for (int64_t i = 0; i < EN; i++) {
        const int32_t k = (int32_t)((i * 7 + i / 13) % EV);
        for (int64_t j = 0; j < ED; j++) embed_want_dw[k * ED + j] += (cg_real)cos(0.011 * (double)(i * ED + j));
    }
    /* the ops around it share pieces too: the embedding's are the pieces beyond the plain twin's */
    shared_in_team("the embedding", embed_runs, &plain, &e, embed_clear, embed_check);
}

/* A broadcast summand's gradient (a position embedding's, summed over the batch: cgi_reduce) in a
 * team: the helpers take ranges of its outputs, and each is the double sum in batch order. */
enum { RB = 12, RT = 40, RD = 64 };
typedef struct {
    cg_real *dp;
    bool plain; /* the same graph with p taking no gradient */
} reduce_case;

static cg_status reduce_runs(void *ctx) {
    reduce_case *e = ctx;
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_params *ps = cg_params_new();
    cg_tensor *x = cg_params_add(ps, "x", 3, S(RB, RT, RD));
    cg_tensor *p = e->plain ? cg_input(g, "p", CG_REAL, 2, S(RT, RD)) : cg_params_add(ps, "p", 2, S(RT, RD));
    cg_tensor *u = cg_input(g, "u", CG_REAL, 3, S(RB, RT, RD));
    for (int64_t i = 0; i < RB * RT * RD; i++) cg_data(x)[i] = (cg_real)sin(0.3 * (double)i);
    for (int64_t i = 0; i < RT * RD; i++) cg_data(p)[i] = (cg_real)cos(0.7 * (double)i);
    for (int64_t i = 0; i < RB * RT * RD; i++) cg_data(u)[i] = (cg_real)cos(0.013 * (double)i);
    cg_tensor *l = cg_sum_all(g, cg_mul(g, cg_add(g, x, p), u));
    cg_params_zero_grad(ps);
    cg_status st = l ? cg_graph_forward(g) : CG_ERR_NOMEM;
    if (!st) st = cg_graph_backward(g, l);
    if (!st && !e->plain) cg_read_grad(p, e->dp);
    cg_graph_free(g);
    cg_params_free(ps);
    return st;
}

static cg_real reduce_want[RT * RD];

static void reduce_clear(void *ctx) { memset(((reduce_case *)ctx)->dp, 0, RT * RD * sizeof(cg_real)); }

static void reduce_check(void *ctx) {
    CHECK(!memcmp(((reduce_case *)ctx)->dp, reduce_want, sizeof reduce_want),
          "the broadcast summand's gradient in a team differs from the ordered sums");
}

static void test_team_reduce(void) {
    static cg_real dp[RT * RD];
    for (int64_t o = 0; o < RT * RD; o++) {
        double acc = 0;
        for (int64_t b = 0; b < RB; b++) acc += (cg_real)cos(0.013 * (double)(b * RT * RD + o));
        reduce_want[o] = (cg_real)acc;
    }
    reduce_case e = {dp, false}, plain = {dp, true};
    shared_in_team("the batch sum", reduce_runs, &plain, &e, reduce_clear, reduce_check);
}

/* A linear's bias sums, further pieces of its backward's products (cgi_gemm_many_then), in a team:
 * they are shared as pieces too (a frozen bias's twin counts the products' alone), with one
 * thread's bits and the column sums' values. */
enum { LR = 512, LK = 64, LN = 96 };
typedef struct {
    cg_real *db;
    bool frozen; /* the same graph with the bias taking no gradient */
} bias_case;

static cg_status bias_runs(void *ctx) {
    bias_case *e = ctx;
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_params *ps = cg_params_new();
    cg_tensor *x = cg_params_add(ps, "x", 2, S(LR, LK)), *w = cg_params_add(ps, "w", 2, S(LN, LK));
    cg_tensor *b = cg_params_add(ps, "b", 1, S(LN));
    if (e->frozen) cg_param_set_trainable(b, false);
    cg_tensor *u = cg_input(g, "u", CG_REAL, 2, S(LR, LN));
    for (int64_t i = 0; i < LR * LK; i++) cg_data(x)[i] = (cg_real)sin(0.3 * (double)i);
    for (int64_t i = 0; i < LN * LK; i++) cg_data(w)[i] = (cg_real)cos(0.7 * (double)i);
    for (int64_t i = 0; i < LN; i++) cg_data(b)[i] = (cg_real)(0.01 * (double)i);
    for (int64_t i = 0; i < LR * LN; i++) cg_data(u)[i] = (cg_real)cos(0.013 * (double)i);
    cg_tensor *l = cg_sum_all(g, cg_mul(g, cg_linear(g, x, w, b), u));
    cg_params_zero_grad(ps);
    cg_status st = l ? cg_graph_forward(g) : CG_ERR_NOMEM;
    if (!st) st = cg_graph_backward(g, l);
    if (!st && !e->frozen) cg_read_grad(b, e->db);
    cg_graph_free(g);
    cg_params_free(ps);
    return st;
}

static cg_real bias_one[LN]; /* one thread's bias gradient */

static void bias_clear(void *ctx) { memset(((bias_case *)ctx)->db, 0, LN * sizeof(cg_real)); }

static void bias_check(void *ctx) {
    CHECK(!memcmp(bias_one, ((bias_case *)ctx)->db, sizeof bias_one), "the bias gradient in a team differs from one thread's");
}

static void test_team_bias_sums(void) {
    static cg_real team[LN];
    bias_case e = {bias_one, false}, frozen = {team, true};
    cg_set_threads(1);
    CHECK(bias_runs(&e) == CG_OK, "%s", cg_last_error());
    for (int64_t c = 0; c < LN; c++) { /* the column sums of u */
        double want = 0;
        for (int64_t r = 0; r < LR; r++) want += (cg_real)cos(0.013 * (double)(r * LN + c));
        CHECK(fabs(bias_one[c] - want) <= 1e-4 * (1 + fabs(want)), "bias gradient %lld: %.7g, column sum %.7g",
              (long long)c, (double)bias_one[c], want);
    }
    e.db = team;
    shared_in_team("the bias sums", bias_runs, &frozen, &e, bias_clear, bias_check);
}

/* Losses and a broadcast sum in a team: their row and element loops were OpenMP loops, which
 * inside a span ran on thread 0 alone while the helper waited. They are shared as ranges now, with
 * one thread's bits: cross_entropy (forward and backward), mse_loss, a broadcast add's forward, and
 * linear_cross_entropy over three vocabulary slabs (its gathers, merges and scatters). */
enum { CR = 512, CC = 96, CV = 600 };
enum { LOSS_CE, LOSS_MSE, LOSS_ADD, LOSS_LCE };
typedef struct {
    int kind;
    bool plain;      /* the same graph on 4 rows: nothing in it is shared */
    cg_real *out;    /* the loss (or the sum's values), then x's gradient */
} loss_case;

static cg_status loss_runs(void *ctx) {
    loss_case *e = ctx;
    const int64_t rows = e->plain ? 4 : CR;
    cg_graph *g = cg_graph_new(e->kind == LOSS_ADD ? CG_EVAL : CG_TRAIN);
    cg_params *ps = cg_params_new();
    cg_tensor *x = cg_params_add(ps, "x", 2, S(rows, CC)), *w = cg_params_add(ps, "w", 2, S(CV, CC));
    cg_tensor *p = cg_input(g, "p", CG_REAL, 1, S(CC)), *y = cg_input(g, "y", CG_REAL, 2, S(rows, CC));
    cg_tensor *tg = cg_input(g, "t", CG_INT32, 1, S(rows));
    for (int64_t i = 0; i < rows * CC; i++) cg_data(x)[i] = (cg_real)(3 * sin(0.37 * (double)i)), cg_data(y)[i] = (cg_real)cos(0.1 * (double)i);
    for (int64_t i = 0; i < CV * CC; i++) cg_data(w)[i] = (cg_real)(0.2 * cos(0.7 * (double)i));
    for (int64_t i = 0; i < CC; i++) cg_data(p)[i] = (cg_real)(0.5 * sin((double)i));
    for (int64_t i = 0; i < rows; i++) cg_idata(tg)[i] = (int32_t)((i * 37) % (e->kind == LOSS_LCE ? CV : CC));
    cg_tensor *l = e->kind == LOSS_CE    ? cg_cross_entropy(g, x, tg, -100)
                   : e->kind == LOSS_MSE ? cg_mse_loss(g, x, y)
                   : e->kind == LOSS_LCE ? cg_linear_cross_entropy(g, x, w, NULL, tg, -100)
                                         : cg_retain(cg_add(g, x, p));
    cg_params_zero_grad(ps);
    cg_status st = l ? cg_graph_forward(g) : CG_ERR_NOMEM;
    if (!st && e->kind != LOSS_ADD) st = cg_graph_backward(g, l);
    if (!st && !e->plain) {
        if (e->kind == LOSS_ADD) memcpy(e->out, cg_data(l), sizeof(cg_real) * CR * CC);
        else e->out[0] = cg_data(l)[0], memcpy(e->out + 1, x->grad, sizeof(cg_real) * CR * CC); /* cg_read_grad's copy shares pieces too */
    }
    cg_graph_free(g);
    cg_params_free(ps);
    return st;
}

static cg_real loss_one[CR * CC + 1]; /* one thread's */
static const char *loss_name[] = {"cross_entropy", "mse_loss", "a broadcast add", "linear_cross_entropy"};

static void loss_clear(void *ctx) { memset(((loss_case *)ctx)->out, 0, sizeof loss_one); }

static void loss_check(void *ctx) {
    const loss_case *e = ctx;
    CHECK(!memcmp(loss_one, e->out, sizeof loss_one), "%s in a team differs from one thread", loss_name[e->kind]);
}

static void test_team_losses(void) {
    static cg_real team[CR * CC + 1];
    for (int kind = LOSS_CE; kind <= LOSS_LCE; kind++) {
        loss_case one = {kind, false, loss_one}, e = {kind, false, team}, plain = {kind, true, team};
        cg_set_threads(1);
        memset(loss_one, 0, sizeof loss_one);
        CHECK(loss_runs(&one) == CG_OK, "%s", cg_last_error());
        if (kind == LOSS_CE) { /* one thread's loss against the rows' log-sum-exp, in double */
            double want = 0;
            for (int64_t r = 0; r < CR; r++) {
                double mx = -INFINITY, sum = 0;
                for (int64_t c = 0; c < CC; c++) mx = fmax(mx, (cg_real)(3 * sin(0.37 * (double)(r * CC + c))));
                for (int64_t c = 0; c < CC; c++) sum += exp((cg_real)(3 * sin(0.37 * (double)(r * CC + c))) - mx);
                want += mx + log(sum) - (cg_real)(3 * sin(0.37 * (double)(r * CC + (r * 37) % CC)));
            }
            want /= CR;
            CHECK(fabs(loss_one[0] - want) <= 1e-5 * (1 + fabs(want)), "cross_entropy %.7g, want %.7g", (double)loss_one[0], want);
        }
        shared_in_team(loss_name[kind], loss_runs, &plain, &e, loss_clear, loss_check);
    }
}

/* An optimizer step with gradient clipping inside a team (cg_run_with_team around a user's step):
 * the norm, the scaling and AdamW's update were OpenMP loops over the blocks' chunks, which ran on
 * thread 0 alone; the helpers take chunks of each now, with one thread's bits. */
enum { ON = 150000 };
typedef struct {
    cg_real *out; /* the parameters after two steps, then the norms */
    bool plain;   /* the same steps on 64 elements */
} optim_case;

static cg_status optim_runs(void *ctx) {
    optim_case *e = ctx;
    const int64_t n = e->plain ? 64 : ON;
    cg_params *ps = cg_params_new();
    cg_tensor *a = cg_params_add(ps, "a", 1, S(n)), *b = cg_params_add(ps, "b", 1, S(n / 2));
    cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
    cg_optim *o = a && b ? cg_optim_new(ps, &oc) : NULL;
    if (!o) return CG_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++) cg_data(a)[i] = (cg_real)sin(0.3 * (double)i);
    for (int64_t i = 0; i < n / 2; i++) cg_data(b)[i] = (cg_real)cos(0.3 * (double)i);
    cg_status st = CG_OK;
    double norm[2] = {0, 0};
    for (int step = 0; step < 2 && !st; step++) {
        cg_real *G = cgi_params_grads(ps);
        cgi_params_settle(ps, 0, -1);
        for (int64_t i = 0; i < cg_params_span(ps); i++) G[i] = (cg_real)(3 * cos(0.01 * (double)(i + step)));
        a->grad_stale = b->grad_stale = false;
        norm[step] = cg_clip_grad_norm(ps, 1.0);
        st = cg_optim_step(o, 1e-2);
    }
    if (!st && !e->plain) {
        memcpy(e->out, cg_params_values(ps), sizeof(cg_real) * (ON + ON / 2));
        e->out[ON + ON / 2] = (cg_real)norm[0], e->out[ON + ON / 2 + 1] = (cg_real)norm[1];
    }
    cg_optim_free(o);
    cg_params_free(ps);
    return st;
}

static cg_real optim_one[ON + ON / 2 + 2];

static void optim_clear(void *ctx) { memset(((optim_case *)ctx)->out, 0, sizeof optim_one); }

static void optim_check(void *ctx) {
    CHECK(!memcmp(optim_one, ((optim_case *)ctx)->out, sizeof optim_one), "a clipped AdamW step in a team differs from one thread's");
}

static void test_team_optim(void) {
    static cg_real team[ON + ON / 2 + 2];
    optim_case one = {optim_one, false}, e = {team, false}, plain = {team, true};
    cg_set_threads(1);
    CHECK(optim_runs(&one) == CG_OK, "%s", cg_last_error());
    double want = 0; /* the first norm, of the gradients as written */
    for (int64_t i = 0; i < ON + ON / 2; i++) want += pow((cg_real)(3 * cos(0.01 * (double)i)), 2);
    CHECK(fabs(optim_one[ON + ON / 2] - sqrt(want)) <= 1e-6 * sqrt(want), "norm %.9g, want %.9g", (double)optim_one[ON + ON / 2],
          sqrt(want));
    shared_in_team("a clipped AdamW step", optim_runs, &plain, &e, optim_clear, optim_check);
}

/* ---- guided pieces (ops/gemm.c): a sharing team's matrix products ---- */

static cgi_gemm_job shape_job(int64_t m, int64_t n, int64_t k) {
    return (cgi_gemm_job){.m = m, .n = n, .k = k, .alpha = 1};
}

/* The cuts of jobs for a two-thread team: each job's cut side covered once in order, cuts on
 * multiples of 32 from its start, sizes falling, into want[] (the pieces' lengths, -1 ended). */
static void check_cuts(const char *what, const cgi_gemm_job *jobs, int njobs, const int64_t *want) {
    int64_t cuts[64][3];
    const int n = cgi_gemm_team_cuts(jobs, njobs, 2, cuts, 64);
    CHECK(n > 0, "%s: %d pieces", what, n);
    int64_t at[4] = {0}, last = INT64_MAX;
    for (int q = 0; q < n; q++) {
        const int j = (int)cuts[q][0];
        const int64_t len = jobs[j].m >= jobs[j].n ? jobs[j].m : jobs[j].n, size = cuts[q][2] - cuts[q][1];
        CHECK(cuts[q][1] == at[j] && size > 0 && cuts[q][1] % 32 == 0 && (cuts[q][2] % 32 == 0 || cuts[q][2] == len),
              "%s: piece %d of job %d is [%lld, %lld) after %lld", what, q, j, (long long)cuts[q][1], (long long)cuts[q][2],
              (long long)at[j]);
        const double work = (double)size * (double)(jobs[j].m + jobs[j].n - len) * (double)jobs[j].k;
        CHECK(work <= last * 1.01, "%s: piece %d (%.0f multiply-adds) after a smaller one", what, q, work);
        last = (int64_t)work, at[j] = cuts[q][2];
        CHECK(want[q] == size, "%s: piece %d has %lld rows, want %lld", what, q, (long long)size, (long long)want[q]);
    }
    CHECK(want[n] == -1, "%s: %d pieces, want more", what, n);
    for (int j = 0; j < njobs; j++)
        CHECK(at[j] == (jobs[j].m >= jobs[j].n ? jobs[j].m : jobs[j].n), "%s: job %d covered to %lld", what, j, (long long)at[j]);
}

/* Guided: each piece half the work left, down to 256 rows; the shortest cut side first (a linear's
 * dW whole, then its dX); a remnant below the floor joins the piece before it; no piece below
 * 2^20 multiply-adds unless the tapered cut's smallest is (16 tokens: 3 pieces, not 2) and none
 * smaller than it (2^21: two halves); vectors keep the tapered 3 pieces, as does
 * CGRAD_TEAM_SPLIT=taper. */
static void test_team_guided_cuts(void) {
    cgi_gemm_set_split("guided");
    const cgi_gemm_job fwd = shape_job(4096, 768, 256), bwd[2] = {shape_job(4096, 256, 1024), shape_job(1024, 256, 4096)};
    check_cuts("gpt-tiny's q/k/v", &fwd, 1, (const int64_t[]){2048, 1024, 512, 256, 256, -1});
    check_cuts("a linear's dX and dW", bwd, 2, (const int64_t[]){1024, 2048, 1024, 512, 256, 256, -1});
    const cgi_gemm_job odd = shape_job(3000, 96, 64), cols = shape_job(96, 3000, 64), vec = shape_job(1, 768, 256);
    check_cuts("3000 rows", &odd, 1, (const int64_t[]){1504, 768, 384, 344, -1});
    check_cuts("3000 columns", &cols, 1, (const int64_t[]){1504, 768, 384, 344, -1});
    check_cuts("a vector", &vec, 1, (const int64_t[]){384, 192, 192, -1});
    const cgi_gemm_job step16 = shape_job(16, 768, 256), step216 = shape_job(216, 768, 256);
    check_cuts("16 tokens' q/k/v", &step16, 1, (const int64_t[]){384, 192, 192, -1});
    check_cuts("216 tokens' q/k/v", &step216, 1, (const int64_t[]){384, 192, 96, 96, -1});
    const cgi_gemm_job small = shape_job(64, 256, 128); /* 2^21 multiply-adds: halves, as tapered */
    check_cuts("a small product", &small, 1, (const int64_t[]){128, 128, -1});
    cgi_gemm_set_split("taper");
    check_cuts("tapered q/k/v", &fwd, 1, (const int64_t[]){2048, 1024, 1024, -1});
    cgi_gemm_set_split(NULL);
}

/* A linear's forward and backward in a two-thread team, its products cut guided (3000 rows: the
 * last piece a remnant of 344) and tapered, give one thread's bits in y, dX, dW and the bias's
 * gradient, and the helpers take pieces. */
enum { GR = 3000, GI = 64, GO = 96, GALL = GR * GO + GR * GI + GO * GI + GO };
static cg_status guided_runs(void *ctx) {
    cg_real *out = ctx;
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_params *ps = cg_params_new();
    cg_tensor *x = cg_params_add(ps, "x", 2, S(GR, GI)), *w = cg_params_add(ps, "w", 2, S(GO, GI));
    cg_tensor *b = cg_params_add(ps, "b", 1, S(GO)), *u = cg_input(g, "u", CG_REAL, 2, S(GR, GO));
    for (int64_t i = 0; i < GR * GI; i++) cg_data(x)[i] = (cg_real)sin(0.3 * (double)i);
    for (int64_t i = 0; i < GO * GI; i++) cg_data(w)[i] = (cg_real)cos(0.7 * (double)i);
    for (int64_t i = 0; i < GO; i++) cg_data(b)[i] = (cg_real)(0.01 * (double)i);
    for (int64_t i = 0; i < GR * GO; i++) cg_data(u)[i] = (cg_real)cos(0.013 * (double)i);
    cg_tensor *y = cg_linear(g, x, w, b), *l = cg_sum_all(g, cg_mul(g, y, u));
    cg_retain(y);
    cg_params_zero_grad(ps);
    cg_status st = l ? cg_graph_forward(g) : CG_ERR_NOMEM;
    if (!st) memcpy(out, cg_data(y), GR * GO * sizeof(cg_real));
    if (!st) st = cg_graph_backward(g, l);
    if (!st) cg_read_grad(x, out + GR * GO), cg_read_grad(w, out + GR * GO + GR * GI), cg_read_grad(b, out + GALL - GO);
    cg_graph_free(g);
    cg_params_free(ps);
    return st;
}

static void test_team_guided_bits(void) {
    static cg_real one[GALL], team[GALL];
    cg_set_threads(1);
    CHECK(guided_runs(one) == CG_OK, "%s", cg_last_error());
    cgi_team_set_guard(CGI_TEAM_GUARD_ON);
    cgi_team_wait_for_helpers(true); /* else a loaded machine may keep the helpers switched out */
    cg_set_threads(2);
    const char *modes[] = {"guided", "taper"};
    for (int m = 0; m < 2; m++) {
        cgi_gemm_set_split(modes[m]);
        long long helped = 0;
        for (int attempt = 0; attempt < 50 && helped == 0; attempt++) {
            memset(team, 0, sizeof team);
            cgi_team_counts before;
            cgi_team_stats(&before);
            CHECK(cg_run_with_team(guided_runs, team) == CG_OK, "%s", cg_last_error());
            helped = team_delta(&before).helper_pieces;
            int64_t diff = -1;
            for (int64_t i = 0; i < GALL && diff < 0; i++)
                if (memcmp(&one[i], &team[i], sizeof one[i])) diff = i;
            CHECK(diff < 0, "%s pieces: value %lld (of y, dX, dW, db) %.9g in a team, %.9g on one thread", modes[m],
                  (long long)diff, diff < 0 ? 0 : team[diff], diff < 0 ? 0 : one[diff]);
        }
        CHECK(helped > 0, "%s pieces: the helpers took none in 50 runs", modes[m]);
    }
    cgi_gemm_set_split(NULL);
    cgi_team_set_guard(CGI_TEAM_GUARD_AUTO);
    cgi_team_wait_for_helpers(false);
    cg_set_threads(0);
}

/* A piece that asks for pieces itself (attention's heads run their block products through the
 * product engine): on thread 0 the inner pieces ran as a second task of the same team, which
 * replaced the open task's claims, so the outer task's unclaimed pieces never ran (or thread 0
 * waited for them forever: alarm). Every outer and inner piece runs once, and each outer piece's
 * product, cut for a sharing team when called outside one, has one thread's bits. */
enum { NO = 4, NI = 6, NR = 96, NK = 256 };
typedef struct {
    _Atomic int outer[NO], inner[NO][NI];
    const cg_real *a, *b;
    cg_real *c; /* NO products [NR, NK] */
} nested_case;

static void nested_inner(void *ctx, int i) {
    nested_case *n = ((void **)ctx)[0];
    const int o = (int)(intptr_t)((void **)ctx)[1];
    atomic_fetch_add(&n->inner[o][i], 1);
}

static void nested_outer(void *ctx, int o) {
    nested_case *n = ctx;
    atomic_fetch_add(&n->outer[o], 1);
    cgi_gemm(NR, NK, NK, n->a, NK, 1, n->b, NK, 1, 1, 0, n->c + o * NR * NK, NK, 1, cgi_nthreads());
    void *inner[2] = {n, (void *)(intptr_t)o};
    cgi_team_pieces(nested_inner, inner, NI);
}

static cg_status nested_runs(void *ctx) {
    cgi_team_pieces(nested_outer, ctx, NO);
    return CG_OK;
}

static void test_team_nested_pieces(void) {
    static cg_real a[NR * NK], b[NK * NK], one[NR * NK], c[NO * NR * NK];
    for (int i = 0; i < NR * NK; i++) a[i] = (cg_real)sin(0.1 * i);
    for (int i = 0; i < NK * NK; i++) b[i] = (cg_real)cos(0.3 * i);
    cgi_gemm(NR, NK, NK, a, NK, 1, b, NK, 1, 1, 0, one, NK, 1, 1);
    cgi_team_set_guard(CGI_TEAM_GUARD_ON);
    cgi_team_wait_for_helpers(true);
    cg_set_threads(2);
    alarm(120); /* a lost piece hangs thread 0: end the test instead */
    for (int run = 0; run < 20; run++) {
        static nested_case n;
        memset(&n, 0, sizeof n);
        memset(c, 0, sizeof c);
        n.a = a, n.b = b, n.c = c;
        CHECK(cg_run_with_team(nested_runs, &n) == CG_OK, "%s", cg_last_error());
        for (int o = 0; o < NO; o++) {
            CHECK(atomic_load(&n.outer[o]) == 1, "run %d: outer piece %d ran %d times", run, o, atomic_load(&n.outer[o]));
            for (int i = 0; i < NI; i++)
                CHECK(atomic_load(&n.inner[o][i]) == atomic_load(&n.outer[o]), "run %d: inner piece %d of %d ran %d times",
                      run, i, o, atomic_load(&n.inner[o][i]));
            CHECK(!memcmp(c + o * NR * NK, one, sizeof one), "run %d: outer piece %d's product differs from one thread's", run, o);
        }
    }
    alarm(0);
    cgi_team_set_guard(CGI_TEAM_GUARD_AUTO);
    cgi_team_wait_for_helpers(false);
    cg_set_threads(0);
}

int main(void) {
    unsetenv("CGRAD_RUN_PAR_MIN"); /* ctest sets 0 for the other tests: here the default is tested */
    test_team_embedding();
    test_team_reduce();
    test_team_bias_sums();
    test_team_losses();
    test_team_optim();
    test_team_guided_cuts();
    test_team_guided_bits();
    test_team_nested_pieces();
    TEST_END();
}
