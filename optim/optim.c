/* SPDX-License-Identifier: MIT */
/* SGD, Adam and AdamW over the contiguous blocks of a cg_params set, plus gradient clipping and
 * scaling. The blocks are cut into a fixed number of chunks that depend only on the span, and
 * each chunk walks the parameters that overlap it; an update is elementwise, and the norm sums
 * chunks in a fixed order, so results do not depend on the thread count at all. Scalars are
 * rounded to cg_real and applied in torch 1.13's operation order, so float results agree with
 * torch to an ulp or two. */
#include <math.h>
#include <stdlib.h>

#include "graph/internal.h"
#include "optim/optim.h"

#ifdef CGRAD_DOUBLE
#define SQRT sqrt
#else
#define SQRT sqrtf
#endif

#define NCHUNK 64         /* fixed chunking of the blocks: the norm's summation order */
#define CHUNK_ALIGN 16    /* chunk edges every 16 elements: no cache line shared by two threads */

struct cg_optim {
    cg_params *ps;
    cg_optim_config cfg;
    int n;           /* parameters when the optimizer was made */
    int64_t span;    /* cg_params_span then */
    bool *decay;     /* per parameter */
    cg_real *m, *v;  /* moments for elements [lo, hi) of the blocks, or NULL */
    int64_t lo, hi;  /* the shard this optimizer updates: [0, span) unless cg_optim_shard */
    int64_t steps;
    cg_graph *graph; /* cg_optim_attach: the graph whose backward applies the updates, or NULL */
    bool *stepped;   /* per parameter, during cg_optim_backward_step: updated in this pass */
    const struct coefs *pass; /* the pass's coefficients, while it runs */
};

/* ---- walking the blocks ---- */

/* Where parameter i's elements start in the blocks. Not its data pointer's distance from the value
 * block: a frozen parameter out of the blocks (a file mapping, a buffer of its own) lies anywhere in
 * memory, and such a distance sent the walk past the adapters. Its offset is kept in order with a
 * length of zero. */
static int64_t param_off(cg_params *ps, int i) { return cg_params_at(ps, i)->block_off; }
static int64_t param_len(cg_params *ps, int i) {
    const cg_tensor *t = cg_params_at(ps, i);
    return t->store == CGI_STORE_BLOCK ? cgi_numel(t->ndim, t->shape) : 0;
}

/* Bounds of chunk c of NCHUNK over span elements. */
static void chunk_bounds(int64_t span, int c, int64_t *lo, int64_t *hi) {
    int64_t per = (span + NCHUNK - 1) / NCHUNK;
    per = (per + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
    *lo = per * c < span ? per * c : span;
    *hi = per * (c + 1) < span ? per * (c + 1) : span;
}

/* First parameter whose elements end after pos (parameters lie in insertion order). */
static int first_param(cg_params *ps, int n, int64_t pos) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (param_off(ps, mid) + param_len(ps, mid) <= pos) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Runs the trailing statements with int i (parameter), int64_t a, e (element range) for every trainable
 * parameter's part inside chunk [lo_, hi_). */
#define FOR_RANGES(ps, n, lo_, hi_, ...)                                          \
    for (int i = first_param(ps, n, lo_); i < (n); i++) {                          \
        cg_tensor *t_ = cg_params_at(ps, i);                                       \
        int64_t off_ = param_off(ps, i);                                           \
        if (off_ >= (hi_)) break;                                                  \
        if (!t_->trainable || t_->store != CGI_STORE_BLOCK) continue;              \
        int64_t end_ = off_ + param_len(ps, i);                                    \
        int64_t a = off_ > (lo_) ? off_ : (lo_), e = end_ < (hi_) ? end_ : (hi_);  \
        __VA_ARGS__                                                                \
    }

/* ---- configuration ---- */

cg_optim_config cg_optim_defaults(cg_optim_kind kind) {
    cg_optim_config c = {.kind = kind, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                         .weight_decay = kind == CG_OPT_ADAMW ? 0.01 : 0.0, .momentum = 0.0,
                         .nesterov = false};
    return c;
}

cg_status cg_optim_parse(const char *name, cg_optim_kind *kind) {
    static const char *names[] = {"sgd", "adam", "adamw"};
    if (!name || !kind) return cgi_fail(CG_ERR_ARG, "[optim_parse] NULL argument");
    for (int k = 0; k < 3; k++)
        if (strcmp(name, names[k]) == 0) {
            *kind = (cg_optim_kind)k;
            return CG_OK;
        }
    return cgi_fail(CG_ERR_ARG, "[optim_parse] unknown optimizer '%s' (sgd, adam, adamw)", name);
}

static cg_status check_config(const cg_optim_config *c) {
    const char *f = "[optim_new]";
    if (c->kind != CG_OPT_SGD && c->kind != CG_OPT_ADAM && c->kind != CG_OPT_ADAMW)
        return cgi_fail(CG_ERR_ARG, "%s unknown optimizer kind %d", f, (int)c->kind);
    if (!(c->lr >= 0 && isfinite(c->lr))) return cgi_fail(CG_ERR_ARG, "%s lr %g must be >= 0", f, c->lr);
    if (!(c->weight_decay >= 0 && isfinite(c->weight_decay)))
        return cgi_fail(CG_ERR_ARG, "%s weight_decay %g must be >= 0", f, c->weight_decay);
    if (c->kind == CG_OPT_SGD) {
        if (!(c->momentum >= 0 && isfinite(c->momentum)))
            return cgi_fail(CG_ERR_ARG, "%s momentum %g must be >= 0", f, c->momentum);
        if (c->nesterov && c->momentum == 0)
            return cgi_fail(CG_ERR_ARG, "%s nesterov needs momentum > 0", f);
        return CG_OK;
    }
    if (!(c->beta1 >= 0 && c->beta1 < 1)) return cgi_fail(CG_ERR_ARG, "%s beta1 %g not in [0, 1)", f, c->beta1);
    if (!(c->beta2 >= 0 && c->beta2 < 1)) return cgi_fail(CG_ERR_ARG, "%s beta2 %g not in [0, 1)", f, c->beta2);
    if (!(c->eps >= 0 && isfinite(c->eps))) return cgi_fail(CG_ERR_ARG, "%s eps %g must be >= 0", f, c->eps);
    if (c->momentum != 0 || c->nesterov)
        return cgi_fail(CG_ERR_ARG, "%s momentum/nesterov are SGD options, not for Adam(W)", f);
    return CG_OK;
}

static cg_real *moment_block(int64_t span) {
    cg_real *b = cgi_alloc_large((size_t)span * sizeof(cg_real)); /* span is 64-byte padded */
    if (b) memset(b, 0, (size_t)span * sizeof(cg_real));
    return b;
}

cg_optim *cg_optim_new(cg_params *ps, const cg_optim_config *cfg) {
    if (!ps || !cfg) {
        cgi_fail(CG_ERR_ARG, "[optim_new] NULL argument");
        return NULL;
    }
    if (check_config(cfg)) return NULL;
    int64_t span = cg_params_span(ps);
    if (cg_params_count(ps) == 0 || span == 0) {
        cgi_fail(CG_ERR_ARG, "[optim_new] the parameter set is empty");
        return NULL;
    }
    cg_optim *o = calloc(1, sizeof *o);
    if (!o) goto nomem;
    o->ps = ps;
    o->cfg = *cfg;
    o->n = cg_params_count(ps);
    o->span = span;
    o->lo = 0, o->hi = span;
    o->decay = malloc((size_t)o->n * sizeof *o->decay);
    if (!o->decay) goto nomem;
    for (int i = 0; i < o->n; i++) o->decay[i] = true;
    bool adam = cfg->kind != CG_OPT_SGD;
    if ((adam || cfg->momentum != 0) && !(o->m = moment_block(span))) goto nomem;
    if (adam && !(o->v = moment_block(span))) goto nomem;
    return o;
nomem:
    cg_optim_free(o);
    cgi_fail(CG_ERR_NOMEM, "[optim_new] cannot allocate moments for %lld elements", (long long)span);
    return NULL;
}

void cg_optim_free(cg_optim *o) {
    if (!o) return;
    free(o->stepped); /* an attached graph stays as it is: its backward refuses to run without the optimizer */
    free(o->decay);
    free(o->m);
    free(o->v);
    free(o);
}

const cg_optim_config *cg_optim_config_of(const cg_optim *o) { return o ? &o->cfg : NULL; }

/* ---- parameter groups ---- */

static int index_of(const cg_optim *o, const cg_tensor *p) {
    for (int i = 0; i < o->n; i++)
        if (cg_params_at(o->ps, i) == p) return i;
    return -1;
}

cg_status cg_optim_set_decay(cg_optim *o, const cg_tensor *param, bool decay) {
    if (!o || !param) return cgi_fail(CG_ERR_ARG, "[optim_set_decay] NULL argument");
    int i = index_of(o, param);
    if (i < 0)
        return cgi_fail(CG_ERR_ARG, "[optim_set_decay] '%s' is not a parameter of the optimizer's set",
                        param->name ? param->name : "");
    o->decay[i] = decay;
    return CG_OK;
}

bool cg_optim_decays(const cg_optim *o, const cg_tensor *param) {
    int i = o && param ? index_of(o, param) : -1;
    return i >= 0 && o->decay[i];
}

static bool contains_ci(const char *s, const char *sub) {
    size_t n = strlen(sub);
    for (; *s; s++) {
        size_t k = 0;
        while (k < n && s[k] && (s[k] | 0x20) == sub[k]) k++;
        if (k == n) return true;
    }
    return false;
}

/* "emb" covers embed/embedding/word_embeddings/tok_emb; wte/wpe are GPT-2's token and position
 * tables. A tied output head is the same tensor as wte, so it follows wte. */
static bool is_embedding(const char *name) {
    return contains_ci(name, "emb") || contains_ci(name, "wte") || contains_ci(name, "wpe");
}

int cg_optim_decay_matrices_only(cg_optim *o, bool decay_embeddings) {
    if (!o) return 0;
    int count = 0;
    for (int i = 0; i < o->n; i++) {
        cg_tensor *t = cg_params_at(o->ps, i);
        o->decay[i] = t->ndim >= 2 && (decay_embeddings || !is_embedding(t->name));
        count += o->decay[i];
    }
    return count;
}

/* ---- the update ---- */

typedef struct coefs {
    cg_real b1, a1, b2, a2; /* moment decays and their complements */
    cg_real keep;           /* AdamW: 1 - lr*wd */
    cg_real l2;             /* Adam/SGD: wd */
    cg_real bc2_sqrt, eps, neg_step; /* Adam: sqrt(1 - beta2^t), eps, -lr / (1 - beta1^t) */
    cg_real mom, neg_lr;    /* SGD */
    cg_real gscale;         /* gradients are read times this (clipping), 1 for none */
} coefs;

/* torch _single_tensor_adam(w): decay, m = m*b1 + a1*g, v = v*b2 + a2*g*g,
 * p += -step * m / (sqrt(v) / sqrt(bc2) + eps). g is read as g * gs, clipping's factor rounded to
 * cg_real: the product cg_grads_scale would have stored, so fusing the scale changes no bit (each
 * product is its own statement, so no compiler contracts it into the next add). */
CGI_CLONES static void adam_range(cg_real *restrict p, const cg_real *restrict g, cg_real *restrict m,
                       cg_real *restrict v, int64_t n, const coefs *k, bool adamw, bool decay) {
    const cg_real b1 = k->b1, a1 = k->a1, b2 = k->b2, a2 = k->a2, bc2 = k->bc2_sqrt, eps = k->eps,
                  ns = k->neg_step, gs = k->gscale;
    /* keep is exactly 1 without decay, so one loop serves both groups */
    const cg_real keep = adamw && decay ? k->keep : 1, l2 = decay && !adamw ? k->l2 : 0;
    if (l2 != 0) {
        for (int64_t j = 0; j < n; j++) {
            cg_real gj = g[j] * gs;
            gj = gj + l2 * p[j];
            m[j] = m[j] * b1 + a1 * gj;
            v[j] = v[j] * b2 + a2 * gj * gj;
            p[j] = p[j] + ns * m[j] / (SQRT(v[j]) / bc2 + eps);
        }
    } else {
        for (int64_t j = 0; j < n; j++) {
            cg_real pj = p[j] * keep, gj = g[j] * gs;
            m[j] = m[j] * b1 + a1 * gj;
            v[j] = v[j] * b2 + a2 * gj * gj;
            p[j] = pj + ns * m[j] / (SQRT(v[j]) / bc2 + eps);
        }
    }
}

/* torch _single_tensor_sgd with dampening 0: d = g + wd*p; buf = buf*mom + d;
 * d = nesterov ? d + mom*buf : buf; p += -lr * d. g is read scaled, as in adam_range. */
CGI_CLONES static void sgd_range(cg_real *restrict p, const cg_real *restrict g, cg_real *restrict buf,
                      int64_t n, const coefs *k, bool nesterov, bool decay) {
    const cg_real l2 = decay ? k->l2 : 0, mom = k->mom, nlr = k->neg_lr, gs = k->gscale;
    for (int64_t j = 0; j < n; j++) {
        cg_real d = g[j] * gs;
        if (l2 != 0) d = d + l2 * p[j];
        if (buf) {
            buf[j] = buf[j] * mom + d;
            d = nesterov ? d + mom * buf[j] : buf[j];
        }
        p[j] = p[j] + nlr * d;
    }
}

/* Parameter i's update over elements [a, e) of the blocks, its gradient read from g (element a's). */
static void update_range(cg_optim *o, int i, int64_t a, int64_t e, const cg_real *g, const coefs *k) {
    cg_real *P = cg_params_values(o->ps), *M = o->m ? o->m - o->lo : NULL, *V = o->v ? o->v - o->lo : NULL;
    const cg_optim_config *c = &o->cfg;
    if (c->kind == CG_OPT_SGD) sgd_range(P + a, g, M ? M + a : NULL, e - a, k, c->nesterov, o->decay[i]);
    else adam_range(P + a, g, M + a, V + a, e - a, k, c->kind == CG_OPT_ADAMW, o->decay[i]);
}

cg_status cg_optim_step(cg_optim *o, double lr) { return cg_optim_step_scaled(o, lr, 1.0); }

/* The passes over the blocks in their NCHUNK fixed chunks, for cgi_par_ranges (a team shares the
 * chunks; an OpenMP loop inside a span ran on thread 0 alone): the update (o set), the gradient
 * norm's partial sums (part set) or the gradients' scaling. Each chunk is computed alone. */
typedef struct {
    cg_optim *o;
    cg_params *ps;
    const coefs *k;
    double *part;
    cg_real *grads; /* scaling: the gradients, times by */
    cg_real by;
} chunks_args;

static void step_chunks(int64_t c0, int64_t c1, void *ctx) {
    const chunks_args *c = ctx;
    cg_optim *o = c->o;
    const cg_real *G = cgi_params_grads(c->ps);
    const int n = o->n;
    const int64_t base = o->lo, len = o->hi - o->lo;
    for (int ch = (int)c0; ch < (int)c1; ch++) {
        int64_t lo, hi;
        chunk_bounds(len, ch, &lo, &hi);
        lo += base, hi += base;
        if (lo >= hi) continue;
        FOR_RANGES(c->ps, n, lo, hi, { update_range(o, i, a, e, G + a, c->k); })
    }
}

/* The checks of a step (f names the caller) and its coefficients for the update count's next step. */
static cg_status step_coefs(cg_optim *o, double lr, double grad_scale, const char *f, coefs *k) {
    if (!o) return cgi_fail(CG_ERR_ARG, "%s optimizer is NULL", f);
    if (!(lr >= 0 && isfinite(lr))) return cgi_fail(CG_ERR_ARG, "%s lr %g must be finite and >= 0", f, lr);
    if (!(grad_scale >= 0 && isfinite(grad_scale)))
        return cgi_fail(CG_ERR_ARG, "%s grad_scale %g must be finite and >= 0", f, grad_scale);
    cg_params *ps = o->ps;
    if (cg_params_count(ps) != o->n || cg_params_span(ps) != o->span)
        return cgi_fail(CG_ERR_STATE,
                        "%s the set now has %d parameters (%lld elements) but the optimizer was "
                        "made for %d (%lld): make the optimizer after adding every parameter", f,
                        cg_params_count(ps), (long long)cg_params_span(ps), o->n, (long long)o->span);
    const cg_optim_config *c = &o->cfg;
    double t = (double)(o->steps + 1);
    *k = (coefs){
        .b1 = (cg_real)c->beta1, .a1 = (cg_real)(1 - c->beta1),
        .b2 = (cg_real)c->beta2, .a2 = (cg_real)(1 - c->beta2),
        .keep = (cg_real)(1 - lr * c->weight_decay), .l2 = (cg_real)c->weight_decay,
        .eps = (cg_real)c->eps, .mom = (cg_real)c->momentum, .neg_lr = (cg_real)-lr,
        .gscale = (cg_real)grad_scale,
    };
    if (c->kind != CG_OPT_SGD) {
        k->bc2_sqrt = (cg_real)sqrt(1 - pow(c->beta2, t));
        k->neg_step = (cg_real)(-(lr / (1 - pow(c->beta1, t))));
    }
    return CG_OK;
}

cg_status cg_optim_step_scaled(cg_optim *o, double lr, double grad_scale) {
    coefs k;
    cg_status st = step_coefs(o, lr, grad_scale, "[optim_step]", &k);
    if (st) return st;
    if (o->graph)
        return cgi_fail(CG_ERR_STATE, "[optim_step] the optimizer is attached to a graph (cg_optim_attach), whose "
                        "backward keeps no gradients: step with cg_optim_backward_step");
    cgi_params_settle(o->ps, 0, -1); /* unused parameters' gradients read as zero */
    const chunks_args c = {o, o->ps, &k, NULL, NULL, 0};
    cgi_par_ranges(NCHUNK, o->hi - o->lo, step_chunks, (void *)&c);
    o->steps++;
    cgi_params_stepped(o->ps); /* the trainable weights' bf16 copies are remade once, at their next use */
    return CG_OK;
}

/* ---- the update inside backward ---- */

/* Parameter i's update in place over its own elements [lo, hi) of the block, its gradient a copy
 * of its own (element lo's at g), in pieces on the run's threads: the same elementwise arithmetic
 * as cg_optim_step's, so the same bits. */
/* A multiple of 16 elements: no cache line shared by two threads. 2^14, not 2^16: inside a team a
 * parameter of one piece (gpt-tiny's 256 x 256 projections and embeddings, 2^16 elements) was
 * updated on thread 0 alone, and a team shares pieces from 2^14 elements (CGI_TEAM_PART_MIN). */
enum { UPDATE_PIECE = 1 << 14 };

typedef struct {
    cg_optim *o;
    int i;
    int64_t lo, hi;
    const cg_real *g;
    const coefs *k;
} update_args;

static void update_pieces(int64_t q0, int64_t q1, void *ctx) {
    const update_args *u = ctx;
    for (int64_t q = q0; q < q1; q++) {
        const int64_t a = u->lo + q * UPDATE_PIECE, e = a + UPDATE_PIECE < u->hi ? a + UPDATE_PIECE : u->hi;
        update_range(u->o, u->i, a, e, u->g + (a - u->lo), u->k);
    }
}

static void update_param(cg_optim *o, int i, int64_t lo, int64_t hi, const cg_real *g, const coefs *k) {
    const update_args u = {o, i, lo, hi, g, k};
    cgi_par_ranges((hi - lo + UPDATE_PIECE - 1) / UPDATE_PIECE, hi - lo, update_pieces, (void *)&u);
    o->stepped[i] = true;
}

/* The index of block parameter p in the set (offsets rise with the index), or -1. */
static int param_index(cg_optim *o, const cg_tensor *p) {
    const int i = first_param(o->ps, o->n, p->block_off);
    return i < o->n && cg_params_at(o->ps, i) == p ? i : index_of(o, p);
}

/* Backward's report that p's gradient is final: its update, at once. */
static void on_grad_ready(cg_tensor *p, void *ctx) {
    cg_optim *o = ctx;
    const int i = p->trainable && p->store == CGI_STORE_BLOCK ? param_index(o, p) : -1;
    if (i < 0 || o->stepped[i]) return;
    update_param(o, i, param_off(o->ps, i), param_off(o->ps, i) + param_len(o->ps, i), p->grad, o->pass);
}

cg_status cg_optim_attach(cg_optim *o, cg_graph *g) {
    if (!o) return cgi_fail(CG_ERR_ARG, "[optim_attach] optimizer is NULL");
    if (o->graph == g) return CG_OK;
    if (g && g->mode != CG_TRAIN) return cgi_fail(CG_ERR_ARG, "[optim_attach] the graph was built in eval mode");
    if (g && g->param_grads_planned)
        return cgi_fail(CG_ERR_STATE, "[optim_attach] the graph has another optimizer attached");
    if (g && (o->lo != 0 || o->hi != o->span))
        return cgi_fail(CG_ERR_STATE, "[optim_attach] the optimizer is sharded ([%lld, %lld) of %lld elements): its "
                        "updates wait for the gathered gradients", (long long)o->lo, (long long)o->hi, (long long)o->span);
    if (g && !o->stepped && !(o->stepped = calloc((size_t)o->n, sizeof *o->stepped)))
        return cgi_fail(CG_ERR_NOMEM, "[optim_attach] out of memory for %d parameters", o->n);
    if (o->graph) /* the old graph plans its gradients as before, from its next forward */
        o->graph->param_grads_planned = false, o->graph->planned = o->graph->ran_forward = false;
    o->graph = g;
    if (g) g->param_grads_planned = true, g->planned = g->ran_forward = false;
    return CG_OK;
}

cg_status cg_optim_backward_step(cg_optim *o, cg_graph *g, cg_tensor *loss, double lr) {
    coefs k;
    cg_status st = step_coefs(o, lr, 1.0, "[optim_backward_step]", &k);
    if (st) return st;
    if (!g || o->graph != g)
        return cgi_fail(CG_ERR_STATE, "[optim_backward_step] the optimizer is not attached to this graph: call "
                        "cg_optim_attach before its first forward");
    if (g->ready_fn)
        return cgi_fail(CG_ERR_STATE, "[optim_backward_step] the graph reports its gradients elsewhere "
                        "(cg_graph_on_grad_ready): their reduction must end before any update");
    memset(o->stepped, 0, (size_t)o->n * sizeof *o->stepped);
    o->pass = &k;
    cg_graph_on_grad_ready(g, on_grad_ready, o);
    g->fused_backward = true;
    st = cg_graph_backward(g, loss);
    g->fused_backward = false;
    cg_graph_on_grad_ready(g, NULL, NULL);
    o->pass = NULL;
    if (st) return st;
    /* parameters the loss does not reach are updated as cg_optim_step would, from a zero gradient */
    for (int i = 0; i < o->n; i++) {
        cg_tensor *p = cg_params_at(o->ps, i);
        if (o->stepped[i] || !p->trainable || p->store != CGI_STORE_BLOCK) continue;
        p->grad_stale = true;
        cgi_param_settle(p);
        update_param(o, i, param_off(o->ps, i), param_off(o->ps, i) + param_len(o->ps, i), p->grad, &k);
    }
    o->steps++;
    cgi_params_stepped(o->ps); /* as cg_optim_step: only the trainable weights changed */
    return CG_OK;
}

int64_t cg_optim_steps(const cg_optim *o) { return o ? o->steps : 0; }

cg_status cg_optim_set_steps(cg_optim *o, int64_t steps) {
    if (!o) return cgi_fail(CG_ERR_ARG, "[optim_set_steps] optimizer is NULL");
    if (steps < 0) return cgi_fail(CG_ERR_ARG, "[optim_set_steps] steps %lld < 0", (long long)steps);
    o->steps = steps;
    return CG_OK;
}

cg_status cg_optim_shard(cg_optim *o, int64_t lo, int64_t hi) {
    if (!o) return cgi_fail(CG_ERR_ARG, "[optim_shard] optimizer is NULL");
    if (lo < 0 || hi > o->span || lo > hi || lo % CHUNK_ALIGN)
        return cgi_fail(CG_ERR_ARG, "[optim_shard] [%lld, %lld) is not a range of the %lld-element block starting at a "
                        "multiple of %d", (long long)lo, (long long)hi, (long long)o->span, CHUNK_ALIGN);
    /* moments of the new range, carried over where the old one covered them */
    const int64_t n = hi - lo, bytes = (n * (int64_t)sizeof(cg_real) + CGI_ALIGN - 1) / CGI_ALIGN * CGI_ALIGN;
    cg_real *nb[2] = {NULL, NULL}, *old[2] = {o->m, o->v};
    for (int k = 0; k < 2; k++) {
        if (!old[k]) continue;
        if (!(nb[k] = cgi_alloc_large((size_t)(bytes ? bytes : CGI_ALIGN)))) {
            free(nb[0]);
            return cgi_fail(CG_ERR_NOMEM, "[optim_shard] cannot allocate moments for %lld elements", (long long)n);
        }
        memset(nb[k], 0, (size_t)bytes);
        const int64_t a = lo > o->lo ? lo : o->lo, e = hi < o->hi ? hi : o->hi;
        if (a < e) memcpy(nb[k] + (a - lo), old[k] + (a - o->lo), (size_t)(e - a) * sizeof(cg_real));
    }
    free(o->m), free(o->v);
    o->m = nb[0], o->v = nb[1];
    o->lo = lo, o->hi = hi;
    return CG_OK;
}

void cg_optim_shard_range(const cg_optim *o, int64_t *lo, int64_t *hi) {
    *lo = o ? o->lo : 0;
    *hi = o ? o->hi : 0;
}

cg_real *cg_optim_moment1(cg_optim *o) { return o ? o->m : NULL; }
cg_real *cg_optim_moment2(cg_optim *o) { return o ? o->v : NULL; }

/* ---- gradients ---- */

/* Sum of squares in double over 8 fixed lanes: vectorisable without reassociating, and the
 * same order whatever the thread count. */
static double sum_squares(const cg_real *x, int64_t n) {
    double lane[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) lane[l] += (double)x[j + l] * (double)x[j + l];
    double s = 0;
    for (; j < n; j++) s += (double)x[j] * (double)x[j];
    for (int l = 0; l < 8; l++) s += lane[l];
    return s;
}

static void norm_chunks(int64_t c0, int64_t c1, void *ctx) {
    const chunks_args *c = ctx;
    const int64_t span = cg_params_span(c->ps);
    const int n = cg_params_count(c->ps);
    const cg_real *G = cgi_params_grads(c->ps);
    for (int ch = (int)c0; ch < (int)c1; ch++) {
        int64_t lo, hi;
        chunk_bounds(span, ch, &lo, &hi);
        double s = 0;
        if (lo < hi) {
            FOR_RANGES(c->ps, n, lo, hi, {
                (void)i;
                s += sum_squares(G + a, e - a);
            })
        }
        c->part[ch] = s;
    }
}

static void scale_chunks(int64_t c0, int64_t c1, void *ctx) {
    const chunks_args *c = ctx;
    const int64_t span = cg_params_span(c->ps);
    const int n = cg_params_count(c->ps);
    cg_real *G = c->grads;
    for (int ch = (int)c0; ch < (int)c1; ch++) {
        int64_t lo, hi;
        chunk_bounds(span, ch, &lo, &hi);
        if (lo >= hi) continue;
        FOR_RANGES(c->ps, n, lo, hi, {
            (void)i;
            for (int64_t j = a; j < e; j++) G[j] *= c->by;
        })
    }
}

/* The norm's pass alone: chunk sums in a fixed order, so the same bits at any thread count. */
static double grad_norm(cg_params *ps) {
    cgi_params_settle(ps, 0, -1);
    double part[NCHUNK];
    const chunks_args c = {NULL, ps, NULL, part, NULL, 0};
    cgi_par_ranges(NCHUNK, cg_params_span(ps), norm_chunks, (void *)&c);
    double sum = 0;
    for (int ch = 0; ch < NCHUNK; ch++) sum += part[ch];
    return sqrt(sum);
}

double cg_grad_norm(cg_params *ps) {
    if (!ps) {
        cgi_fail(CG_ERR_ARG, "[grad_norm] parameter set is NULL");
        return NAN;
    }
    return grad_norm(ps);
}

double cg_clip_scale(double norm, double max_norm) {
    const double coef = max_norm / (norm + 1e-6);
    return isfinite(norm) && coef < 1 ? coef : 1.0;
}

double cg_clip_grad_norm(cg_params *ps, double max_norm) {
    if (!ps) {
        cgi_fail(CG_ERR_ARG, "[clip_grad_norm] parameter set is NULL");
        return NAN;
    }
    if (!(max_norm >= 0)) {
        cgi_fail(CG_ERR_ARG, "[clip_grad_norm] max_norm %g must be >= 0", max_norm);
        return NAN;
    }
    const double norm = grad_norm(ps), coef = cg_clip_scale(norm, max_norm);
    if (coef < 1) cg_grads_scale(ps, coef);
    return norm;
}

void cg_grads_scale(cg_params *ps, double s) {
    if (!ps) return;
    cgi_params_settle(ps, 0, -1);
    const chunks_args c = {NULL, ps, NULL, NULL, cgi_params_grads(ps), (cg_real)s};
    cgi_par_ranges(NCHUNK, cg_params_span(ps), scale_chunks, (void *)&c);
}
