/* SPDX-License-Identifier: MIT */
/* The fused attention (cg_sdpa) against its composite twin, matmul -> masked softmax -> matmul,
 * forward and backward, at sizes that span several query blocks and several 256-key blocks, with causal masks (Tq == Tk,
 * Tq < Tk, Tq > Tk), key padding, rows with every key hidden, and strided head views; the biases
 * (ALiBi, T5's table, a bias tensor) against a materialised bias added by the twin, and dropout
 * against the twin multiplying by the mask materialised from the same hash; and the packing under
 * its micro-kernel path: BLIS's packing kernels against the loops that stand in where BLIS has none. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"
#include "graph/internal.h"
#include "ops/attention_internal.h"

typedef struct {
    int64_t b, h, tq, tk, d;
    bool causal, padding, all_hidden_row, views;
    int64_t hk, window; /* key/value heads (0: h) and sliding window (0: none), through cg_sdpa_ex */
    bool alibi;
    int64_t t5; /* T5 table buckets (0: none), max distance 20 */
    int bias;   /* a bias tensor: 0 none, 1 [1, H, Tq, Tk], 2 [B, 1, 1, Tk], 3 [Tq, Tk] */
    double dropout;
} cfg;

enum { NLEAF = 5 }; /* q, k, v, bias, T5 table */

/* T5's bucket, written from the paper's description (exact buckets below half, then logarithmic to
 * max_distance), in double precision; hand-checked in t5_buckets below. */
static int64_t t5_ref(int64_t rel, bool bidirectional, int64_t nb, int64_t maxd) {
    int64_t base = 0;
    if (bidirectional) {
        nb /= 2;
        base = rel > 0 ? nb : 0;
        rel = labs((long)rel);
    } else rel = rel < 0 ? -rel : 0;
    const int64_t exact = nb / 2;
    if (rel < exact) return base + rel;
    const int64_t large = exact + (int64_t)(log((double)rel / exact) / log((double)maxd / exact) * (double)(nb - exact));
    return base + (large < nb - 1 ? large : nb - 1);
}

/* ALiBi's slopes for n heads as BLOOM's get_slopes lists them. */
static double alibi_ref(int64_t h, int64_t n) {
    int64_t p = 1;
    while (2 * p <= n) p *= 2;
    if (h < p) return pow(pow(2.0, -8.0 / (double)p), (double)(h + 1));
    return pow(pow(2.0, -4.0 / (double)p), (double)(2 * (h - p) + 1));
}

/* The fused node's id and the dropout step of its forward, so the twin can draw the same mask. */
static int drop_id;
static const uint64_t drop_seed = 77, drop_step = 5;

static size_t last_aux; /* the fused node's scratch bytes in the last run */

static cg_precision run_precision = CG_FP32; /* the precision of run's graphs */

static void run(const cfg *c, bool fused, cg_real **out, cg_real *grads[NLEAF]) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, run_precision) == CG_OK, "%s", cg_last_error());
    cg_rng r;
    cg_rng_seed(&r, 5);
    const int64_t hk = c->hk ? c->hk : c->h;
    int64_t sq[4] = {c->b, c->h, c->tq, c->d}, sk[4] = {c->b, hk, c->tk, c->d};
    cg_tensor *leaf[NLEAF] = {0}, *q, *k, *v;
    if (c->views) { /* q, k, v as head views of one [B, T, 3*H*D] tensor, as in GPT-2 */
        int64_t s3[3] = {c->b, c->tq, 3 * c->h * c->d};
        leaf[0] = cg_requires_grad(cg_input(g, "qkv", CG_REAL, 3, s3));
        cg_fill_uniform(leaf[0], &r, -2, 2);
        cg_tensor *p[3];
        cg_split(g, leaf[0], -1, 3, NULL, p);
        q = cg_split_heads(g, p[0], (int)c->h), k = cg_split_heads(g, p[1], (int)c->h), v = cg_split_heads(g, p[2], (int)c->h);
        leaf[1] = leaf[2] = NULL;
    } else {
        leaf[0] = q = cg_requires_grad(cg_input(g, "q", CG_REAL, 4, sq));
        leaf[1] = k = cg_requires_grad(cg_input(g, "k", CG_REAL, 4, sk));
        leaf[2] = v = cg_requires_grad(cg_input(g, "v", CG_REAL, 4, sk));
        for (int i = 0; i < 3; i++) cg_fill_uniform(leaf[i], &r, -2, 2);
    }
    cg_tensor *kp = NULL;
    if (c->padding) {
        kp = cg_input(g, "keep", CG_INT32, 2, (int64_t[]){c->b, c->tk});
        for (int64_t i = 0; i < c->b * c->tk; i++) cg_idata(kp)[i] = (cg_rng_next(&r) % 4) != 0;
        for (int64_t bb = 0; bb < c->b; bb++) cg_idata(kp)[bb * c->tk] = 1;
        if (c->all_hidden_row) memset(cg_idata(kp), 0, (size_t)c->tk * sizeof(int32_t)); /* batch 0 sees nothing */
    }
    cg_tensor *bias = NULL, *table = NULL;
    if (c->bias) {
        const int64_t shapes[3][4] = {{1, c->h, c->tq, c->tk}, {c->b, 1, 1, c->tk}, {c->tq, c->tk}};
        leaf[3] = bias = cg_requires_grad(cg_input(g, "bias", CG_REAL, c->bias == 3 ? 2 : 4, shapes[c->bias - 1]));
        cg_fill_uniform(bias, &r, -1, 1);
    }
    if (c->t5) {
        leaf[4] = table = cg_requires_grad(cg_input(g, "t5", CG_REAL, 2, (int64_t[]){c->t5, c->h}));
        cg_fill_uniform(table, &r, -1, 1);
    }
    const double scale = 1.0 / sqrt((double)c->d);
    cg_tensor *o;
    cg_graph_set_rng(g, drop_seed, drop_step);
    if (fused && (c->hk || c->window || c->alibi || c->t5 || c->bias || c->dropout)) {
        const cg_sdpa_opts opts = {.scale = scale, .causal = c->causal, .key_padding = kp, .window = c->window,
                                   .alibi = c->alibi, .rel_bias = table, .rel_max_distance = 20, .bias = bias,
                                   .dropout = c->dropout};
        o = cg_sdpa_ex(g, q, k, v, &opts);
        if (o) drop_id = o->id;
    } else if (fused) o = cg_sdpa(g, q, k, v, scale, c->causal, kp);
    else {
        if (hk != c->h) { /* each key head repeated for its group of query heads */
            cg_tensor *rep = cg_input(g, "rep", CG_INT32, 1, (int64_t[]){c->h});
            for (int64_t i = 0; i < c->h; i++) cg_idata(rep)[i] = (int32_t)(i / (c->h / hk));
            k = cg_index_select(g, k, 1, rep), v = cg_index_select(g, v, 1, rep);
        }
        cg_tensor *mask = NULL;
        if (c->window) { /* -inf outside the window, built by hand */
            mask = cg_input(g, "window", CG_REAL, 2, (int64_t[]){c->tq, c->tk});
            for (int64_t i = 0; i < c->tq; i++)
                for (int64_t j = 0; j < c->tk; j++) {
                    const int64_t p = i + c->tk - c->tq;
                    const bool seen = j > p - c->window && (c->causal || j < p + c->window);
                    cg_data(mask)[i * c->tk + j] = seen ? 0 : -INFINITY;
                }
        }
        if (c->alibi || c->t5) { /* the relative biases materialised as [H, Tq, Tk]; T5's gathered from its table */
            cg_tensor *rel = cg_input(g, "alibi", CG_REAL, 3, (int64_t[]){c->h, c->tq, c->tk});
            cg_tensor *idx = cg_input(g, "buckets", CG_INT32, 1, (int64_t[]){c->tq * c->tk});
            for (int64_t hh = 0; hh < c->h; hh++)
                for (int64_t i = 0; i < c->tq; i++)
                    for (int64_t j = 0; j < c->tk; j++) {
                        const int64_t dist = j - (i + c->tk - c->tq);
                        cg_data(rel)[(hh * c->tq + i) * c->tk + j] =
                            c->alibi ? (cg_real)(-alibi_ref(hh, c->h) * (double)labs((long)dist)) : 0;
                        cg_idata(idx)[i * c->tk + j] = (int32_t)t5_ref(dist, !c->causal, c->t5, 20);
                    }
            if (table) { /* [Tq Tk, H] rows of the table -> [H, Tq, Tk] */
                cg_tensor *rows = cg_reshape(g, cg_index_select(g, table, 0, idx), 3, (int64_t[]){c->tq, c->tk, c->h});
                rel = cg_add(g, rel, cg_permute(g, rows, (const int[]){2, 0, 1}));
            }
            mask = mask ? cg_add(g, mask, rel) : rel;
        }
        if (bias) mask = mask ? cg_add(g, mask, bias) : bias;
        cg_tensor *w = cg_masked_softmax(g, cg_matmul(g, q, cg_transpose(g, k, -1, -2)), scale, mask, c->causal, kp);
        if (c->dropout) { /* the fused node's mask, drawn from the same hash: element (b, h, i, j) of [B, H, Tq, Tk] */
            cg_tensor *m = cg_input(g, "drop", CG_REAL, 4, (int64_t[]){c->b, c->h, c->tq, c->tk});
            const uint64_t key = cgi_dropout_key(drop_seed, drop_id, drop_step), thr = cgi_dropout_threshold(c->dropout);
            for (int64_t e = 0; e < cg_numel(m); e++)
                cg_data(m)[e] = cgi_dropout_keeps(key, (uint64_t)e, thr) ? (cg_real)(1.0 / (1.0 - c->dropout)) : 0;
            w = cg_mul(g, w, m);
        }
        o = cg_matmul(g, w, v);
    }
    cg_tensor *w = cg_input(g, "w", CG_REAL, 4, cg_shape(o));
    cg_fill_uniform(w, &r, -1, 1);
    cg_retain(o);
    if (fused) last_aux = o->aux_bytes;
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, o, w));
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    *out = malloc((size_t)cg_numel(o) * sizeof(cg_real));
    cg_read(o, *out);
    for (int i = 0; i < NLEAF; i++) {
        grads[i] = NULL;
        if (!leaf[i]) continue;
        grads[i] = malloc((size_t)cg_numel(leaf[i]) * sizeof(cg_real));
        cg_read_grad(leaf[i], grads[i]);
    }
    if (fused) last_aux = o->aux_bytes; /* as the plan left it */
    cg_graph_free(g);
}

static double rel_diff(const cg_real *a, const cg_real *b, int64_t n) {
    double worst = 0, big = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)a[i] - (double)b[i]));
        big = fmax(big, fabs((double)b[i]));
        if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
    }
    return worst / big;
}

static void compare(const char *what, const cfg *c) {
    cg_real *oa, *ob, *ga[NLEAF], *gb[NLEAF];
    run(c, true, &oa, ga);
    run(c, false, &ob, gb);
    const double tol = sizeof(cg_real) == 4 ? 2e-5 : 1e-12;
    int64_t no = c->b * c->h * c->tq * c->d, nk = c->b * (c->hk ? c->hk : c->h) * c->tk * c->d;
    double e = rel_diff(oa, ob, no);
    CHECK(e <= tol, "%s: output differs by %g", what, e);
    const int64_t nbias[4] = {0, c->h * c->tq * c->tk, c->b * c->tk, c->tq * c->tk};
    for (int i = 0; i < NLEAF; i++) {
        if (!ga[i]) continue;
        int64_t n = c->views && i == 0 ? c->b * c->tq * 3 * c->h * c->d : i == 0 ? no : i < 3 ? nk : i == 3 ? nbias[c->bias] : c->t5 * c->h;
        e = rel_diff(ga[i], gb[i], n);
        CHECK(e <= tol, "%s: gradient %d differs by %g", what, i, e);
    }
    free(oa);
    free(ob);
    for (int i = 0; i < NLEAF; i++) free(ga[i]), free(gb[i]);
}

/* The fused output and gradients of two runs of c, bit for bit (same < 0: must differ). */
static void same_bits(const char *what, const cfg *a, const cfg *b, bool same) {
    cg_real *oa, *ob, *ga[NLEAF], *gb[NLEAF];
    run(a, true, &oa, ga);
    run(b, true, &ob, gb);
    const size_t n = (size_t)(a->b * a->h * a->tq * a->d) * sizeof(cg_real);
    CHECK((memcmp(oa, ob, n) == 0) == same, "%s: outputs %s", what, same ? "differ" : "are the same");
    for (int i = 0; i < 3 && same; i++)
        CHECK(memcmp(ga[i], gb[i], (size_t)(i ? a->b * a->h * a->tk * a->d : a->b * a->h * a->tq * a->d) * sizeof(cg_real)) == 0,
              "%s: gradient %d differs", what, i);
    free(oa);
    free(ob);
    for (int i = 0; i < NLEAF; i++) free(ga[i]), free(gb[i]);
}

/* Probabilities that backward remakes (the plan's choice where they are live at its peak, forced
 * here by CGRAD_ATTN_PROBS) give the outputs and gradients of the kept ones bit for bit, and the
 * node's scratch holds B x H x Tq x Tk floats less, but for a copy of K^T per thread. */
static void remade_probs(const char *what, const cfg *c) {
    cg_real *ok, *orm, *gk[NLEAF], *gr[NLEAF];
    setenv("CGRAD_ATTN_PROBS", "keep", 1);
    run(c, true, &ok, gk);
    const size_t aux_kept = last_aux;
    setenv("CGRAD_ATTN_PROBS", "remake", 1);
    run(c, true, &orm, gr);
    const size_t aux_remade = last_aux;
    unsetenv("CGRAD_ATTN_PROBS");
    const int64_t hk = c->hk ? c->hk : c->h, no = c->b * c->h * c->tq * c->d, nk = c->b * hk * c->tk * c->d;
    const int64_t nbias[4] = {0, c->h * c->tq * c->tk, c->b * c->tk, c->tq * c->tk};
    CHECK(memcmp(ok, orm, (size_t)no * sizeof *ok) == 0, "%s: outputs differ with the probabilities remade", what);
    for (int i = 0; i < NLEAF; i++) {
        if (!gk[i]) continue;
        const int64_t n = c->views && i == 0 ? c->b * c->tq * 3 * c->h * c->d : i == 0 ? no : i < 3 ? nk : i == 3 ? nbias[c->bias] : c->t5 * c->h;
        CHECK(memcmp(gk[i], gr[i], (size_t)n * sizeof(cg_real)) == 0, "%s: gradient %d differs with the probabilities remade",
              what, i);
    }
    const size_t probs = (size_t)(c->b * c->h * c->tq * c->tk) * (run_precision == CG_BF16 ? 2 : sizeof(cg_real));
    CHECK(aux_kept >= aux_remade + probs / 2, "%s: scratch %zu bytes kept, %zu remade, want about %zu less", what, aux_kept,
          aux_remade, probs);
    free(ok), free(orm);
    for (int i = 0; i < NLEAF; i++) free(gk[i]), free(gr[i]);
}

/* The one-block cases of the direct and micro-kernel paths with their probabilities remade. */
static void remade_cases(void) {
    remade_probs("causal 256, D 64, head views", &(cfg){.b = 2, .h = 2, .tq = 256, .tk = 256, .d = 64, .causal = true, .views = true});
    remade_probs("full 128, D 64, padding, a fully hidden batch",
                 &(cfg){.b = 2, .h = 2, .tq = 128, .tk = 128, .d = 64, .padding = true, .all_hidden_row = true});
    remade_probs("causal 70, D 48, dropout 0.2", &(cfg){.b = 2, .h = 3, .tq = 70, .tk = 70, .d = 48, .causal = true, .dropout = 0.2});
    remade_probs("cross 64x50, D 80, bias + ALiBi", &(cfg){.b = 2, .h = 4, .tq = 64, .tk = 50, .d = 80, .alibi = true, .bias = 1});
    remade_probs("grouped 4 on 2, window 20, T5, causal 90",
                 &(cfg){.b = 2, .h = 4, .tq = 90, .tk = 90, .d = 8, .causal = true, .hk = 2, .window = 20, .t5 = 8});
}

/* Dropout's mask read off the output: with q = k = 0 every weight is 1 / Tk, and with V the identity
 * (D = Tk) output row i is row i of the dropped weights. Checks the kept fraction against 1 - p,
 * the kept values against 1 / (Tk (1 - p)), and each element against the hash at its (b, h, i, j). */
static void keep_rate(int64_t tq, int64_t tk, double p) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    const int64_t B = 2, H = 2, sq[4] = {B, H, tq, tk}, sk[4] = {B, H, tk, tk};
    cg_tensor *q = cg_input(g, "q", CG_REAL, 4, sq), *k = cg_input(g, "k", CG_REAL, 4, sk), *v = cg_input(g, "v", CG_REAL, 4, sk);
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t j = 0; j < tk; j++) cg_data(v)[(bh * tk + j) * tk + j] = 1;
    const cg_sdpa_opts opts = {.scale = 1, .dropout = p};
    cg_tensor *o = cg_retain(cg_sdpa_ex(g, q, k, v, &opts));
    cg_graph_set_rng(g, 9, 3);
    CHECK(o && cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
    const uint64_t key = cgi_dropout_key(9, o->id, 3), thr = cgi_dropout_threshold(p);
    const cg_real want = (cg_real)(1.0 / ((double)tk * (1 - p)));
    int64_t kept = 0, wrong = 0, off = 0;
    cg_real *od = malloc((size_t)cg_numel(o) * sizeof *od); /* in [B, H, Tq, Tk] order, as the hash counts */
    CHECK(od && cg_read(o, od) == CG_OK, "%s", cg_last_error());
    for (int64_t e = 0; od && e < cg_numel(o); e++) {
        const cg_real x = od[e];
        kept += x != 0;
        wrong += (x != 0) != cgi_dropout_keeps(key, (uint64_t)e, thr);
        off += x != 0 && fabs((double)(x - want)) > 1e-5 * want;
    }
    const double n = (double)cg_numel(o), rate = (double)kept / n, sd = sqrt(p * (1 - p) / n);
    CHECK(fabs(rate - (1 - p)) <= 5 * sd, "keep rate %.5f, expected %.5f +- %.5f (Tk %lld)", rate, 1 - p, 5 * sd, (long long)tk);
    CHECK(wrong == 0 && off == 0, "Tk %lld: %lld elements against the hash, %lld kept values off", (long long)tk,
          (long long)wrong, (long long)off);
    free(od);
    cg_graph_free(g);
}

/* Bad options are refused with a message naming the op and the shapes. */
static void refused(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    const int64_t sq[4] = {2, 4, 5, 8}, sk[4] = {2, 2, 7, 8};
    cg_tensor *q = cg_input(g, "q", CG_REAL, 4, sq), *k = cg_input(g, "k", CG_REAL, 4, sk), *v = cg_input(g, "v", CG_REAL, 4, sk);
    const struct { cg_sdpa_opts o; const char *says; } bad[] = {
        {{.scale = 1, .dropout = 1}, "dropout 1 must be in [0, 1)"},
        {{.scale = 1, .bias = cg_input(g, "b", CG_REAL, 3, (int64_t[]){3, 5, 7})}, "bias[3,5,7] must broadcast to [B, Hq, Tq, Tk] = [2,4,5,7]"},
        {{.scale = 1, .rel_bias = cg_input(g, "t", CG_REAL, 2, (int64_t[]){32, 2})}, "rel_bias[32,2] must be [num_buckets, Hq = 4]"},
        {{.scale = 1, .rel_bias = cg_input(g, "t", CG_REAL, 2, (int64_t[]){8, 4}), .rel_max_distance = 2}, "max distance 2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(cg_sdpa_ex(g, q, k, v, &bad[i].o) == NULL && strstr(cg_last_error(), "[sdpa]") &&
                  strstr(cg_last_error(), bad[i].says),
              "case %zu: %s", i, cg_last_error());
    }
    cg_graph_free(g);
}

static void dropout_cases(void) {
    const cfg base = {.b = 2, .h = 3, .tq = 90, .tk = 90, .d = 8, .causal = true, .alibi = true, .dropout = 0.25};
    same_bits("dropout, same seed and step twice", &base, &base, true);
    cfg other = base;
    other.dropout = 0.3;
    same_bits("dropout 0.25 against 0.3", &base, &other, false);
    cfg none = base, zero = base;
    none.dropout = 0, zero.dropout = 1e-300; /* p > 0 that drops nothing: the dropout path, bit for bit */
    same_bits("dropout ~0 against none", &none, &zero, true);
    keep_rate(100, 200, 0.1);  /* probabilities kept */
    keep_rate(40, 300, 0.35); /* recomputed from the log-sum-exp, two key blocks */
}

/* Packs a matrix both ways (BLIS's kernel, then the fallback loops) for every stride order and
 * compares the panels element by element, padding included. */
static void packing_fallback(void) {
    cgi_ukr u, plain;
    cgi_ukr_init(&u);
    plain = u;
    plain.pack_a = plain.pack_b = NULL;
    enum { R = 13, K = 37 };
    cg_real src[R * K];
    for (int i = 0; i < R * K; i++) src[i] = (cg_real)(i % 29) - 14;
    const size_t ra = cgi_ukr_packed_a(&u, R, K), rb = cgi_ukr_packed_b(&u, K, R), room = ra > rb ? ra : rb;
    /* the panels; the room after them is the kernel's read-ahead, which no pack writes */
    const size_t na = (size_t)((R + u.mr - 1) / u.mr * u.pmr * K), nb = (size_t)((R + u.nr - 1) / u.nr * u.pnr * K);
    cg_real *x = malloc(room * sizeof(cg_real)), *y = malloc(room * sizeof(cg_real));
    for (int order = 0; order < 2; order++) { /* the source by rows, then by columns */
        const int64_t rs = order ? 1 : K, cs = order ? R : 1;
        for (size_t i = 0; i < na; i++) x[i] = 7, y[i] = -7;
        cgi_ukr_pack_a(&u, R, K, src, rs, cs, x);
        cgi_ukr_pack_a(&plain, R, K, src, rs, cs, y);
        CHECK(memcmp(x, y, na * sizeof(cg_real)) == 0, "A panels differ (order %d)", order);
        for (size_t i = 0; i < nb; i++) x[i] = 7, y[i] = -7;
        cgi_ukr_pack_b(&u, K, R, src, cs, rs, x); /* B [K, R] is the same numbers, transposed */
        cgi_ukr_pack_b(&plain, K, R, src, cs, rs, y);
        CHECK(memcmp(x, y, nb * sizeof(cg_real)) == 0, "B panels differ (order %d)", order);
    }
    CHECK(y[0] == src[0] && y[1] == src[1], "B panel starts with row 0 of B: %g %g", (double)y[0], (double)y[1]);
    free(x);
    free(y);
}

/* cgi_attn_mm against a plain double loop, at sizes off its 6 x 64 tile (rows 1..70, columns
 * 1..130, depth 1..129), A by rows and transposed, beta 0 and 1, and with the causal arguments:
 * A is zero where a row's depth lies outside [row + k_first, row + 1 + k_diag) (as attention's
 * hidden weights are), so skipping that depth must give the whole product, and the columns up
 * to row + n_diag must be right (those after may stay unwritten). */
static void direct_products(void) {
    const int64_t ms[] = {1, 5, 6, 7, 13, 64, 70}, ns[] = {1, 15, 16, 17, 48, 64, 65, 80, 130}, ks[] = {1, 7, 64, 129};
    cg_rng r;
    cg_rng_seed(&r, 3);
    enum { CAP = 140 * 140 };
    cg_real *a = malloc(CAP * sizeof *a), *b = malloc(CAP * sizeof *b), *c = malloc(CAP * sizeof *c);
    double *want = malloc(CAP * sizeof *want);
    int cases = 0;
    for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
                for (int variant = 0; variant < 4; variant++) {
                    const int64_t m = ms[mi], n = ns[ni], k = ks[ki];
                    const bool trans = variant & 1, causal = variant & 2;
                    const cg_real beta = (cg_real)((mi + ni + ki) % 2), alpha = (cg_real)0.75;
                    /* causal: rows see depth [row - 3, row + 2) and columns up to row + 5 */
                    const int64_t kd = causal ? 1 : CGI_UKR_FULL, kf = causal ? -3 : CGI_UKR_FULL,
                                  nd = causal ? 5 : CGI_UKR_FULL;
                    const int64_t ars = trans ? 1 : k + 2, acs = trans ? m + 3 : 1, bs = n + 1, cs = n + 4;
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t p = 0; p < k; p++) {
                            const bool seen = !causal || (p >= i - 3 && p < i + 2);
                            a[i * ars + p * acs] = seen ? (cg_real)(2 * cg_rng_uniform(&r) - 1) : 0;
                        }
                    for (int64_t p = 0; p < k; p++)
                        for (int64_t j = 0; j < n; j++) b[p * bs + j] = (cg_real)(2 * cg_rng_uniform(&r) - 1);
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t j = 0; j < n; j++) {
                            c[i * cs + j] = (cg_real)(2 * cg_rng_uniform(&r) - 1);
                            double s = 0;
                            for (int64_t p = 0; p < k; p++) s += (double)a[i * ars + p * acs] * (double)b[p * bs + j];
                            want[i * n + j] = alpha * s + beta * (double)c[i * cs + j];
                        }
                    cgi_attn_mm(m, n, k, alpha, a, ars, acs, b, bs, beta, c, cs, nd, kd, kf);
                    double worst = 0;
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t j = 0; j < n && (!causal || j <= i + 5); j++)
                            worst = fmax(worst, fabs((double)c[i * cs + j] - want[i * n + j]));
                    CHECK(worst <= 1e-5 * (double)(k + 1), "cgi_attn_mm m %lld n %lld k %lld variant %d: off by %g",
                          (long long)m, (long long)n, (long long)k, variant, worst);
                    cases++;
                }
    cg_real src[37 * 29], dst[29 * 41];
    for (int i = 0; i < 37 * 29; i++) src[i] = (cg_real)i;
    cgi_attn_transpose(37, 29, src, 29, dst, 41); /* 8 x 8 blocks and both edges */
    int bad = 0;
    for (int i = 0; i < 37; i++)
        for (int j = 0; j < 29; j++) bad += dst[j * 41 + i] != src[i * 29 + j];
    CHECK(bad == 0 && cases == 7 * 9 * 4 * 4, "transpose: %d elements wrong", bad);
    free(a), free(b), free(c), free(want);
}

/* cgi_attn_softmax against a double softmax: row lengths off its 16 lanes (1..256 keys), causal rows
 * starting before the first key (vis0 < 0: leading rows see nothing), key padding by a strided
 * keep vector, a fully padded block, and a NaN score, which must reach its row (and only it). */
static void direct_softmax(void) {
    enum { NQ = 9, SS = 260 };
    const int64_t kends[] = {1, 15, 16, 17, 64, 100, 256};
    cg_rng r;
    cg_rng_seed(&r, 11);
    static cg_real s[NQ * SS], x[NQ * SS];
    int32_t keep[2 * 256];
    int cases = 0;
    for (size_t ki = 0; ki < sizeof kends / sizeof *kends; ki++)
        for (int variant = 0; variant < 5; variant++) {
            const int64_t kend = kends[ki];
            const bool causal = variant & 1, padded = variant >= 2, none_kept = variant == 4;
            const int64_t vis0 = causal ? kend / 2 - 3 : 0;
            for (int64_t c = 0; c < 2 * kend; c++) keep[c] = !none_kept && (c % 2 || cg_rng_next(&r) % 3 != 0);
            for (int64_t i = 0; i < NQ * SS; i++) x[i] = s[i] = (cg_real)(8 * cg_rng_uniform(&r) - 4);
            if (variant == 3) /* a NaN at a kept key of row 4 */
                keep[2 * (kend - 1)] = 1, x[4 * SS + kend - 1] = s[4 * SS + kend - 1] = NAN;
            cg_real lse[NQ];
            const bool any = cgi_attn_softmax(s, SS, NQ, kend, causal, vis0, padded ? keep : NULL, 2, lse);
            bool want_any = false;
            double worst = 0;
            for (int64_t q = 0; q < NQ; q++) {
                const int64_t vis = causal ? (vis0 + q < 0 ? 0 : vis0 + q > kend ? kend : vis0 + q) : kend;
                double mx = -INFINITY, l = 0;
                for (int64_t c = 0; c < vis; c++)
                    if (!padded || keep[2 * c]) mx = fmax(mx, (double)x[q * SS + c]);
                for (int64_t c = 0; c < vis; c++)
                    if (!padded || keep[2 * c]) l += exp((double)x[q * SS + c] - mx);
                /* a NaN is passed over by the max (as cgi_row_max), so a row of it alone sees nothing */
                const bool seen = mx > -INFINITY, nan_row = variant == 3 && q == 4 && vis == kend && seen;
                want_any |= seen;
                for (int64_t c = 0; c < kend; c++) {
                    const bool on = seen && c < vis && (!padded || keep[2 * c]);
                    const double want = on ? exp((double)x[q * SS + c] - mx) / l : 0, got = s[q * SS + c];
                    if (nan_row)
                        CHECK(isnan(got), "kend %lld variant %d: row 4 key %lld is %g, want NaN", (long long)kend,
                              variant, (long long)c, got);
                    else worst = fmax(worst, fabs(got - want));
                }
                CHECK(s[q * SS + kend] == x[q * SS + kend], "kend %lld variant %d: wrote past the row", (long long)kend,
                      variant);
                if (!nan_row)
                    CHECK(seen ? fabs(lse[q] - (mx + log(l))) < 1e-5 : lse[q] == INFINITY,
                          "kend %lld variant %d row %lld: lse %g, want %g", (long long)kend, variant, (long long)q,
                          (double)lse[q], seen ? mx + log(l) : INFINITY);
            }
            CHECK(worst < 1e-6 && any == want_any, "kend %lld variant %d: off by %g, any %d want %d", (long long)kend,
                  variant, worst, any, want_any);
            cases++;
        }
    CHECK(cases == 35, "%d cases", cases);
}

/* Self-attention on q, k and v cut from one [B, T, (Hq + 2 Hk) D] node: its backward writes that
 * node's gradient first, in full, instead of adding into a zeroed one (claim_qkv in ops/attention.c):
 * with one query block a head (100 queries, not causal) its products assign, with several (200, or
 * causal) or grouped query heads (4 on 2) each head zeroes the rows a block writes first. A second
 * backward zeroes none of the node's gradient (only the rest of the graph's), and the gradient
 * equals the first pass's bit for bit (the graph's memory is reused, so stale values would show). */
static void first_writer(void) {
    for (int variant = 0; variant < 6; variant++) {
        const int64_t t = variant & 1 ? 200 : 100;
        const bool causal = variant & 2, grouped = variant >= 4; /* 4: 4 query heads on 2 key heads */
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_rng r;
        cg_rng_seed(&r, 21);
        const int64_t b = 2, h = grouped ? 4 : 2, hk = 2, d = 16, s3[3] = {b, t, (h + 2 * hk) * d}, so[4] = {b, h, t, d};
        const int64_t sizes[3] = {h * d, hk * d, hk * d};
        cg_tensor *qkv = cg_requires_grad(cg_input(g, "qkv", CG_REAL, 3, s3)), *p[3];
        cg_fill_uniform(qkv, &r, -2, 2);
        cg_split(g, qkv, -1, 3, sizes, p);
        cg_tensor *o = cg_sdpa(g, cg_split_heads(g, p[0], (int)h), cg_split_heads(g, p[1], (int)hk),
                               cg_split_heads(g, p[2], (int)hk), 0.25, causal, NULL);
        cg_tensor *w = cg_input(g, "w", CG_REAL, 4, so);
        cg_fill_uniform(w, &r, -1, 1);
        cg_tensor *loss = cg_sum_all(g, cg_mul(g, o, w));
        const size_t n = (size_t)(b * t * (h + 2 * hk) * d);
        cg_real *g1 = malloc(n * sizeof *g1), *g2 = malloc(n * sizeof *g2);
        CHECK(loss && !cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
        cg_read_grad(qkv, g1);
        CHECK(!cg_graph_forward(g), "%s", cg_last_error());
        const long long before = cgi_zeroed_bytes();
        CHECK(!cg_graph_backward(g, loss), "%s", cg_last_error());
        const long long zeroed = cgi_zeroed_bytes() - before, node = (long long)(n * sizeof(cg_real));
        cg_read_grad(qkv, g2);
        CHECK(memcmp(g1, g2, n * sizeof *g1) == 0, "T %lld causal %d grouped %d: the second pass's gradient differs",
              (long long)t, causal, grouped);
        /* the rest of the graph zeroes o's gradient and the product's (and a few scalars) */
        const long long rest = 2 * (long long)(b * h * t * d * sizeof(cg_real)) + 64;
        CHECK(zeroed <= rest, "T %lld causal %d grouped %d: backward zeroed %lld bytes, want %lld at most (node %lld)",
              (long long)t, causal, grouped, zeroed, rest, node);
        free(g1), free(g2);
        cg_graph_free(g);
    }
}

/* cgi_attn_mm_panels on B transposed into panels (cgi_attn_transpose_panels) gives cgi_attn_mm's
 * result on the plain transpose bit for bit, with columns off the 64-column panels (1..200) and
 * the causal arguments a query block at i0 gets (n_diag i0, shifts by -8..130, so a panel may start
 * past every row's diagonal: its columns stay unwritten there, as with the plain B). */
static void direct_panels(void) {
    const int64_t ns[] = {1, 15, 63, 64, 65, 130, 200}, diags[] = {CGI_UKR_FULL, -8, 0, 5, 64, 130};
    enum { M = 70, K = 37, NMAX = 200 };
    cg_rng r;
    cg_rng_seed(&r, 5);
    cg_real *a = malloc(M * K * sizeof *a), *src = malloc(NMAX * (K + 3) * sizeof *src),
            *bt = malloc(K * NMAX * sizeof *bt),
            *bp = malloc((size_t)cgi_attn_panels_reals(NMAX, K) * sizeof *bp), *c1 = malloc(M * NMAX * sizeof *c1),
            *c2 = malloc(M * NMAX * sizeof *c2);
    for (int64_t i = 0; i < M * K; i++) a[i] = (cg_real)(2 * cg_rng_uniform(&r) - 1);
    for (int64_t i = 0; i < NMAX * (K + 3); i++) src[i] = (cg_real)(2 * cg_rng_uniform(&r) - 1);
    int bad = 0, cases = 0;
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
        const int64_t n = ns[ni]; /* B = the transpose of src's n rows of K (rows K + 3 apart), as K^T */
        cgi_attn_transpose(n, K, src, K + 3, bt, n);
        cgi_attn_transpose_panels(n, K, src, K + 3, bp);
        for (int64_t p = 0; p < K; p++) /* the panels hold B's elements where the layout puts them */
            for (int64_t j = 0; j < n; j++) bad += bp[j / 64 * 64 * K + p * 64 + j % 64] != bt[p * n + j];
        for (size_t di = 0; di < sizeof diags / sizeof *diags; di++)
            for (int beta = 0; beta < 2; beta++) {
                for (int64_t i = 0; i < M * NMAX; i++) c1[i] = c2[i] = (cg_real)i;
                cgi_attn_mm(M, n, K, 0.5f, a, K, 1, bt, n, (cg_real)beta, c1, NMAX, diags[di], CGI_UKR_FULL, CGI_UKR_FULL);
                cgi_attn_mm_panels(M, n, K, 0.5f, a, K, 1, bp, (cg_real)beta, c2, NMAX, diags[di], CGI_UKR_FULL,
                                   CGI_UKR_FULL);
                const int diff = memcmp(c1, c2, M * NMAX * sizeof *c1) != 0;
                CHECK(!diff, "cgi_attn_mm_panels n %lld n_diag %lld beta %d: differs from cgi_attn_mm", (long long)n,
                      (long long)diags[di], beta);
                cases++;
            }
    }
    CHECK(bad == 0 && cases == 7 * 6 * 2, "transposed panels: %d elements misplaced, %d cases", bad, cases);
    free(a), free(src), free(bt), free(bp), free(c1), free(c2);
}

/* cgi_attn_ds_panels (backward's dS = P * (dO V^T - D) in dP's tiles) against the sums in double, and
 * bit for bit against cgi_attn_mm_panels's dP then P * (dP - D) as the unfused backward rounds it,
 * with columns off the panels (1..200), rows off the 6-row strips and P's padded keys (zeros). Writes
 * nothing past n columns. */
static void direct_ds(void) {
    const int64_t ns[] = {1, 15, 64, 65, 128, 200};
    enum { M = 70, K = 37, NMAX = 200, PS = NMAX + 5 };
    cg_rng r;
    cg_rng_seed(&r, 9);
    cg_real *a = malloc(M * (K + 2) * sizeof *a), *src = malloc(NMAX * K * sizeof *src),
            *bp = malloc((size_t)cgi_attn_panels_reals(NMAX, K) * sizeof *bp), *pm = malloc(M * PS * sizeof *pm),
            *dd = malloc(M * sizeof *dd), *c1 = malloc(M * NMAX * sizeof *c1), *c2 = malloc(M * NMAX * sizeof *c2);
    for (int64_t i = 0; i < M * (K + 2); i++) a[i] = (cg_real)(2 * cg_rng_uniform(&r) - 1);
    for (int64_t i = 0; i < NMAX * K; i++) src[i] = (cg_real)(2 * cg_rng_uniform(&r) - 1);
    for (int64_t i = 0; i < M * PS; i++) pm[i] = i % 7 == 3 ? 0 : (cg_real)cg_rng_uniform(&r); /* 0: a padded key */
    for (int64_t i = 0; i < M; i++) dd[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
    int cases = 0;
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
        const int64_t n = ns[ni]; /* B = the transpose of src's n rows of K, in panels (V^T) */
        cgi_attn_transpose_panels(n, K, src, K, bp);
        for (int64_t i = 0; i < M * NMAX; i++) c1[i] = c2[i] = (cg_real)i;
        cgi_attn_ds_panels(M, n, K, a, K + 2, bp, c1, NMAX, pm, PS, dd);
        cgi_attn_mm_panels(M, n, K, 1, a, K + 2, 1, bp, 0, c2, NMAX, CGI_UKR_FULL, CGI_UKR_FULL, CGI_UKR_FULL);
        double worst = 0;
        int past = 0;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < NMAX; j++) {
                if (j >= n) { /* untouched */
                    past += c1[i * NMAX + j] != (cg_real)(i * NMAX + j);
                    continue;
                }
                double dp = 0;
                for (int64_t p = 0; p < K; p++) dp += (double)a[i * (K + 2) + p] * src[j * K + p];
                const double want = pm[i * PS + j] * (dp - dd[i]);
                worst = fmax(worst, fabs(c1[i * NMAX + j] - want));
                c2[i * NMAX + j] = pm[i * PS + j] * (c2[i * NMAX + j] - dd[i]);
            }
        CHECK(worst < 1e-5 && past == 0, "cgi_attn_ds_panels n %lld: off by %g from the double sums, %d written past n",
              (long long)n, worst, past);
        CHECK(memcmp(c1, c2, M * NMAX * sizeof *c1) == 0, "cgi_attn_ds_panels n %lld: differs from dP then P * (dP - D)",
              (long long)n);
        cases++;
    }
    CHECK(cases == 6, "%d cases", cases);
    free(a), free(src), free(bp), free(pm), free(dd), free(c1), free(c2);
}

/* The shapes of the direct products' path (kept probabilities, Tq >= 16) at feature sizes and
 * lengths off its tiles, with every option that goes through it, on the direct kernels (on; their
 * own ctest entry) or on BLIS's micro-kernel. */
static void direct_cases(bool on) {
    cgi_attn_direct_force(on);
    compare("encdec's head: full 64, D 64, padding", &(cfg){.b = 2, .h = 2, .tq = 64, .tk = 64, .d = 64, .padding = true});
    compare("causal 70, D 48, head views", &(cfg){.b = 2, .h = 2, .tq = 70, .tk = 70, .d = 48, .causal = true, .views = true});
    /* one query block a head: the products write q, k and v's gradients first (claim_qkv) */
    compare("full 100, D 32, head views, padding", &(cfg){.b = 2, .h = 2, .tq = 100, .tk = 100, .d = 32, .views = true, .padding = true});
    compare("causal 64, D 16, head views, dropout 0.2",
            &(cfg){.b = 2, .h = 3, .tq = 64, .tk = 64, .d = 16, .causal = true, .views = true, .dropout = 0.2});
    compare("cross 64x50, D 80, bias [1,H,Tq,Tk] + ALiBi",
            &(cfg){.b = 1, .h = 2, .tq = 64, .tk = 50, .d = 80, .alibi = true, .bias = 1});
    compare("causal 129, D 32, dropout 0.2", &(cfg){.b = 1, .h = 2, .tq = 129, .tk = 129, .d = 32, .causal = true, .dropout = 0.2});
    compare("causal Tq 37 < Tk 101, D 128, T5 16, grouped",
            &(cfg){.b = 1, .h = 2, .tq = 37, .tk = 101, .d = 128, .causal = true, .hk = 1, .t5 = 16});
    compare("window 30 both sides, D 24, padding, 100", &(cfg){.b = 2, .h = 2, .tq = 100, .tk = 100, .d = 24, .padding = true, .window = 30});
    cgi_attn_direct_force(true);
}

int main(int argc, char **argv) {
    /* `test_attention direct`: the AVX-512 kernels (ctest test_attention_direct), skipped without them */
    if (!strcmp(test_part(argc, argv), "direct")) {
        if (!cgi_attn_direct()) return test_skip("test_attention direct", "no AVX-512 on this CPU, or a float64 build");
        direct_products();
        direct_panels();
        direct_ds();
        direct_softmax();
        direct_cases(true);
        remade_cases();
        if (!cg_bf16_unavailable()) { /* bf16 keeps P rounded to bf16; remade, it is rounded the same */
            run_precision = CG_BF16;
            remade_probs("bf16: causal 256, D 64, head views",
                         &(cfg){.b = 2, .h = 2, .tq = 256, .tk = 256, .d = 64, .causal = true, .views = true});
            remade_probs("bf16: causal 70, D 48, dropout 0.2",
                         &(cfg){.b = 4, .h = 3, .tq = 70, .tk = 70, .d = 48, .causal = true, .dropout = 0.2});
            run_precision = CG_FP32;
        }
        TEST_END();
    }
    packing_fallback();
    first_writer();
    direct_cases(false);
    cgi_attn_direct_force(false);
    remade_cases();
    cgi_attn_direct_force(true);
    compare("causal 150x150", &(cfg){2, 3, 150, 150, 16, true, false, false, false, 0, 0, false, 0, 0, 0});
    compare("causal 600x600 (several 256-key blocks)", &(cfg){1, 2, 600, 600, 8, true, false, false, false, 0, 0, false, 0, 0, 0});
    compare("full 300x700 with padding (several key blocks)", &(cfg){1, 2, 300, 700, 8, false, true, false, false, 0, 0, false, 0, 0, 0});
    compare("cross 70x130 with padding", &(cfg){2, 2, 70, 130, 8, false, true, false, false, 0, 0, false, 0, 0, 0});
    compare("causal Tq 5 < Tk 140 (cached keys)", &(cfg){1, 2, 5, 140, 16, true, false, false, false, 0, 0, false, 0, 0, 0});
    compare("causal + padding + a fully hidden batch", &(cfg){2, 2, 80, 80, 8, true, true, true, false, 0, 0, false, 0, 0, 0});
    compare("GPT-2 head views of qkv, causal 100", &(cfg){2, 4, 100, 100, 8, true, false, false, true, 0, 0, false, 0, 0, 0});
    compare("causal Tq 40 > Tk 24 (leading rows see no key)", &(cfg){1, 2, 40, 24, 16, true, false, false, false, 0, 0, false, 0, 0, 0});
    compare("gpt-tiny's head: causal 256, D 64", &(cfg){1, 2, 256, 256, 64, true, false, false, true, 0, 0, false, 0, 0, 0});
    compare("bert-small's head: full 128 with padding, D 64", &(cfg){2, 2, 128, 128, 64, false, true, false, false, 0, 0, false, 0, 0, 0});
    compare("grouped-query: 6 query heads on 2 key heads, causal 150", &(cfg){2, 6, 150, 150, 16, true, false, false, false, 2, 0, false, 0, 0, 0});
    compare("multi-query: 4 query heads on 1, cross 70x300, padding", &(cfg){2, 4, 70, 300, 8, false, true, false, false, 1, 0, false, 0, 0, 0});
    compare("sliding window 33, causal 150", &(cfg){1, 2, 150, 150, 16, true, false, false, false, 0, 33, false, 0, 0, 0});
    compare("sliding window 100, causal 700 (skips key blocks)", &(cfg){1, 2, 700, 700, 8, true, false, false, false, 0, 100, false, 0, 0, 0});
    compare("window 20 both sides, grouped, padding, 90x90", &(cfg){2, 4, 90, 90, 8, false, true, false, false, 2, 20, false, 0, 0, 0});
    compare("window 50, causal Tq 5 < Tk 300 (cached keys), multi-query", &(cfg){1, 4, 5, 300, 16, true, false, false, false, 1, 50, false, 0, 0, 0});
    /* 3 heads: BLOOM's slopes 1/16, 1/256 and 1/4; T5's buckets worked by hand (32 buckets, 128) */
    CHECK(alibi_ref(0, 3) == 1.0 / 16 && alibi_ref(1, 3) == 1.0 / 256 && alibi_ref(2, 3) == 0.25, "slopes %g %g %g",
          alibi_ref(0, 3), alibi_ref(1, 3), alibi_ref(2, 3));
    CHECK(t5_ref(-1, true, 32, 128) == 1 && t5_ref(1, true, 32, 128) == 17 && t5_ref(-20, true, 32, 128) == 10 &&
              t5_ref(-200, true, 32, 128) == 15 && t5_ref(5, false, 32, 128) == 0 && t5_ref(-20, false, 32, 128) == 17,
          "T5 buckets %lld %lld %lld", (long long)t5_ref(-1, true, 32, 128), (long long)t5_ref(-20, true, 32, 128),
          (long long)t5_ref(-20, false, 32, 128));
    compare("ALiBi, 3 heads, causal 150", &(cfg){.b = 2, .h = 3, .tq = 150, .tk = 150, .d = 16, .causal = true, .alibi = true});
    compare("ALiBi, grouped 4 on 2, full 300x700 with padding (key blocks)",
            &(cfg){.b = 1, .h = 4, .tq = 300, .tk = 700, .d = 8, .padding = true, .hk = 2, .alibi = true});
    compare("T5 bidirectional 32 buckets, cross 70x300, padding",
            &(cfg){.b = 2, .h = 2, .tq = 70, .tk = 300, .d = 8, .padding = true, .t5 = 32});
    compare("T5 causal 16 buckets, 600 (key blocks), multi-query",
            &(cfg){.b = 1, .h = 3, .tq = 600, .tk = 600, .d = 8, .causal = true, .hk = 1, .t5 = 16});
    compare("bias [1,H,Tq,Tk] shared by the batch, causal 100, views",
            &(cfg){.b = 2, .h = 4, .tq = 100, .tk = 100, .d = 8, .causal = true, .views = true, .bias = 1});
    compare("bias [B,1,1,Tk], full 300x700", &(cfg){.b = 2, .h = 2, .tq = 300, .tk = 700, .d = 8, .bias = 2});
    compare("bias [Tq,Tk] + ALiBi + T5, window 20 both sides, grouped",
            &(cfg){.b = 2, .h = 4, .tq = 90, .tk = 90, .d = 8, .hk = 2, .window = 20, .alibi = true, .t5 = 8, .bias = 3});
    compare("dropout 0.2, causal 150 (kept, micro-kernel)",
            &(cfg){.b = 2, .h = 3, .tq = 150, .tk = 150, .d = 16, .causal = true, .dropout = 0.2});
    compare("dropout 0.1 + T5 + bias, full 300x700 with padding (recomputed)",
            &(cfg){.b = 1, .h = 2, .tq = 300, .tk = 700, .d = 8, .padding = true, .t5 = 32, .bias = 1, .dropout = 0.1});
    compare("dropout 0.5, causal Tq 5 < Tk 140 (kept, BLIS), grouped",
            &(cfg){.b = 2, .h = 4, .tq = 5, .tk = 140, .d = 16, .causal = true, .hk = 2, .dropout = 0.5});
    dropout_cases();
    refused();
    TEST_END();
}
