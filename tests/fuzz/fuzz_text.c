/* SPDX-License-Identifier: MIT */
/* Plain-text corpus loader (`cgrad train --data` for gpt2 and bert): cg_read_text_file on the
 * input as a file, then what training does with it: a character tokenizer, a small BPE trained on
 * it, encoding, language-model windows. A file that loads is non-empty UTF-8 without NUL; both
 * tokenizers give back the exact text; batches hold ids of the vocabulary in the right windows. */
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    cg_set_threads(1);
    return 0;
}

static void check_round_trip(const cg_tokenizer *t, const char *text, size_t len, int32_t **ids_out, int64_t *n_out) {
    int32_t *ids = NULL;
    int64_t n = 0;
    FUZZ_CHECK(cg_tokenizer_encode(t, text, len, &ids, &n) == CG_OK, "encode of its own text failed: %s",
               cg_last_error());
    int32_t v = cg_tokenizer_vocab_size(t);
    for (int64_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < v, "id %d of %d", (int)ids[i], (int)v);
    char *back = NULL;
    size_t blen = 0;
    FUZZ_CHECK(cg_tokenizer_decode(t, ids, n, &back, &blen) == CG_OK, "decode failed: %s", cg_last_error());
    FUZZ_CHECK(blen == len && !memcmp(back, text, len), "decode(encode(text)) != text");
    free(back);
    if (ids_out) *ids_out = ids, *n_out = n;
    else free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, data, size);
    char *text = NULL;
    size_t len = 0;
    cg_clear_error();
    if (cg_read_text_file(path, &text, &len) != CG_OK) {
        FUZZ_CHECK(!text, "a failed read left text");
        fuzz_expect_message(path);
        return 0;
    }
    FUZZ_CHECK(len > 0 && text[len] == 0 && !memchr(text, 0, len), "loaded text is empty or holds a NUL");
    cg_tokenizer *ct = cg_tokenizer_char_new(text, len);
    FUZZ_CHECK(ct, "char tokenizer of loaded text failed: %s", cg_last_error());
    int32_t *ids;
    int64_t n;
    check_round_trip(ct, text, len, &ids, &n);
    cg_lm_data *lm = cg_lm_data_new(ids, n, 0.1);
    FUZZ_CHECK(lm, "lm data failed: %s", cg_last_error());
    int64_t nt = cg_lm_data_count(lm, false), ctx = nt > 9 ? 8 : nt - 1;
    if (ctx >= 1) {
        int32_t x[2 * 8], y[2 * 8];
        cg_rng r;
        cg_rng_seed(&r, size);
        FUZZ_CHECK(cg_lm_batch(lm, false, &r, 2, ctx, x, y) == CG_OK, "lm batch failed: %s", cg_last_error());
        for (int64_t b = 0; b < 2; b++)
            for (int64_t t = 0; t + 1 < ctx; t++) FUZZ_CHECK(x[b * ctx + t + 1] == y[b * ctx + t], "y is not x shifted");
        FUZZ_CHECK(cg_check_ids("x", x, 2 * ctx, cg_tokenizer_vocab_size(ct), ctx, false) == CG_OK, "%s", cg_last_error());
    }
    cg_lm_data_free(lm);
    free(ids);
    cg_tokenizer_free(ct);
    /* a small BPE trained on (the start of) the text */
    size_t cut = len < 512 ? len : 512;
    while (cut < len && ((unsigned char)text[cut] & 0xC0) == 0x80) cut--; /* not inside a character */
    cg_tokenizer *bt = cg_tokenizer_bpe_train(text, cut, 280);
    FUZZ_CHECK(bt, "bpe_train on valid text failed: %s", cg_last_error());
    check_round_trip(bt, text, len, NULL, NULL);
    cg_tokenizer_free(bt);
    free(text);
    return 0;
}
