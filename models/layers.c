/* SPDX-License-Identifier: MIT */
/* Composite layers: attention is the fused cg_sdpa (its dropout included), with the heads split
 * and merged by views, so it needs no backward of its own. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/layers.h"
#include "ops/ops.h"

static cg_tensor *param_v(cg_params *ps, int ndim, const int64_t *shape, const char *fmt, va_list ap) {
    char name[256];
    vsnprintf(name, sizeof name, fmt, ap);
    return cg_params_add(ps, name, ndim, shape);
}

cg_tensor *cg_param_normal(cg_params *ps, cg_rng *r, double std, int ndim, const int64_t *shape, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cg_tensor *t = param_v(ps, ndim, shape, fmt, ap);
    va_end(ap);
    if (t && std > 0) cg_fill_normal(t, r, 0, std);
    return t;
}

cg_tensor *cg_param_const(cg_params *ps, double value, int ndim, const int64_t *shape, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cg_tensor *t = param_v(ps, ndim, shape, fmt, ap);
    va_end(ap);
    if (t && value != 0) cg_fill(t, value);
    return t;
}

/* Scaled dot-product attention at 1/sqrt(D), the blocks' one call into the fused op; past: the keys
 * a replayed decode graph holds, read at each run (or NULL). */
static cg_tensor *attend(cg_graph *g, cg_tensor *q, cg_tensor *k, cg_tensor *v, bool causal, cg_tensor *key_padding,
                         double dropout, cg_tensor *past) {
    if (!q || !k || !v) return NULL;
    /* dropout on the weights happens inside the fused kernel, its mask drawn again in backward */
    const cg_sdpa_opts o = {.scale = 1.0 / sqrt((double)cg_dim(q, -1)), .causal = causal, .key_padding = key_padding,
                            .dropout = dropout, .past = past};
    return cg_sdpa_ex(g, q, k, v, &o);
}

cg_tensor *cg_attention(cg_graph *g, cg_tensor *q, cg_tensor *k, cg_tensor *v, bool causal,
                        cg_tensor *key_padding, double dropout) {
    return attend(g, q, k, v, causal, key_padding, dropout, NULL);
}

cg_tensor *cg_multi_head(cg_graph *g, cg_tensor *q, cg_tensor *k, cg_tensor *v, int heads, bool causal,
                         cg_tensor *key_padding, double dropout) {
    cg_tensor *o = cg_attention(g, cg_split_heads(g, q, heads), cg_split_heads(g, k, heads),
                                cg_split_heads(g, v, heads), causal, key_padding, dropout);
    return cg_merge_heads(g, o);
}

cg_tensor *cg_post_ln_residual(cg_graph *g, cg_tensor *x, cg_tensor *sub, double dropout, cg_tensor *w, cg_tensor *b,
                               double eps) {
    return cg_add_layernorm(g, x, cg_dropout(g, sub, dropout), w, b, eps);
}

cg_tensor *cg_residual_linear(cg_graph *g, cg_tensor *x, cg_tensor *a, cg_tensor *w, cg_tensor *b, double dropout) {
    if (dropout == 0 || (g && cg_graph_mode(g) == CG_EVAL)) return cg_linear_add(g, a, w, b, x);
    return cg_add(g, x, cg_dropout(g, cg_linear(g, a, w, b), dropout));
}

cg_tensor *cg_position_ids(cg_graph *g, int64_t t, int64_t offset) {
    cg_tensor *p = cg_input(g, "positions", CG_INT32, 1, &t);
    for (int64_t i = 0; p && i < t; i++) cg_idata(p)[i] = (int32_t)(offset + i);
    return p;
}

cg_tensor *cg_sinusoidal(cg_graph *g, int64_t t, int64_t d, int64_t offset) {
    int64_t s[2] = {t, d};
    cg_tensor *pe = cg_input(g, "sinusoidal", CG_REAL, 2, s);
    if (!pe) return NULL;
    cg_real *x = cg_data(pe);
    for (int64_t p = 0; p < t; p++)
        for (int64_t i = 0; i < d; i += 2) {
            double angle = (double)(p + offset) / pow(10000.0, (double)i / (double)d);
            x[p * d + i] = (cg_real)sin(angle);
            if (i + 1 < d) x[p * d + i + 1] = (cg_real)cos(angle);
        }
    return pe;
}

typedef struct {
    double p;
    int32_t id;
} cand;

static int by_prob_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id; /* ties broken by id so the order never depends on qsort */
}

/* True when candidate a ranks below b: smaller value, or equal and a later index. */
static bool ranks_below(const cg_real *x, int32_t a, int32_t b) {
    const double u = isnan(x[a]) ? -INFINITY : x[a], w = isnan(x[b]) ? -INFINITY : x[b];
    return u < w || (u == w && a > b);
}

/* Restores the min-heap (root: the lowest-ranked kept index) below slot i. */
static void sift_down(const cg_real *x, int32_t *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t lo = i, l = 2 * i + 1, r = l + 1;
        if (l < n && ranks_below(x, h[l], h[lo])) lo = l;
        if (r < n && ranks_below(x, h[r], h[lo])) lo = r;
        if (lo == i) return;
        int32_t t = h[i];
        h[i] = h[lo], h[lo] = t, i = lo;
    }
}

int64_t cg_top_k(const cg_real *x, int64_t n, int64_t k, int32_t *idx) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    for (int64_t i = 0; i < k; i++) idx[i] = (int32_t)i;
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(x, idx, k, i);
    for (int64_t j = k; j < n; j++)
        if (ranks_below(x, idx[0], (int32_t)j)) idx[0] = (int32_t)j, sift_down(x, idx, k, 0);
    for (int64_t m = k - 1; m > 0; m--) { /* heap sort: the lowest goes to the back each time */
        int32_t t = idx[0];
        idx[0] = idx[m], idx[m] = t;
        sift_down(x, idx, m, 0);
    }
    return k;
}

/* Restores the max-heap (by by_prob_desc) of c[n] below slot k. */
static void sift_cands(cand *c, int64_t n, int64_t k) {
    for (;;) {
        int64_t hi = k, l = 2 * k + 1, r = l + 1;
        if (l < n && by_prob_desc(&c[l], &c[hi]) > 0) hi = l;
        if (r < n && by_prob_desc(&c[r], &c[hi]) > 0) hi = r;
        if (hi == k) return;
        const cand t = c[k];
        c[k] = c[hi], c[hi] = t, k = hi;
    }
}

/* Heap sort of c[n] in by_prob_desc's order: a total order, so qsort's result, without the buffer
 * glibc's qsort takes from malloc for arrays this size (once per generated token). */
static void sort_cands(cand *c, int64_t n) {
    for (int64_t i = n / 2 - 1; i >= 0; i--) sift_cands(c, n, i);
    for (int64_t end = n - 1; end > 0; end--) {
        const cand t = c[0];
        c[0] = c[end], c[end] = t;
        sift_cands(c, end, 0);
    }
}

/* cg_sample with the candidates in c[v] (NULL: greedy only). */
static int32_t sample(const cg_real *logits, int64_t v, const cg_sampling *s, cg_rng *r, cand *c) {
    int32_t best = 0;
    for (int64_t i = 1; i < v; i++)
        if (logits[i] > logits[best]) best = (int32_t)i;
    if (!s || s->temperature <= 0 || v <= 1 || !c) return best;
    double sum = 0;
    for (int64_t i = 0; i < v; i++) {
        c[i].id = (int32_t)i;
        c[i].p = exp(((double)logits[i] - (double)logits[best]) / s->temperature);
        sum += c[i].p;
    }
    sort_cands(c, v);
    int64_t keep = v;
    if (s->top_k > 0 && s->top_k < keep) keep = s->top_k;
    if (s->top_p > 0 && s->top_p < 1) {
        double acc = 0;
        for (int64_t i = 0; i < keep; i++) {
            acc += c[i].p / sum;
            if (acc >= s->top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    double total = 0;
    for (int64_t i = 0; i < keep; i++) total += c[i].p;
    double u = cg_rng_uniform(r) * total, acc = 0;
    int32_t pick = c[keep - 1].id;
    for (int64_t i = 0; i < keep; i++) {
        acc += c[i].p;
        if (u < acc) {
            pick = c[i].id;
            break;
        }
    }
    return pick;
}

int32_t cg_sample(const cg_real *logits, int64_t v, const cg_sampling *s, cg_rng *r) {
    cand *c = s && s->temperature > 0 && v > 1 ? malloc((size_t)v * sizeof *c) : NULL;
    const int32_t pick = sample(logits, v, s, r, c); /* out of memory: greedy, as before */
    free(c);
    return pick;
}

cg_status cg_kv_cache_start(const cg_kv_cache *c, int64_t t, int64_t limit, const char *model, const char *limit_name,
                            int64_t *past) {
    const bool replay = c && c->past; /* the position is read at each run: one token, at most cap */
    *past = replay ? c->cap - 1 : c ? c->len : 0;
    if (replay && t != 1)
        return cg_set_error(CG_ERR_SHAPE, "[%s] a replayed decode step takes one token, not %lld", model, (long long)t);
    if (*past + t > limit)
        return cg_set_error(CG_ERR_SHAPE, "[%s] %lld positions exceed %s %lld", model, (long long)(*past + t),
                            limit_name, (long long)limit);
    return CG_OK;
}

cg_tensor *cg_kv_cache_extend(cg_graph *g, cg_kv_cache *c, int64_t layer, bool values, cg_tensor *fresh) {
    if (!fresh || !c) return NULL;
    const int64_t h = c->heads, d = c->head_dim, cap = c->cap;
    if (cg_ndim(fresh) != 4 || cg_dim(fresh, 1) != h || cg_dim(fresh, 3) != d) {
        cg_set_error(CG_ERR_SHAPE, "[kv cache] keys%s do not fit a cache of %lld heads of %lld", cg_shape_str(fresh),
                 (long long)h, (long long)d);
        return NULL;
    }
    int64_t s[4] = {1, h, cap, d}, st[4] = {h * cap * d, cap * d, d, 1};
    cg_real *store = (values ? c->v : c->k) + layer * h * cap * d;
    cg_tensor *buf = cg_wrap(g, "kv_cache", CG_REAL, 4, s, st, store);
    return c->past ? cg_append_into_at(g, buf, c->past, fresh, 2) : cg_append_into(g, buf, c->len, fresh, 2);
}

cg_tensor *cg_cached_attention(cg_graph *g, cg_kv_cache *c, int64_t layer, cg_tensor *q, cg_tensor *k, cg_tensor *v,
                               double dropout) {
    if (!c) return attend(g, q, k, v, true, NULL, dropout, NULL);
    k = cg_kv_cache_extend(g, c, layer, false, k), v = cg_kv_cache_extend(g, c, layer, true, v);
    return attend(g, q, k, v, true, NULL, dropout, c->past);
}

typedef struct {
    cg_decoder_forward fwd;
    const void *model;
    cg_graph *g;
    cg_kv_cache *kc;
    const cg_sampling *s;
    int32_t *out;
    int64_t n_prompt, total, v;
    bool use_cache, replays;
    cg_rng r;
    cand *cands; /* sampling's candidates, made once for the whole loop */
} gen_loop;

/* Builds the decode graph of one token once: the token and the cache length are int32 inputs
 * written before each run, so a token costs no graph construction, planning or allocation. */
static cg_tensor *build_decode(gen_loop *L, int32_t **id, int32_t **past) {
    cg_graph *g = L->g;
    cg_graph_reset(g);
    cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){1, 1});
    L->kc->past = cg_input(g, "past", CG_INT32, 2, (int64_t[]){1, 1});
    cg_tensor *logits = L->fwd(g, L->model, ids, L->kc);
    *id = cg_idata(ids), *past = cg_idata(L->kc->past);
    return logits;
}

/* The status of the op that made a graph builder return NULL (its message is cg_last_error()). */
static cg_status build_failed(void) {
    const cg_status st = cg_last_status();
    return st ? st : cg_set_error(CG_ERR_STATE, "[generate] the model's forward returned NULL without an error");
}

static cg_status gen_steps(void *ctx) {
    gen_loop *L = ctx;
    cg_graph *g = L->g;
    cg_kv_cache *kc = L->use_cache ? L->kc : NULL;
    cg_status st = CG_OK;
    cg_tensor *decode = NULL; /* the replayed graph's logits, once built */
    int32_t *id = NULL, *past = NULL;
    for (int64_t n = L->n_prompt; !st && n < L->total; n++) {
        if (!decode && kc && L->replays && n > L->n_prompt) {
            cg_clear_error();
            if (!(decode = build_decode(L, &id, &past))) return build_failed();
        }
        if (decode) {
            *id = L->out[n - 1], *past = (int32_t)kc->len;
            if ((st = cg_graph_forward(g))) break;
            kc->len++;
            L->out[n] = sample(cg_data(decode), L->v, L->s, &L->r, L->cands);
            continue;
        }
        cg_graph_reset(g);
        cg_clear_error();
        /* With the cache, the first step feeds the whole prompt and later steps one token. */
        const int64_t from = kc ? kc->len : 0, t = n - from;
        cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){1, t});
        if (ids) memcpy(cg_idata(ids), L->out + from, (size_t)t * sizeof(int32_t));
        cg_tensor *logits = L->fwd(g, L->model, ids, kc);
        if (!logits) return build_failed();
        st = cg_graph_forward(g);
        if (st) break;
        if (kc) kc->len += t; /* forward wrote this step's keys and values into the cache */
        L->out[n] = sample(cg_data(logits) + (t - 1) * L->v, L->v, L->s, &L->r, L->cands);
    }
    return st;
}

cg_status cg_decoder_generate(cg_decoder_forward fwd, const void *model, const cg_decoder_info *info,
                              const int32_t *prompt, int64_t n_prompt, int64_t n_new, const cg_sampling *s,
                              uint64_t seed, bool use_cache, int32_t *out) {
    const char *what = info && info->name ? info->name : "generate";
    if (!fwd || !model || !info || !prompt || !out || n_prompt <= 0 || n_new < 0)
        return cg_set_error(CG_ERR_ARG, "[%s] need a model, a non-empty prompt and an output buffer", what);
    const int64_t total = n_prompt + n_new, v = info->vocab;
    if (total > info->context)
        return cg_set_error(CG_ERR_ARG, "[%s] %lld prompt + %lld new tokens exceed the context of %lld", what,
                        (long long)n_prompt, (long long)n_new, (long long)info->context);
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= v)
            return cg_set_error(CG_ERR_RANGE, "[%s] prompt token %d at %lld outside vocabulary [0, %lld)", what, prompt[i],
                            (long long)i, (long long)v);
    memcpy(out, prompt, (size_t)n_prompt * sizeof *out);
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_kv_cache kc = {.cap = total, .heads = info->kv_heads, .head_dim = info->head_dim};
    cg_status st = g ? CG_OK : CG_ERR_NOMEM;
    if (!st && use_cache) {
        size_t per = (size_t)(info->layers * info->kv_heads * info->head_dim * total);
        kc.k = malloc(per * sizeof(cg_real));
        kc.v = malloc(per * sizeof(cg_real));
        if (!kc.k || !kc.v) st = cg_set_error(CG_ERR_NOMEM, "[%s] out of memory", what);
    }
    gen_loop L = {.fwd = fwd, .model = model, .g = g, .kc = &kc, .s = s, .out = out, .n_prompt = n_prompt,
                  .total = total, .v = v, .use_cache = use_cache, .replays = info->replays};
    cg_rng_seed(&L.r, seed);
    if (!st && s && s->temperature > 0 && v > 1 && !(L.cands = malloc((size_t)v * sizeof *L.cands)))
        st = cg_set_error(CG_ERR_NOMEM, "[%s] out of memory", what);
    /* one thread team for the whole loop: a token is too small a run to wake threads for */
    if (!st) st = cg_run_with_team(gen_steps, &L);
    free(L.cands);
    free(kc.k);
    free(kc.v);
    cg_graph_free(g);
    return st;
}
