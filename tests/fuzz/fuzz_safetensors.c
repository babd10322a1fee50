/* SPDX-License-Identifier: MIT */
/* safetensors reader: any bytes either open with every tensor readable (values and ids, within
 * the buffer) or fail with a message naming the label. */
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    cg_set_threads(1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cg_clear_error();
    cg_st *f = cg_st_open_memory(data, size, "fuzz.safetensors");
    if (!f) {
        fuzz_expect_message("fuzz.safetensors");
        return 0;
    }
    (void)cg_st_metadata(f, "format");
    int n = cg_st_count(f);
    for (int i = 0; i < n; i++) {
        const char *name = cg_st_name(f, i);
        FUZZ_CHECK(name && cg_st_find(f, name) == i, "tensor %d: find(name) != index", i);
        const char *dt;
        int nd;
        int64_t shape[CG_MAX_DIMS];
        if (cg_st_info(f, name, &dt, &nd, shape) != CG_OK) continue; /* more dims than cgrad has */
        uint64_t numel = 1;
        for (int d = 0; d < nd; d++) numel *= (uint64_t)shape[d];
        /* a validated header promises the bytes exist: numel elements of at least one byte each */
        FUZZ_CHECK(numel <= size, "tensor '%s' claims %llu elements in a %zu-byte file", name,
                   (unsigned long long)numel, size);
        bool real = !strcmp(dt, "F32") || !strcmp(dt, "F64") || !strcmp(dt, "F16") || !strcmp(dt, "BF16") ||
                    !strcmp(dt, "F8_E4M3") || !strcmp(dt, "F8_E5M2");
        void *dst = malloc((numel ? numel : 1) * sizeof(cg_real));
        FUZZ_CHECK(dst, "out of memory in the harness");
        cg_status s = real ? cg_st_read(f, name, dst, nd, shape) : cg_st_read_ids(f, name, dst, nd, shape);
        FUZZ_CHECK(s == CG_OK || (!real && s == CG_ERR_RANGE), "reading '%s' (%s) failed: %s", name, dt,
                   cg_last_error());
        /* the wrong reader must refuse, not reinterpret */
        s = real ? cg_st_read_ids(f, name, dst, nd, shape) : cg_st_read(f, name, dst, nd, shape);
        FUZZ_CHECK(s != CG_OK, "'%s' (%s) read by the wrong reader", name, dt);
        free(dst);
    }
    cg_st_close(f);
    return 0;
}
