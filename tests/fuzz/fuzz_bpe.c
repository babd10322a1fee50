/* SPDX-License-Identifier: MIT */
/* GPT-2 BPE loader and encoder. Input: encoder.json, SEP, vocab.bpe, SEP, text. The loader either
 * fails with a message naming the file or gives a tokenizer; the text is then encoded by it and by
 * GPT-2's own vocabulary (data/gpt2, when setup.sh fetched it): ids stay in the vocabulary and, for
 * valid UTF-8, decoding gives back the exact bytes (the documented promise); invalid UTF-8 fails
 * naming the byte offset. */
#include "fuzz.h"

#define SEP "\n#cgrad-fuzz#\n"

static cg_tokenizer *gpt2;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    cg_set_threads(1);
    gpt2 = cg_tokenizer_load(fuzz_src_path("data/gpt2"));
    if (!gpt2) fprintf(stderr, "fuzz_bpe: no data/gpt2 (run ./setup.sh): fuzzing the loader only\n");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *p1, *p2;
    size_t n0, n1, n1b, n2;
    fuzz_split(data, size, SEP, &p1, &n0, &n1);
    fuzz_split(p1, n1, SEP, &p2, &n1b, &n2);
    char *text = fuzz_strndup(p2, n2); /* a copy, so reads past the text are caught */
    cg_clear_error();
    cg_tokenizer *t = cg_tokenizer_bpe_from_memory((const char *)data, n0, (const char *)p1, n1b, "fuzz-encoder.json",
                                                   "fuzz-vocab.bpe");
    if (!t) fuzz_expect_message("fuzz-");
    else fuzz_encode_decode(t, text, n2, true);
    if (gpt2) fuzz_encode_decode(gpt2, text, n2, true);
    cg_tokenizer_free(t);
    free(text);
    return 0;
}
