/* SPDX-License-Identifier: MIT */
/* What the losses in ops/loss.c and ops/loss_head.c share. */
#ifndef CGRAD_LOSS_INTERNAL_H
#define CGRAD_LOSS_INTERNAL_H

#include "graph/internal.h"

/* Targets are data: checked on every forward. Calls each(r) for every counted row, in order. */
#define FOR_COUNTED_TARGETS(op, tg, classes, ignore, r, k, EACH)                                               \
    for (int64_t r = 0; r < cgi_numel((tg)->ndim, (tg)->shape); r++) {                                      \
        const int32_t k = ((const int32_t *)(tg)->data)[cgi_elem_offset(tg, r)];                          \
        if (k == (ignore)) continue;                                                                        \
        if (k < 0 || k >= (classes))                                                                        \
            return cgi_fail(CG_ERR_RANGE, "[%s] target %d at position %lld of targets%s is outside [0, %lld) " \
                            "and is not ignore_index %d", op, k, (long long)r, cgi_shp(tg), (long long)(classes), \
                            (int)(ignore));                                                                 \
        EACH;                                                                                               \
    }

#endif
