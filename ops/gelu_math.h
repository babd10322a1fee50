/* SPDX-License-Identifier: MIT */
/* GELU's scalar mathematics, shared by the gelu and gelu_tanh ops (ops/elementwise.c) and the fused
 * linear + activation's passes (ops/act_passes.c), so both compute the same bits. */
#ifndef CGRAD_OPS_GELU_MATH_H
#define CGRAD_OPS_GELU_MATH_H

#include <math.h>

#include "graph/internal.h"

#define GELU_K ((cg_real)0.7978845608028654) /* sqrt(2 / pi) */
#define INV_SQRT2 ((cg_real)0.7071067811865476)
#define INV_SQRT2PI ((cg_real)0.3989422804014327)

/* GELU's tanh and erf through cgi_exp, so the loops vectorise (libm's tanhf and erff are scalar
 * calls that dominated a training step). tanh(u) = 1 - 2 / (1 + e^2u); erf as the rational
 * function below. The float64 build keeps libm for its 1e-6 gradient checks. */
static inline cg_real fast_tanh(cg_real u) {
#ifdef CGRAD_DOUBLE
    return tanh(u);
#else
    return 1 - 2 / (1 + cgi_exp(2 * u));
#endif
}

/* erf(z) = z P(s) / Q(s), s = (z / 4)^2, z clamped to [-4, 4] (beyond, erf is 1 to working
 * precision): a rational fit to erf(z) / z over [0, 4] (weighted least squares toward the largest
 * error, P(0) = 2 / sqrt(pi)), within 4e-7 of erf evaluated in float, and within 4e-7 relative
 * near 0. It replaced Abramowitz and Stegun's 7.1.26 (1 - t p(t) e^-z^2, t = 1 / (1 + 0.3275911 |z|)),
 * as accurate in absolute terms (5e-7 in float) but not near 0, where 1 - p e^-z^2 cancels. Its
 * exponential, reciprocal and clamps made GELU's 16-lane pass compute-bound (some 40 instructions a
 * vector, 25 now): over bert-small's [2048, 1024] on one thread it took 0.62 ms (best of 21 runs,
 * CPU time), now 0.45. */
#define ERF_P0 ((cg_real)1.1283791670955126)
#define ERF_P1 ((cg_real)3.115161675403347)
#define ERF_P2 ((cg_real)13.63363313837377)
#define ERF_P3 ((cg_real)16.11109865823951)
#define ERF_P4 ((cg_real)18.72819116064787)
#define ERF_P5 ((cg_real)2.075067474812178)
#define ERF_Q1 ((cg_real)8.09405884002665)
#define ERF_Q2 ((cg_real)29.652050449427996)
#define ERF_Q3 ((cg_real)62.69912655407019)
#define ERF_Q4 ((cg_real)78.50216182422571)
#define ERF_Q5 ((cg_real)39.21872617077499)
static inline cg_real fast_erf(cg_real z) {
#ifdef CGRAD_DOUBLE
    return erf(z);
#else
    if (z != z) return z;
    const cg_real zc = z > 4 ? 4 : z < -4 ? -4 : z, u = zc * (cg_real)0.25, s = u * u;
    const cg_real p = ERF_P0 + s * (ERF_P1 + s * (ERF_P2 + s * (ERF_P3 + s * (ERF_P4 + s * ERF_P5))));
    const cg_real q = 1 + s * (ERF_Q1 + s * (ERF_Q2 + s * (ERF_Q3 + s * (ERF_Q4 + s * ERF_Q5))));
    const cg_real r = zc * (p / q);
    return r > 1 ? 1 : r < -1 ? -1 : r;
#endif
}

/* Both GELUs are x * gate(x), gate = Phi(x) or sigmoid(2u); their derivatives read the gate back
 * from the saved output as y / x instead of recomputing an erf or a tanh, which made backward as
 * costly as forward (at [4096, 1024] on two threads: gelu_tanh backward 2.0 ms faster, gelu 0.7).
 * Below |x| = 1e-20 the gate is 1/2 to working precision and y / x would lose it to rounding. */
static inline cg_real gelu_gate(cg_real x, cg_real y) {
    return x < (cg_real)1e-20 && x > (cg_real)-1e-20 ? (cg_real)0.5 : y / x;
}

/* d/dx of x * Phi(x): Phi(x) + x * phi(x) */
static inline cg_real gelu_grad(cg_real x, cg_real y) {
    return gelu_gate(x, y) + x * cgi_exp((cg_real)-0.5 * x * x) * INV_SQRT2PI;
}

static inline cg_real gelu_tanh_t(cg_real x) { return fast_tanh(GELU_K * (x + (cg_real)0.044715 * x * x * x)); }

/* d/dx of x * s, s = sigmoid(2u): s + 2 x s (1 - s) u' */
static inline cg_real gelu_tanh_grad(cg_real x, cg_real y) {
    const cg_real s = gelu_gate(x, y);
    return s + 2 * x * s * (1 - s) * GELU_K * (1 + (cg_real)3 * (cg_real)0.044715 * x * x);
}

/* GELU (erf): 0.5 x (1 + erf(x / sqrt 2)) */
static inline cg_real gelu_erf_value(cg_real x) { return (cg_real)0.5 * x * (1 + fast_erf(x * INV_SQRT2)); }

/* GELU (tanh form): 0.5 x (1 + tanh(K (x + 0.044715 x^3))) */
static inline cg_real gelu_tanh_value(cg_real x) { return (cg_real)0.5 * x * (1 + gelu_tanh_t(x)); }

#endif
