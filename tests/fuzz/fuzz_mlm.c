/* SPDX-License-Identifier: MIT */
/* Masked-LM loader (`cgrad train --arch bert`): the text split into documents and sentences and
 * tokenized with bert-base-uncased's WordPiece (data/bert, else a test fixture), then BERT
 * pre-training batches. Loading either fails with a message or gives sentences whose rows are
 * [CLS] A [SEP] B [SEP] [PAD]... with labels only on masked positions and ids in the vocabulary. */
#include "fuzz.h"

static cg_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    cg_set_threads(1);
    tok = cg_tokenizer_load(fuzz_src_path("data/bert/vocab.txt"));
    if (!tok) tok = cg_tokenizer_load(fuzz_src_path("tests/fixtures/tokenizer/tiny_vocab.txt"));
    FUZZ_CHECK(tok, "no WordPiece vocabulary: %s", cg_last_error());
    return 0;
}

enum { B = 2, T = 12 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cg_mlm_options o;
    FUZZ_CHECK(cg_mlm_options_default(tok, &o) == CG_OK, "%s", cg_last_error());
    o.val_fraction = size ? (double)(data[0] % 4) / 8 : 0; /* 0, 1/8, 1/4 or 3/8 held out */
    cg_clear_error();
    cg_mlm_data *d = cg_mlm_data_new((const char *)data, size, tok, &o);
    if (!d) {
        fuzz_expect_message("[data]");
        return 0;
    }
    int64_t n = cg_mlm_data_count(d, false) + cg_mlm_data_count(d, true);
    for (int64_t i = 0; i < n; i++) {
        const int32_t *ids;
        int64_t k, doc;
        FUZZ_CHECK(cg_mlm_sentence(d, i, &ids, &k, &doc) == CG_OK, "%s", cg_last_error());
        FUZZ_CHECK(cg_check_ids("sentence", ids, k, o.vocab_size, 0, false) == CG_OK, "%s", cg_last_error());
    }
    int32_t in[B * T], tt[B * T], am[B * T], lab[B * T], nsp[B];
    cg_rng r;
    cg_rng_seed(&r, size);
    for (int v = 0; v < 2; v++) {
        if (cg_mlm_batch(d, v, &r, B, T, in, tt, am, lab, nsp) != CG_OK) {
            FUZZ_CHECK(v == 1, "training batch failed: %s", cg_last_error()); /* the held-out split may be too small */
            continue;
        }
        FUZZ_CHECK(cg_check_ids("input_ids", in, B * T, o.vocab_size, T, false) == CG_OK, "%s", cg_last_error());
        FUZZ_CHECK(cg_check_ids("labels", lab, B * T, o.vocab_size, T, true) == CG_OK, "%s", cg_last_error());
        for (int b = 0; b < B; b++) {
            FUZZ_CHECK(in[b * T] == o.cls_id && nsp[b] >= 0 && nsp[b] <= 1, "row %d: no [CLS] or bad NSP label", b);
            for (int t = 0; t < T; t++) {
                int i = b * T + t;
                FUZZ_CHECK(am[i] == 1 || (am[i] == 0 && in[i] == o.pad_id),
                           "row %d: attention mask %d at %d", b, am[i], t);
                FUZZ_CHECK(t == 0 || am[i] <= am[i - 1], "row %d: padding before a token at %d", b, t);
                FUZZ_CHECK(tt[i] == 0 || tt[i] == 1, "token type %d", tt[i]);
                FUZZ_CHECK(lab[i] == CG_IGNORE_INDEX || am[i] == 1, "a label on padding");
            }
        }
    }
    cg_mlm_data_free(d);
    return 0;
}
