/* SPDX-License-Identifier: MIT */
/* The relative position biases of the fused attention (ops/attention.c): T5's bucketed table and
 * ALiBi's per-head slopes, both functions of the key's offset from the query only. */
#include <math.h>

#include "ops/attention_internal.h"

/* T5's bucket of a relative position rel = key - query (Raffel et al., as Hugging Face's
 * _relative_position_bucket computes it, in float32 for the logarithmic part): exact buckets for
 * short distances, logarithmic ones up to max_distance; bidirectional tables spend half their
 * buckets on keys after the query. */
int32_t cgi_t5_bucket(int64_t rel, bool bidirectional, int64_t nb, int64_t max_distance) {
    int64_t b = 0;
    if (bidirectional) {
        nb /= 2;
        if (rel > 0) b += nb;
        rel = rel < 0 ? -rel : rel;
    } else rel = rel < 0 ? -rel : 0;
    const int64_t exact = nb / 2;
    if (rel < exact) return (int32_t)(b + rel);
    const float f = logf((float)rel / (float)exact) / (float)log((double)max_distance / (double)exact) *
                    (float)(nb - exact);
    const int64_t large = exact + (int64_t)f;
    return (int32_t)(b + (large < nb - 1 ? large : nb - 1));
}

/* ALiBi's slope for query head h of n (Press et al.): 2^(-8 (h + 1) / n) for n a power of two;
 * otherwise, as BLOOM, the slopes of the power of two p below n, then every other slope of 2p. */
double cgi_alibi_slope(int64_t h, int64_t n) {
    int64_t p = 1;
    while (p * 2 <= n) p *= 2;
    return h < p ? pow(2.0, -8.0 * (double)(h + 1) / (double)p) : pow(2.0, -4.0 * (double)(2 * (h - p) + 1) / (double)p);
}
