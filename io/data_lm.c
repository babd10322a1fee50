/* SPDX-License-Identifier: MIT */
/* Language-model windows over one token stream, split into a training head and a held-out tail. */
#include <stdlib.h>
#include <string.h>

#include "io/data_internal.h"

struct cg_lm_data {
    int32_t *ids;
    int64_t n, n_train; /* training split = ids[0 .. n_train), held-out = ids[n_train .. n) */
};

cg_lm_data *cg_lm_data_new(const int32_t *ids, int64_t n, double val_fraction) {
    int64_t n_val;
    if (!ids || n < 1) {
        cgi_fail(CG_ERR_ARG, "[data] lm_data_new: %s", ids ? "no tokens" : "NULL ids");
        return NULL;
    }
    if (cgi_val_count("lm_data_new", n, val_fraction, &n_val)) return NULL;
    cg_lm_data *d = calloc(1, sizeof *d);
    if (d) d->ids = malloc((size_t)n * sizeof *ids);
    if (!d || !d->ids) {
        free(d);
        cgi_fail(CG_ERR_NOMEM, "[data] lm_data_new: out of memory for %lld ids", (long long)n);
        return NULL;
    }
    memcpy(d->ids, ids, (size_t)n * sizeof *ids);
    d->n = n;
    d->n_train = n - n_val;
    return d;
}

void cg_lm_data_free(cg_lm_data *d) {
    if (!d) return;
    free(d->ids);
    free(d);
}

int64_t cg_lm_data_count(const cg_lm_data *d, bool val) {
    if (!d) return 0;
    return val ? d->n - d->n_train : d->n_train;
}

cg_status cg_lm_batch(const cg_lm_data *d, bool val, cg_rng *r, int64_t batch, int64_t context, int32_t *x,
                      int32_t *y) {
    if (!d || !r || !x || !y) return cgi_fail(CG_ERR_ARG, "[data] lm_batch: NULL argument");
    if (batch < 1 || context < 1)
        return cgi_fail(CG_ERR_ARG, "[data] lm_batch: batch %lld and context %lld must be positive", (long long)batch,
                        (long long)context);
    const int32_t *base = d->ids + (val ? d->n_train : 0);
    int64_t n = cg_lm_data_count(d, val);
    if (n < context + 1)
        return cgi_fail(CG_ERR_ARG, "[data] lm_batch: the %s split has %lld tokens, fewer than context %lld + 1",
                        val ? "held-out" : "training", (long long)n, (long long)context);
    for (int64_t b = 0; b < batch; b++) {
        int64_t o = (int64_t)cgi_rng_below(r, (uint64_t)(n - context));
        memcpy(x + b * context, base + o, (size_t)context * sizeof *x);
        memcpy(y + b * context, base + o + 1, (size_t)context * sizeof *y);
    }
    return CG_OK;
}
