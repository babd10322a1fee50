/* SPDX-License-Identifier: MIT */
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *p1;
    size_t n0, n1;
    fuzz_split(data, size, SEP, &p1, &n0, &n1);
    char *text = fuzz_strndup(p1, n1);
    cg_clear_error();
    cg_tokenizer *t = cg_tokenizer_wordpiece_from_memory((const char *)data, n0, "fuzz-vocab.txt");
    if (!t) fuzz_expect_message("fuzz-vocab.txt");
    else fuzz_encode_decode(t, text, n1, false);
    fuzz_encode_decode(bert, text, n1, false);
    cg_tokenizer_free(t);
    free(text);
    return 0;
}
