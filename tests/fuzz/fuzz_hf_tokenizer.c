/* SPDX-License-Identifier: MIT */
/* Hugging Face tokenizer.json: the input is a tokenizer.json, optionally followed by "\n@@TEXT@@\n"
 * and a text. Any input either fails to load with a message naming the file, or gives a tokenizer
 * that encodes the text (or a fixed sample) into ids inside its vocabulary (failing only on invalid
 * UTF-8 or a regex that gives up, with a message), decodes them into valid UTF-8, and encodes the
 * same ids again after a trip through its checkpoint form (serialize, deserialize). */
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    cg_set_threads(1);
    return 0;
}

static const char SAMPLE[] = "Hello world! It's 2024: naïve café, ΣΊΣΥΦΟΣ, 中文 😀👨‍👩‍👧 e\xcc\x81  \t\n<s> x";

static bool encode(const cg_tokenizer *t, const char *text, size_t len, int32_t **ids, int64_t *n) {
    cg_clear_error();
    if (cg_tokenizer_encode_special(t, text, len, ids, n) == CG_OK) return true;
    const char *m = cg_last_error();
    FUZZ_CHECK(strstr(m, "UTF-8") || strstr(m, "regex") || strstr(m, "out of memory"), "encode failed: %s", m);
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *tx;
    size_t nj, nt;
    fuzz_split(data, size, "\n@@TEXT@@\n", &tx, &nj, &nt);
    const char *text = nt ? (const char *)tx : SAMPLE;
    size_t tlen = nt ? nt : sizeof SAMPLE - 1;
    cg_clear_error();
    cg_tokenizer *t = cg_tokenizer_hf_from_memory((const char *)data, nj, "fuzz.json");
    if (!t) {
        fuzz_expect_message("fuzz.json");
        return 0;
    }
    int32_t v = cg_tokenizer_vocab_size(t);
    FUZZ_CHECK(v > 0 && cg_tokenizer_kind(t) == CG_TOK_HF, "a loaded tokenizer has %d ids", (int)v);
    int32_t *ids = NULL;
    int64_t n = 0;
    if (encode(t, text, tlen, &ids, &n)) {
        for (int64_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < v, "encode gave id %d of %d", (int)ids[i], (int)v);
        char *back = NULL;
        size_t blen = 0;
        FUZZ_CHECK(cg_tokenizer_decode(t, ids, n, &back, &blen) == CG_OK, "decode of encode failed: %s", cg_last_error());
        FUZZ_CHECK(strlen(back) <= blen, "decode length");
        /* the decoded text is UTF-8: encoding it fails on nothing but a regex giving up */
        int32_t *ids2 = NULL;
        int64_t n2 = 0;
        cg_clear_error();
        if (cg_tokenizer_encode(t, back, blen, &ids2, &n2) != CG_OK)
            FUZZ_CHECK(!strstr(cg_last_error(), "UTF-8"), "decode gave invalid UTF-8: %s", cg_last_error());
        free(ids2);
        free(back);
        /* the checkpoint form encodes alike */
        char *json = NULL;
        FUZZ_CHECK(cg_tokenizer_serialize(t, &json) == CG_OK, "serialize: %s", cg_last_error());
        cg_tokenizer *t2 = cg_tokenizer_deserialize(json);
        FUZZ_CHECK(t2, "the serialised tokenizer does not load: %s", cg_last_error());
        int32_t *ids3 = NULL;
        int64_t n3 = 0;
        if (encode(t2, text, tlen, &ids3, &n3))
            FUZZ_CHECK(n3 == n && !memcmp(ids3, ids, (size_t)n * sizeof *ids), "the serialised tokenizer encodes "
                       "differently (%lld vs %lld ids)", (long long)n3, (long long)n);
        free(ids3);
        free(json);
        cg_tokenizer_free(t2);
    }
    free(ids);
    cg_tokenizer_free(t);
    return 0;
}
