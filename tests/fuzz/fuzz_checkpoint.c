/* SPDX-License-Identifier: MIT */
/* Checkpoint loader, as `cgrad info`, `sample` and `train --resume` run it (cli/ckpt.c): gunzip,
 * parse the safetensors image, check format and version, rebuild tokenizer and model from the
 * metadata and read the parameters. An input that starts with the gzip magic is the file itself;
 * any other input is taken as the image inside and gzipped here, so mutations reach the metadata
 * and tensors instead of dying at the CRC check. */
#define FUZZ_MAX_ALLOC_MB "64"
#include "fuzz.h"

#include <math.h>
#include <zlib.h>

#include "../../cli/session.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    cg_set_threads(1);
    return 0;
}

/* data gzip-compressed (level 1) into a malloc'd buffer. */
static unsigned char *gzip(const uint8_t *data, size_t size, size_t *out_len) {
    z_stream z = {0};
    FUZZ_CHECK(deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK, "deflateInit2");
    size_t cap = deflateBound(&z, (uLong)size) + 64;
    unsigned char *out = malloc(cap);
    FUZZ_CHECK(out, "out of memory in the harness");
    z.next_in = (Bytef *)data;
    z.avail_in = (uInt)size;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    FUZZ_CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END, "deflate");
    *out_len = cap - z.avail_out;
    deflateEnd(&z);
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path;
    if (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) {
        path = fuzz_file(0, data, size);
    } else {
        size_t n;
        unsigned char *gz = gzip(data, size, &n);
        path = fuzz_file(0, gz, n);
        free(gz);
    }
    cg_clear_error();
    cli_ckpt ck;
    if (cli_ckpt_load(path, -1, &ck) != CG_OK) {
        fuzz_expect_message(path);
        return 0;
    }
    FUZZ_CHECK(ck.model && ck.tok && ck.ps && ck.train && ck.state, "a load succeeded without its parts");
    /* the loader refuses non-finite weights, so a model that loaded computes with finite ones */
    for (int i = 0; i < cg_params_count(ck.ps); i++) {
        cg_tensor *p = cg_params_at(ck.ps, i);
        for (int64_t k = 0; k < cg_numel(p); k++)
            FUZZ_CHECK(isfinite((double)cg_data(p)[k]), "parameter %s[%lld] = %g loaded", cg_name(p), (long long)k,
                       (double)cg_data(p)[k]);
    }
    /* every saved option and position field, read the ways `info` and `train --resume` read them */
    const cJSON *objs[2] = {ck.train, ck.state};
    for (int k = 0; k < 2; k++)
        for (const cJSON *v = objs[k]->child; v; v = v->next) {
            (void)cli_json_i64(objs[k], v->string, 0);
            (void)cli_json_u64(objs[k], v->string, 0);
            (void)cli_json_num(objs[k], v->string, 0);
            (void)cli_json_str(objs[k], v->string, "");
        }
    cli_ckpt_free(&ck);
    return 0;
}
