/* LoRA adapters: two small parameters per adapted weight, linked from the base parameter so
 * that cg_linear finds them (ops/lora.c), and folded back into it for export. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "graph/internal.h"
#include "optim/lora.h"

static bool in_set(const cg_params *ps, const cg_tensor *p) {
    for (int i = 0; i < cg_params_count(ps); i++)
        if (cg_params_at(ps, i) == p) return true;
    return false;
}

cg_tensor *cg_lora_base(const cg_params *ps, const cg_tensor *p) {
    for (int i = 0; p && i < cg_params_count(ps); i++) {
        cg_tensor *q = cg_params_at(ps, i);
        if (q->lora_a == p || q->lora_b == p) return q;
    }
    return NULL;
}

bool cg_lora_is_adapter(const cg_tensor *p) {
    if (!p || p->op != CGI_OP_PARAM || !p->name) return false;
    const size_t n = strlen(p->name);
    return n > 7 && (!strcmp(p->name + n - 7, ".lora_A") || !strcmp(p->name + n - 7, ".lora_B"));
}

cg_status cg_lora_add(cg_params *ps, cg_tensor *p, int rank, double alpha, cg_rng *r) {
    if (!ps || !p || !r) return cgi_fail(CG_ERR_ARG, "[lora] NULL argument");
    if (p->op != CGI_OP_PARAM || p->ndim != 2 || !in_set(ps, p))
        return cgi_fail(CG_ERR_ARG, "[lora] %s%s: adapters go on 2-D parameters of the set", cg_name(p), cgi_shp(p));
    if (p->lora_a) return cgi_fail(CG_ERR_ARG, "[lora] %s already has an adapter", p->name);
    const int64_t R = p->shape[0], C = p->shape[1];
    if (rank < 1 || rank > R || rank > C)
        return cgi_fail(CG_ERR_ARG, "[lora] %s%s: rank %d outside [1, %lld]", p->name, cgi_shp(p), rank,
                        (long long)(R < C ? R : C));
    if (!isfinite(alpha) || alpha == 0) return cgi_fail(CG_ERR_ARG, "[lora] %s: alpha %g must be finite and nonzero", p->name, alpha);
    char name[512];
    snprintf(name, sizeof name, "%s.lora_A", p->name);
    cg_tensor *a = cg_params_add(ps, name, 2, (int64_t[]){rank, C});
    snprintf(name, sizeof name, "%s.lora_B", p->name);
    cg_tensor *b = a ? cg_params_add(ps, name, 2, (int64_t[]){R, rank}) : NULL;
    if (!b) return CG_ERR_ARG; /* cg_params_add said why */
    const double bound = 1 / sqrt((double)C); /* PEFT's kaiming_uniform_(a = sqrt(5)) */
    cg_fill_uniform(a, r, -bound, bound);
    p->lora_a = a;
    p->lora_b = b;
    p->lora_scale = alpha / rank;
    cg_param_set_trainable(p, false);
    return CG_OK;
}

/* True when name contains one of the comma-separated targets. */
static bool targeted(const char *name, const char *targets) {
    for (const char *t = targets; *t;) {
        const char *end = strchr(t, ',');
        const size_t n = end ? (size_t)(end - t) : strlen(t);
        for (const char *s = name; n && *s; s++)
            if (!strncmp(s, t, n)) return true;
        t += n + (end != NULL);
    }
    return false;
}

int cg_lora_apply(cg_params *ps, const char *targets, int rank, double alpha, cg_rng *r) {
    if (!ps || !targets || !*targets) {
        cgi_fail(CG_ERR_ARG, "[lora] no targets given");
        return -1;
    }
    const int n = cg_params_count(ps);
    int added = 0;
    for (int i = 0; i < n; i++) {
        cg_tensor *p = cg_params_at(ps, i);
        if (cg_lora_is_adapter(p)) continue;
        if (p->ndim == 2 && targeted(p->name, targets)) {
            if (cg_lora_add(ps, p, rank, alpha, r)) return -1;
            added++;
        } else {
            cg_param_set_trainable(p, false);
        }
    }
    if (!added) {
        cgi_fail(CG_ERR_ARG, "[lora] no 2-D parameter name contains any of '%s'", targets);
        return -1;
    }
    return added;
}

cg_status cg_lora_merge(cg_params *ps) {
    if (!ps) return cgi_fail(CG_ERR_ARG, "[lora] NULL argument");
    for (int i = 0; i < cg_params_count(ps); i++) {
        cg_tensor *p = cg_params_at(ps, i);
        if (!p->lora_a) continue;
        const int64_t R = p->shape[0], C = p->shape[1], k = p->lora_a->shape[0];
        cg_real *w = p->data, *a = p->lora_a->data, *b = p->lora_b->data;
        /* P += s B A in double per element, so the merge adds no more rounding than one update */
#pragma omp parallel for schedule(static) if (R * C > CGI_PAR_MIN) num_threads(cgi_nthreads())
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) {
                double acc = 0;
                for (int64_t q = 0; q < k; q++) acc += (double)b[i * k + q] * a[q * C + j];
                w[i * C + j] = (cg_real)(w[i * C + j] + p->lora_scale * acc);
            }
        memset(b, 0, (size_t)(R * k) * sizeof *b);
    }
    return CG_OK;
}
