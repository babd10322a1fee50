/* SPDX-License-Identifier: MIT */
/* Hugging Face directory loader, as `cgrad info`, `sample`, `fill-mask` and `train --init-from`
 * run it (cli/hf.c): config.json + model.safetensors + tokenizer files in a directory. Input:
 * config.json, SEP, model.safetensors, SEP, the tokenizer (cg_tokenizer.json when it starts with
 * '{', else vocab.txt); written into a scratch directory and loaded strictly (every name must
 * match) and partially (--init-from). A failed load names the directory's file it refused; a load
 * that succeeds has finite weights, a tokenizer of the model's vocabulary and, where the file
 * stores a tied twin, a twin equal to its parameter. */
#define FUZZ_MAX_ALLOC_MB "64"
#include "fuzz.h"

#include <math.h>
#include <sys/stat.h>

#include "../../cli/session.h"

#define SEP "\n#cgrad-fuzz#\n"

static char dir[64];

static const char *in_dir(const char *name) {
    static char p[4][128];
    static int k;
    char *b = p[k++ & 3];
    snprintf(b, 128, "%s/%s", dir, name);
    return b;
}

static void cleanup(void) {
    static const char *const files[] = {"config.json", "model.safetensors", "cg_tokenizer.json", "vocab.txt"};
    for (int i = 0; i < 4; i++) unlink(in_dir(files[i]));
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    cg_set_threads(1);
    snprintf(dir, sizeof dir, "%s", access("/dev/shm", W_OK) == 0 ? "/dev/shm/cgrad-fuzz-hf.XXXXXX" : "/tmp/cgrad-fuzz-hf.XXXXXX");
    FUZZ_CHECK(mkdtemp(dir), "mkdtemp failed");
    atexit(cleanup);
    return 0;
}

static void put(const char *name, const uint8_t *p, size_t n) {
    FILE *f = fopen(in_dir(name), "wb");
    FUZZ_CHECK(f && fwrite(p, 1, n, f) == n && fclose(f) == 0, "cannot write %s", in_dir(name));
}

/* Values of a tied twin in the file equal its parameter's (the load checked them). */
static void check_twin(const cli_ckpt *ck, const char *stored, const char *param) {
    cg_tensor *p = cg_params_find(ck->ps, param);
    char prefixed[256];
    snprintf(prefixed, sizeof prefixed, "transformer.%s", param);
    const bool source_stored = cg_st_find(ck->st, param) >= 0 || cg_st_find(ck->st, prefixed) >= 0;
    if (!p || !source_stored || cg_params_find(ck->ps, stored) || cg_st_find(ck->st, stored) < 0) return;
    const int64_t n = cg_numel(p);
    cg_real *v = malloc((size_t)n * sizeof *v + 1);
    FUZZ_CHECK(v, "out of memory in the harness");
    FUZZ_CHECK(cg_st_read(ck->st, stored, v, cg_ndim(p), cg_shape(p)) == CG_OK, "twin %s unreadable after a load: %s",
               stored, cg_last_error());
    FUZZ_CHECK(!memcmp(v, cg_data(p), (size_t)n * sizeof *v), "twin %s differs from %s after a load", stored, param);
    free(v);
}

static void load(bool partial) {
    cli_ckpt ck;
    cg_clear_error();
    if (cli_hf_load(dir, 0.0, partial, &ck) != CG_OK) {
        fuzz_expect_message(dir);
        return;
    }
    FUZZ_CHECK(ck.model && ck.tok && ck.ps && ck.st, "a load succeeded without its parts");
    for (int i = 0; i < cg_params_count(ck.ps); i++) {
        cg_tensor *p = cg_params_at(ck.ps, i);
        for (int64_t k = 0; k < cg_numel(p); k++)
            FUZZ_CHECK(isfinite((double)cg_data(p)[k]), "parameter %s[%lld] = %g loaded", cg_name(p), (long long)k,
                       (double)cg_data(p)[k]);
    }
    FUZZ_CHECK(cli_check_vocab(ck.model, ck.tok, "tokenizer", "config") == CG_OK, "loaded with a mismatched vocabulary: %s",
               cg_last_error());
    check_twin(&ck, "lm_head.weight", "wte.weight");
    check_twin(&ck, "lm_head.weight", "model.embed_tokens.weight");
    check_twin(&ck, "cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight");
    check_twin(&ck, "cls.predictions.decoder.bias", "cls.predictions.bias");
    cli_ckpt_free(&ck);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *p1, *p2;
    size_t n0, n1, n1a, n2;
    fuzz_split(data, size, SEP, &p1, &n0, &n1);
    fuzz_split(p1, n1, SEP, &p2, &n1a, &n2);
    put("config.json", data, n0);
    put("model.safetensors", p1, n1a);
    const bool json = n2 && p2[0] == '{';
    unlink(in_dir(json ? "vocab.txt" : "cg_tokenizer.json"));
    put(json ? "cg_tokenizer.json" : "vocab.txt", p2, n2);
    load(false);
    load(true);
    return 0;
}
