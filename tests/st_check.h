/* SPDX-License-Identifier: MIT */
/* Reading a tensor of a safetensors file whole, as the parity tests against committed PyTorch
 * fixtures do (test_models, test_families). Include after cgrad.h. */
#ifndef CGRAD_TEST_ST_CHECK_H
#define CGRAD_TEST_ST_CHECK_H
#include <stdlib.h>

#include "../io/safetensors.h"

/* Tensor name of f as real values, malloc'd, its element count in *n; NULL if absent or unreadable. */
static cg_real *st_read_all(const cg_st *f, const char *name, int64_t *n) {
    int ndim;
    int64_t s[CG_MAX_DIMS];
    if (cg_st_info(f, name, NULL, &ndim, s)) return NULL;
    *n = 1;
    for (int i = 0; i < ndim; i++) *n *= s[i];
    cg_real *x = malloc((size_t)(*n ? *n : 1) * sizeof *x);
    if (x && cg_st_read(f, name, x, -1, NULL)) {
        free(x);
        return NULL;
    }
    return x;
}

#endif
