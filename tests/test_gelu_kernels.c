/* SPDX-License-Identifier: MIT */
/* The fused linear + GELU's passes (cgi_bias_gelu_fwd, cgi_bias_act_bwd in ops/act_passes.c) against
 * GELU and its derivative in double precision (libm's erf and tanh), both forms, over every 4099th
 * float of [-10, 10]: the value within 3e-7 and the derivative (backward's dpre for dy = 1) within
 * 4e-7 of the reference, times max(1, |x|) (measured on every 64th float: 1.9e-7 and 2.5e-7 at
 * most). A wrong coefficient or term moves some point by 1e-6 or more. Rows of 1000 columns, so each
 * row's last 8 take the scalar lanes. Also: the tanh form's derivative the remake stores and the one
 * backward computes from the product are the same bits (the plan's regen relies on it), the bias is
 * added before GELU, and a NaN stays NaN. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "graph/internal.h"
#include "check.h"

#define PI 3.14159265358979323846

enum { COLS = 1000, ROWS = 64 };

static double ref_value(double x, bool tanh_form) {
    if (!tanh_form) return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    return 0.5 * x * (1 + tanh(sqrt(2 / PI) * (x + 0.044715 * x * x * x)));
}

/* d/dx: Phi(x) + x phi(x); tanh form 0.5 (1 + t) + 0.5 x (1 - t^2) u', t = tanh(u) */
static double ref_deriv(double x, bool tanh_form) {
    if (!tanh_form) return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * PI);
    const double k = sqrt(2 / PI), t = tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

static float from_bits(uint32_t b) {
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* Every `step`th float of [-10, 10] through the passes, [ROWS, COLS] at a time: the largest errors
 * of value and derivative relative to max(1, |x|), and where. */
static void sweep(bool tanh_form, uint32_t step) {
    const uint32_t hi = 0x41200000u; /* 10.0f */
    static float x[ROWS * COLS], c[ROWS * COLS], y[ROWS * COLS], ones[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++) ones[i] = 1;
    double worst_y = 0, worst_d = 0;
    float at_y = 0, at_d = 0;
    int64_t count = 0;
    uint64_t b = 0;
    int sign = 0;
    while (sign < 2) {
        int n = 0;
        for (; n < ROWS * COLS && sign < 2; n++) {
            x[n] = from_bits((uint32_t)b | (sign ? 0x80000000u : 0));
            if ((b += step) > hi) b = 0, sign++;
        }
        for (int i = n; i < ROWS * COLS; i++) x[i] = 0;
        memcpy(c, x, sizeof c);
        cgi_bias_gelu_fwd(c, NULL, y, ROWS, COLS, tanh_form, false);
        cgi_bias_act_bwd(c, NULL, y, ones, ROWS, COLS, tanh_form ? CGI_ACT_GELU_TANH : CGI_ACT_GELU, false, NULL, NULL);
        for (int i = 0; i < n; i++) {
            const double s = fabs(x[i]) > 1 ? fabs(x[i]) : 1;
            const double ey = fabs(y[i] - ref_value(x[i], tanh_form)) / s, ed = fabs(c[i] - ref_deriv(x[i], tanh_form)) / s;
            if (ey > worst_y) worst_y = ey, at_y = x[i];
            if (ed > worst_d) worst_d = ed, at_d = x[i];
        }
        count += n;
    }
    const char *form = tanh_form ? "gelu_tanh" : "gelu";
    printf("%s over %lld floats of [-10, 10]: value within %.3g, derivative within %.3g (x max(1, |x|))\n", form,
           (long long)count, worst_y, worst_d);
    CHECK(count > 500000, "%s: %lld floats compared", form, (long long)count);
    CHECK(worst_y <= 3e-7, "%s value: error %.3g x max(1, |x|) at x = %.9g", form, worst_y, (double)at_y);
    CHECK(worst_d <= 4e-7, "%s derivative: error %.3g x max(1, |x|) at x = %.9g", form, worst_d, (double)at_d);
}

/* With a bias: forward's value, the derivative stored beside it (tanh form; erf stores none and
 * leaves the product), and backward's dpre from the stored derivative and from the product are
 * consistent to the bit, and the bias gradient is the column sum of dpre. */
static void bias_and_backward(bool tanh_form) {
    enum { M = 37, N = 83 }; /* 5 lanes of 16 and 3 scalar columns per row */
    static float c[M * N], pre[M * N], d[M * N], dp[M * N], dy[M * N], y[M * N], y2[M * N], b[N], db[N];
    cg_rng rng;
    cg_rng_seed(&rng, 5);
    for (int i = 0; i < M * N; i++) c[i] = (float)(cg_rng_uniform(&rng) * 12 - 6), dy[i] = (float)(cg_rng_uniform(&rng) * 2 - 1);
    for (int j = 0; j < N; j++) b[j] = (float)(cg_rng_uniform(&rng) - 0.5);
    memcpy(d, c, sizeof d);
    cgi_bias_gelu_fwd(d, b, y, M, N, tanh_form, true);
    cgi_bias_gelu_fwd(c, b, y2, M, N, tanh_form, false); /* forward without the derivative: c unchanged */
    for (int i = 0; i < M * N; i++) pre[i] = c[i] + b[i % N];
    const char *form = tanh_form ? "gelu_tanh" : "gelu";
    CHECK(!memcmp(y, y2, sizeof y), "%s: the value differs with the derivative made beside it", form);
    int far = 0;
    for (int i = 0; i < M * N; i++)
        far += fabs(y[i] - ref_value(pre[i], tanh_form)) > 3e-7 * 6 ||
               (tanh_form ? fabs(d[i] - ref_deriv(pre[i], tanh_form)) > 4e-7 * 6 : d[i] != c[i]);
    CHECK(far == 0, "%s: %d of %d values or derivatives at c + b off the reference", form, far, M * N);
    /* backward from the stored derivative (into d), and from the product (into dp) */
    memcpy(dp, c, sizeof dp);
    const cgi_act act = tanh_form ? CGI_ACT_GELU_TANH : CGI_ACT_GELU;
    cg_real *scratch = malloc((size_t)cgi_colsum_scratch(M, N) * sizeof *scratch);
    memset(db, 0, sizeof db);
    cgi_bias_act_bwd(d, b, y, dy, M, N, act, true, db, scratch);
    cgi_bias_act_bwd(dp, b, y, dy, M, N, act, false, NULL, NULL);
    CHECK(!memcmp(d, dp, sizeof d), "%s: dpre from the stored derivative differs from dpre from the product", form);
    int bad = 0;
    for (int i = 0; i < M * N; i++) bad += fabs(dp[i] - dy[i] * ref_deriv(pre[i], tanh_form)) > 4e-7 * 6;
    CHECK(bad == 0, "%s: %d of %d dpre off dy * gelu'(c + b)", form, bad, M * N);
    double worst = 0;
    for (int j = 0; j < N; j++) {
        double sum = 0;
        for (int i = 0; i < M; i++) sum += dp[i * N + j];
        if (fabs(db[j] - sum) > worst) worst = fabs(db[j] - sum);
    }
    CHECK(worst < 1e-5, "%s: bias gradient off the column sums of dpre by %.3g", form, worst);
    free(scratch);
}

/* A NaN pre-activation gives a NaN value and derivative, in the 16 lanes and the scalar ones. */
static void nan_stays(bool tanh_form) {
    enum { N = 19 };
    float c[N], y[N], ones[N];
    for (int j = 0; j < N; j++) c[j] = j == 3 || j == 17 ? NAN : 0.5f, ones[j] = 1;
    cgi_bias_gelu_fwd(c, NULL, y, 1, N, tanh_form, false);
    cgi_bias_act_bwd(c, NULL, y, ones, 1, N, tanh_form ? CGI_ACT_GELU_TANH : CGI_ACT_GELU, false, NULL, NULL);
    CHECK(isnan(y[3]) && isnan(c[3]) && isnan(y[17]) && isnan(c[17]), "%s: NaN in gives %g, %g (lanes), %g, %g (scalar)",
          tanh_form ? "gelu_tanh" : "gelu", (double)y[3], (double)c[3], (double)y[17], (double)c[17]);
    CHECK(!isnan(y[2]) && !isnan(c[18]), "%s: a NaN leaked into its neighbours", tanh_form ? "gelu_tanh" : "gelu");
}

int main(void) {
    for (int t = 0; t < 2; t++) {
        sweep(t, 4099);
        bias_and_backward(t);
        nan_stays(t);
    }
    TEST_END();
}
