/* SPDX-License-Identifier: MIT */
/* Attention for one query row at a time: token-by-token generation with a KV cache, where each
 * step's single new query meets every cached key. The fused attention (ops/attention.c) calls these
 * for a block of one query row. */
#include "ops/attention_internal.h"

/* One query row against nk keys (rows ks apart): s[c] = scale (q . k_c), in 16 partial sums added
 * as a fixed tree, so the loop vectorises without reassociation. Token-by-token generation has a
 * single query row, and there BLIS's call and gemv setup cost more than the products themselves:
 * two calls per head, eight per gpt-tiny layer. */
CGI_CLONES void cgi_attn_row_scores(const cg_real *restrict q, const cg_real *restrict k, int64_t ks, int64_t nk,
                                       int64_t d, cg_real scale, cg_real *restrict s) {
    for (int64_t c = 0; c < nk; c++) {
        const cg_real *kc = k + c * ks;
        cg_real a[16] = {0};
        int64_t e = 0;
        for (; e + 16 <= d; e += 16)
            for (int l = 0; l < 16; l++) a[l] += q[e + l] * kc[e + l];
        for (int l = 0; e < d; e++, l++) a[l] += q[e] * kc[e];
        for (int l = 0; l < 8; l++) a[l] += a[l + 8];
        for (int l = 0; l < 4; l++) a[l] += a[l + 4];
        s[c] = scale * ((a[0] + a[2]) + (a[1] + a[3]));
    }
}

/* o[e] = beta o[e] + sum_c p[c] v_c[e] for one query row (beta 0 or 1), keys in order, 64 features
 * at a time held in registers. */
CGI_CLONES void cgi_attn_row_pv(const cg_real *restrict p, int64_t nk, const cg_real *restrict v, int64_t vs, int64_t d,
                                   cg_real beta, cg_real *restrict o) {
    enum { W = 64 };
    for (int64_t e0 = 0; e0 < d; e0 += W) {
        cg_real a[W];
        const int64_t n = d - e0 < W ? d - e0 : W;
        if (n == W) {
            for (int l = 0; l < W; l++) a[l] = beta == 0 ? 0 : o[e0 + l];
            for (int64_t c = 0; c < nk; c++) {
                const cg_real pc = p[c], *vc = v + c * vs + e0;
                for (int l = 0; l < W; l++) a[l] += pc * vc[l];
            }
            for (int l = 0; l < W; l++) o[e0 + l] = a[l];
        } else {
            for (int64_t l = 0; l < n; l++) a[l] = beta == 0 ? 0 : o[e0 + l];
            for (int64_t c = 0; c < nk; c++) {
                const cg_real pc = p[c], *vc = v + c * vs + e0;
                for (int64_t l = 0; l < n; l++) a[l] += pc * vc[l];
            }
            for (int64_t l = 0; l < n; l++) o[e0 + l] = a[l];
        }
    }
}
