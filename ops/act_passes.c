/* SPDX-License-Identifier: MIT */
/* The fused linear + activation's passes (cg_linear_gelu, cg_linear_relu; ops/matmul.c): bias and
 * GELU over the product in forward and its remake, and the pre-activation gradient in backward. */
#include "graph/internal.h"
#include "ops/gelu_math.h"

/* y[i, j] = gelu(c[i, j] + b[j]) over the product c[m, n] (b NULL: no bias), one pass while the
 * product's rows are fresh, instead of a bias fill before the product and a GELU pass after. */
#if defined(__AVX512F__) && !defined(CGRAD_DOUBLE)
#include "ops/exp16.h"
#define GELU_AVX512 1
/* 1 / d: the 14-bit estimate and one Newton step (about 2^-28 relative), a third of vdivps's time. */
static inline __m512 recip16(__m512 d) {
    const __m512 r = _mm512_rcp14_ps(d);
    return _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));
}
/* GELU's tanh form on 16 lanes as x * s, s = sigmoid(2u) = 1 / (1 + e), e = e^-2u, u = K (x + 0.044715 x^3):
 * one exponential and a reciprocal, where the scalar form's division held the loop to 2.5x its
 * memory time; -2u as x (-2K - 2K 0.044715 x^2), one product fewer than through x^3. e is clamped
 * to [e^-87, e^80]; a NaN x stays NaN through the product. With d, also
 * the derivative from the same exponential: d/dx (x s) = s + x 2u' s (1 - s), with 1 - s = e s, exact
 * in both tails where 1 - s would cancel (gelu_tanh_dx's formula). */
static inline __m512 gelu_tanh16(__m512 x, __m512 *d) {
    const __m512 x2 = _mm512_mul_ps(x, x);
    __m512 a = _mm512_mul_ps(x, _mm512_fmadd_ps(x2, _mm512_set1_ps(-2 * (float)GELU_K * 0.044715f), _mm512_set1_ps(-2 * (float)GELU_K)));
    a = _mm512_max_ps(_mm512_min_ps(a, _mm512_set1_ps(80.0f)), _mm512_set1_ps(-87.0f));
    const __m512 e = cgi_exp16(a), s = recip16(_mm512_add_ps(e, _mm512_set1_ps(1.0f)));
    if (d) {
        const __m512 du = _mm512_fmadd_ps(x2, _mm512_set1_ps(2 * (float)GELU_K * 3 * 0.044715f), _mm512_set1_ps(2 * (float)GELU_K));
        *d = _mm512_fmadd_ps(_mm512_mul_ps(x, du), _mm512_mul_ps(_mm512_mul_ps(s, e), s), s);
    }
    return _mm512_mul_ps(x, s);
}
/* GELU (erf) on 16 lanes: 0.5 x (1 + erf(x / sqrt 2)), erf as fast_erf with its division by the
 * reciprocal; a NaN x stays NaN through the last product. Its derivative is not made beside it as
 * the tanh form's is: phi's exponential of its own made the remake cost more than backward saved
 * (over bert-small's [2048, 1024] on one thread, the step's three passes 1.87 -> 1.96 ms), so
 * backward reads the gate back from the output (act_row_grad). */
static inline __m512 gelu_erf16(__m512 x) {
    const __m512 z = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(x, _mm512_set1_ps((float)INV_SQRT2)), _mm512_set1_ps(-4.0f)),
                                   _mm512_set1_ps(4.0f));
    const __m512 u = _mm512_mul_ps(z, _mm512_set1_ps(0.25f)), s = _mm512_mul_ps(u, u);
    __m512 p = _mm512_fmadd_ps(s, _mm512_set1_ps(ERF_P5), _mm512_set1_ps(ERF_P4));
    p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(ERF_P3));
    p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(ERF_P2));
    p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(ERF_P1));
    p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(ERF_P0));
    __m512 q = _mm512_fmadd_ps(s, _mm512_set1_ps(ERF_Q5), _mm512_set1_ps(ERF_Q4));
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(ERF_Q3));
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(ERF_Q2));
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(ERF_Q1));
    q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(1.0f));
    __m512 erf = _mm512_mul_ps(z, _mm512_mul_ps(p, recip16(q)));
    erf = _mm512_min_ps(_mm512_max_ps(erf, _mm512_set1_ps(-1.0f)), _mm512_set1_ps(1.0f));
    const __m512 h = _mm512_mul_ps(x, _mm512_set1_ps(0.5f));
    return _mm512_fmadd_ps(h, erf, h);
}
#endif

/* The tanh form's derivative in the fused passes' scalar lanes (the tail of a row, and builds
 * without AVX-512), from x alone, so a backward that finds only the pre-activation computes what the
 * remake stored (see cgi_bias_gelu_fwd): s + x 2u' s (1 - s), s = 1 / (1 + e), e = e^-2u, 1 - s = e s. */
static inline cg_real gelu_tanh_dx(cg_real x) {
    const cg_real x2 = x * x, a0 = -2 * GELU_K * (x + (cg_real)0.044715 * x2 * x);
    const cg_real a = a0 > 80 ? 80 : a0 < -87 ? -87 : a0, e = cgi_exp(a), s = 1 / (1 + e);
    return s + x * (2 * GELU_K * (1 + (cg_real)3 * (cg_real)0.044715 * x2)) * (s * e * s);
}
/* One row of cgi_bias_gelu_fwd: yi[j] = gelu(ci[j] + b[j]) (yi NULL: not written; the tanh form
 * only), and for the tanh form with deriv ci[j] = gelu'(ci[j] + b[j]) over the product. */
static void bias_gelu_row(cg_real *ci, const cg_real *b, cg_real *yi, int64_t n, bool tanh_form, bool deriv) {
    int64_t j0 = 0;
    deriv = deriv && tanh_form;
#ifdef GELU_AVX512
    for (; j0 + 16 <= n; j0 += 16) {
        __m512 x = _mm512_loadu_ps(ci + j0), d, y;
        if (b) x = _mm512_add_ps(x, _mm512_loadu_ps(b + j0));
        if (deriv) {
            y = gelu_tanh16(x, &d);
            _mm512_storeu_ps(ci + j0, d);
        } else y = tanh_form ? gelu_tanh16(x, NULL) : gelu_erf16(x);
        if (yi) _mm512_storeu_ps(yi + j0, y);
    }
#endif
    if (tanh_form)
        for (int64_t j = j0; j < n; j++) {
            const cg_real x = b ? ci[j] + b[j] : ci[j];
            if (yi) yi[j] = gelu_tanh_value(x);
            if (deriv) ci[j] = gelu_tanh_dx(x);
        }
    else if (b)
        for (int64_t j = j0; j < n; j++) yi[j] = gelu_erf_value(ci[j] + b[j]);
    else
        for (int64_t j = j0; j < n; j++) yi[j] = gelu_erf_value(ci[j]);
}

typedef struct {
    cg_real *c;
    const cg_real *b;
    cg_real *y;
    int64_t n;
    bool tanh_form, deriv;
} bias_gelu_args;

static void bias_gelu_rows(int64_t lo, int64_t hi, void *ctx) {
    const bias_gelu_args *k = ctx;
    for (int64_t i = lo; i < hi; i++)
        bias_gelu_row(k->c + i * k->n, k->b, k->y ? k->y + i * k->n : NULL, k->n, k->tanh_form, k->deriv);
}

void cgi_bias_gelu_fwd(cg_real *c, const cg_real *b, cg_real *y, int64_t m, int64_t n, bool tanh_form, bool deriv) {
    bias_gelu_args k = {c, b, y, n, tanh_form, deriv};
    cgi_par_ranges(m, m * n, bias_gelu_rows, &k);
}

typedef struct {
    cg_real *c;
    const cg_real *b, *y, *dy;
    int64_t n;
    cgi_act act;
    bool c_deriv;
} act_rows;

/* Row r of dpre = dy * act'(pre) written into c's row: the tanh form's from the derivative c holds
 * (c_deriv), else first computed over the product c as cgi_bias_gelu_fwd's deriv does, pre = c + b
 * (the same bits either way); erf's as cgi_bwd_gelu, the gate Phi read back from y as y / x;
 * ReLU's as cgi_bwd_relu, from the output's sign. */
static const cg_real *act_row_grad(void *ctx, int64_t r) {
    const act_rows *o = ctx;
    const int64_t n = o->n;
    cg_real *c = o->c + r * n;
    const cg_real *y = o->y + r * n, *dy = o->dy + r * n;
    if (o->act == CGI_ACT_RELU) {
        for (int64_t j = 0; j < n; j++) c[j] = y[j] > 0 ? dy[j] : 0;
        return c;
    }
    if (o->act == CGI_ACT_GELU_TANH) {
        if (!o->c_deriv) bias_gelu_row(c, o->b, NULL, n, true, true);
        for (int64_t j = 0; j < n; j++) c[j] = dy[j] * c[j];
        return c;
    }
    const cg_real *b = o->b;
    int64_t j0 = 0;
#ifdef GELU_AVX512
    /* as gelu_grad, the gate y / x through the reciprocal */
    for (; j0 + 16 <= n; j0 += 16) {
        __m512 x = _mm512_loadu_ps(c + j0);
        if (b) x = _mm512_add_ps(x, _mm512_loadu_ps(b + j0));
        const __m512 ax = _mm512_abs_ps(x), x2 = _mm512_mul_ps(x, x);
        const __mmask16 tiny = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(1e-20f), _CMP_LT_OQ);
        const __m512 s =
            _mm512_mask_blend_ps(tiny, _mm512_mul_ps(_mm512_loadu_ps(y + j0), recip16(x)), _mm512_set1_ps(0.5f));
        /* s + x phi(x), phi(x) = e^(-x^2 / 2) / sqrt(2 pi) */
        const __m512 e = cgi_exp16(_mm512_max_ps(_mm512_mul_ps(_mm512_set1_ps(-0.5f), x2), _mm512_set1_ps(-87.0f)));
        const __m512 g = _mm512_fmadd_ps(_mm512_mul_ps(x, e), _mm512_set1_ps((float)INV_SQRT2PI), s);
        _mm512_storeu_ps(c + j0, _mm512_mul_ps(_mm512_loadu_ps(dy + j0), g));
    }
#endif
    if (b)
        for (int64_t j = j0; j < n; j++) c[j] = dy[j] * gelu_grad(c[j] + b[j], y[j]);
    else
        for (int64_t j = j0; j < n; j++) c[j] = dy[j] * gelu_grad(c[j], y[j]);
    return c;
}

static void act_rows_grad(int64_t lo, int64_t hi, void *ctx) {
    for (int64_t i = lo; i < hi; i++) act_row_grad(ctx, i);
}

void cgi_bias_act_bwd(cg_real *c, const cg_real *b, const cg_real *y, const cg_real *dy, int64_t m, int64_t n,
                      cgi_act act, bool c_deriv, cg_real *db, cg_real *scratch) {
    act_rows o = {c, b, y, dy, n, act, c_deriv};
    if (db) { /* the bias gradient's column sums in the same pass, as cgi_colsum_add would sum dpre */
        cgi_colsum_add_made(db, m, n, scratch, act_row_grad, &o);
        return;
    }
    cgi_par_ranges(m, m * n, act_rows_grad, &o);
}
