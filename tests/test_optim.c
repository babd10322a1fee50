/* SPDX-License-Identifier: MIT */
/* Optimizers against torch 1.13 (fixtures from tests/make_optim_fixtures.py), checkpoint
 * restore, frozen parameters and padding, thread-count determinism, clipping, gradient
 * accumulation through a real graph, and the schedules against hand-computed values. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "../graph/graph.h"
#include "../ops/ops.h"
#include "../optim/optim.h"
#include "check.h"

/* ---- the torch fixtures ---- */

#define MAXP 4
#define MAXN 32
#define STEPS 5
#define MAXRUN 8

typedef struct {
    char name[32];
    int ndim;
    int64_t shape[4];
    int numel;
    double init[MAXN];
    double grad[STEPS][MAXN];
} fx_param;

typedef struct {
    char label[32];
    cg_optim_kind kind;
    double beta1, beta2, eps, wd, momentum;
    int nesterov;
    int decay[MAXP];
    double lr[STEPS];
    double expect[STEPS][MAXP][MAXN];
    double m1[MAXP][MAXN], m2[MAXP][MAXN];
    bool has_m1, has_m2;
} fx_run;

static fx_param FP[MAXP];
static int n_fp;
static fx_run FR[MAXRUN];
static int n_fr;

static int fx_index(const char *name) {
    for (int i = 0; i < n_fp; i++)
        if (strcmp(FP[i].name, name) == 0) return i;
    return -1;
}

static bool read_vals(FILE *f, int n, double *dst) {
    for (int i = 0; i < n; i++)
        if (fscanf(f, "%lf", &dst[i]) != 1) return false;
    return true;
}

static bool load_fixtures(void) {
    const char *path = CGRAD_TEST_DIR "/fixtures/optim/optim.txt";
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return false;
    }
    char tok[64], name[64];
    fx_run *r = NULL;
    bool ok = true;
    while (ok && fscanf(f, "%63s", tok) == 1) {
        int s, p;
        if (tok[0] == '#') {
            int c;
            while ((c = fgetc(f)) != '\n' && c != EOF) {}
        } else if (strcmp(tok, "param") == 0) {
            fx_param *q = &FP[n_fp++];
            ok = n_fp <= MAXP && fscanf(f, "%31s %d", q->name, &q->ndim) == 2 && q->ndim <= 4;
            q->numel = 1;
            for (int d = 0; ok && d < q->ndim; d++) {
                ok = fscanf(f, "%" SCNd64, &q->shape[d]) == 1;
                q->numel *= (int)q->shape[d];
            }
            ok = ok && q->numel <= MAXN && read_vals(f, q->numel, q->init);
        } else if (strcmp(tok, "grad") == 0) {
            ok = fscanf(f, "%d %63s", &s, name) == 2 && s >= 0 && s < STEPS && (p = fx_index(name)) >= 0 &&
                 read_vals(f, FP[p].numel, FP[p].grad[s]);
        } else if (strcmp(tok, "run") == 0) {
            r = &FR[n_fr++];
            char kind[16];
            ok = n_fr <= MAXRUN &&
                 fscanf(f, "%31s %15s %lf %lf %lf %lf %lf %d", r->label, kind, &r->beta1, &r->beta2, &r->eps,
                        &r->wd, &r->momentum, &r->nesterov) == 8 &&
                 cg_optim_parse(kind, &r->kind) == CG_OK;
        } else if (r && strcmp(tok, "decay") == 0) {
            ok = fscanf(f, "%63s", name) == 1 && (p = fx_index(name)) >= 0 && fscanf(f, "%d", &r->decay[p]) == 1;
        } else if (r && strcmp(tok, "lr") == 0) {
            ok = fscanf(f, "%d", &s) == 1 && s >= 0 && s < STEPS && fscanf(f, "%lf", &r->lr[s]) == 1;
        } else if (r && strcmp(tok, "expect") == 0) {
            ok = fscanf(f, "%d %63s", &s, name) == 2 && s >= 0 && s < STEPS && (p = fx_index(name)) >= 0 &&
                 read_vals(f, FP[p].numel, r->expect[s][p]);
        } else if (r && (strcmp(tok, "moment1") == 0 || strcmp(tok, "moment2") == 0)) {
            bool one = tok[6] == '1';
            ok = fscanf(f, "%63s", name) == 1 && (p = fx_index(name)) >= 0 &&
                 read_vals(f, FP[p].numel, one ? r->m1[p] : r->m2[p]);
            if (one) r->has_m1 = true;
            else r->has_m2 = true;
        } else {
            ok = false;
        }
        if (!ok) fprintf(stderr, "%s: bad record at '%s'\n", path, tok);
    }
    fclose(f);
    return ok && n_fp == 3 && n_fr >= 5;
}

/* |got - want| <= 1e-6 relative, with values below 1 judged absolutely (parameters near 0). */
static bool close_rel(double got, double want, double rel) {
    return fabs(got - want) <= rel * fmax(1.0, fabs(want));
}

/* Compares n values to want; prints the first difference. */
static void check_vals(const char *what, const char *label, int step, const char *name, const cg_real *got,
                       const double *want, int n, double rel) {
    int bad = 0, first = -1;
    for (int i = 0; i < n; i++)
        if (!close_rel(got[i], want[i], rel)) {
            bad++;
            if (first < 0) first = i;
        }
    CHECK(bad == 0, "%s %s step %d '%s': %d of %d differ, first [%d] got %.9g want %.9g", what, label, step, name,
          bad, n, first, first >= 0 ? (double)got[first] : 0.0, first >= 0 ? want[first] : 0.0);
}

/* The fixture's parameters in a fresh set, with a frozen parameter between them whose values
 * and gradients are nonzero: the update must skip it. */
static cg_params *fixture_params(cg_tensor **t, cg_tensor **frozen) {
    cg_params *ps = cg_params_new();
    for (int i = 0; i < n_fp; i++) {
        t[i] = cg_params_add(ps, FP[i].name, FP[i].ndim, FP[i].shape);
        if (i == 0) *frozen = cg_params_add(ps, "frozen.weight", 2, (int64_t[]){3, 7});
        cg_real v[MAXN];
        for (int j = 0; j < FP[i].numel; j++) v[j] = (cg_real)FP[i].init[j];
        cg_write(t[i], v);
    }
    cg_fill(*frozen, 0.5);
    cg_param_set_trainable(*frozen, false);
    return ps;
}

static void set_grads(cg_tensor **t, cg_tensor *frozen, int s) {
    for (int i = 0; i < n_fp; i++)
        for (int j = 0; j < FP[i].numel; j++) cg_grad(t[i])[j] = (cg_real)FP[i].grad[s][j];
    for (int j = 0; j < 21; j++) cg_grad(frozen)[j] = 1.0f; /* as if someone wrote it: still skipped */
}

static cg_optim *fixture_optim(cg_params *ps, const fx_run *r, cg_tensor **t) {
    cg_optim_config c = cg_optim_defaults(r->kind);
    c.lr = r->lr[0];
    c.beta1 = r->beta1;
    c.beta2 = r->beta2;
    c.eps = r->eps;
    c.weight_decay = r->wd;
    c.momentum = r->momentum;
    c.nesterov = r->nesterov;
    cg_optim *o = cg_optim_new(ps, &c);
    CHECK(o != NULL, "%s: cg_optim_new: %s", r->label, cg_last_error());
    for (int i = 0; o && i < n_fp; i++) {
        CHECK(cg_optim_set_decay(o, t[i], r->decay[i]) == CG_OK, "%s", cg_last_error());
        CHECK(cg_optim_decays(o, t[i]) == (bool)r->decay[i], "%s: decay flag of %s", r->label, FP[i].name);
    }
    return o;
}

/* Replays run r; when restart > 0 the state after that many steps moves into a new set and
 * optimizer through the checkpoint accessors, as a resumed run would. */
static void replay(const fx_run *r, int restart) {
    cg_tensor *t[MAXP], *frozen;
    cg_params *ps = fixture_params(t, &frozen);
    cg_optim *o = fixture_optim(ps, r, t);
    if (!o) {
        cg_params_free(ps);
        return;
    }
    for (int s = 0; s < STEPS; s++) {
        if (s == restart) {
            cg_tensor *t2[MAXP], *frozen2;
            cg_params *ps2 = fixture_params(t2, &frozen2);
            cg_optim *o2 = fixture_optim(ps2, r, t2);
            int64_t span = cg_params_span(ps);
            CHECK(span == cg_params_span(ps2), "spans %lld vs %lld", (long long)span, (long long)cg_params_span(ps2));
            memcpy(cg_params_values(ps2), cg_params_values(ps), (size_t)span * sizeof(cg_real));
            if (cg_optim_moment1(o)) memcpy(cg_optim_moment1(o2), cg_optim_moment1(o), (size_t)span * sizeof(cg_real));
            if (cg_optim_moment2(o)) memcpy(cg_optim_moment2(o2), cg_optim_moment2(o), (size_t)span * sizeof(cg_real));
            CHECK(cg_optim_set_steps(o2, cg_optim_steps(o)) == CG_OK, "%s", cg_last_error());
            cg_optim_free(o);
            cg_params_free(ps);
            o = o2;
            ps = ps2;
            memcpy(t, t2, sizeof t);
            frozen = frozen2;
        }
        set_grads(t, frozen, s);
        CHECK(cg_optim_step(o, r->lr[s]) == CG_OK, "%s step %d: %s", r->label, s, cg_last_error());
        char label[64];
        snprintf(label, sizeof label, "%s%s", r->label, restart > 0 ? " (resumed)" : "");
        for (int i = 0; i < n_fp; i++)
            check_vals("param", label, s, FP[i].name, cg_data(t[i]), r->expect[s][i], FP[i].numel, 1e-6);
    }
    CHECK(cg_optim_steps(o) == STEPS, "%s: %lld steps", r->label, (long long)cg_optim_steps(o));

    cg_real *vals = cg_params_values(ps), *m1 = cg_optim_moment1(o), *m2 = cg_optim_moment2(o);
    CHECK((m1 != NULL) == r->has_m1, "%s: moment1 %p, torch has it: %d", r->label, (void *)m1, r->has_m1);
    CHECK((m2 != NULL) == r->has_m2, "%s: moment2 %p, torch has it: %d", r->label, (void *)m2, r->has_m2);
    for (int i = 0; i < n_fp; i++) {
        int64_t off = cg_data(t[i]) - vals;
        if (m1 && r->has_m1) check_vals("moment1", r->label, STEPS - 1, FP[i].name, m1 + off, r->m1[i], FP[i].numel, 1e-6);
        if (m2 && r->has_m2) check_vals("moment2", r->label, STEPS - 1, FP[i].name, m2 + off, r->m2[i], FP[i].numel, 1e-6);
    }
    /* frozen: values unchanged, no state; padding: zero everywhere */
    int64_t foff = cg_data(frozen) - vals;
    int changed = 0;
    for (int j = 0; j < 21; j++) changed += cg_data(frozen)[j] != 0.5f || (m1 && m1[foff + j] != 0) || (m2 && m2[foff + j] != 0);
    CHECK(changed == 0, "%s: %d frozen elements changed", r->label, changed);
    int64_t span = cg_params_span(ps);
    int dirty = 0;
    for (int64_t j = 0; j < span; j++) {
        bool inside = false;
        for (int i = 0; i < cg_params_count(ps); i++) {
            cg_tensor *p = cg_params_at(ps, i);
            int64_t off = cg_data(p) - vals;
            if (j >= off && j < off + cg_numel(p)) inside = true;
        }
        if (!inside) dirty += vals[j] != 0 || cg_params_grads(ps)[j] != 0 || (m1 && m1[j] != 0) || (m2 && m2[j] != 0);
    }
    CHECK(dirty == 0, "%s: %d padding elements are not zero", r->label, dirty);
    cg_optim_free(o);
    cg_params_free(ps);
}

static void test_fixtures(void) {
    bool ok = load_fixtures();
    CHECK(ok, "fixtures did not load");
    if (!ok) return;
    for (int k = 0; k < n_fr; k++) {
        replay(&FR[k], -1);
        replay(&FR[k], 3);
    }
}

/* ---- a larger set: parallel chunks, frozen parameter in the middle, thread independence ---- */

#define NBIG 5
static const int64_t big_shapes[NBIG][2] = {{70001, 1}, {13, 1}, {300, 111}, {5, 1}, {17, 3}};
static const int big_ndim[NBIG] = {1, 1, 2, 1, 2};

static cg_params *big_params(void) {
    cg_params *ps = cg_params_new();
    cg_rng r;
    cg_rng_seed(&r, 42);
    for (int i = 0; i < NBIG; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        cg_tensor *t = cg_params_add(ps, name, big_ndim[i], big_shapes[i]);
        cg_fill_normal(t, &r, 0, 1);
    }
    cg_param_set_trainable(cg_params_at(ps, 3), false);
    return ps;
}

static void big_grads(cg_params *ps, int step) {
    cg_rng r;
    cg_rng_seed(&r, 1000 + (uint64_t)step);
    for (int i = 0; i < cg_params_count(ps); i++) {
        cg_tensor *t = cg_params_at(ps, i);
        for (int64_t j = 0; j < cg_numel(t); j++) cg_grad(t)[j] = (cg_real)(0.1 * cg_rng_normal(&r));
    }
}

/* AdamW in double, element by element, as the reference for the chunked float update. */
static void ref_adamw(double *p, double *m, double *v, const cg_real *g, int64_t n, int t, double lr, bool decay) {
    const double b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    for (int64_t j = 0; j < n; j++) {
        if (decay) p[j] *= 1 - lr * wd;
        m[j] = b1 * m[j] + (1 - b1) * g[j];
        v[j] = b2 * v[j] + (1 - b2) * g[j] * g[j];
        p[j] -= lr / (1 - pow(b1, t)) * m[j] / (sqrt(v[j]) / sqrt(1 - pow(b2, t)) + eps);
    }
}

static void test_big(void) {
    cg_params *ps[2];
    cg_optim *o[2];
    double norms[2];
    cg_optim_config c = cg_optim_defaults(CG_OPT_ADAMW);
    c.beta2 = 0.95;
    c.weight_decay = 0.1;
    /* reference state */
    cg_params *init = big_params();
    int64_t span = cg_params_span(init);
    double *rp = malloc((size_t)span * sizeof *rp), *rm = calloc((size_t)span, sizeof *rm),
           *rv = calloc((size_t)span, sizeof *rv);
    for (int64_t j = 0; j < span; j++) rp[j] = cg_params_values(init)[j];

    for (int k = 0; k < 2; k++) {
        cg_set_threads(k + 1);
        ps[k] = big_params();
        o[k] = cg_optim_new(ps[k], &c);
        int ndecay = cg_optim_decay_matrices_only(o[k], false);
        CHECK(ndecay == 2, "%d parameters decay, want 2 (p2, p4)", ndecay);
        for (int s = 0; s < 3; s++) {
            big_grads(ps[k], s);
            norms[k] = cg_clip_grad_norm(ps[k], 1e9); /* no clipping: the norm only */
            CHECK(cg_optim_step(o[k], 1e-2) == CG_OK, "%s", cg_last_error());
        }
    }
    cg_set_threads(0);
    CHECK(memcmp(cg_params_values(ps[0]), cg_params_values(ps[1]), (size_t)span * sizeof(cg_real)) == 0,
          "values differ between 1 and 2 threads");
    CHECK(memcmp(cg_optim_moment2(o[0]), cg_optim_moment2(o[1]), (size_t)span * sizeof(cg_real)) == 0,
          "second moments differ between 1 and 2 threads");
    CHECK(norms[0] == norms[1], "norm %.17g with 1 thread, %.17g with 2", norms[0], norms[1]);

    /* reference: the same three steps in double on every trainable element */
    double refnorm = 0;
    for (int s = 0; s < 3; s++) {
        big_grads(init, s);
        refnorm = 0;
        for (int i = 0; i < NBIG; i++) {
            cg_tensor *t = cg_params_at(init, i);
            int64_t off = cg_data(t) - cg_params_values(init);
            if (!cg_param_trainable(t)) continue;
            for (int64_t j = 0; j < cg_numel(t); j++) refnorm += (double)cg_grad(t)[j] * cg_grad(t)[j];
            ref_adamw(rp + off, rm + off, rv + off, cg_grad(t), cg_numel(t), s + 1, 1e-2, big_ndim[i] == 2);
        }
    }
    refnorm = sqrt(refnorm);
    CHECK(close_rel(norms[1], refnorm, 1e-12) && fabs(norms[1] - refnorm) <= 1e-9 * refnorm,
          "norm %.17g, reference %.17g", norms[1], refnorm);
    int bad = 0;
    int64_t first = -1;
    const cg_real *got = cg_params_values(ps[1]);
    for (int64_t j = 0; j < span; j++)
        if (!close_rel(got[j], rp[j], 2e-6)) {
            if (first < 0) first = j;
            bad++;
        }
    CHECK(bad == 0, "%d of %lld elements differ from the double reference, first [%lld] %.9g vs %.9g", bad,
          (long long)span, (long long)first, first >= 0 ? (double)got[first] : 0.0, first >= 0 ? rp[first] : 0.0);
    free(rp);
    free(rm);
    free(rv);
    cg_params_free(init);
    for (int k = 0; k < 2; k++) {
        cg_optim_free(o[k]);
        cg_params_free(ps[k]);
    }
}

/* ---- groups, errors ---- */

static void test_groups_and_errors(void) {
    cg_params *ps = cg_params_new();
    const char *names[] = {"transformer.wte.weight", "transformer.wpe.weight", "h.0.attn.c_attn.weight",
                           "h.0.attn.c_attn.bias", "h.0.ln_1.weight", "embeddings.word_embeddings.weight",
                           "encoder.tok_emb.weight", "lm_head.weight"};
    int ndims[] = {2, 2, 2, 1, 1, 2, 2, 2};
    bool want_default[] = {false, false, true, false, false, false, false, true};
    cg_tensor *t[8];
    for (int i = 0; i < 8; i++) t[i] = cg_params_add(ps, names[i], ndims[i], (int64_t[]){4, 3});
    cg_optim *o = cg_optim_new(ps, &(cg_optim_config){.kind = CG_OPT_ADAMW, .lr = 1e-3, .beta1 = 0.9,
                                                       .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1});
    CHECK(o != NULL, "%s", cg_last_error());
    for (int i = 0; i < 8; i++) CHECK(cg_optim_decays(o, t[i]), "%s decays before grouping", names[i]);
    int n = cg_optim_decay_matrices_only(o, false);
    CHECK(n == 2, "%d decay", n);
    for (int i = 0; i < 8; i++)
        CHECK(cg_optim_decays(o, t[i]) == want_default[i], "decay of %s: %d", names[i], cg_optim_decays(o, t[i]));
    n = cg_optim_decay_matrices_only(o, true);
    CHECK(n == 6, "%d decay with embeddings", n);
    CHECK(cg_optim_decays(o, t[0]) && !cg_optim_decays(o, t[3]), "embeddings kept, biases not");

    /* a parameter from another set is refused */
    cg_params *other = cg_params_new();
    cg_tensor *x = cg_params_add(other, "x", 1, (int64_t[]){2});
    CHECK(cg_optim_set_decay(o, x, false) == CG_ERR_ARG, "foreign parameter accepted");
    CHECK(strstr(cg_last_error(), "optim_set_decay") != NULL, "message: %s", cg_last_error());
    cg_params_free(other);

    CHECK(cg_optim_step(o, -1) == CG_ERR_ARG, "negative lr accepted");
    CHECK(cg_optim_step(o, NAN) == CG_ERR_ARG, "NaN lr accepted");
    CHECK(cg_optim_steps(o) == 0, "failed steps counted");
    CHECK(cg_optim_set_steps(o, -3) == CG_ERR_ARG, "negative steps accepted");
    /* adding a parameter after the optimizer exists is a state error, not a buffer overrun */
    cg_params_add(ps, "late", 1, (int64_t[]){100000});
    CHECK(cg_optim_step(o, 1e-3) == CG_ERR_STATE, "step after adding a parameter");
    CHECK(strstr(cg_last_error(), "optim_step") != NULL, "message: %s", cg_last_error());
    cg_optim_free(o);

    cg_optim_config bad = cg_optim_defaults(CG_OPT_ADAM);
    bad.beta2 = 1.0;
    CHECK(cg_optim_new(ps, &bad) == NULL && strstr(cg_last_error(), "beta2"), "beta2 1 accepted: %s", cg_last_error());
    bad = cg_optim_defaults(CG_OPT_SGD);
    bad.nesterov = true;
    CHECK(cg_optim_new(ps, &bad) == NULL && strstr(cg_last_error(), "nesterov"), "nesterov without momentum");
    CHECK(cg_optim_new(NULL, &bad) == NULL, "NULL set accepted");
    cg_params *empty = cg_params_new();
    cg_optim_config ok = cg_optim_defaults(CG_OPT_SGD);
    CHECK(cg_optim_new(empty, &ok) == NULL, "empty set accepted");
    cg_params_free(empty);
    cg_params_free(ps);

    cg_optim_config d = cg_optim_defaults(CG_OPT_ADAMW);
    CHECK(d.lr == 1e-3 && d.beta1 == 0.9 && d.beta2 == 0.999 && d.eps == 1e-8 && d.weight_decay == 0.01,
          "AdamW defaults");
    CHECK(cg_optim_defaults(CG_OPT_ADAM).weight_decay == 0 && cg_optim_defaults(CG_OPT_SGD).momentum == 0, "defaults");
    cg_optim_kind k;
    CHECK(cg_optim_parse("adamw", &k) == CG_OK && k == CG_OPT_ADAMW, "parse adamw");
    CHECK(cg_optim_parse("sgd", &k) == CG_OK && k == CG_OPT_SGD, "parse sgd");
    CHECK(cg_optim_parse("lion", &k) == CG_ERR_ARG, "parse lion");
    cg_optim_free(NULL);
}

/* ---- clipping ---- */

static void test_clip(void) {
    cg_params *ps = cg_params_new();
    cg_tensor *a = cg_params_add(ps, "a", 1, (int64_t[]){2});
    cg_tensor *fz = cg_params_add(ps, "frozen", 1, (int64_t[]){1});
    cg_tensor *b = cg_params_add(ps, "b", 2, (int64_t[]){1, 1});
    cg_param_set_trainable(fz, false);
    cg_grad(a)[0] = 3, cg_grad(a)[1] = 4, cg_grad(b)[0] = 12, cg_grad(fz)[0] = 100;
    /* sqrt(9 + 16 + 144) = 13; the frozen gradient does not count */
    double norm = cg_clip_grad_norm(ps, 20);
    CHECK_NEAR(norm, 13.0, 1e-12);
    CHECK(cg_grad(a)[0] == 3 && cg_grad(a)[1] == 4 && cg_grad(b)[0] == 12, "scaled below max_norm");
    norm = cg_clip_grad_norm(ps, 6.5);
    CHECK_NEAR(norm, 13.0, 1e-12);
    double coef = 6.5 / (13.0 + 1e-6); /* torch: max_norm / (norm + 1e-6) */
    CHECK_NEAR(cg_grad(a)[0], 3 * coef, 1e-6);
    CHECK_NEAR(cg_grad(a)[1], 4 * coef, 1e-6);
    CHECK_NEAR(cg_grad(b)[0], 12 * coef, 1e-6);
    CHECK(cg_grad(fz)[0] == 100, "frozen gradient scaled: %g", (double)cg_grad(fz)[0]);
    norm = cg_clip_grad_norm(ps, 100);
    CHECK_NEAR(norm, 6.5, 1e-5);
    CHECK(isnan(cg_clip_grad_norm(ps, -1)) && strstr(cg_last_error(), "clip_grad_norm"), "negative max_norm");
    CHECK(isnan(cg_clip_grad_norm(NULL, 1)), "NULL set");
    cg_grads_scale(ps, 0.5);
    CHECK_NEAR(cg_grad(b)[0], 6 * coef, 1e-6);
    cg_params_free(ps);
}

/* ---- fused clipping ---- */

/* Parameters for the fused-clipping test: a big vector, a matrix, an unused U whose gradient goes
 * stale (a second graph writes 2U into it, then zero_grad), and a frozen one. */
static cg_params *fused_params(cg_graph **gu, cg_tensor **loss_u) {
    cg_params *ps = big_params();
    cg_tensor *u = cg_params_add(ps, "u", 1, (int64_t[]){37});
    cg_rng r;
    cg_rng_seed(&r, 7);
    cg_fill_normal(u, &r, 0, 1);
    *gu = cg_graph_new(CG_TRAIN);
    *loss_u = cg_sum_all(*gu, cg_mul(*gu, u, u));
    return ps;
}

/* One step's gradients: U's 2U left stale by zero_grad, the others random. */
static void fused_grads(cg_params *ps, cg_graph *gu, cg_tensor *loss_u, int step) {
    CHECK(!cg_graph_forward(gu) && !cg_graph_backward(gu, loss_u), "%s", cg_last_error());
    cg_params_zero_grad(ps);
    cg_rng r;
    cg_rng_seed(&r, 1000 + (uint64_t)step);
    for (int i = 0; i < NBIG; i++) {
        cg_tensor *t = cg_params_at(ps, i);
        cg_real *g = cg_grad(t);
        for (int64_t j = 0; j < cg_numel(t); j++) g[j] = (cg_real)(0.1 * cg_rng_normal(&r));
    }
}

/* cg_grad_norm + cg_optim_step_scaled(cg_clip_scale) against cg_clip_grad_norm + cg_optim_step:
 * the same bits for every rule, with clipping active and not, weight decay on and off, a stale
 * gradient and a frozen parameter, at 1 and 2 threads; and AdamW with clipping against a double
 * reference, so a scale that were dropped on both paths would still be caught. */
static void test_fused_clip(void) {
    struct {
        const char *label;
        cg_optim_kind kind;
        double wd, momentum;
        bool nesterov, matrices_only;
    } cases[] = {
        {"adamw wd 0.1 matrices", CG_OPT_ADAMW, 0.1, 0, false, true},
        {"adamw wd 0", CG_OPT_ADAMW, 0.0, 0, false, false},
        {"adam l2 0.01", CG_OPT_ADAM, 0.01, 0, false, false},
        {"sgd nesterov l2", CG_OPT_SGD, 0.01, 0.9, true, false},
        {"sgd plain", CG_OPT_SGD, 0.0, 0, false, false},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int clip = 0; clip < 2; clip++)
            for (int threads = 1; threads <= 2; threads++) {
                cg_set_threads(threads);
                cg_optim_config c = cg_optim_defaults(cases[ci].kind);
                c.weight_decay = cases[ci].wd, c.momentum = cases[ci].momentum, c.nesterov = cases[ci].nesterov;
                cg_params *ps[2];
                cg_graph *gu[2];
                cg_tensor *lu[2];
                cg_optim *o[2];
                for (int k = 0; k < 2; k++) {
                    ps[k] = fused_params(&gu[k], &lu[k]);
                    o[k] = cg_optim_new(ps[k], &c);
                    if (cases[ci].matrices_only) cg_optim_decay_matrices_only(o[k], false);
                }
                cg_tensor *u = cg_params_find(ps[1], "u");
                cg_real u0[37];
                memcpy(u0, cg_data(u), sizeof u0);
                int64_t span = cg_params_span(ps[0]);
                double scales[3] = {1, 1, 1};
                for (int s = 0; s < 3; s++) {
                    double norm[2];
                    for (int k = 0; k < 2; k++) fused_grads(ps[k], gu[k], lu[k], s);
                    if (!clip && s == 2) { /* no norm first: the step alone must read the stale 2U as zero */
                        CHECK(cg_optim_step(o[0], 1e-2) == CG_OK && cg_optim_step_scaled(o[1], 1e-2, 1) == CG_OK, "%s",
                              cg_last_error());
                        continue;
                    }
                    /* max_norm half the norm (every step clips) or far above it */
                    const double probe = cg_grad_norm(ps[0]), max_norm = clip ? 0.5 * probe : 1e9;
                    norm[0] = cg_clip_grad_norm(ps[0], max_norm);
                    CHECK(cg_optim_step(o[0], 1e-2) == CG_OK, "%s", cg_last_error());
                    norm[1] = cg_grad_norm(ps[1]);
                    scales[s] = cg_clip_scale(norm[1], max_norm);
                    CHECK(cg_optim_step_scaled(o[1], 1e-2, scales[s]) == CG_OK, "%s", cg_last_error());
                    CHECK(norm[0] == norm[1] && norm[1] == probe, "%s: norm %.17g clipped, %.17g fused", cases[ci].label,
                          norm[0], norm[1]);
                    CHECK(clip ? scales[s] < 0.51 : scales[s] == 1, "%s: clip scale %g", cases[ci].label, scales[s]);
                }
                const char *what = clip ? "clipping" : "no clipping";
                CHECK(memcmp(cg_params_values(ps[0]), cg_params_values(ps[1]), (size_t)span * sizeof(cg_real)) == 0,
                      "%s, %s, %d threads: fused values differ from clip-then-step", cases[ci].label, what, threads);
                for (int mk = 0; mk < 2; mk++) {
                    cg_real *m0 = mk ? cg_optim_moment2(o[0]) : cg_optim_moment1(o[0]);
                    cg_real *m1 = mk ? cg_optim_moment2(o[1]) : cg_optim_moment1(o[1]);
                    CHECK(!m0 == !m1 && (!m0 || memcmp(m0, m1, (size_t)span * sizeof(cg_real)) == 0),
                          "%s, %s: fused moment %d differs", cases[ci].label, what, mk + 1);
                }
                /* the stale 2U read as zero: without decay on u nothing moves it */
                if (cases[ci].matrices_only || cases[ci].wd == 0)
                    CHECK(memcmp(cg_data(u), u0, sizeof u0) == 0, "%s: the stale gradient of u moved it", cases[ci].label);
                /* the fused path leaves the gradients as backward wrote them */
                if (clip) {
                    cg_rng r;
                    cg_rng_seed(&r, 1002);
                    CHECK(cg_grad(cg_params_at(ps[1], 0))[0] == (cg_real)(0.1 * cg_rng_normal(&r)),
                          "%s: the fused step rewrote a gradient", cases[ci].label);
                }
                if (cases[ci].kind == CG_OPT_ADAMW && cases[ci].wd == 0 && clip) { /* against double AdamW */
                    cg_params *init = big_params();
                    int64_t n0 = cg_numel(cg_params_at(init, 0));
                    double *rp = malloc((size_t)n0 * sizeof *rp), *rm = calloc((size_t)n0, sizeof *rm),
                           *rv = calloc((size_t)n0, sizeof *rv);
                    cg_real *gs = malloc((size_t)n0 * sizeof *gs);
                    for (int64_t j = 0; j < n0; j++) rp[j] = cg_data(cg_params_at(init, 0))[j];
                    for (int s = 0; s < 3; s++) {
                        big_grads(init, s);
                        const cg_real *g = cg_grad(cg_params_at(init, 0));
                        for (int64_t j = 0; j < n0; j++) gs[j] = (cg_real)(g[j] * scales[s]);
                        /* ref_adamw's wd and betas: 0.1 decay is off here, beta2 0.999 below */
                        for (int64_t j = 0; j < n0; j++) {
                            rm[j] = 0.9 * rm[j] + 0.1 * gs[j];
                            rv[j] = 0.999 * rv[j] + 0.001 * (double)gs[j] * gs[j];
                            rp[j] -= 1e-2 / (1 - pow(0.9, s + 1)) * rm[j] / (sqrt(rv[j]) / sqrt(1 - pow(0.999, s + 1)) + 1e-8);
                        }
                    }
                    int bad = 0;
                    const cg_real *got = cg_data(cg_params_at(ps[1], 0));
                    for (int64_t j = 0; j < n0; j++) bad += !close_rel(got[j], rp[j], 2e-6);
                    CHECK(bad == 0, "fused clipped AdamW: %d of %lld elements differ from the double reference", bad,
                          (long long)n0);
                    free(rp), free(rm), free(rv), free(gs);
                    cg_params_free(init);
                }
                for (int k = 0; k < 2; k++) {
                    cg_optim_free(o[k]);
                    cg_graph_free(gu[k]);
                    cg_params_free(ps[k]);
                }
            }
    cg_set_threads(0);
    cg_params *ps = cg_params_new();
    cg_params_add(ps, "a", 1, (int64_t[]){4});
    cg_optim_config c = cg_optim_defaults(CG_OPT_ADAMW);
    cg_optim *o = cg_optim_new(ps, &c);
    CHECK(cg_optim_step_scaled(o, 1e-3, NAN) == CG_ERR_ARG && strstr(cg_last_error(), "grad_scale"), "NAN scale accepted");
    CHECK(cg_optim_step_scaled(o, 1e-3, -1) == CG_ERR_ARG, "negative scale accepted");
    CHECK(isnan(cg_grad_norm(NULL)) && strstr(cg_last_error(), "grad_norm"), "NULL set");
    CHECK(cg_clip_scale(NAN, 1) == 1 && cg_clip_scale(INFINITY, 1) == 1 && cg_clip_scale(1, INFINITY) == 1,
          "clip scale of a non-finite norm or an infinite max_norm");
    CHECK(cg_clip_scale(13, 6.5) == 6.5 / (13 + 1e-6), "clip scale %.17g", cg_clip_scale(13, 6.5));
    cg_optim_free(o);
    cg_params_free(ps);
}

/* ---- gradient accumulation through a graph ---- */

/* Mean squared error of linear(x[rows], w, b) against y[rows]; grads added into the set. */
static void mse_backward(cg_params *ps, const cg_real *x, const cg_real *y, int rows) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *xin = cg_input(g, "x", CG_REAL, 2, (int64_t[]){rows, 4});
    cg_tensor *yin = cg_input(g, "y", CG_REAL, 2, (int64_t[]){rows, 3});
    cg_tensor *out = cg_linear(g, xin, cg_params_find(ps, "w"), cg_params_find(ps, "b"));
    cg_tensor *loss = cg_mean_all(g, cg_square(g, cg_sub(g, out, yin)));
    CHECK(loss != NULL, "%s", cg_last_error());
    if (loss) {
        cg_write(xin, x);
        cg_write(yin, y);
        CHECK(cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
        CHECK(cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    }
    cg_graph_free(g);
}

static cg_params *mse_params(void) {
    cg_params *ps = cg_params_new();
    cg_rng r;
    cg_rng_seed(&r, 7);
    cg_fill_normal(cg_params_add(ps, "w", 2, (int64_t[]){3, 4}), &r, 0, 0.5);
    cg_fill_normal(cg_params_add(ps, "b", 1, (int64_t[]){3}), &r, 0, 0.5);
    return ps;
}

static void test_accumulation(void) {
    cg_real x[16], y[12];
    cg_rng r;
    cg_rng_seed(&r, 9);
    for (int i = 0; i < 16; i++) x[i] = (cg_real)cg_rng_normal(&r);
    for (int i = 0; i < 12; i++) y[i] = (cg_real)cg_rng_normal(&r);
    cg_params *full = mse_params(), *acc = mse_params();
    mse_backward(full, x, y, 4);                 /* one batch of 4, mean loss */
    mse_backward(acc, x, y, 2);                  /* two micro-batches of 2, grads summed */
    mse_backward(acc, x + 8, y + 6, 2);
    int64_t span = cg_params_span(full);
    const cg_real *gf = cg_params_grads(full), *ga = cg_params_grads(acc);
    double ratio = ga[0] / gf[0];
    CHECK(fabs(ratio - 2) < 1e-5, "summed micro-batch grads are %g x the batch mean's, want 2", ratio);
    cg_grads_scale(acc, 0.5);
    int bad = 0;
    for (int64_t j = 0; j < span; j++) bad += !(fabs(ga[j] - gf[j]) <= 1e-6 * fmax(1e-2, fabs(gf[j])));
    CHECK(bad == 0, "%d gradients differ after scaling by 1/2", bad);
    /* and the updates agree */
    cg_optim_config c = cg_optim_defaults(CG_OPT_ADAMW);
    cg_optim *of = cg_optim_new(full, &c), *oa = cg_optim_new(acc, &c);
    cg_optim_step(of, 1e-2);
    cg_optim_step(oa, 1e-2);
    bad = 0;
    for (int64_t j = 0; j < span; j++)
        bad += !close_rel(cg_params_values(acc)[j], cg_params_values(full)[j], 1e-6);
    CHECK(bad == 0, "%d parameters differ after one AdamW step", bad);
    cg_optim_free(of);
    cg_optim_free(oa);
    cg_params_free(full);
    cg_params_free(acc);
}

/* ---- schedules: values worked out by hand ---- */

static void test_schedules(void) {
    cg_schedule cos = {.kind = CG_SCHED_COSINE, .lr = 6e-4, .min_lr = 6e-5, .warmup = 10, .total = 100};
    CHECK(cg_schedule_check(&cos) == CG_OK, "%s", cg_last_error());
    CHECK_NEAR(cg_schedule_lr(&cos, 0), 0.0, 1e-15);       /* warmup start */
    CHECK_NEAR(cg_schedule_lr(&cos, 5), 3e-4, 1e-15);      /* warmup middle */
    CHECK_NEAR(cg_schedule_lr(&cos, 10), 6e-4, 1e-15);     /* warmup end: the peak */
    CHECK_NEAR(cg_schedule_lr(&cos, 40), 4.65e-4, 1e-15);  /* ratio 1/3: 6e-5 + .75 * 5.4e-4 */
    CHECK_NEAR(cg_schedule_lr(&cos, 55), 3.3e-4, 1e-15);   /* ratio 1/2 */
    CHECK_NEAR(cg_schedule_lr(&cos, 100), 6e-5, 1e-15);    /* end */
    CHECK_NEAR(cg_schedule_lr(&cos, 1000), 6e-5, 1e-15);   /* beyond total */
    CHECK(cg_schedule_lr(&cos, 99) > 6e-5, "cosine reaches the floor early");

    cg_schedule lin = {.kind = CG_SCHED_LINEAR, .lr = 1.0, .min_lr = 0.1, .warmup = 10, .total = 110};
    CHECK_NEAR(cg_schedule_lr(&lin, 3), 0.3, 1e-15);
    CHECK_NEAR(cg_schedule_lr(&lin, 10), 1.0, 1e-15);
    CHECK_NEAR(cg_schedule_lr(&lin, 35), 0.775, 1e-15);    /* ratio 1/4: .1 + .75 * .9 */
    CHECK_NEAR(cg_schedule_lr(&lin, 60), 0.55, 1e-15);
    CHECK_NEAR(cg_schedule_lr(&lin, 110), 0.1, 1e-15);
    CHECK_NEAR(cg_schedule_lr(&lin, 500), 0.1, 1e-15);

    cg_schedule cst = {.kind = CG_SCHED_CONSTANT, .lr = 0.01, .warmup = 4};
    CHECK_NEAR(cg_schedule_lr(&cst, 0), 0.0, 1e-15);
    CHECK_NEAR(cg_schedule_lr(&cst, 2), 0.005, 1e-15);
    CHECK_NEAR(cg_schedule_lr(&cst, 4), 0.01, 1e-15);
    CHECK_NEAR(cg_schedule_lr(&cst, 1000000), 0.01, 1e-15);
    cst.warmup = 0;
    CHECK_NEAR(cg_schedule_lr(&cst, 0), 0.01, 1e-15);

    cg_schedule noam = {.kind = CG_SCHED_NOAM, .warmup = 4000, .d_model = 512, .noam_factor = 1.0};
    CHECK(cg_schedule_check(&noam) == CG_OK, "%s", cg_last_error());
    double peak = cg_schedule_lr(&noam, 4000);
    CHECK_NEAR(peak, 6.98771242e-4, 1e-12);                   /* 1 / sqrt(512 * 4000) */
    CHECK(cg_schedule_lr(&noam, 3999) < peak && cg_schedule_lr(&noam, 4001) < peak, "noam peak not at warmup");
    CHECK_NEAR(cg_schedule_lr(&noam, 2000), peak / 2, 1e-12); /* linear rise */
    CHECK_NEAR(cg_schedule_lr(&noam, 16000), peak / 2, 1e-12); /* 1/sqrt decay */
    CHECK_NEAR(cg_schedule_lr(&noam, 0), cg_schedule_lr(&noam, 1), 0); /* step 0 reads as 1 */
    CHECK(cg_schedule_lr(&noam, 1) > 0, "noam starts at 0");
    noam.noam_factor = 2;
    CHECK_NEAR(cg_schedule_lr(&noam, 4000), 2 * peak, 1e-12);

    cg_sched_kind k;
    CHECK(cg_schedule_parse("cosine", &k) == CG_OK && k == CG_SCHED_COSINE, "parse cosine");
    CHECK(cg_schedule_parse("noam", &k) == CG_OK && k == CG_SCHED_NOAM, "parse noam");
    CHECK(cg_schedule_parse("linear", &k) == CG_OK && k == CG_SCHED_LINEAR, "parse linear");
    CHECK(cg_schedule_parse("constant", &k) == CG_OK && k == CG_SCHED_CONSTANT, "parse constant");
    CHECK(cg_schedule_parse("step", &k) == CG_ERR_ARG && strstr(cg_last_error(), "step"), "parse step");
    cg_schedule bad = cos;
    bad.total = 10;
    CHECK(cg_schedule_check(&bad) == CG_ERR_ARG && strstr(cg_last_error(), "total"), "total <= warmup");
    bad = cos;
    bad.min_lr = 1;
    CHECK(cg_schedule_check(&bad) == CG_ERR_ARG && strstr(cg_last_error(), "min_lr"), "min_lr > lr");
    bad = noam;
    bad.d_model = 0;
    CHECK(cg_schedule_check(&bad) == CG_ERR_ARG && strstr(cg_last_error(), "d_model"), "noam d_model 0");
}

/* Parameters come zeroed, values and gradients, also after the block grows and moves under
 * tensors already added (growth no longer zeroes the block as a whole). */
static void test_params_start_zero(void) {
    cg_params *ps = cg_params_new();
    cg_tensor *first = cg_params_add(ps, "first", 1, (const int64_t[]){5});
    cg_fill(first, 3);
    int64_t bad = 0;
    char name[32];
    for (int i = 0; i < 40; i++) { /* 40 x 7000 elements: several doublings past the first block */
        snprintf(name, sizeof name, "p%d", i);
        cg_tensor *t = cg_params_add(ps, name, 2, (const int64_t[]){70, 100});
        const cg_real *v = cg_data(t), *gr = cg_grad(t);
        for (int64_t j = 0; j < cg_numel(t); j++) bad += v[j] != 0 || gr[j] != 0;
        cg_fill(t, -1); /* dirty it, so a later block that copied stale memory would show */
    }
    CHECK(bad == 0, "%lld freshly added parameter values or gradients were not zero", (long long)bad);
    const cg_real *fv = cg_data(first);
    CHECK(fv[0] == 3 && fv[4] == 3, "the first tensor's values survived the moves: %g %g", (double)fv[0], (double)fv[4]);
    cg_params_free(ps);
}

int main(void) {
    test_params_start_zero();
    test_fixtures();
    test_big();
    test_groups_and_errors();
    test_clip();
    test_fused_clip();
    test_accumulation();
    test_schedules();
    TEST_END();
}
