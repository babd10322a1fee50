/* SPDX-License-Identifier: MIT */
/* Mamba's selective scan (S6) as one custom op with a fused forward and backward, defined outside
 * the library through ops/custom.h. Per batch b and channel d, with a diagonal state of N:
 *
 *     h[t, n] = exp(delta[t] * A[n]) * h[t-1, n] + delta[t] * B[t, n] * u[t]
 *     y[t]    = sum_n C[t, n] * h[t, n] + D * u[t]
 *
 * delta is input-dependent (the discretisation step), so the recurrence cannot be a convolution.
 * Inputs: u, delta [batch, T, channels]; A [channels, N]; B, C [batch, T, N]; D [channels].
 *
 *   selective_scan             checks the op: its gradients against the same model unrolled into
 *                              T steps of built-in ops, and against finite differences
 *   selective_scan --bench T   times forward + backward of both at sequence length T (and their
 *                              planned memory), medians over interleaved rounds
 *
 * Build against libcgrad_f64 for the float64 check that ctest runs (example_selective_scan). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cgrad.h"

/* ---- the op ---- */

typedef struct {
    int64_t batch, T, channels, N;
} dims;

static dims dims_of(const cg_custom_tensor *u, const cg_custom_tensor *A) {
    return (dims){u->shape[0], u->shape[1], u->shape[2], A->shape[1]};
}

static bool same(const cg_custom_tensor *t, int nd, int64_t a, int64_t b, int64_t c) {
    const int64_t want[3] = {a, b, c};
    if (t->ndim != nd || t->dtype != CG_REAL) return false;
    for (int i = 0; i < nd; i++)
        if (t->shape[i] != want[i]) return false;
    return true;
}

static cg_status scan_shape(const cg_custom_tensor *in, int n, const void *params, void *user, cg_custom_shape *out) {
    if (in[0].ndim != 3 || in[2].ndim != 2)
        return cg_set_error(CG_ERR_SHAPE, "u%s must be [batch, T, channels] and A%s [channels, N]",
                            cg_dims_str(in[0].ndim, in[0].shape), cg_dims_str(in[2].ndim, in[2].shape));
    const dims d = dims_of(&in[0], &in[2]);
    if (!same(&in[1], 3, d.batch, d.T, d.channels) || !same(&in[2], 2, d.channels, d.N, 0) ||
        !same(&in[3], 3, d.batch, d.T, d.N) || !same(&in[4], 3, d.batch, d.T, d.N) || !same(&in[5], 1, d.channels, 0, 0))
        return cg_set_error(CG_ERR_SHAPE, "with u%s and A%s: delta must be %s, B and C [%lld,%lld,%lld], D [%lld]; got "
                            "delta%s B%s C%s D%s", cg_dims_str(3, in[0].shape), cg_dims_str(2, in[2].shape),
                            cg_dims_str(3, in[0].shape), (long long)d.batch, (long long)d.T, (long long)d.N,
                            (long long)d.channels, cg_dims_str(in[1].ndim, in[1].shape),
                            cg_dims_str(in[3].ndim, in[3].shape), cg_dims_str(in[4].ndim, in[4].shape),
                            cg_dims_str(in[5].ndim, in[5].shape));
    out->ndim = 3;
    memcpy(out->shape, in[0].shape, 3 * sizeof(int64_t));
    const size_t states = (size_t)(d.batch * d.T * d.channels * d.N);
    out->saved_bytes = states * sizeof(cg_real);           /* h[b, t, d, n]: backward reads every state */
    /* each channel's share of dB and dC, then each channel's carried gradients dL/dh and dL/dA */
    out->bwd_scratch_bytes = (2 * states + 2 * (size_t)(d.batch * d.channels * d.N)) * sizeof(cg_real);
    return CG_OK;
}

/* Element (i, j, k) of a 3-D custom tensor, and (i, j) of a 2-D one, by strides. */
#define E3(t, i, j, k) ((cg_real *)(t).data)[(i) * (t).stride[0] + (j) * (t).stride[1] + (k) * (t).stride[2]]
#define E2(t, i, j) ((cg_real *)(t).data)[(i) * (t).stride[0] + (j) * (t).stride[1]]
#define E1(t, i) ((cg_real *)(t).data)[(i) * (t).stride[0]]

typedef struct {
    cg_custom_ctx *c;
    dims d;
} job;

/* Channels [lo, hi) of batch * channels: each runs its own recurrence, so threads never share a state. */
static void scan_forward_channels(int64_t lo, int64_t hi, void *p) {
    const job *j = p;
    const dims d = j->d;
    const cg_custom_tensor u = cg_custom_input(j->c, 0), dt = cg_custom_input(j->c, 1), A = cg_custom_input(j->c, 2),
                           B = cg_custom_input(j->c, 3), C = cg_custom_input(j->c, 4), D = cg_custom_input(j->c, 5),
                           y = cg_custom_output(j->c);
    cg_real *hs = cg_custom_saved(j->c);
    for (int64_t bc = lo; bc < hi; bc++) {
        const int64_t b = bc / d.channels, ch = bc % d.channels;
        for (int64_t t = 0; t < d.T; t++) {
            cg_real *h = hs + ((b * d.T + t) * d.channels + ch) * d.N, *prev = t ? h - d.channels * d.N : NULL;
            const cg_real step = E3(dt, b, t, ch), x = E3(u, b, t, ch);
            double acc = 0;
            for (int64_t n = 0; n < d.N; n++) {
                h[n] = (cg_real)exp(step * E2(A, ch, n)) * (prev ? prev[n] : 0) + step * E3(B, b, t, n) * x;
                acc += (double)E3(C, b, t, n) * h[n];
            }
            E3(y, b, t, ch) = (cg_real)(acc + E1(D, ch) * x);
        }
    }
}

static cg_status scan_forward(cg_custom_ctx *c) {
    const cg_custom_tensor u = cg_custom_input(c, 0), A = cg_custom_input(c, 2);
    job j = {c, dims_of(&u, &A)};
    cg_parallel_for(j.d.batch * j.d.channels, 1, scan_forward_channels, &j);
    return CG_OK;
}

/* Backward through one channel's recurrence, last step first; g is dL/dh[t] carried back. dB and
 * dC go to the channel's own rows of the scratch, summed over channels afterwards in a fixed order,
 * so the result does not depend on how channels were split over threads. */
static void scan_backward_channels(int64_t lo, int64_t hi, void *p) {
    const job *j = p;
    const dims d = j->d;
    cg_custom_ctx *c = j->c;
    const cg_custom_tensor u = cg_custom_input(c, 0), dt = cg_custom_input(c, 1), A = cg_custom_input(c, 2),
                           B = cg_custom_input(c, 3), C = cg_custom_input(c, 4), D = cg_custom_input(c, 5),
                           dy = cg_custom_output_grad(c), du = cg_custom_input_grad(c, 0), ddt = cg_custom_input_grad(c, 1),
                           dA = cg_custom_input_grad(c, 2), dD = cg_custom_input_grad(c, 5);
    const cg_real *hs = cg_custom_saved(c);
    cg_real *part = cg_custom_scratch(c);
    const size_t states = (size_t)(d.batch * d.T * d.channels * d.N);
    for (int64_t bc = lo; bc < hi; bc++) {
        const int64_t b = bc / d.channels, ch = bc % d.channels;
        cg_real *g = part + 2 * states + 2 * bc * d.N, *gA = g + d.N; /* this channel's, in the plan's scratch */
        memset(g, 0, (size_t)d.N * sizeof *g);
        memset(gA, 0, (size_t)d.N * sizeof *gA);
        double gD = 0;
        for (int64_t t = d.T - 1; t >= 0; t--) {
            const int64_t at = ((b * d.T + t) * d.channels + ch) * d.N;
            const cg_real *h = hs + at, *prev = t ? h - d.channels * d.N : NULL;
            const cg_real step = E3(dt, b, t, ch), x = E3(u, b, t, ch), gy = E3(dy, b, t, ch);
            double gx = E1(D, ch) * gy, gstep = 0;
            gD += (double)gy * x;
            for (int64_t n = 0; n < d.N; n++) {
                const cg_real a = E2(A, ch, n), decay = (cg_real)exp(step * a), hp = prev ? prev[n] : 0;
                g[n] += E3(C, b, t, n) * gy;                   /* dL/dh[t] */
                part[states + at + n] = gy * h[n];             /* dC[b, t, n], this channel's share */
                part[at + n] = g[n] * step * x;                /* dB[b, t, n], this channel's share */
                gx += (double)g[n] * step * E3(B, b, t, n);
                gstep += (double)g[n] * (a * decay * hp + E3(B, b, t, n) * x);
                gA[n] += g[n] * step * decay * hp;
                g[n] *= decay;                                 /* carried to h[t-1] */
            }
            if (du.data) E3(du, b, t, ch) += (cg_real)gx;
            if (ddt.data) E3(ddt, b, t, ch) += (cg_real)gstep;
        }
        if (dA.data)
            for (int64_t n = 0; n < d.N; n++) E2(dA, ch, n) += gA[n];
        if (dD.data) E1(dD, ch) += (cg_real)gD;
    }
}

/* dB and dC of rows [lo, hi) of batch * T: each the sum of the channels' shares, in channel order. */
static void scan_reduce_rows(int64_t lo, int64_t hi, void *p) {
    const job *j = p;
    const dims d = j->d;
    const cg_custom_tensor dB = cg_custom_input_grad(j->c, 3), dC = cg_custom_input_grad(j->c, 4);
    const cg_real *part = cg_custom_scratch(j->c);
    const size_t states = (size_t)(d.batch * d.T * d.channels * d.N);
    for (int64_t bt = lo; bt < hi; bt++) {
        const int64_t b = bt / d.T, t = bt % d.T;
        for (int64_t n = 0; n < d.N; n++) {
            double sb = 0, sc = 0;
            for (int64_t ch = 0; ch < d.channels; ch++) {
                sb += part[(bt * d.channels + ch) * d.N + n];
                sc += part[states + (bt * d.channels + ch) * d.N + n];
            }
            if (dB.data) E3(dB, b, t, n) += (cg_real)sb;
            if (dC.data) E3(dC, b, t, n) += (cg_real)sc;
        }
    }
}

static cg_status scan_backward(cg_custom_ctx *c) {
    const cg_custom_tensor u = cg_custom_input(c, 0), A = cg_custom_input(c, 2);
    job j = {c, dims_of(&u, &A)};
    cg_parallel_for(j.d.batch * j.d.channels, 1, scan_backward_channels, &j);
    cg_parallel_for(j.d.batch * j.d.T, 16, scan_reduce_rows, &j);
    return CG_OK;
}

static const cg_custom_op selective_scan_op = {
    "selective_scan", 6, scan_shape, scan_forward, scan_backward,
    0x3f, /* backward reads every input */
    false, NULL, NULL};

/* ---- the same model unrolled into T steps of built-in ops ---- */

static cg_tensor *scan_unrolled(cg_graph *g, cg_tensor *u, cg_tensor *dt, cg_tensor *A, cg_tensor *B, cg_tensor *C,
                                cg_tensor *D) {
    const int64_t batch = cg_dim(u, 0), T = cg_dim(u, 1), ch = cg_dim(u, 2);
    cg_tensor *h = NULL, **ys = malloc((size_t)T * sizeof *ys);
    if (!ys) return NULL;
    for (int64_t t = 0; t < T; t++) {
        cg_tensor *ut = cg_reshape(g, cg_slice(g, u, 1, t, t + 1), 3, (int64_t[]){batch, ch, 1});
        cg_tensor *st = cg_reshape(g, cg_slice(g, dt, 1, t, t + 1), 3, (int64_t[]){batch, ch, 1});
        cg_tensor *bt = cg_slice(g, B, 1, t, t + 1), *ct = cg_slice(g, C, 1, t, t + 1); /* [batch, 1, N] */
        cg_tensor *decay = cg_exp(g, cg_mul(g, st, A));                                 /* [batch, ch, N] */
        cg_tensor *in = cg_mul(g, cg_mul(g, st, bt), ut);
        h = h ? cg_add(g, cg_mul(g, decay, h), in) : in;
        cg_tensor *yt = cg_add(g, cg_sum(g, cg_mul(g, ct, h), 2, false), cg_mul(g, D, cg_reshape(g, ut, 2, (int64_t[]){batch, ch})));
        ys[t] = cg_reshape(g, yt, 3, (int64_t[]){batch, 1, ch});
    }
    cg_tensor *y = cg_concat(g, (int)T, ys, 1);
    free(ys);
    return y;
}

/* ---- a small model around it, built either way ---- */

typedef struct {
    cg_graph *g;
    cg_tensor *in[6], *y, *loss;
} model;

static void fill(cg_tensor *t, cg_rng *r, double lo, double hi) {
    for (int64_t i = 0; i < cg_numel(t); i++) cg_data(t)[i] = (cg_real)(lo + (hi - lo) * cg_rng_uniform(r));
}

/* loss = sum(y * w) for a fixed w; delta = softplus(raw) as Mamba makes it, A = -exp(a_log). */
static model build(bool fused, int64_t batch, int64_t T, int64_t ch, int64_t N, uint64_t seed) {
    model m = {cg_graph_new(CG_TRAIN), {0}, NULL, NULL};
    cg_rng r;
    cg_rng_seed(&r, seed);
    const char *names[6] = {"u", "delta_raw", "a_log", "B", "C", "D"};
    const int64_t shapes[6][3] = {{batch, T, ch}, {batch, T, ch}, {ch, N, 0}, {batch, T, N}, {batch, T, N}, {ch, 0, 0}};
    const int nd[6] = {3, 3, 2, 3, 3, 1};
    for (int k = 0; k < 6; k++) {
        m.in[k] = cg_requires_grad(cg_input(m.g, names[k], CG_REAL, nd[k], shapes[k]));
        if (!m.in[k]) return m;
        fill(m.in[k], &r, k == 1 ? -2 : -1, k == 1 ? 0 : 1);
    }
    cg_tensor *delta = cg_softplus(m.g, m.in[1], 1), *A = cg_neg(m.g, cg_exp(m.g, m.in[2]));
    m.y = fused ? cg_custom(m.g, &selective_scan_op, (cg_tensor *[]){m.in[0], delta, A, m.in[3], m.in[4], m.in[5]}, NULL, 0)
                : scan_unrolled(m.g, m.in[0], delta, A, m.in[3], m.in[4], m.in[5]);
    cg_tensor *w = cg_input(m.g, "w", CG_REAL, 3, shapes[0]);
    if (w) fill(w, &r, -1, 1);
    m.loss = cg_sum_all(m.g, cg_mul(m.g, cg_retain(m.y), w));
    return m;
}

static int check(void) {
    const bool f64 = sizeof(cg_real) == 8;
    int failed = 0;
    model a = build(true, 2, 12, 5, 4, 7), b = build(false, 2, 12, 5, 4, 7);
    if (!a.loss || !b.loss || cg_graph_forward(a.g) || cg_graph_backward(a.g, a.loss) || cg_graph_forward(b.g) ||
        cg_graph_backward(b.g, b.loss)) {
        fprintf(stderr, "selective_scan: %s\n", cg_last_error());
        return 1;
    }
    double worst = 0;
    for (int64_t i = 0; i < cg_numel(a.y); i++) worst = fmax(worst, fabs(cg_data(a.y)[i] - cg_data(b.y)[i]));
    printf("%-10s max |fused - unrolled| %.3g\n", "y", worst);
    failed += worst > (f64 ? 1e-12 : 1e-5);
    for (int k = 0; k < 6; k++) {
        double err = 0, scale = 0;
        for (int64_t i = 0; i < cg_numel(a.in[k]); i++) {
            err = fmax(err, fabs(cg_grad(a.in[k])[i] - cg_grad(b.in[k])[i]));
            scale = fmax(scale, fabs(cg_grad(b.in[k])[i]));
        }
        printf("%-10s max |fused - unrolled| gradient %.3g (largest %.3g)\n", cg_name(a.in[k]), err, scale);
        failed += err > (f64 ? 1e-10 : 1e-4) * fmax(1, scale);
    }
    cg_gradcheck_result res[6];
    model c = build(true, 1, 6, 3, 2, 9);
    if (!c.loss || cg_gradcheck(c.g, c.loss, 6, c.in, 0, res)) {
        fprintf(stderr, "selective_scan: gradcheck: %s\n", cg_last_error());
        return 1;
    }
    for (int k = 0; k < 6; k++) {
        printf("%-10s finite differences: max rel err %.3g %s\n", res[k].name, res[k].max_rel_err, res[k].pass ? "PASS" : "FAIL");
        failed += !res[k].pass;
    }
    cg_graph_free(a.g), cg_graph_free(b.g), cg_graph_free(c.g);
    printf("%s: %d failed\n", failed ? "FAIL" : "PASS", failed);
    return failed ? 1 : 0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int bench(int64_t T) {
    enum { ROUNDS = 7 };
    const int64_t batch = 2, ch = 64, N = 16;
    double ms[2][ROUNDS];
    size_t bytes[2] = {0, 0};
    int nodes[2] = {0, 0};
    model m[2] = {build(true, batch, T, ch, N, 1), build(false, batch, T, ch, N, 1)};
    for (int k = 0; k < 2; k++)
        if (!m[k].loss || cg_graph_forward(m[k].g) || cg_graph_backward(m[k].g, m[k].loss)) { /* plans, warms */
            fprintf(stderr, "selective_scan: %s\n", cg_last_error());
            return 1;
        }
    for (int r = 0; r < ROUNDS; r++) /* interleaved: a drift of the machine's speed hits both alike */
        for (int k = 0; k < 2; k++) {
            const double t0 = omp_get_wtime();
            if (cg_graph_forward(m[k].g) || cg_graph_backward(m[k].g, m[k].loss)) return 1;
            ms[k][r] = 1e3 * (omp_get_wtime() - t0);
            bytes[k] = cg_graph_plan_bytes(m[k].g), nodes[k] = cg_graph_size(m[k].g);
        }
    printf("selective scan, batch %lld, T %lld, channels %lld, state %lld, %d threads; forward + backward, %d rounds\n",
           (long long)batch, (long long)T, (long long)ch, (long long)N, cg_threads(), ROUNDS);
    const char *name[2] = {"custom op", "unrolled"};
    double med[2];
    for (int k = 0; k < 2; k++) {
        qsort(ms[k], ROUNDS, sizeof(double), cmp_double);
        med[k] = ms[k][ROUNDS / 2];
        printf("%-10s %6d nodes  median %9.2f ms (min %.2f, max %.2f)  planned memory %8.2f MB\n", name[k], nodes[k], med[k],
               ms[k][0], ms[k][ROUNDS - 1], (double)bytes[k] / 1e6);
    }
    printf("custom op: %.1fx faster, %.2fx the memory\n", med[1] / med[0], (double)bytes[0] / (double)bytes[1]);
    cg_graph_free(m[0].g), cg_graph_free(m[1].g);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--bench")) {
        const long long T = atoll(argv[2]);
        if (T < 1 || T > 1 << 20) {
            fprintf(stderr, "selective_scan --bench T: T in [1, 1048576], got '%s'\n", argv[2]);
            return 2;
        }
        return bench(T);
    }
    if (argc != 1) {
        fprintf(stderr, "usage: selective_scan [--bench T]\n");
        return 2;
    }
    return check();
}
