/* SPDX-License-Identifier: MIT */
/* Plain-C references, in double precision and written independently of the kernels, for the fused
 * ops whose composite twins share their code (test_fused holds add_layernorm to layernorm(add),
 * which runs the same norm_bwd; masked_softmax and sdpa serve as each other's twin; cg_rope_at is
 * held to cg_rope). Here each op meets arithmetic that shares nothing with it:
 *   masked_softmax  causal with Tq < Tk, additive mask, key padding: forward and both gradients
 *   sdpa            causal with Tq < Tk: forward and dq, dk, dv from the textbook products
 *   layernorm, rmsnorm, add_layernorm  forward and every gradient, the input gradient as the
 *                   explicit Jacobian (dy_j/dx_k summed against the upstream gradient, O(D^2))
 *   rope            LLaMA 3 frequencies as Hugging Face computes them (three bands, where-style),
 *                   linear scaling, partial and interleaved rotation; cg_rope and cg_rope_at, both ways
 * Every output is checked as loss = sum(out * R), R random, so the upstream gradient is R. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"

/* Achieved (max |got - want| / (1 + |want|) over every case): 5.3e-14 in float64, 1.4e-7 in float32;
 * the bounds leave about 20x and 7x. */
#ifdef CGRAD_DOUBLE
#define TOL 1e-12
#else
#define TOL 1e-6
#endif
#define S(...) ((const int64_t[]){__VA_ARGS__})
#define PI 3.14159265358979323846

static cg_rng rng;

/* A leaf of the given shape, uniform in [lo, hi), optionally requiring a gradient. */
static cg_tensor *leaf(cg_graph *g, int nd, const int64_t *shape, double lo, double hi, bool grad) {
    cg_tensor *t = cg_input(g, "leaf", CG_REAL, nd, shape);
    if (t) cg_fill_uniform(t, &rng, lo, hi);
    return grad ? cg_requires_grad(t) : t;
}

/* Widens a tensor's values (or gradient) into a fresh double array. */
static double *values(cg_tensor *t, bool grad) {
    const int64_t n = cg_numel(t);
    cg_real *tmp = malloc((size_t)n * sizeof *tmp);
    double *out = malloc((size_t)n * sizeof *out);
    cg_status s = grad ? cg_read_grad(t, tmp) : cg_read(t, tmp);
    CHECK(s == CG_OK, "read: %s", cg_last_error());
    for (int64_t i = 0; i < n; i++) out[i] = s == CG_OK ? (double)tmp[i] : NAN;
    free(tmp);
    return out;
}

/* Each element within TOL (1 + |want|) of want; prints the worst element and the largest error. */
static void expect(const char *what, cg_tensor *t, bool grad, const double *want) {
    double *got = values(t, grad), worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < cg_numel(t); i++) {
        const double e = fabs(got[i] - want[i]) / (1 + fabs(want[i]));
        if (!(e <= worst)) worst = e, at = i;
    }
    CHECK(worst <= TOL, "%s%s: element %lld is %.9g, reference %.9g (error %.3g > %.1g)", what, grad ? " gradient" : "",
          (long long)at, got[at], want[at], worst, TOL);
    if (getenv("CGRAD_TEST_VERBOSE")) printf("%-40s %-9s max error %.3g\n", what, grad ? "gradient" : "value", worst);
    free(got);
}

/* loss = sum(y * R) with R uniform in [-1, 1): forward and backward; R's values into r. */
static double *run(cg_graph *g, cg_tensor *y) {
    cg_tensor *R = leaf(g, cg_ndim(y), cg_shape(y), -1, 1, false);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, cg_retain(y), R));
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    return values(R, false);
}

/* ---- masked softmax: query i of Tq sees key j of Tk when j <= i + Tk - Tq (the last query sees
 * every key, as a KV cache's newest tokens do), and the key is not padding ---- */
static void masked_softmax_ref(int64_t B, int64_t H, int64_t Tq, int64_t Tk, bool causal, bool with_mask,
                               bool with_padding) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    const double scale = 0.7;
    cg_tensor *x = leaf(g, 4, S(B, H, Tq, Tk), -2, 2, true);
    cg_tensor *mask = with_mask ? leaf(g, 2, S(Tq, Tk), -1, 1, true) : NULL;
    cg_tensor *pad = with_padding ? cg_input(g, "pad", CG_INT32, 2, S(B, Tk)) : NULL;
    for (int64_t i = 0; pad && i < B * Tk; i++) cg_idata(pad)[i] = i % Tk == Tk - 1 || i % 3 != 1; /* last key kept */
    cg_tensor *y = cg_masked_softmax(g, x, scale, mask, causal, pad);
    double *R = run(g, y), *X = values(x, false), *M = mask ? values(mask, false) : NULL;
    double *want = calloc((size_t)(B * H * Tq * Tk), sizeof *want), *dx = calloc((size_t)(B * H * Tq * Tk), sizeof *dx);
    double *dm = calloc((size_t)(Tq * Tk), sizeof *dm);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Tq; i++) {
                const int64_t row = ((b * H + h) * Tq + i) * Tk;
                double mx = -INFINITY, z[64], sum = 0, dot = 0;
                bool seen[64];
                for (int64_t j = 0; j < Tk; j++) {
                    seen[j] = (!causal || j <= i + Tk - Tq) && (!pad || cg_idata(pad)[b * Tk + j]);
                    z[j] = scale * X[row + j] + (M ? M[i * Tk + j] : 0);
                    if (seen[j] && z[j] > mx) mx = z[j];
                }
                for (int64_t j = 0; j < Tk; j++) sum += seen[j] ? exp(z[j] - mx) : 0;
                for (int64_t j = 0; j < Tk; j++) want[row + j] = seen[j] ? exp(z[j] - mx) / sum : 0;
                for (int64_t j = 0; j < Tk; j++) dot += R[row + j] * want[row + j];
                for (int64_t j = 0; j < Tk; j++) { /* dz_j = y_j (R_j - sum_k R_k y_k) */
                    const double dz = want[row + j] * (R[row + j] - dot);
                    dx[row + j] = scale * dz;
                    dm[i * Tk + j] += dz;
                }
            }
    char what[96];
    snprintf(what, sizeof what, "masked_softmax %lldx%lld%s%s%s", (long long)Tq, (long long)Tk, causal ? " causal" : "",
             mask ? " +mask" : "", pad ? " +padding" : "");
    expect(what, y, false, want);
    expect(what, x, true, dx);
    if (mask) expect(what, mask, true, dm);
    free(R), free(X), free(M), free(want), free(dx), free(dm);
    cg_graph_free(g);
}

/* ---- attention: O = softmax(scale Q K^T + causal mask) V and its gradients from the products
 * dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dP P)), dQ = scale dS K, dK = scale dS^T Q ---- */
static void sdpa_ref(int64_t H, int64_t Tq, int64_t Tk, int64_t D) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    const double scale = 0.45;
    cg_tensor *q = leaf(g, 4, S(1, H, Tq, D), -1, 1, true), *k = leaf(g, 4, S(1, H, Tk, D), -1, 1, true);
    cg_tensor *v = leaf(g, 4, S(1, H, Tk, D), -1, 1, true);
    cg_tensor *o = cg_sdpa(g, q, k, v, scale, true, NULL);
    double *R = run(g, o), *Q = values(q, false), *K = values(k, false), *V = values(v, false);
    double *O = calloc((size_t)(H * Tq * D), sizeof *O), *dQ = calloc((size_t)(H * Tq * D), sizeof *dQ);
    double *dK = calloc((size_t)(H * Tk * D), sizeof *dK), *dV = calloc((size_t)(H * Tk * D), sizeof *dV);
    for (int64_t h = 0; h < H; h++) {
        const double *q_ = Q + h * Tq * D, *k_ = K + h * Tk * D, *v_ = V + h * Tk * D, *r_ = R + h * Tq * D;
        for (int64_t i = 0; i < Tq; i++) {
            double p[64], dp[64], mx = -INFINITY, sum = 0, dot = 0;
            const int64_t seen = i + Tk - Tq + 1; /* keys [0, seen) */
            for (int64_t j = 0; j < seen; j++) {
                p[j] = 0;
                for (int64_t e = 0; e < D; e++) p[j] += scale * q_[i * D + e] * k_[j * D + e];
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int64_t j = 0; j < seen; j++) sum += p[j] = exp(p[j] - mx);
            for (int64_t j = 0; j < seen; j++) {
                p[j] /= sum;
                dp[j] = 0;
                for (int64_t e = 0; e < D; e++) {
                    O[(h * Tq + i) * D + e] += p[j] * v_[j * D + e];
                    dV[(h * Tk + j) * D + e] += p[j] * r_[i * D + e];
                    dp[j] += r_[i * D + e] * v_[j * D + e];
                }
                dot += dp[j] * p[j];
            }
            for (int64_t j = 0; j < seen; j++) {
                const double ds = p[j] * (dp[j] - dot);
                for (int64_t e = 0; e < D; e++) {
                    dQ[(h * Tq + i) * D + e] += scale * ds * k_[j * D + e];
                    dK[(h * Tk + j) * D + e] += scale * ds * q_[i * D + e];
                }
            }
        }
    }
    char what[64];
    snprintf(what, sizeof what, "sdpa causal %lldx%lld d %lld", (long long)Tq, (long long)Tk, (long long)D);
    expect(what, o, false, O);
    expect(what, q, true, dQ);
    expect(what, k, true, dK);
    expect(what, v, true, dV);
    free(R), free(Q), free(K), free(V), free(O), free(dQ), free(dK), free(dV);
    cg_graph_free(g);
}

/* ---- norms. y_j = g_j xh_j + b_j, xh = (x - mu) r, r = 1 / sqrt(var + eps) (mu = 0 and var the
 * mean square for RMS norm). By hand: dy_j/dx_k = g_j r (delta_jk - c/D - xh_j xh_k / D), c = 1
 * for layer norm and 0 for RMS norm; add_layernorm is that at x + res, for both summands. ---- */
enum { LAYER, RMS, ADD_LAYER };
static void norm_ref(int kind, int64_t rows, int64_t D, double eps) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = leaf(g, 2, S(rows, D), -1, 1, true), *res = kind == ADD_LAYER ? leaf(g, 2, S(rows, D), -1, 1, true) : NULL;
    cg_tensor *gain = leaf(g, 1, S(D), 0.5, 1.5, true), *bias = kind != RMS ? leaf(g, 1, S(D), -1, 1, true) : NULL;
    cg_tensor *y = kind == LAYER ? cg_layernorm(g, x, gain, bias, eps)
                 : kind == RMS   ? cg_rmsnorm(g, x, gain, eps)
                                 : cg_add_layernorm(g, x, res, gain, bias, eps);
    double *R = run(g, y), *X = values(x, false), *Res = res ? values(res, false) : NULL, *G = values(gain, false);
    double *B = bias ? values(bias, false) : NULL;
    double *want = calloc((size_t)(rows * D), sizeof *want), *dx = calloc((size_t)(rows * D), sizeof *dx);
    double *dg = calloc((size_t)D, sizeof *dg), *db = calloc((size_t)D, sizeof *db), s[256], xh[256];
    const double c = kind == RMS ? 0 : 1;
    for (int64_t i = 0; i < rows; i++) {
        double mu = 0, var = 0;
        for (int64_t j = 0; j < D; j++) s[j] = X[i * D + j] + (Res ? Res[i * D + j] : 0);
        for (int64_t j = 0; j < D; j++) mu += c * s[j] / (double)D;
        for (int64_t j = 0; j < D; j++) var += (s[j] - mu) * (s[j] - mu) / (double)D;
        const double r = 1 / sqrt(var + eps);
        for (int64_t j = 0; j < D; j++) {
            xh[j] = (s[j] - mu) * r;
            want[i * D + j] = G[j] * xh[j] + (B ? B[j] : 0);
            dg[j] += R[i * D + j] * xh[j];
            db[j] += R[i * D + j];
        }
        for (int64_t k = 0; k < D; k++)
            for (int64_t j = 0; j < D; j++)
                dx[i * D + k] += R[i * D + j] * G[j] * r * ((j == k) - c / (double)D - xh[j] * xh[k] / (double)D);
    }
    static const char *names[] = {"layernorm", "rmsnorm", "add_layernorm"};
    char what[64];
    snprintf(what, sizeof what, "%s [%lld,%lld] eps %g", names[kind], (long long)rows, (long long)D, eps);
    expect(what, y, false, want);
    expect(what, x, true, dx);
    if (res) expect(what, res, true, dx);
    expect(what, gain, true, dg);
    if (bias) expect(what, bias, true, db);
    free(R), free(X), free(Res), free(G), free(B), free(want), free(dx), free(dg), free(db);
    cg_graph_free(g);
}

/* ---- rope ---- */

/* The frequencies as Hugging Face's _compute_default_rope_parameters and _compute_llama3_parameters
 * compute them: inv_freq = theta^(-2i / dims); with LLaMA 3 scaling, wavelengths past
 * original_context / low_freq_factor are slowed by factor, those below original_context /
 * high_freq_factor kept, and the band between interpolated: (1 - s) inv_freq / factor + s inv_freq,
 * s = (original_context / wavelength - low) / (high - low). Linear scaling divides positions. */
static void rope_freqs(const cg_rope_config *c, int64_t dims, double *f) {
    for (int64_t i = 0; i < dims / 2; i++) {
        const double inv_freq = 1.0 / pow(c->theta, (double)(2 * i) / (double)dims);
        double out = inv_freq;
        if (c->llama3_factor) {
            const double ctx = (double)c->llama3_original_context, wavelen = 2 * PI / inv_freq;
            const double low_freq_wavelen = ctx / c->llama3_low_freq_factor, high_freq_wavelen = ctx / c->llama3_high_freq_factor;
            const double scaled = wavelen > low_freq_wavelen ? inv_freq / c->llama3_factor : inv_freq;
            const double smooth = (ctx / wavelen - c->llama3_low_freq_factor) /
                                  (c->llama3_high_freq_factor - c->llama3_low_freq_factor);
            const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
            out = medium ? (1 - smooth) * scaled / c->llama3_factor + smooth * scaled : scaled;
        }
        f[i] = c->linear_factor > 1 ? out / c->linear_factor : out;
    }
}

/* x[T, D] rotated by sign * angle at positions off + t into y: pairs (i, i + dims/2), or (2i, 2i + 1). */
static void rope_rotate(const cg_rope_config *c, int64_t T, int64_t D, int64_t off, int sign, const double *x, double *y) {
    const int64_t dims = c->dims ? c->dims : D;
    double f[128];
    rope_freqs(c, dims, f);
    for (int64_t t = 0; t < T; t++) {
        memcpy(y + t * D, x + t * D, (size_t)D * sizeof *y);
        for (int64_t i = 0; i < dims / 2; i++) {
            const int64_t a = c->interleaved ? 2 * i : i, b = c->interleaved ? 2 * i + 1 : i + dims / 2;
            const double ang = sign * (double)(off + t) * f[i], x1 = x[t * D + a], x2 = x[t * D + b];
            y[t * D + a] = x1 * cos(ang) - x2 * sin(ang);
            y[t * D + b] = x1 * sin(ang) + x2 * cos(ang);
        }
    }
}

/* cg_rope at a fixed offset and cg_rope_at at the same offset read at run time, both against the
 * plain rotation, forward and backward (the inverse rotation of R). */
static void rope_ref(const char *name, const cg_rope_config *cfg, int64_t H, int64_t T, int64_t D, int64_t off) {
    for (int at = 0; at < 2; at++) {
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_tensor *x = leaf(g, 4, S(1, H, T, D), -1, 1, true), *y;
        if (at) {
            cg_tensor *pos = cg_input(g, "pos", CG_INT32, 1, S(1));
            if (pos) cg_idata(pos)[0] = (int32_t)off;
            y = cg_rope_at(g, x, pos, cfg);
        } else y = cg_rope(g, x, off, cfg);
        double *R = run(g, y), *X = values(x, false);
        double *want = malloc((size_t)(H * T * D) * sizeof *want), *dx = malloc((size_t)(H * T * D) * sizeof *dx);
        for (int64_t h = 0; h < H; h++) {
            rope_rotate(cfg, T, D, off, 1, X + h * T * D, want + h * T * D);
            rope_rotate(cfg, T, D, off, -1, R + h * T * D, dx + h * T * D);
        }
        char what[96];
        snprintf(what, sizeof what, "%s %s offset %lld", at ? "rope_at" : "rope", name, (long long)off);
        expect(what, y, false, want);
        expect(what, x, true, dx);
        free(R), free(X), free(want), free(dx);
        cg_graph_free(g);
    }
}

static void rope_refs(void) {
    /* theta 10000 over 16 dims: wavelengths 6.3, 19.9, 62.8, 199, ...; with an original context of
     * 64, low 1 and high 4 the bands are < 16 (kept), [16, 64] (interpolated: two of them) and > 64 */
    const cg_rope_config l3 = {.theta = 10000, .llama3_factor = 8, .llama3_low_freq_factor = 1,
                               .llama3_high_freq_factor = 4, .llama3_original_context = 64};
    rope_ref("llama3", &l3, 2, 5, 16, 0);
    rope_ref("llama3", &l3, 2, 5, 16, 1000);
    const cg_rope_config l31 = {.theta = 500000, .llama3_factor = 8, .llama3_low_freq_factor = 1,
                                .llama3_high_freq_factor = 4, .llama3_original_context = 8192};
    rope_ref("llama3.1 head 64", &l31, 1, 3, 64, 9000); /* LLaMA 3.1's settings: the band holds 3 of 32 */
    const cg_rope_config inter = {.dims = 12, .theta = 500000, .linear_factor = 2, .interleaved = true};
    rope_ref("interleaved 12 of 16, linear 2", &inter, 2, 4, 16, 37);
    const cg_rope_config neox = {.dims = 10, .theta = 10000};
    rope_ref("half-split 10 of 14", &neox, 1, 6, 14, 5);
}

int main(void) {
    cg_rng_seed(&rng, 29);
    masked_softmax_ref(2, 2, 3, 7, true, true, true);
    masked_softmax_ref(1, 2, 4, 21, true, false, false); /* rows past 16 keys */
    masked_softmax_ref(2, 1, 5, 5, true, false, true);
    masked_softmax_ref(2, 2, 3, 6, false, true, true);
    sdpa_ref(2, 3, 7, 5);
    sdpa_ref(2, 4, 21, 20); /* head dim and rows past 16 */
    sdpa_ref(1, 1, 9, 70);  /* one query row: the decode kernels */
    for (int k = LAYER; k <= ADD_LAYER; k++) {
        norm_ref(k, 3, 45, 0.1); /* a large eps: where it sits in the formula shows */
        norm_ref(k, 4, 7, 1e-5);
        norm_ref(k, 2, 83, 1e-5);
    }
    rope_refs();
    TEST_END();
}
