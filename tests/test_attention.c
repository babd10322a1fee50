/* The fused attention (cg_sdpa) against its composite twin, matmul -> masked softmax -> matmul,
 * forward and backward, at sizes that span several query blocks and several 256-key blocks, with causal masks (Tq == Tk,
 * Tq < Tk, Tq > Tk), key padding, rows with every key hidden, and strided head views; and the
 * packing under its micro-kernel path: BLIS's packing kernels against the loops that stand in
 * where BLIS has none. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"
#include "graph/internal.h"

typedef struct {
    int64_t b, h, tq, tk, d;
    bool causal, padding, all_hidden_row, views;
    int64_t hk, window; /* key/value heads (0: h) and sliding window (0: none), through cg_sdpa_ex */
} cfg;

static void run(const cfg *c, bool fused, cg_real **out, cg_real *grads[3]) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_rng r;
    cg_rng_seed(&r, 5);
    const int64_t hk = c->hk ? c->hk : c->h;
    int64_t sq[4] = {c->b, c->h, c->tq, c->d}, sk[4] = {c->b, hk, c->tk, c->d};
    cg_tensor *leaf[3], *q, *k, *v;
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
    const double scale = 1.0 / sqrt((double)c->d);
    cg_tensor *o;
    if (fused && (c->hk || c->window)) {
        const cg_sdpa_opts opts = {.scale = scale, .causal = c->causal, .key_padding = kp, .window = c->window};
        o = cg_sdpa_ex(g, q, k, v, &opts);
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
        o = cg_matmul(g, cg_masked_softmax(g, cg_matmul(g, q, cg_transpose(g, k, -1, -2)), scale, mask, c->causal, kp), v);
    }
    cg_tensor *w = cg_input(g, "w", CG_REAL, 4, cg_shape(o));
    cg_fill_uniform(w, &r, -1, 1);
    cg_retain(o);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, o, w));
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    *out = malloc((size_t)cg_numel(o) * sizeof(cg_real));
    cg_read(o, *out);
    for (int i = 0; i < 3; i++) {
        grads[i] = NULL;
        if (!leaf[i]) continue;
        grads[i] = malloc((size_t)cg_numel(leaf[i]) * sizeof(cg_real));
        cg_read_grad(leaf[i], grads[i]);
    }
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
    cg_real *oa, *ob, *ga[3], *gb[3];
    run(c, true, &oa, ga);
    run(c, false, &ob, gb);
    const double tol = sizeof(cg_real) == 4 ? 2e-5 : 1e-12;
    int64_t no = c->b * c->h * c->tq * c->d, nk = c->b * (c->hk ? c->hk : c->h) * c->tk * c->d;
    double e = rel_diff(oa, ob, no);
    CHECK(e <= tol, "%s: output differs by %g", what, e);
    for (int i = 0; i < 3; i++) {
        if (!ga[i]) continue;
        int64_t n = c->views ? c->b * c->tq * 3 * c->h * c->d : i ? nk : no;
        e = rel_diff(ga[i], gb[i], n);
        CHECK(e <= tol, "%s: gradient %d differs by %g", what, i, e);
    }
    free(oa);
    free(ob);
    for (int i = 0; i < 3; i++) free(ga[i]), free(gb[i]);
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
    const size_t na = cgi_ukr_packed_a(&u, R, K), nb = cgi_ukr_packed_b(&u, K, R);
    cg_real *x = malloc((na > nb ? na : nb) * sizeof(cg_real)), *y = malloc((na > nb ? na : nb) * sizeof(cg_real));
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

int main(void) {
    packing_fallback();
    compare("causal 150x150", &(cfg){2, 3, 150, 150, 16, true, false, false, false, 0, 0});
    compare("causal 600x600 (several 256-key blocks)", &(cfg){1, 2, 600, 600, 8, true, false, false, false, 0, 0});
    compare("full 300x700 with padding (several key blocks)", &(cfg){1, 2, 300, 700, 8, false, true, false, false, 0, 0});
    compare("cross 70x130 with padding", &(cfg){2, 2, 70, 130, 8, false, true, false, false, 0, 0});
    compare("causal Tq 5 < Tk 140 (cached keys)", &(cfg){1, 2, 5, 140, 16, true, false, false, false, 0, 0});
    compare("causal + padding + a fully hidden batch", &(cfg){2, 2, 80, 80, 8, true, true, true, false, 0, 0});
    compare("GPT-2 head views of qkv, causal 100", &(cfg){2, 4, 100, 100, 8, true, false, false, true, 0, 0});
    compare("causal Tq 40 > Tk 24 (leading rows see no key)", &(cfg){1, 2, 40, 24, 16, true, false, false, false, 0, 0});
    compare("gpt-tiny's head: causal 256, D 64", &(cfg){1, 2, 256, 256, 64, true, false, false, true, 0, 0});
    compare("bert-small's head: full 128 with padding, D 64", &(cfg){2, 2, 128, 128, 64, false, true, false, false, 0, 0});
    compare("grouped-query: 6 query heads on 2 key heads, causal 150", &(cfg){2, 6, 150, 150, 16, true, false, false, false, 2, 0});
    compare("multi-query: 4 query heads on 1, cross 70x300, padding", &(cfg){2, 4, 70, 300, 8, false, true, false, false, 1, 0});
    compare("sliding window 33, causal 150", &(cfg){1, 2, 150, 150, 16, true, false, false, false, 0, 33});
    compare("sliding window 100, causal 700 (skips key blocks)", &(cfg){1, 2, 700, 700, 8, true, false, false, false, 0, 100});
    compare("window 20 both sides, grouped, padding, 90x90", &(cfg){2, 4, 90, 90, 8, false, true, false, false, 2, 20});
    compare("window 50, causal Tq 5 < Tk 300 (cached keys), multi-query", &(cfg){1, 4, 5, 300, 16, true, false, false, false, 1, 50});
    TEST_END();
}
