/* WordPiece loader and encoder. Input: vocab.txt, SEP, text. The loader either fails with a
 * message naming the file or gives a tokenizer; the text is then encoded by it and by
 * bert-base-uncased's vocabulary (data/bert, when setup.sh fetched it; else a test fixture):
 * valid UTF-8 always encodes, to ids inside the vocabulary that decode; invalid UTF-8 fails
 * naming the byte offset. */
#include "fuzz.h"

#define SEP "\n#cgrad-fuzz#\n"

static cg_tokenizer *bert;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    cg_set_threads(1);
    bert = cg_tokenizer_load(fuzz_src_path("data/bert/vocab.txt"));
    if (!bert) bert = cg_tokenizer_load(fuzz_src_path("tests/fixtures/tokenizer/tiny_vocab.txt"));
    FUZZ_CHECK(bert, "no WordPiece vocabulary: %s", cg_last_error());
    return 0;
}

static void encode(const cg_tokenizer *t, const char *text, size_t len) {
    int32_t *ids = NULL;
    int64_t n = 0;
    cg_clear_error();
    if (cg_tokenizer_encode(t, text, len, &ids, &n) != CG_OK) {
        FUZZ_CHECK(strstr(cg_last_error(), "UTF-8"), "encode failed on valid input? %s", cg_last_error());
        return;
    }
    int32_t v = cg_tokenizer_vocab_size(t);
    for (int64_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < v, "encode gave id %d of %d", (int)ids[i], (int)v);
    char *back = NULL;
    size_t blen = 0;
    FUZZ_CHECK(cg_tokenizer_decode(t, ids, n, &back, &blen) == CG_OK, "decode failed: %s", cg_last_error());
    free(back);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *p1;
    size_t n0, n1;
    fuzz_split(data, size, SEP, &p1, &n0, &n1);
    char *text = fuzz_strndup(p1, n1);
    cg_clear_error();
    cg_tokenizer *t = cg_tokenizer_wordpiece_from_memory((const char *)data, n0, "fuzz-vocab.txt");
    if (!t) fuzz_expect_message("fuzz-vocab.txt");
    else encode(t, text, n1);
    encode(bert, text, n1);
    cg_tokenizer_free(t);
    free(text);
    return 0;
}
