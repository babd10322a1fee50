/* SPDX-License-Identifier: MIT */
/* Unary elementwise ops (scale, tanh, ...) inside a thread team: their chunks are ranges the team
 * shares (ops/elementwise.c), where as OpenMP loops they ran on thread 0 alone. A scale's and a
 * tanh's forward called inside a team of two must give the helper pieces and the values by hand
 * (s * x and tanhf(y), in float); a graph through both, forward and backward inside the
 * team, must give one thread's bits, and its gradient by hand: d/dx sum(tanh(s x) R) = R s (1 - y^2). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"
#include "graph/internal.h"

enum { ROWS = 512, D = 256, N = ROWS * D };
#define SCALE 3.0

typedef struct {
    cg_graph *g;
    cg_tensor *x, *R, *y, *z, *loss;
} net;

static net build(void) {
    net n = {.g = cg_graph_new(CG_TRAIN)};
    cg_rng rng;
    cg_rng_seed(&rng, 21);
    n.x = cg_requires_grad(cg_input(n.g, "x", CG_REAL, 2, (const int64_t[]){ROWS, D}));
    n.R = cg_input(n.g, "R", CG_REAL, 2, (const int64_t[]){ROWS, D});
    cg_fill_uniform(n.x, &rng, -1, 1);
    cg_fill_uniform(n.R, &rng, -1, 1);
    n.y = cg_retain(cg_scale(n.g, n.x, SCALE));
    n.z = cg_retain(cg_tanh(n.g, n.y));
    n.loss = cg_sum_all(n.g, cg_mul(n.g, n.z, n.R));
    return n;
}

typedef struct {
    net *n;
    long long helper_pieces;
    cg_status st;
} team_ctx;

/* The forwards alone, called as the executor calls them, inside the team. */
static cg_status forwards_in_team(void *ctx) {
    team_ctx *c = ctx;
    cgi_team_counts a, b;
    cgi_team_stats(&a);
    c->st = cgi_ops[CGI_OP_SCALE].forward(c->n->y);
    if (!c->st) c->st = cgi_ops[CGI_OP_TANH].forward(c->n->z);
    cgi_team_stats(&b);
    c->helper_pieces = b.helper_pieces - a.helper_pieces;
    return CG_OK;
}

static cg_status step_in_team(void *ctx) {
    team_ctx *c = ctx;
    c->st = cg_graph_forward(c->n->g);
    if (!c->st) c->st = cg_graph_backward(c->n->g, c->n->loss);
    return CG_OK;
}

int main(void) {
    cg_real *x = malloc(N * sizeof *x), *R = malloc(N * sizeof *R), *y = malloc(N * sizeof *y),
            *z = malloc(N * sizeof *z), *dx1 = malloc(N * sizeof *dx1), *dx2 = malloc(N * sizeof *dx2);
    /* one thread: the reference bits of the whole step */
    cg_set_threads(1);
    net one = build();
    CHECK(one.loss && cg_graph_forward(one.g) == CG_OK && cg_graph_backward(one.g, one.loss) == CG_OK &&
          cg_read_grad(one.x, dx1) == CG_OK && cg_read(one.x, x) == CG_OK && cg_read(one.R, R) == CG_OK,
          "one thread: %s", cg_last_error());
    cg_graph_free(one.g);

    cg_set_threads(2);
    cgi_team_set_guard(CGI_TEAM_GUARD_ON);
    cgi_team_wait_for_helpers(true); /* each task's first piece waits for the helper */
    net two = build();
    team_ctx c = {&two, 0, CG_OK};
    CHECK(cg_graph_forward(two.g) == CG_OK, "%s", cg_last_error()); /* plans the storage */
    memset(cg_data(two.y), 0, N * sizeof(cg_real));
    memset(cg_data(two.z), 0, N * sizeof(cg_real));
    CHECK(cg_run_with_team(forwards_in_team, &c) == CG_OK && c.st == CG_OK, "%s", cg_last_error());
    CHECK(c.helper_pieces >= 2, "the helper took %lld pieces of scale's and tanh's forwards (want one or more each)",
          c.helper_pieces);
    CHECK(cg_read(two.y, y) == CG_OK && cg_read(two.z, z) == CG_OK, "%s", cg_last_error());
    int64_t bad_y = -1, bad_z = -1;
    for (int64_t i = 0; i < N; i++) {
        if (bad_y < 0 && y[i] != (cg_real)SCALE * x[i]) bad_y = i;
        if (bad_z < 0 && z[i] != tanhf(y[i])) bad_z = i; /* tgmath: the op calls tanhf */
    }
    CHECK(bad_y < 0, "scale in a team: y[%lld] = %.9g, 3 x = %.9g", (long long)bad_y, bad_y < 0 ? 0.0 : (double)y[bad_y],
          bad_y < 0 ? 0.0 : (double)((cg_real)SCALE * x[bad_y]));
    CHECK(bad_z < 0, "tanh in a team: z[%lld] = %.9g", (long long)bad_z, bad_z < 0 ? 0.0 : (double)z[bad_z]);

    CHECK(cg_run_with_team(step_in_team, &c) == CG_OK && c.st == CG_OK && cg_read_grad(two.x, dx2) == CG_OK, "%s",
          cg_last_error());
    CHECK(!memcmp(dx1, dx2, N * sizeof *dx1), "x's gradient in a team of two differs from one thread's");
    int64_t bad = -1;
    for (int64_t i = 0; i < N && bad < 0; i++) {
        const double want = R[i] * SCALE * (1 - (double)z[i] * z[i]);
        if (fabs(dx2[i] - want) > 1e-5 * (1 + fabs(want))) bad = i;
    }
    CHECK(bad < 0, "x's gradient [%lld] = %.9g, R s (1 - y^2) = %.9g", (long long)bad, bad < 0 ? 0.0 : (double)dx2[bad],
          bad < 0 ? 0.0 : R[bad] * SCALE * (1 - (double)z[bad] * z[bad]));
    cg_graph_free(two.g);
    cgi_team_wait_for_helpers(false);
    cgi_team_set_guard(CGI_TEAM_GUARD_AUTO);
    cg_set_threads(0);
    free(x), free(R), free(y), free(z), free(dx1), free(dx2);
    TEST_END();
}
