/* SPDX-License-Identifier: MIT */
/* Tokenizer files in a directory, as a Hugging Face directory and `--tokenizer PATH` load them
 * (cg_tokenizer_load): the first byte picks the layout, 'j' vocab.json + merges.txt (the hub's
 * names), 'e' encoder.json + vocab.bpe (GPT-2's), anything else vocab.txt; the rest is the files,
 * SEP-separated, then a text. A load either fails naming its file, or gives a tokenizer that
 * survives cg_tokenizer_save_hf and a reload unchanged (same size, the same spelling for every
 * id: the promise a NUL inside a vocab.txt line once broke) and encodes the text to ids that
 * decode. */
#include "fuzz.h"

#include <sys/stat.h>

#define SEP "\n#cgrad-fuzz#\n"

static char dir[64], out[80];

static const char *in(const char *d, const char *name) {
    static char p[4][160];
    static int k;
    char *b = p[k++ & 3];
    snprintf(b, 160, "%s/%s", d, name);
    return b;
}

static const char *const files[] = {"vocab.json", "merges.txt", "encoder.json", "vocab.bpe", "vocab.txt",
                                    "cg_tokenizer.json"};
#define N_FILES (int)(sizeof files / sizeof files[0])

static void cleanup(void) {
    for (int i = 0; i < N_FILES; i++) unlink(in(dir, files[i])), unlink(in(out, files[i]));
    rmdir(out);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    cg_set_threads(1);
    snprintf(dir, sizeof dir, "%s", access("/dev/shm", W_OK) == 0 ? "/dev/shm/cgrad-fuzz-tok.XXXXXX" : "/tmp/cgrad-fuzz-tok.XXXXXX");
    FUZZ_CHECK(mkdtemp(dir), "mkdtemp failed");
    snprintf(out, sizeof out, "%s/saved", dir);
    atexit(cleanup);
    return 0;
}

static void put(const char *path, const uint8_t *p, size_t n) {
    FILE *f = fopen(path, "wb");
    FUZZ_CHECK(f && fwrite(p, 1, n, f) == n && fclose(f) == 0, "cannot write %s", path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    const char layout = (char)data[0];
    const uint8_t *p1, *p2;
    size_t n0, n1, n1a, n2;
    fuzz_split(data + 1, size - 1, SEP, &p1, &n0, &n1);
    for (int i = 0; i < N_FILES; i++) unlink(in(dir, files[i]));
    const char *text;
    size_t tlen;
    if (layout == 'j' || layout == 'e') {
        fuzz_split(p1, n1, SEP, &p2, &n1a, &n2);
        put(in(dir, layout == 'j' ? "vocab.json" : "encoder.json"), data + 1, n0);
        put(in(dir, layout == 'j' ? "merges.txt" : "vocab.bpe"), p1, n1a);
        text = (const char *)p2, tlen = n2;
    } else {
        put(in(dir, "vocab.txt"), data + 1, n0);
        text = (const char *)p1, tlen = n1;
    }
    cg_clear_error();
    cg_tokenizer *t = cg_tokenizer_load(dir);
    if (!t) {
        fuzz_expect_message(dir);
        return 0;
    }
    for (int i = 0; i < N_FILES; i++) unlink(in(out, files[i])); /* the last input's saved files */
    cg_clear_error();
    if (cg_tokenizer_save_hf(t, out) != CG_OK) { /* only the disk may refuse */
        FUZZ_CHECK(strstr(cg_last_error(), out), "save failed without naming the directory: %s", cg_last_error());
        cg_tokenizer_free(t);
        return 0;
    }
    cg_tokenizer *back = cg_tokenizer_load(out);
    FUZZ_CHECK(back, "a saved tokenizer does not load: %s", cg_last_error());
    const int32_t v = cg_tokenizer_vocab_size(t);
    FUZZ_CHECK(cg_tokenizer_vocab_size(back) == v && cg_tokenizer_kind(back) == cg_tokenizer_kind(t),
               "save and load changed the vocabulary: %d -> %d tokens", (int)v, (int)cg_tokenizer_vocab_size(back));
    for (int32_t id = 0; id < v; id++) {
        const char *a = cg_tokenizer_token_str(t, id), *b = cg_tokenizer_token_str(back, id);
        FUZZ_CHECK(a && b && !strcmp(a, b), "save and load changed token %d: '%s' -> '%s'", (int)id, a ? a : "(null)",
                   b ? b : "(null)");
    }
    char *s = fuzz_strndup((const uint8_t *)text, tlen);
    fuzz_encode_decode(t, s, tlen, false);
    free(s);
    cg_tokenizer_free(back);
    cg_tokenizer_free(t);
    return 0;
}
