/* SPDX-License-Identifier: MIT */
/* LoRA adapters: two small parameters per adapted weight, linked from the base parameter so
 * that cg_linear finds them (ops/lora.c), and folded back into it for export. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <unistd.h>

#include "graph/internal.h"
#include "io/safetensors.h"
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
        cg_status ws = cgi_param_writable(p); /* a base read in place from its file gets a float copy */
        if (ws) return ws;
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
        cg_params_touch(ps);
    }
    return CG_OK;
}

/* ---- adapters on disk ---- */

/* An adapter's moments sit at its offset in the blocks. */
static cg_real *moment_of(cg_real *block, const cg_tensor *p) {
    return block ? block + p->block_off : NULL;
}

cg_status cg_lora_save(cg_params *ps, const cg_optim *o, const char *path) {
    if (!ps || !path) return cgi_fail(CG_ERR_ARG, "[lora save] NULL argument");
    cg_st_writer *w = cg_st_writer_new();
    if (!w) return CG_ERR_NOMEM;
    cg_real *m1 = o ? cg_optim_moment1((cg_optim *)o) : NULL, *m2 = o ? cg_optim_moment2((cg_optim *)o) : NULL;
    cg_status st = CG_OK;
    int n = 0;
    char name[600], num[64];
    for (int i = 0; !st && i < cg_params_count(ps); i++) {
        cg_tensor *p = cg_params_at(ps, i);
        if (!p->lora_a) continue;
        const cg_tensor *ab[2] = {p->lora_a, p->lora_b};
        for (int k = 0; !st && k < 2; k++) {
            cg_tensor *t = (cg_tensor *)ab[k];
            st = cg_st_add(w, t->name, 2, t->shape, t->data);
            snprintf(name, sizeof name, "%s.exp_avg", t->name);
            if (!st && m1) st = cg_st_add(w, name, 2, t->shape, moment_of(m1, t));
            snprintf(name, sizeof name, "%s.exp_avg_sq", t->name);
            if (!st && m2) st = cg_st_add(w, name, 2, t->shape, moment_of(m2, t));
        }
        snprintf(name, sizeof name, "scale:%s", p->name);
        snprintf(num, sizeof num, "%.17g", p->lora_scale);
        if (!st) st = cg_st_set_metadata(w, name, num);
        n++;
    }
    if (!st && !n) st = cgi_fail(CG_ERR_STATE, "[lora save] %s: the parameter set has no adapters", path);
    snprintf(num, sizeof num, "%lld", o ? (long long)cg_optim_steps(o) : -1LL);
    if (!st) st = cg_st_set_metadata(w, "format", "cgrad-lora");
    if (!st && o) st = cg_st_set_metadata(w, "optim_steps", num);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (!st) st = cg_st_write(w, tmp);
    if (!st && rename(tmp, path)) st = cgi_fail(CG_ERR_IO, "[lora save] cannot rename %s to %s", tmp, path);
    if (st) remove(tmp);
    cg_st_writer_free(w);
    return st;
}

/* The base parameter name of an adapter tensor name "<base>.lora_A" into buf; false otherwise. */
static bool base_name(const char *name, char *buf, size_t n) {
    const size_t len = strlen(name);
    if (len <= 7 || len - 7 >= n || strcmp(name + len - 7, ".lora_A")) return false;
    memcpy(buf, name, len - 7);
    buf[len - 7] = 0;
    return true;
}

cg_status cg_lora_load(cg_params *ps, const char *path) {
    if (!ps || !path) return cgi_fail(CG_ERR_ARG, "[lora load] NULL argument");
    cg_st *f = cg_st_open(path);
    if (!f) return CG_ERR_IO;
    const char *fmt = cg_st_metadata(f, "format");
    cg_status st = fmt && !strcmp(fmt, "cgrad-lora")
                       ? CG_OK
                       : cgi_fail(CG_ERR_FORMAT, "[lora load] %s: not an adapter file (format '%s')", path, fmt ? fmt : "");
    /* check every adapter against its base before changing anything */
    char base[512], key[600];
    int found = 0;
    for (int i = 0; !st && i < cg_st_count(f); i++) {
        if (!base_name(cg_st_name(f, i), base, sizeof base)) continue;
        cg_tensor *p = cg_params_find(ps, base);
        int na = 0, nb = 0;
        int64_t sa[CG_MAX_DIMS], sb[CG_MAX_DIMS];
        snprintf(key, sizeof key, "%s.lora_B", base);
        if (!p || p->ndim != 2 || p->lora_a)
            st = cgi_fail(CG_ERR_FORMAT, "[lora load] %s: adapter '%s' has no free 2-D base parameter '%s'", path,
                          cg_st_name(f, i), base);
        else if (cg_st_info(f, key, NULL, &nb, sb))
            st = cgi_fail(CG_ERR_FORMAT, "[lora load] %s: adapter '%s' has no '%s' beside it", path, cg_st_name(f, i), key);
        else if (cg_st_info(f, cg_st_name(f, i), NULL, &na, sa) || na != 2 || nb != 2 || sa[1] != p->shape[1] ||
                 sb[0] != p->shape[0] || sa[0] != sb[1] || sa[0] < 1 || sa[0] > p->shape[0] || sa[0] > p->shape[1])
            st = cgi_fail(CG_ERR_SHAPE, "[lora load] %s: adapter of '%s'%s: lora_A is %s and lora_B %s, but they must be "
                          "[r, %lld] and [%lld, r] with 1 <= r <= %lld", path, base, cgi_shp(p), cgi_dims(na, sa),
                          cgi_dims(nb, sb), (long long)p->shape[1], (long long)p->shape[0],
                          (long long)(p->shape[0] < p->shape[1] ? p->shape[0] : p->shape[1]));
        snprintf(key, sizeof key, "scale:%s", base);
        const char *sc = cg_st_metadata(f, key);
        if (!st && (!sc || !isfinite(strtod(sc, NULL)) || strtod(sc, NULL) == 0))
            st = cgi_fail(CG_ERR_FORMAT, "[lora load] %s: no valid scale for '%s'", path, base);
        found++;
    }
    if (!st && !found) st = cgi_fail(CG_ERR_FORMAT, "[lora load] %s: holds no adapters", path);
    /* The values go through the load step every weight load uses (dtype, byte range, finite), into
     * stand-ins of the adapters' names and shapes: only once it passes are adapters added to ps. */
    cg_params *scratch = st ? NULL : cg_params_new();
    cg_st_load *l = scratch ? cg_st_load_new() : NULL;
    if (!st && !l) st = CG_ERR_NOMEM;
    for (int i = 0; !st && i < cg_st_count(f); i++) {
        if (!base_name(cg_st_name(f, i), base, sizeof base)) continue;
        for (int k = 0; !st && k < 2; k++) {
            snprintf(key, sizeof key, "%s.lora_%c", base, "AB"[k]);
            int64_t sh[CG_MAX_DIMS];
            cg_tensor *t = cg_st_info(f, key, NULL, NULL, sh) ? NULL : cg_params_add(scratch, key, 2, sh);
            st = t ? cg_st_load_add(l, t, f, key) : CG_ERR_NOMEM;
        }
    }
    if (!st) st = cg_st_load_run(l);
    cg_st_load_free(l);
    for (int i = 0; !st && i < cg_st_count(f); i++) {
        if (!base_name(cg_st_name(f, i), base, sizeof base)) continue;
        cg_tensor *p = cg_params_find(ps, base);
        int64_t sa[CG_MAX_DIMS];
        cg_st_info(f, cg_st_name(f, i), NULL, NULL, sa);
        snprintf(key, sizeof key, "scale:%s", base);
        const double scale = strtod(cg_st_metadata(f, key), NULL);
        cg_rng r;
        cg_rng_seed(&r, 0);
        if ((st = cg_lora_add(ps, p, (int)sa[0], scale * (double)sa[0], &r))) break;
        if ((st = cg_write(p->lora_a, cg_data(cg_params_find(scratch, cg_name(p->lora_a)))))) break;
        st = cg_write(p->lora_b, cg_data(cg_params_find(scratch, cg_name(p->lora_b))));
    }
    cg_params_free(scratch);
    if (!st) /* as cg_lora_apply: the fine-tune trains its adapters alone */
        for (int i = 0; i < cg_params_count(ps); i++)
            if (!cg_lora_is_adapter(cg_params_at(ps, i))) cg_param_set_trainable(cg_params_at(ps, i), false);
    cg_st_close(f);
    return st;
}

cg_status cg_lora_load_optim(cg_optim *o, cg_params *ps, const char *path) {
    if (!o || !ps || !path) return cgi_fail(CG_ERR_ARG, "[lora load] NULL argument");
    cg_st *f = cg_st_open(path);
    if (!f) return CG_ERR_IO;
    const char *steps = cg_st_metadata(f, "optim_steps");
    cg_real *m[2] = {cg_optim_moment1(o), cg_optim_moment2(o)};
    const char *suffix[2] = {"exp_avg", "exp_avg_sq"};
    cg_status st = steps && m[0] ? CG_OK
                                 : cgi_fail(CG_ERR_FORMAT, "[lora load] %s: no optimizer state to restore", path);
    char *end = NULL;
    const long long n_steps = st ? 0 : strtoll(steps, &end, 10);
    if (!st && (end == steps || *end || n_steps < 0))
        st = cgi_fail(CG_ERR_FORMAT, "[lora load] %s: metadata optim_steps '%s' is not a step count", path, steps);
    char key[600];
    /* The moments pass the checks of every weight load (shape, dtype, byte range, finite) into
     * stand-ins first, so a refused file leaves the optimizer as it was. */
    cg_params *scratch = st ? NULL : cg_params_new();
    cg_st_load *l = scratch ? cg_st_load_new() : NULL;
    if (!st && !l) st = cgi_fail(CG_ERR_NOMEM, "[lora load] out of memory");
    for (int i = 0; !st && i < cg_params_count(ps); i++) {
        cg_tensor *t = cg_params_at(ps, i);
        if (!cg_lora_is_adapter(t)) continue;
        for (int k = 0; !st && k < 2 && m[k]; k++) {
            snprintf(key, sizeof key, "%s.%s", t->name, suffix[k]);
            cg_tensor *stand_in = cg_params_add(scratch, key, 2, t->shape);
            st = stand_in ? cg_st_load_add(l, stand_in, f, key) : CG_ERR_NOMEM;
        }
    }
    if (!st) st = cg_st_load_run(l);
    for (int i = 0; !st && i < cg_params_count(ps); i++) {
        cg_tensor *t = cg_params_at(ps, i);
        if (!cg_lora_is_adapter(t)) continue;
        for (int k = 0; k < 2 && m[k]; k++) {
            snprintf(key, sizeof key, "%s.%s", t->name, suffix[k]);
            memcpy(moment_of(m[k], t), cg_data(cg_params_find(scratch, key)), (size_t)cg_numel(t) * sizeof(cg_real));
        }
    }
    if (!st) st = cg_optim_set_steps(o, n_steps);
    cg_st_load_free(l);
    cg_params_free(scratch);
    cg_st_close(f);
    return st;
}
