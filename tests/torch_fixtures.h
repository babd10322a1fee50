/* SPDX-License-Identifier: MIT */
/* The committed PyTorch fixtures of single ops (tests/make_conv_fixtures.py, tests/make_op_fixtures.py):
 * one tensor a line, NAME NDIM DIMS... VALUES... in row-major order. fx_load reads a file, fx_find
 * looks a tensor up by case and part ("conv2d", "dx"), fx_input makes a graph input of it, and
 * fx_compare / fx_compare_ints CHECK a cgrad tensor or its gradient against it. Include after
 * <cgrad/cgrad.h> and "check.h". */
#ifndef CGRAD_TEST_TORCH_FIXTURES_H
#define CGRAD_TEST_TORCH_FIXTURES_H
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char name[48];
    int ndim;
    int64_t shape[6];
    double *v;
    int64_t n;
} fx_tensor;
static fx_tensor *fx;
static int nfx, fx_cap;

/* Every fixture of a case is small: a bound on a tensor's elements catches a garbled line. */
#define FX_MAX_NUMEL (1 << 20)

/* float64 matches torch to round-off; float32 to its precision over sums of a few dozen terms,
 * relative to 1 + |torch's value|. */
#define FX_TOL (sizeof(cg_real) == 8 ? 1e-12 : 2e-5)

static inline void fx_free(void) {
    for (int i = 0; i < nfx; i++) free(fx[i].v);
    free(fx);
    fx = NULL, nfx = fx_cap = 0;
}

/* Reads every tensor of the file at path; false (with what is wrong on stderr) on a missing file or
 * a malformed line. */
static inline bool fx_load(const char *path) {
    char *s = test_slurp(path, NULL);
    if (!s) {
        fprintf(stderr, "cannot read %s\n", path);
        return false;
    }
    bool ok = true;
    for (char *line = strtok(s, "\n"); ok && line; line = strtok(NULL, "\n")) {
        if (nfx == fx_cap) {
            fx_tensor *more = realloc(fx, (size_t)(fx_cap = fx_cap ? 2 * fx_cap : 64) * sizeof *fx);
            if (!more) break;
            fx = more;
        }
        fx_tensor *t = &fx[nfx];
        int used = 0;
        ok = sscanf(line, "%47s %d%n", t->name, &t->ndim, &used) == 2 && t->ndim >= 0 && t->ndim <= 6;
        char *p = line + used, *end;
        t->n = 1;
        for (int d = 0; ok && d < t->ndim; d++) {
            t->shape[d] = strtoll(p, &end, 10);
            ok = end != p && t->shape[d] >= 0 && t->shape[d] <= FX_MAX_NUMEL && (t->n *= t->shape[d]) <= FX_MAX_NUMEL;
            p = end;
        }
        t->v = ok ? malloc((size_t)(t->n ? t->n : 1) * sizeof *t->v) : NULL;
        ok = ok && t->v;
        for (int64_t i = 0; ok && i < t->n; i++, p = end) {
            t->v[i] = strtod(p, &end);
            ok = end != p;
        }
        if (ok) nfx++;
        else fprintf(stderr, "%s: malformed line %.60s\n", path, line);
    }
    free(s);
    return ok && nfx > 0;
}

static inline const fx_tensor *fx_find(const char *c, const char *part) {
    char name[64];
    snprintf(name, sizeof name, "%s.%s", c, part);
    for (int i = 0; i < nfx; i++)
        if (!strcmp(fx[i].name, name)) return &fx[i];
    return NULL;
}

/* A new input leaf of dtype CG_REAL or CG_INT32 holding the fixture's values; NULL if t is NULL. */
static inline cg_tensor *fx_input(cg_graph *g, const fx_tensor *t, cg_dtype dtype) {
    cg_tensor *x = t ? cg_input(g, t->name, dtype, t->ndim, t->shape) : NULL;
    for (int64_t i = 0; x && i < t->n; i++)
        if (dtype == CG_INT32) cg_idata(x)[i] = (int32_t)t->v[i];
        else cg_data(x)[i] = (cg_real)t->v[i];
    return x;
}

/* CHECKs t's values (or its gradient) against the fixture c.part within FX_TOL; NaN matches NaN. */
static inline void fx_compare(const char *c, const char *part, cg_tensor *t, bool grad) {
    const fx_tensor *want = fx_find(c, part);
    CHECK(want && t && cg_numel(t) == want->n, "%s.%s: missing or %lld elements", c, part,
          t ? (long long)cg_numel(t) : -1LL);
    if (!want || !t || cg_numel(t) != want->n) return;
    cg_real *got = malloc((size_t)(want->n ? want->n : 1) * sizeof *got);
    cg_status s = got ? (grad ? cg_read_grad(t, got) : cg_read(t, got)) : CG_ERR_ARG;
    CHECK(!s, "%s.%s: %s", c, part, cg_last_error());
    double worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; !s && i < want->n; i++) {
        const double w = want->v[i], v = (double)got[i];
        const double err = isnan(w) ? (isnan(v) ? 0 : INFINITY) : isnan(v) ? INFINITY : fabs(v - w) / (1 + fabs(w));
        if (err > worst) worst = err, at = i;
    }
    if (getenv("CGRAD_TEST_VERBOSE")) printf("%-28s %-4s worst %.2e\n", c, part, worst);
    CHECK(!s && worst <= FX_TOL, "%s.%s: element %lld is %.9g, torch %.9g", c, part, (long long)at,
          s ? NAN : (double)got[at], want->v[at]);
    free(got);
}

/* CHECKs a contiguous int32 tensor against the fixture c.part exactly. */
static inline void fx_compare_ints(const char *c, const char *part, cg_tensor *t) {
    const fx_tensor *want = fx_find(c, part);
    CHECK(want && t && cg_idata(t) && cg_numel(t) == want->n, "%s.%s: missing, not int32 or %lld elements", c,
          part, t ? (long long)cg_numel(t) : -1LL);
    if (!want || !t || !cg_idata(t) || cg_numel(t) != want->n) return;
    int64_t bad = -1;
    for (int64_t i = 0; bad < 0 && i < want->n; i++)
        if ((double)cg_idata(t)[i] != want->v[i]) bad = i;
    CHECK(bad < 0, "%s.%s: element %lld is %d, torch %.17g", c, part, (long long)bad, bad < 0 ? 0 : cg_idata(t)[bad],
          bad < 0 ? 0 : want->v[bad]);
}
#endif
