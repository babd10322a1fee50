/* SPDX-License-Identifier: MIT */
/* Serialised tokenizer (the "tokenizer" a checkpoint stores, or a cg_tokenizer.json): any text
 * either fails with a message or gives a tokenizer that serialises to JSON it reads back the same,
 * and that encodes and decodes its own vocabulary. */
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    cg_set_threads(1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_strndup(data, size);
    cg_clear_error();
    cg_tokenizer *t = cg_tokenizer_deserialize(text);
    free(text);
    if (!t) {
        fuzz_expect_message("deserialize");
        return 0;
    }
    int32_t n = cg_tokenizer_vocab_size(t);
    FUZZ_CHECK(n > 0, "an empty vocabulary was accepted");
    char *j1 = NULL, *j2 = NULL;
    FUZZ_CHECK(cg_tokenizer_serialize(t, &j1) == CG_OK, "serialize failed: %s", cg_last_error());
    cg_tokenizer *t2 = cg_tokenizer_deserialize(j1);
    FUZZ_CHECK(t2, "the tokenizer's own JSON does not load: %s", cg_last_error());
    FUZZ_CHECK(cg_tokenizer_serialize(t2, &j2) == CG_OK && !strcmp(j1, j2), "serialisation is not stable");
    /* every token's spelling maps back to an id that spells the same (but the char tokenizer's
     * U+0000 is "" as a C string, and so is an id of a tokenizer.json that no token has) */
    for (int32_t i = 0; i < n && i < 4096; i++) {
        const char *s = cg_tokenizer_token_str(t, i);
        FUZZ_CHECK(s, "token %d has no spelling", (int)i);
        if (!s[0] && (cg_tokenizer_kind(t) == CG_TOK_CHAR || cg_tokenizer_kind(t) == CG_TOK_HF)) continue;
        int32_t k = cg_tokenizer_token_id(t, s);
        FUZZ_CHECK(k >= 0 && k < n && !strcmp(cg_tokenizer_token_str(t, k), s), "token %d does not map back", (int)i);
    }
    /* decode all ids, then encode that text: ids stay in range */
    int32_t m = n < 512 ? n : 512, *ids = malloc((size_t)m * sizeof *ids), *back = NULL;
    for (int32_t i = 0; i < m; i++) ids[i] = i;
    char *txt = NULL;
    size_t len = 0;
    int64_t nb = 0;
    if (cg_tokenizer_decode(t, ids, m, &txt, &len) == CG_OK &&
        cg_tokenizer_encode(t, txt, len, &back, &nb) == CG_OK)
        for (int64_t i = 0; i < nb; i++) FUZZ_CHECK(back[i] >= 0 && back[i] < n, "encode gave id %d", (int)back[i]);
    free(ids), free(back), free(txt), free(j1), free(j2);
    cg_tokenizer_free(t2);
    cg_tokenizer_free(t);
    return 0;
}
