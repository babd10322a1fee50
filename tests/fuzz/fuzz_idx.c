/* SPDX-License-Identifier: MIT */
/* The IDX reader (`cgrad train --arch vit|cnn --data DIR`): the input parsed as an IDX image in
 * memory and read as a file (raw, or gzip when it starts 1f 8b). Either it fails with a message
 * naming the buffer or file, leaving the output untouched, or it gives an array whose sizes
 * account for every byte: 4 + 4 * ndim + count == length, count the product of the sizes. */
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    cg_set_threads(1);
    return 0;
}

static void check(cg_status st, const cg_idx *x, size_t len, const char *label, bool exact_len) {
    if (st) {
        fuzz_expect_message(label);
        FUZZ_CHECK(x->data == NULL && x->ndim == 0, "a refusal wrote the output");
        return;
    }
    FUZZ_CHECK(x->ndim >= 1 && x->ndim <= CG_IDX_MAX_DIMS, "ndim %d", x->ndim);
    int64_t n = 1;
    for (int i = 0; i < x->ndim; i++) {
        FUZZ_CHECK(x->dims[i] >= 1, "size %d is %lld", i, (long long)x->dims[i]);
        n *= x->dims[i];
    }
    FUZZ_CHECK(n == x->count && x->data, "count %lld, product %lld", (long long)x->count, (long long)n);
    if (exact_len)
        FUZZ_CHECK((size_t)(4 + 4 * x->ndim + x->count) == len, "header + %lld elements != %zu bytes",
                   (long long)x->count, len);
    volatile uint8_t sum = 0; /* every element readable (ASan checks the bound) */
    for (int64_t i = 0; i < x->count; i++) sum += x->data[i];
    (void)sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cg_idx x = {0};
    cg_clear_error();
    check(cg_idx_parse(data, size, "fuzz.idx", &x), &x, size, "fuzz.idx", true);
    cg_idx_free(&x);
    const char *path = fuzz_file(0, data, size);
    cg_clear_error();
    const bool gz = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
    check(cg_idx_read(path, &x), &x, size, "/proc/self/fd/", !gz);
    cg_idx_free(&x);
    return 0;
}
