/* SPDX-License-Identifier: MIT */
/* TSV loaders (`cgrad train --arch classifier|encdec --data F --val-data G`): input = training
 * file, SEP, held-out file (no SEP: no held-out file, the last quarter of lines is held out).
 * Classification lines are tokenized with WordPiece, sequence pairs with a character tokenizer of
 * printable ASCII (so other characters are tokenizer errors). Loading either fails with a message
 * naming a file or gives examples whose batches hold ids of the vocabulary, masks of 0/1 and
 * labels among the label names. */
#include "fuzz.h"

#define SEP "\n#cgrad-fuzz#\n"

static cg_tokenizer *wp, *ascii;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    cg_set_threads(1);
    wp = cg_tokenizer_load(fuzz_src_path("data/bert/vocab.txt"));
    if (!wp) wp = cg_tokenizer_load(fuzz_src_path("tests/fixtures/tokenizer/tiny_vocab.txt"));
    char printable[96];
    for (int c = 32; c < 127; c++) printable[c - 32] = (char)c;
    printable[95] = '\t';
    ascii = cg_tokenizer_char_new(printable, 96);
    FUZZ_CHECK(wp && ascii, "tokenizers: %s", cg_last_error());
    return 0;
}

enum { B = 2 };

static void textcls(const char *train, const char *val) {
    cg_textcls_options o;
    cg_textcls_options_default(wp, &o);
    o.max_len = 16;
    o.val_fraction = val ? 0 : 0.25;
    cg_clear_error();
    cg_textcls_data *d = cg_textcls_data_load(train, val, wp, &o);
    if (!d) {
        fuzz_expect_message("/proc/self/fd/");
        return;
    }
    int32_t nl = cg_textcls_num_labels(d), v = cg_tokenizer_vocab_size(wp);
    FUZZ_CHECK(nl >= 1, "no labels");
    for (int32_t i = 0; i < nl; i++) {
        const char *name = cg_textcls_label_name(d, i);
        FUZZ_CHECK(name && name[0] && cg_textcls_label_id(d, name) == i, "label %d does not map back", (int)i);
    }
    int64_t T = cg_textcls_data_cap(d);
    FUZZ_CHECK(T >= 1 && T <= 16, "cap %lld", (long long)T);
    int32_t ids[B * 16], mask[B * 16], lab[B];
    int64_t len;
    for (int s = 0; s < 2; s++) {
        cg_data_cursor c;
        cg_data_cursor_init(&c, 7);
        int64_t n = cg_textcls_data_count(d, s);
        for (int k = 0; k < 3 && n >= B; k++) {
            FUZZ_CHECK(cg_textcls_batch(d, s, &c, B, ids, mask, lab, &len) == CG_OK, "%s", cg_last_error());
            FUZZ_CHECK(len >= 1 && len <= T, "batch length %lld of cap %lld", (long long)len, (long long)T);
            FUZZ_CHECK(cg_check_ids("input_ids", ids, B * len, v, len, false) == CG_OK, "%s", cg_last_error());
            for (int b = 0; b < B; b++) FUZZ_CHECK(lab[b] >= 0 && lab[b] < nl, "label %d of %d", (int)lab[b], (int)nl);
            for (int64_t i = 0; i < B * len; i++) FUZZ_CHECK(mask[i] == 0 || mask[i] == 1, "mask %d", (int)mask[i]);
        }
    }
    cg_textcls_data_free(d);
}

static void seq2seq(const char *train, const char *val) {
    int32_t v = cg_tokenizer_vocab_size(ascii);
    cg_seq2seq_options o = {.pad_id = v, .bos_id = v + 1, .eos_id = v + 2, .max_src = 12, .max_tgt = 12,
                            .val_fraction = val ? 0 : 0.25};
    cg_clear_error();
    cg_seq2seq_data *d = cg_seq2seq_data_load(train, val, ascii, NULL, &o);
    if (!d) {
        fuzz_expect_message("/proc/self/fd/");
        return;
    }
    int64_t S, T;
    cg_seq2seq_data_caps(d, &S, &T);
    FUZZ_CHECK(S >= 1 && S <= 12 && T >= 1 && T <= 12, "caps %lld %lld", (long long)S, (long long)T);
    int32_t src[B * 12], sm[B * 12], ti[B * 12], to[B * 12];
    int64_t ls, lt;
    for (int s = 0; s < 2; s++) {
        cg_data_cursor c;
        cg_data_cursor_init(&c, 7);
        int64_t n = cg_seq2seq_data_count(d, s);
        for (int k = 0; k < 3 && n >= B; k++) {
            FUZZ_CHECK(cg_seq2seq_batch(d, s, &c, B, src, sm, ti, to, &ls, &lt) == CG_OK, "%s", cg_last_error());
            FUZZ_CHECK(ls >= 1 && ls <= S && lt >= 1 && lt <= T, "batch %lld %lld", (long long)ls, (long long)lt);
            FUZZ_CHECK(cg_check_ids("src", src, B * ls, v + 3, ls, false) == CG_OK, "%s", cg_last_error());
            FUZZ_CHECK(cg_check_ids("tgt_in", ti, B * lt, v + 3, lt, false) == CG_OK, "%s", cg_last_error());
            FUZZ_CHECK(cg_check_ids("tgt_out", to, B * lt, v + 3, lt, true) == CG_OK, "%s", cg_last_error());
            for (int b = 0; b < B; b++) FUZZ_CHECK(ti[b * lt] == o.bos_id, "tgt_in does not start with bos");
        }
    }
    cg_seq2seq_data_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *p1;
    size_t n0, n1;
    fuzz_split(data, size, SEP, &p1, &n0, &n1);
    bool has_val = p1 < data + size || (n0 < size);
    const char *train = fuzz_file(0, data, n0), *val = has_val ? fuzz_file(1, p1, n1) : NULL;
    textcls(train, val);
    seq2seq(train, val);
    return 0;
}
