/* SPDX-License-Identifier: MIT */
/* cgi_reduce sums outputs whose kept axis is contiguous side by side, in runs (graph/iter.c): each
 * output must still be the sum of its reduced elements in the fixed order, from a double 0, times
 * the scale, rounded once, the same bits as the sum taken alone. The reference here is that sum
 * written out by hand, so a run that skips, repeats or reorders an element, or crosses a kept row's
 * end, shows as a different bit. Shapes cut runs at 64 outputs and at a kept row's end, and ranges
 * start inside a row (two threads, ctest runs every kernel parallel). Then a position table added
 * to every row of a batch, through cg_add's backward, against the batch sum by hand. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"
#include "graph/internal.h"

static uint64_t rng_state = 88172645463325252ull;
static cg_real uniform(void) { /* xorshift: an independent stream, in [-1, 1) */
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (cg_real)((double)(rng_state >> 11) / (double)(1ull << 53) * 2 - 1);
}

/* The reference: every output's reduced elements in row-major order of the reduced axes. */
static void reference(cg_real *dst, const int64_t *dst_stride, const cg_real *src, const int64_t *src_stride, int ndim,
                      const int64_t *shape, unsigned mask, double scale, bool accumulate) {
    int64_t kept = 1, red = 1;
    for (int d = 0; d < ndim; d++) *(mask >> d & 1 ? &red : &kept) *= shape[d];
    for (int64_t o = 0; o < kept; o++) {
        double acc = 0;
        int64_t doff = 0, koff = 0, rem = o;
        for (int d = ndim - 1; d >= 0; d--)
            if (!(mask >> d & 1)) {
                const int64_t i = rem % shape[d];
                rem /= shape[d];
                doff += i * dst_stride[d], koff += i * src_stride[d];
            }
        for (int64_t r = 0; r < red; r++) {
            int64_t off = koff, rr = r;
            for (int d = ndim - 1; d >= 0; d--)
                if (mask >> d & 1) {
                    off += rr % shape[d] * src_stride[d];
                    rr /= shape[d];
                }
            acc += src[off];
        }
        if (accumulate) dst[doff] += (cg_real)(scale * acc);
        else dst[doff] = (cg_real)(scale * acc);
    }
}

/* src contiguous over shape; dst keeps the unmasked axes, contiguous, or with its inner kept axis
 * at stride 2 (the one-at-a-time path). Compares every output bit for bit. */
static void case_reduce(int ndim, const int64_t *shape, unsigned mask, double scale, bool accumulate, bool strided_dst) {
    int64_t ss[CG_MAX_DIMS], ds[CG_MAX_DIMS], n = 1, kept = 1;
    cgi_contig_strides(ndim, shape, ss);
    for (int d = 0; d < ndim; d++) n *= shape[d];
    int64_t step = strided_dst ? 2 : 1;
    for (int d = ndim - 1; d >= 0; d--)
        if (mask >> d & 1) ds[d] = 0;
        else ds[d] = step, step *= shape[d], kept *= shape[d];
    const int64_t dn = kept * (strided_dst ? 2 : 1);
    cg_real *src = malloc((size_t)n * sizeof *src), *got = malloc((size_t)dn * sizeof *got),
            *want = malloc((size_t)dn * sizeof *want);
    for (int64_t i = 0; i < n; i++) src[i] = uniform();
    for (int64_t i = 0; i < dn; i++) got[i] = want[i] = uniform();
    cgi_reduce(got, ds, src, ss, ndim, shape, mask, scale, accumulate);
    reference(want, ds, src, ss, ndim, shape, mask, scale, accumulate);
    int64_t bad = -1;
    for (int64_t i = 0; i < dn && bad < 0; i++)
        if (memcmp(&got[i], &want[i], sizeof *got)) bad = i;
    CHECK(bad < 0, "cgi_reduce ndim %d shape[0] %lld mask %u scale %g accumulate %d strided %d: dst[%lld] = %.9g, the "
          "sum in order %.9g", ndim, (long long)shape[0], mask, scale, accumulate, strided_dst, (long long)bad,
          bad < 0 ? 0.0 : (double)got[bad], bad < 0 ? 0.0 : (double)want[bad]);
    free(src), free(got), free(want);
}

/* y = x[B, T, D] + pos[T, D]: pos's gradient is dy summed over the batch (a position table's). */
static void case_position_table(int64_t B, int64_t T, int64_t D) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 3, (const int64_t[]){B, T, D}));
    cg_tensor *pos = cg_requires_grad(cg_input(g, "pos", CG_REAL, 2, (const int64_t[]){T, D}));
    cg_tensor *R = cg_input(g, "R", CG_REAL, 3, (const int64_t[]){B, T, D});
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, cg_add(g, x, pos), R));
    const int64_t n = B * T * D;
    cg_real *r = malloc((size_t)n * sizeof *r), *v = malloc((size_t)n * sizeof *v), *got = malloc((size_t)(T * D) * sizeof *got);
    for (int64_t i = 0; i < n; i++) r[i] = uniform(), v[i] = uniform();
    bool ok = loss && cg_write(x, v) == CG_OK && cg_write(pos, v) == CG_OK && cg_write(R, r) == CG_OK &&
              cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK && cg_read_grad(pos, got) == CG_OK;
    CHECK(ok, "position table [%lld, %lld] over batch %lld: %s", (long long)T, (long long)D, (long long)B, cg_last_error());
    int64_t bad = -1;
    double want_bad = 0;
    for (int64_t o = 0; ok && o < T * D && bad < 0; o++) {
        double acc = 0;
        for (int64_t b = 0; b < B; b++) acc += r[b * T * D + o];
        if ((cg_real)acc != got[o]) bad = o, want_bad = (cg_real)acc;
    }
    CHECK(bad < 0, "position table [%lld, %lld] over batch %lld: grad[%lld] = %.9g, the batch sum %.9g", (long long)T,
          (long long)D, (long long)B, (long long)bad, bad < 0 ? 0.0 : (double)got[bad], want_bad);
    free(r), free(v), free(got);
    cg_graph_free(g);
}

int main(void) {
    /* a position embedding's gradient: [16, 128, 256] over the batch */
    case_reduce(3, (const int64_t[]){16, 128, 256}, 1u, 1.0, false, false);
    case_reduce(3, (const int64_t[]){16, 128, 256}, 1u, 1.0, true, false);
    /* kept rows of 70 (a run of 64, then 6) and of 3; ranges starting inside rows */
    case_reduce(3, (const int64_t[]){4, 9, 70}, 2u, -0.5, false, false);
    case_reduce(3, (const int64_t[]){5, 7, 3}, 2u, 2.0, true, false);
    case_reduce(4, (const int64_t[]){3, 5, 2, 131}, 5u, 1.0, true, false);
    /* a bias's gradient: rows summed, one kept row of 1000 outputs */
    case_reduce(2, (const int64_t[]){37, 1000}, 1u, 1.0, true, false);
    /* kept axis of one element, kept axis strided, last axis reduced: the one-at-a-time sums */
    case_reduce(2, (const int64_t[]){33, 1}, 1u, 1.0, false, false);
    case_reduce(3, (const int64_t[]){6, 10, 20}, 1u, 1.0, false, true);
    case_reduce(3, (const int64_t[]){6, 10, 20}, 4u, 3.0, true, false);
    case_position_table(16, 128, 256);
    case_position_table(3, 7, 67);
    TEST_END();
}
