/* SPDX-License-Identifier: MIT */
/* Data loaders: text files, id checks, LM windows, BERT masked-LM/next-sentence rows, seq2seq and
 * classification TSVs (hand-checked tensors from tests/fixtures/data), errors, resumable state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "io/data.h"

#define FIX CGRAD_TEST_DIR "/fixtures/data/"

static char tmpdir[64];

/* Writes n bytes to a file in the test's temporary directory; returns its path (static buffer). */
static const char *write_tmp(const char *name, const char *bytes, size_t n) {
    static char path[4][256];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, 256, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "wb");
    if (f) {
        fwrite(bytes, 1, n, f);
        fclose(f);
    }
    return p;
}

static bool has(const char *msg, const char *part) { return strstr(msg, part) != NULL; }

static bool same(const int32_t *a, const int32_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (a[i] != b[i]) return false;
    return true;
}

/* ---- text files and id checks ---- */

static void test_text_files(void) {
    char *text;
    size_t len;
    const char *p = write_tmp("ok.txt", "\xEF\xBB\xBFh\xC3\xA9llo\n", 10);
    CHECK(cg_read_text_file(p, &text, &len) == CG_OK && len == 7 && !memcmp(text, "h\xC3\xA9llo\n", 8),
          "BOM dropped, NUL-terminated: %s", cg_last_error());
    free(text);

    p = write_tmp("empty.txt", "", 0);
    CHECK(cg_read_text_file(p, &text, &len) == CG_ERR_FORMAT && has(cg_last_error(), "empty.txt") &&
              has(cg_last_error(), "empty file") && text == NULL,
          "%s", cg_last_error());

    struct { const char *bytes; size_t n, at; } bad[] = {
        {"ok\xC3\x28 rest", 9, 2},     /* lead byte without its continuation */
        {"\xC0\xAF", 2, 0},            /* overlong '/' */
        {"abc\xED\xA0\x80", 6, 3},     /* UTF-16 surrogate */
        {"ab\xE2\x82", 4, 2},          /* truncated at the end */
        {"x\xF4\x90\x80\x80", 5, 1},   /* past U+10FFFF */
        {"\xE2\x82\xAC\x80", 4, 3},    /* stray continuation after a valid euro sign */
        {"ab\xE0\x80\xAF", 5, 2},       /* overlong 3-byte '/' */
        {"\xF0\x80\x80\xAF", 4, 0},      /* overlong 4-byte '/' */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        p = write_tmp("bad.txt", bad[i].bytes, bad[i].n);
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu ", bad[i].at);
        cg_status s = cg_read_text_file(p, &text, &len);
        CHECK(s == CG_ERR_FORMAT && has(cg_last_error(), want) && has(cg_last_error(), "bad.txt"),
              "case %zu: status %d, message %s (want %s)", i, (int)s, cg_last_error(), want);
    }
    p = write_tmp("nul.txt", "ab\0c", 4);
    CHECK(cg_read_text_file(p, &text, &len) == CG_ERR_FORMAT && has(cg_last_error(), "offset 2"), "%s",
          cg_last_error());
    CHECK(cg_read_text_file(FIX "missing.txt", &text, &len) == CG_ERR_IO && has(cg_last_error(), "missing.txt"), "%s",
          cg_last_error());
    CHECK(cg_read_text_file(tmpdir, &text, &len) == CG_ERR_IO && has(cg_last_error(), "is a directory"), "directory: %s",
          cg_last_error());
    /* a device never ends: refused before a byte is read, naming it */
    CHECK(cg_read_text_file("/dev/zero", &text, &len) == CG_ERR_IO && has(cg_last_error(), "/dev/zero") &&
              has(cg_last_error(), "character device"),
          "device: %s", cg_last_error());
}

static void test_check_ids(void) {
    int32_t ids[6] = {0, 5, 9, 3, 10, 1};
    CHECK(cg_check_ids("input_ids", ids, 4, 10, 3, false) == CG_OK, "%s", cg_last_error());
    CHECK(cg_check_ids("input_ids", ids, 6, 10, 3, false) == CG_ERR_RANGE &&
              has(cg_last_error(), "input_ids[1,1] = 10") && has(cg_last_error(), "[0, 10)"),
          "%s", cg_last_error());
    CHECK(cg_check_ids("ids", ids, 6, 10, 0, false) == CG_ERR_RANGE && has(cg_last_error(), "ids[4] = 10"), "%s",
          cg_last_error());
    int32_t lab[3] = {2, -100, -1};
    CHECK(cg_check_ids("labels", lab, 2, 3, 0, true) == CG_OK, "-100 allowed: %s", cg_last_error());
    CHECK(cg_check_ids("labels", lab, 2, 3, 0, false) == CG_ERR_RANGE && has(cg_last_error(), "labels[1] = -100"),
          "%s", cg_last_error());
    CHECK(cg_check_ids("labels", lab, 3, 3, 0, true) == CG_ERR_RANGE && has(cg_last_error(), "labels[2] = -1"), "%s",
          cg_last_error());
}

/* ---- language-model windows ---- */

static void test_lm(void) {
    enum { N = 1000, B = 64, T = 16 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = i; /* each id names its own position */
    cg_lm_data *d = cg_lm_data_new(ids, N, 0.1);
    CHECK(d && cg_lm_data_count(d, false) == 900 && cg_lm_data_count(d, true) == 100, "split 900/100");
    static int32_t x[B * T], y[B * T], x2[B * T], y2[B * T];
    cg_rng r;
    cg_rng_seed(&r, 7);
    bool shifted = true, contiguous = true, inside = true, hit_lo = false, hit_hi = false;
    double mean = 0;
    int draws = 0;
    for (int it = 0; it < 300; it++) {
        CHECK(cg_lm_batch(d, false, &r, B, T, x, y) == CG_OK, "%s", cg_last_error());
        for (int b = 0; b < B; b++) {
            int o = x[b * T];
            inside &= o >= 0 && o + T <= 899; /* y's last id stays in the training split */
            hit_lo |= o == 0;
            hit_hi |= o == 900 - T - 1;
            mean += o, draws++;
            for (int t = 0; t < T; t++) {
                shifted &= y[b * T + t] == x[b * T + t] + 1;
                contiguous &= x[b * T + t] == o + t;
            }
        }
    }
    CHECK(shifted && contiguous && inside, "x/y windows: shifted %d contiguous %d inside %d", shifted, contiguous,
          inside);
    CHECK(hit_lo && hit_hi, "offsets 0 and n-T-1 both drawn (%d %d)", hit_lo, hit_hi);
    CHECK_NEAR(mean / draws, (900 - T - 1) / 2.0, 6.0); /* uniform over [0, 883]: sd of the mean ~1.1 */

    bool val_ok = true;
    for (int it = 0; it < 50; it++) {
        CHECK(cg_lm_batch(d, true, &r, B, T, x, y) == CG_OK, "%s", cg_last_error());
        for (int b = 0; b < B; b++) val_ok &= x[b * T] >= 900 && y[b * T + T - 1] <= 999 && y[b * T] == x[b * T] + 1;
    }
    CHECK(val_ok, "validation windows lie in the last 10%%");

    cg_rng a, b2;
    cg_rng_seed(&a, 42);
    cg_rng_seed(&b2, 42);
    cg_lm_batch(d, false, &a, B, T, x, y);
    cg_lm_batch(d, false, &b2, B, T, x2, y2);
    CHECK(same(x, x2, B * T) && same(y, y2, B * T), "same seed, same batch");
    cg_rng_seed(&b2, 43);
    cg_lm_batch(d, false, &b2, B, T, x2, y2);
    CHECK(!same(x, x2, B * T), "different seed, different batch");
    /* resume: the one state word is the whole checkpoint */
    uint64_t saved = a.state;
    cg_lm_batch(d, false, &a, B, T, x, y);
    cg_rng c = {saved};
    cg_lm_batch(d, false, &c, B, T, x2, y2);
    CHECK(same(x, x2, B * T) && a.state == c.state, "restored rng state gives the same next batch");

    /* sizes: a split of n tokens allows context n - 1 and no more; failures draw nothing */
    CHECK(cg_lm_batch(d, false, &a, 1, 899, x, y) == CG_OK, "context 899 fits 900 tokens: %s", cg_last_error());
    saved = a.state;
    CHECK(cg_lm_batch(d, false, &a, 1, 900, x, y) == CG_ERR_ARG && has(cg_last_error(), "900 tokens") &&
              a.state == saved,
          "%s", cg_last_error());
    CHECK(cg_lm_batch(d, true, &a, 1, 100, x, y) == CG_ERR_ARG && has(cg_last_error(), "held-out split has 100"), "%s",
          cg_last_error());
    CHECK(cg_lm_batch(d, false, &a, 0, 4, x, y) == CG_ERR_ARG, "batch 0");
    CHECK(cg_lm_data_new(ids, N, 1.0) == NULL && has(cg_last_error(), "val_fraction"), "%s", cg_last_error());
    cg_lm_data_free(d);
    cg_lm_data *nv = cg_lm_data_new(ids, 10, 0.0);
    CHECK(nv && cg_lm_batch(nv, true, &a, 1, 1, x, y) == CG_ERR_ARG, "no held-out split: %s", cg_last_error());
    cg_lm_data_free(nv);
}

/* ---- masked LM and next-sentence pairs ---- */

/* Text of sentence i decoded with the char tokenizer (caller frees). */
static char *sentence_text(const cg_mlm_data *d, const cg_tokenizer *tok, int64_t i, int64_t *doc) {
    const int32_t *ids;
    int64_t n;
    char *s = NULL;
    if (cg_mlm_sentence(d, i, &ids, &n, doc) || cg_tokenizer_decode(tok, ids, n, &s, NULL)) return NULL;
    return s;
}

static void test_mlm_split(void) {
    const char *text = "Hello world. How are you?\nFine!  Thanks.\n\nNew doc \"quoted.\" End\nhere.\n   \n\n"
                       "Last one. 3.14 is pi.";
    const char *want[8] = {"Hello world.", "How are you?", "Fine!", "Thanks.", "New doc \"quoted.\"", "End here.",
                           "Last one.", "3.14 is pi."};
    int64_t want_doc[8] = {0, 0, 0, 0, 1, 1, 2, 2};
    cg_tokenizer *tok = cg_tokenizer_char_new(text, strlen(text));
    int32_t V = cg_tokenizer_vocab_size(tok);
    cg_mlm_options o = {V, V + 1, V + 2, V + 3, V, 0.15, 0.25};
    cg_mlm_data *d = cg_mlm_data_new(text, strlen(text), tok, &o);
    CHECK(d && cg_mlm_data_count(d, false) == 6 && cg_mlm_data_count(d, true) == 2, "%s", cg_last_error());
    for (int i = 0; d && i < 8; i++) {
        int64_t doc = -1;
        char *s = sentence_text(d, tok, i, &doc);
        CHECK(s && !strcmp(s, want[i]) && doc == want_doc[i], "sentence %d: '%s' doc %lld, want '%s' doc %lld", i,
              s ? s : "(null)", (long long)doc, want[i], (long long)want_doc[i]);
        free(s);
    }
    /* the held-out split is one document of two sentences: no NotNext partner; failures draw nothing */
    static int32_t ii[80], tt[80], am[80], lab[80], nsp[2];
    cg_rng r;
    cg_rng_seed(&r, 1);
    uint64_t before = r.state;
    CHECK(d && cg_mlm_batch(d, true, &r, 2, 20, ii, tt, am, lab, nsp) == CG_ERR_ARG &&
              has(cg_last_error(), "held-out") && r.state == before,
          "%s", cg_last_error());
    CHECK(d && cg_mlm_batch(d, false, &r, 2, 4, ii, tt, am, lab, nsp) == CG_ERR_ARG &&
              has(cg_last_error(), "at least 5"),
          "%s", cg_last_error());
    const int32_t *sids;
    int64_t sn;
    CHECK(d && cg_mlm_sentence(d, 8, &sids, &sn, NULL) == CG_ERR_ARG, "index out of range");
    cg_mlm_data_free(d);
    /* a cut inside a document makes two: 3 held out = the last of doc 1 and doc 2 */
    o.val_fraction = 0.375;
    d = cg_mlm_data_new(text, strlen(text), tok, &o);
    int64_t docs[8], expect[8] = {0, 0, 0, 0, 1, 2, 3, 3};
    bool ok = d != NULL;
    for (int i = 0; ok && i < 8; i++) ok = cg_mlm_sentence(d, i, &sids, &sn, &docs[i]) == CG_OK && docs[i] == expect[i];
    CHECK(ok && cg_mlm_data_count(d, true) == 3, "documents after the cut");
    /* held out: A can only be sentence 6; IsNext B is 7, NotNext B is 5 (the other document) */
    int32_t s5[16], s6[16], s7[16];
    int64_t n5 = 0, n6 = 0, n7 = 0;
    if (ok) {
        cg_mlm_sentence(d, 5, &sids, &n5, NULL), memcpy(s5, sids, (size_t)n5 * 4);
        cg_mlm_sentence(d, 6, &sids, &n6, NULL), memcpy(s6, sids, (size_t)n6 * 4);
        cg_mlm_sentence(d, 7, &sids, &n7, NULL), memcpy(s7, sids, (size_t)n7 * 4);
    }
    CHECK(ok && cg_mlm_batch(d, true, &r, 2, 40, ii, tt, am, lab, nsp) == CG_OK, "%s", cg_last_error());
    for (int b = 0; ok && b < 2; b++) {
        int32_t orig[40];
        for (int t = 0; t < 40; t++) orig[t] = lab[b * 40 + t] != -100 ? lab[b * 40 + t] : ii[b * 40 + t];
        const int32_t *bs = nsp[b] ? s5 : s7;
        int64_t nb = nsp[b] ? n5 : n7;
        CHECK(orig[0] == o.cls_id && same(orig + 1, s6, n6) && orig[1 + n6] == o.sep_id &&
                  same(orig + 2 + n6, bs, nb) &&
                  orig[2 + n6 + nb] == o.sep_id && orig[3 + n6 + nb] == o.pad_id,
              "held-out row %d (label %d)", b, (int)nsp[b]);
    }
    cg_mlm_data_free(d);
    const char *one = "Hello there now.";
    CHECK(cg_mlm_data_new(one, strlen(one), tok, &o) == NULL && has(cg_last_error(), "no two consecutive"), "%s",
          cg_last_error());
    const char *two = "Hello. Fine.";
    o.val_fraction = 0;
    CHECK(cg_mlm_data_new(two, strlen(two), tok, &o) == NULL && has(cg_last_error(), "NotNext"), "%s", cg_last_error());
    CHECK(cg_mlm_data_new("Bad\xFF. Yes. No.", 14, tok, &o) == NULL && has(cg_last_error(), "offset 3"), "%s",
          cg_last_error());
    const char *unknown = "Zebra. Yes. No."; /* 'Z' and 'b' are not in the char vocabulary */
    CHECK(cg_mlm_data_new(unknown, strlen(unknown), tok, &o) == NULL && has(cg_last_error(), "sentence at byte 0"),
          "%s", cg_last_error());
    o.mask_id = o.cls_id;
    CHECK(cg_mlm_data_new(text, strlen(text), tok, &o) == NULL && has(cg_last_error(), "must differ"), "%s",
          cg_last_error());
    cg_tokenizer_free(tok);
}

/* A corpus of numbered sentences in documents of varied length: every sentence is distinct. */
static char *make_corpus(void) {
    static const char *words[] = {"the", "whale", "sea", "ship", "captain", "rope", "harpoon", "deck", "storm", "sail"};
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    cg_rng r;
    cg_rng_seed(&r, 99);
    int id = 0;
    for (int doc = 0; doc < 12; doc++) {
        int ns = 2 + doc % 5;
        for (int k = 0; k < ns; k++) {
            n += (size_t)snprintf(s + n, cap - n, "s%d", id++);
            int nw = 2 + (int)(cg_rng_next(&r) % 7);
            for (int w = 0; w < nw; w++) n += (size_t)snprintf(s + n, cap - n, " %s", words[cg_rng_next(&r) % 10]);
            n += (size_t)snprintf(s + n, cap - n, "%s", k % 3 == 0 ? ".\n" : k % 3 == 1 ? "! " : "? ");
        }
        n += (size_t)snprintf(s + n, cap - n, "\n\n");
    }
    return s;
}

static void test_mlm_batches(void) {
    char *text = make_corpus();
    cg_tokenizer *tok = cg_tokenizer_char_new(text, strlen(text));
    int32_t V = cg_tokenizer_vocab_size(tok);
    cg_mlm_options o = {V, V + 1, V + 2, V + 3, V, 0.15, 0.0};
    cg_mlm_data *d = cg_mlm_data_new(text, strlen(text), tok, &o);
    CHECK(d != NULL, "%s", cg_last_error());
    if (!d) return;
    int64_t N = cg_mlm_data_count(d, false);
    CHECK(N == 45, "12 documents of 2..6 sentences: %lld", (long long)N);
    enum { B = 1500, T = 160 };
    static int32_t ii[B * T], tt[B * T], am[B * T], lab[B * T], nsp[B], orig[T];
    cg_rng r;
    cg_rng_seed(&r, 2024);
    CHECK(cg_mlm_batch(d, false, &r, B, T, ii, tt, am, lab, nsp) == CG_OK, "%s", cg_last_error());
    long chosen = 0, tokens = 0, masked = 0, replaced = 0, kept = 0, is_next = 0;
    bool layout = true, count_ok = true, specials = true, pairs = true, notnext = true, repl_ok = true;
    for (int b = 0; b < B; b++) {
        const int32_t *ri = ii + b * T, *rt = tt + b * T, *rm = am + b * T, *rl = lab + b * T;
        for (int t = 0; t < T; t++) orig[t] = rl[t] != -100 ? rl[t] : ri[t];
        int sep1 = -1, sep2 = -1;
        for (int t = 1; t < T && sep2 < 0; t++)
            if (orig[t] == o.sep_id) {
                if (sep1 < 0) sep1 = t;
                else sep2 = t;
            }
        if (orig[0] != o.cls_id || sep1 < 2 || sep2 < sep1 + 2) {
            layout = false;
            continue;
        }
        for (int t = 0; t < T; t++) {
            bool pad = t > sep2, special = t == 0 || t == sep1 || t == sep2;
            layout &= rm[t] == !pad && rt[t] == (t > sep1 && !pad) && (!pad || (ri[t] == o.pad_id && rl[t] == -100));
            if (special || pad) specials &= rl[t] == -100 && ri[t] == orig[t];
            else layout &= orig[t] >= 0 && orig[t] < V;
        }
        int n_ab = sep2 - 2, n_lab = 0;
        for (int t = 0; t < T; t++) {
            if (rl[t] == -100) continue;
            n_lab++;
            if (ri[t] == o.mask_id) masked++;
            else if (ri[t] != rl[t]) replaced++, repl_ok &= ri[t] >= 0 && ri[t] < V;
            else kept++;
        }
        int want = (int)(0.15 * n_ab + 0.5);
        count_ok &= n_lab == (want < 1 ? 1 : want);
        chosen += n_lab, tokens += n_ab;
        /* A and B must be whole sentences (rows of 160 never cut these); B follows A iff label 0 */
        int64_t a = -1, bsent = -1, doc_a = -1, doc_b = -1;
        for (int64_t s = 0; s < N; s++) {
            const int32_t *ids;
            int64_t n, doc;
            cg_mlm_sentence(d, s, &ids, &n, &doc);
            if (n == sep1 - 1 && same(ids, orig + 1, n)) a = s, doc_a = doc;
            if (n == sep2 - sep1 - 1 && same(ids, orig + sep1 + 1, n)) bsent = s, doc_b = doc;
        }
        if (nsp[b] == 0) is_next++, pairs &= a >= 0 && bsent == a + 1 && doc_a == doc_b;
        else notnext &= nsp[b] == 1 && a >= 0 && bsent >= 0 && doc_a != doc_b;
    }
    CHECK(layout, "[CLS] A [SEP] B [SEP] pad layout, segments and attention mask");
    CHECK(specials, "special and pad positions never chosen");
    CHECK(count_ok, "max(1, round(0.15 n)) positions chosen in every row");
    CHECK(pairs, "IsNext rows hold consecutive sentences of one document");
    CHECK(notnext, "NotNext rows pair sentences of different documents");
    CHECK(repl_ok, "random replacements are ordinary ids");
    if (getenv("CGRAD_TEST_VERBOSE"))
        printf("mlm: chosen %.4f masked %.4f replaced %.4f kept %.4f isnext %.4f\n", (double)chosen / tokens,
               (double)masked / chosen, (double)replaced / chosen, (double)kept / chosen, (double)is_next / B);
    CHECK_NEAR((double)chosen / tokens, 0.15, 0.01);
    CHECK_NEAR((double)masked / chosen, 0.8, 0.02);
    CHECK_NEAR((double)replaced / chosen, 0.1 * (1 - 1.0 / V), 0.015);
    CHECK_NEAR((double)kept / chosen, 0.1 + 0.1 / V, 0.015);
    CHECK_NEAR((double)is_next / B, 0.5, 0.05);

    /* determinism */
    static int32_t ii2[B * T], tt2[B * T], am2[B * T], lab2[B * T], nsp2[B];
    cg_rng r1, r2;
    cg_rng_seed(&r1, 5);
    cg_rng_seed(&r2, 5);
    cg_mlm_batch(d, false, &r1, 8, T, ii, tt, am, lab, nsp);
    cg_mlm_batch(d, false, &r2, 8, T, ii2, tt2, am2, lab2, nsp2);
    CHECK(same(ii, ii2, 8 * T) && same(lab, lab2, 8 * T) && same(nsp, nsp2, 8), "same seed, same rows");
    cg_rng_seed(&r2, 6);
    cg_mlm_batch(d, false, &r2, 8, T, ii2, tt2, am2, lab2, nsp2);
    CHECK(!same(ii, ii2, 8 * T), "different seed, different rows");
    cg_mlm_data_free(d);
    cg_tokenizer_free(tok);
    free(text);
}

/* Longest-first truncation: A of 10 and B of 4 into 10 slots leaves 4 + 3. */
static void test_mlm_truncation(void) {
    const char *text = "aaaaaaaaa. bbb.\n\ncc. dd.";
    cg_tokenizer *tok = cg_tokenizer_char_new(text, strlen(text));
    int32_t V = cg_tokenizer_vocab_size(tok);
    cg_mlm_options o = {V, V + 1, V + 2, V + 3, V, 0.15, 0.0};
    cg_mlm_data *d = cg_mlm_data_new(text, strlen(text), tok, &o);
    enum { B = 200, T = 10 };
    static int32_t ii[B * T], tt[B * T], am[B * T], lab[B * T], nsp[B];
    cg_rng r;
    cg_rng_seed(&r, 3);
    CHECK(d && cg_mlm_batch(d, false, &r, B, T, ii, tt, am, lab, nsp) == CG_OK, "%s", cg_last_error());
    int32_t a_id = cg_tokenizer_token_id(tok, "a"), b_id = cg_tokenizer_token_id(tok, "b");
    int seen = 0;
    bool ok = true;
    for (int b = 0; d && b < B; b++) {
        int32_t orig[T];
        for (int t = 0; t < T; t++) orig[t] = lab[b * T + t] != -100 ? lab[b * T + t] : ii[b * T + t];
        if (nsp[b] != 0 || orig[1] != a_id) continue;
        seen++;
        int32_t want[T] = {o.cls_id, a_id, a_id, a_id, a_id, o.sep_id, b_id, b_id, b_id, o.sep_id};
        ok &= same(orig, want, T) && tt[b * T + 5] == 0 && tt[b * T + 6] == 1 && am[b * T + 9] == 1;
    }
    CHECK(seen > 20 && ok, "IsNext rows of the long pair cut to 4 + 3 (%d seen)", seen);
    cg_mlm_data_free(d);
    /* rows of 6 or 7 A/B tokens at mask_prob 0.05 round to 0 predictions: at least one is chosen */
    o.mask_prob = 0.05;
    d = cg_mlm_data_new(text, strlen(text), tok, &o);
    CHECK(d && cg_mlm_batch(d, false, &r, B, T, ii, tt, am, lab, nsp) == CG_OK, "%s", cg_last_error());
    ok = d != NULL;
    for (int b = 0; ok && b < B; b++) {
        int n_lab = 0;
        for (int t = 0; t < T; t++) n_lab += lab[b * T + t] != -100;
        ok = n_lab == 1;
    }
    CHECK(ok, "one prediction in every short row");
    cg_mlm_data_free(d);
    cg_tokenizer_free(tok);
}

/* WordPiece: special ids from the tokenizer; [UNK] and [unused0] are never random replacements. */
static void test_mlm_wordpiece(void) {
    cg_tokenizer *tok = cg_tokenizer_wordpiece_load(FIX "vocab.txt");
    CHECK(tok != NULL, "%s", cg_last_error());
    if (!tok) return;
    cg_mlm_options o;
    CHECK(cg_mlm_options_default(tok, &o) == CG_OK && o.cls_id == 3 && o.sep_id == 4 && o.mask_id == 5 &&
              o.pad_id == 0 && o.vocab_size == 16 && o.mask_prob == 0.15,
          "%s", cg_last_error());
    o.mask_prob = 1.0;
    const char *text = "The cat sat on a mat. The dog ran.\n\nA cat runs. The dogs sat on the mat.";
    cg_mlm_data *d = cg_mlm_data_new(text, strlen(text), tok, &o);
    CHECK(d != NULL, "%s", cg_last_error());
    enum { B = 300, T = 24 };
    static int32_t ii[B * T], tt[B * T], am[B * T], lab[B * T], nsp[B];
    cg_rng r;
    cg_rng_seed(&r, 11);
    CHECK(d && cg_mlm_batch(d, false, &r, B, T, ii, tt, am, lab, nsp) == CG_OK, "%s", cg_last_error());
    int replaced = 0;
    bool ok = true;
    for (int i = 0; d && i < B * T; i++) {
        if (lab[i] == -100 || ii[i] == o.mask_id || ii[i] == lab[i]) continue;
        replaced++;
        ok &= ii[i] >= 6 && ii[i] < 16;
    }
    CHECK(ok && replaced > 50, "random replacements in [6, 16) (%d)", replaced);
    /* the first row: [CLS] the cat ... with every A/B token a label */
    const int32_t *ids;
    int64_t n;
    CHECK(d && cg_mlm_sentence(d, 0, &ids, &n, NULL) == CG_OK && n == 7 && ids[0] == 6 && ids[1] == 7 && ids[6] == 11,
          "'the cat sat on a mat .' = 6 7 8 9 15 10 11");
    cg_mlm_data_free(d);
    cg_tokenizer *ch = cg_tokenizer_char_new("abc", 3);
    CHECK(cg_mlm_options_default(ch, &o) == CG_ERR_ARG && has(cg_last_error(), "[CLS]"), "%s", cg_last_error());
    cg_tokenizer_free(ch);
    cg_tokenizer_free(tok);
}

/* ---- seq2seq ---- */

/* Index of the expected row equal to (a, b), or -1; rows are rows x width. */
static int find_row(const int32_t *want, int rows, int width, const int32_t *got) {
    for (int i = 0; i < rows; i++)
        if (same(want + i * width, got, width)) return i;
    return -1;
}

static void test_seq2seq(void) {
    cg_tokenizer *tok = cg_tokenizer_char_new(" abcdxyz", 8); /* ' '=0 a=1 b=2 c=3 d=4 x=5 y=6 z=7 */
    cg_seq2seq_options o = {.pad_id = 8, .bos_id = 9, .eos_id = 10, .val_fraction = 0.2};
    cg_seq2seq_data *d = cg_seq2seq_data_load(FIX "s2s_train.tsv", NULL, tok, NULL, &o);
    CHECK(d && cg_seq2seq_data_count(d, false) == 4 && cg_seq2seq_data_count(d, true) == 1, "%s", cg_last_error());
    if (!d) return;
    int64_t S, T;
    cg_seq2seq_data_caps(d, &S, &T);
    CHECK(S == 5 && T == 4, "caps %lld %lld", (long long)S, (long long)T);
    const int32_t *src, *tgt;
    int64_t ns, nt;
    CHECK(cg_seq2seq_example(d, true, 0, &src, &ns, &tgt, &nt) == CG_OK && ns == 1 && src[0] == 2 && nt == 2 &&
              tgt[0] == 7 && tgt[1] == 7,
          "held-out pair is the last line 'b\\tzz'");
    /* ab->xyz, c->x (CRLF line), abc d->y z, dd->(empty) */
    static const int32_t want_src[4][5] = {{1, 2, 8, 8, 8}, {3, 8, 8, 8, 8}, {1, 2, 3, 0, 4}, {4, 4, 8, 8, 8}};
    static const int32_t want_msk[4][5] = {{1, 1, 0, 0, 0}, {1, 0, 0, 0, 0}, {1, 1, 1, 1, 1}, {1, 1, 0, 0, 0}};
    static const int32_t want_in[4][4] = {{9, 5, 6, 7}, {9, 5, 8, 8}, {9, 6, 0, 7}, {9, 8, 8, 8}};
    static const int32_t want_out[4][4] = {{5, 6, 7, 10}, {5, 10, -100, -100}, {6, 0, 7, 10}, {10, -100, -100, -100}};
    int32_t bs[20], bm[20], bi[16], bo[16];
    cg_data_cursor c;
    cg_data_cursor_init(&c, 1);
    int64_t gs = 0, gt = 0;
    CHECK(cg_seq2seq_batch(d, false, &c, 4, bs, bm, bi, bo, &gs, &gt) == CG_OK && gs == 5 && gt == 4, "%s",
          cg_last_error());
    int seen = 0;
    for (int b = 0; b < 4; b++) {
        int k = find_row(&want_src[0][0], 4, 5, bs + b * 5);
        bool ok = k >= 0 && same(want_msk[k], bm + b * 5, 5) && same(want_in[k], bi + b * 4, 4) &&
                  same(want_out[k], bo + b * 4, 4);
        CHECK(ok, "row %d (pair %d)", b, k);
        if (k >= 0) seen |= 1 << k;
    }
    CHECK(seen == 15 && c.epoch == 1 && c.pos == 0, "one epoch serves every pair once");

    cg_data_cursor cv;
    cg_data_cursor_init(&cv, 1);
    int32_t vin[3] = {0}, vout[3] = {0}, vs[1], vm[1];
    CHECK(cg_seq2seq_batch(d, true, &cv, 1, vs, vm, vin, vout, &gs, &gt) == CG_OK && gs == 1 && gt == 3 && vs[0] == 2 &&
              vm[0] == 1 && vin[0] == 9 && vin[1] == 7 && vin[2] == 7 && vout[0] == 7 && vout[1] == 7 && vout[2] == 10,
          "held-out batch sized to its own pair");
    cg_data_cursor keep = c;
    CHECK(cg_seq2seq_batch(d, false, &c, 5, bs, bm, bi, bo, NULL, NULL) == CG_ERR_ARG &&
              has(cg_last_error(), "batch 5") &&
              !memcmp(&keep, &c, sizeof c),
          "%s", cg_last_error());
    c.pos = 7;
    CHECK(cg_seq2seq_batch(d, false, &c, 1, bs, bm, bi, bo, NULL, NULL) == CG_ERR_STATE, "%s", cg_last_error());
    cg_seq2seq_data_free(d);

    /* caps 3 and 3, always padded to them: sources cut to 3, targets to 2 + eos */
    o.max_src = 3, o.max_tgt = 3, o.pad_to_max = true;
    d = cg_seq2seq_data_load(FIX "s2s_train.tsv", NULL, tok, tok, &o);
    static const int32_t t_src[4][3] = {{1, 2, 8}, {3, 8, 8}, {1, 2, 3}, {4, 4, 8}};
    static const int32_t t_msk[4][3] = {{1, 1, 0}, {1, 0, 0}, {1, 1, 1}, {1, 1, 0}};
    static const int32_t t_in[4][3] = {{9, 5, 6}, {9, 5, 8}, {9, 6, 0}, {9, 8, 8}};
    static const int32_t t_out[4][3] = {{5, 6, 10}, {5, 10, -100}, {6, 0, 10}, {10, -100, -100}};
    cg_data_cursor_init(&c, 9);
    bool ok = d != NULL;
    for (int round = 0; ok && round < 4; round++) { /* batches of 3 cross epoch boundaries */
        ok = cg_seq2seq_batch(d, false, &c, 3, bs, bm, bi, bo, &gs, &gt) == CG_OK && gs == 3 && gt == 3;
        for (int b = 0; ok && b < 3; b++) {
            int k = find_row(&t_src[0][0], 4, 3, bs + b * 3);
            ok = k >= 0 && same(t_msk[k], bm + b * 3, 3) && same(t_in[k], bi + b * 3, 3) &&
                 same(t_out[k], bo + b * 3, 3);
        }
    }
    CHECK(ok && c.epoch == 3 && c.pos == 0, "truncated, padded rows; 12 rows = 3 epochs (%s)", cg_last_error());
    cg_seq2seq_data_free(d);

    /* errors name the file and line */
    const char *p = write_tmp("ragged.tsv", "ab\tx\n\nab x\n", 11);
    CHECK(!cg_seq2seq_data_load(p, NULL, tok, NULL, &o) && has(cg_last_error(), "ragged.tsv:3:") &&
              has(cg_last_error(), "found 0"),
          "%s", cg_last_error());
    p = write_tmp("ragged2.tsv", "ab\tx\ta\n", 7);
    CHECK(!cg_seq2seq_data_load(p, NULL, tok, NULL, &o) && has(cg_last_error(), "ragged2.tsv:1:") &&
              has(cg_last_error(), "found 2"),
          "%s", cg_last_error());
    p = write_tmp("nosrc.tsv", "ab\tx\n\ty\n", 8);
    CHECK(!cg_seq2seq_data_load(p, NULL, tok, NULL, &o) && has(cg_last_error(), "nosrc.tsv:2: empty source"), "%s",
          cg_last_error());
    p = write_tmp("unk.tsv", "ab\tx\nab\tq\n", 10);
    CHECK(!cg_seq2seq_data_load(p, NULL, tok, NULL, &o) && has(cg_last_error(), "unk.tsv:2: target:"), "%s",
          cg_last_error());
    p = write_tmp("one.tsv", "ab\tx\n", 5);
    o.val_fraction = 0.5;
    CHECK(!cg_seq2seq_data_load(p, NULL, tok, NULL, &o) && has(cg_last_error(), "no training pair"), "%s",
          cg_last_error());
    /* found by fuzzing (tests/fuzz/corpus/tsv/empty_targets.tsv): when every target is empty the
     * target ids had no storage, and a batch did arithmetic on a NULL pointer (UBSan) */
    p = write_tmp("emptytgt.tsv", "ab\t\nb\t\n", 7);
    o = (cg_seq2seq_options){.pad_id = 8, .bos_id = 9, .eos_id = 10};
    d = cg_seq2seq_data_load(p, NULL, tok, NULL, &o);
    CHECK(d && cg_seq2seq_data_count(d, false) == 2, "%s", cg_last_error());
    const int32_t *e_tgt = NULL;
    int64_t e_nt = -1;
    CHECK(d && cg_seq2seq_example(d, false, 1, &src, &ns, &e_tgt, &e_nt) == CG_OK && e_nt == 0 && e_tgt,
          "an empty target is a valid pointer (memcpy(dst, tgt, 0) is defined), n 0: %p %lld", (const void *)e_tgt,
          (long long)e_nt);
    cg_data_cursor_init(&c, 1);
    int64_t es, et;
    int32_t e_src[4], e_mask[4], e_in[2], e_out[2];
    CHECK(d && cg_seq2seq_batch(d, false, &c, 2, e_src, e_mask, e_in, e_out, &es, &et) == CG_OK && es == 2 &&
              et == 1 && e_in[0] == 9 && e_in[1] == 9 && e_out[0] == 10 && e_out[1] == 10,
          "empty targets: tgt_in = bos, tgt_out = eos (%s)", cg_last_error());
    cg_seq2seq_data_free(d);
    cg_tokenizer_free(tok);
}

/* ---- classification ---- */

static void test_textcls(void) {
    cg_tokenizer *tok = cg_tokenizer_char_new(" abc", 4); /* ' '=0 a=1 b=2 c=3 */
    cg_textcls_options o;
    cg_textcls_options_default(tok, &o);
    CHECK(o.pad_id == 0 && o.cls_id == -1, "char tokenizer: no [PAD] or [CLS]");
    o = (cg_textcls_options){.pad_id = 4, .cls_id = 5, .max_len = 4, .pad_to_max = true, .val_fraction = 0.2};
    cg_textcls_data *d = cg_textcls_data_load(FIX "cls.tsv", NULL, tok, &o);
    CHECK(d && cg_textcls_data_count(d, false) == 4 && cg_textcls_data_count(d, true) == 1 &&
              cg_textcls_num_labels(d) == 3,
          "%s", cg_last_error());
    if (!d) return;
    CHECK(!strcmp(cg_textcls_label_name(d, 0), "neg") && !strcmp(cg_textcls_label_name(d, 1), "neutral") &&
              !strcmp(cg_textcls_label_name(d, 2), "pos") && cg_textcls_label_name(d, 3) == NULL &&
              cg_textcls_label_id(d, "pos") == 2 && cg_textcls_label_id(d, "nope") == -1,
          "labels in byte order, ' neg ' trimmed");
    /* pos ab, neg 'ba c', neutral c, pos abcabc -> [CLS] + text cut to 3 */
    static const int32_t want[4][4] = {{5, 1, 2, 4}, {5, 2, 1, 0}, {5, 3, 4, 4}, {5, 1, 2, 3}};
    static const int32_t want_m[4][4] = {{1, 1, 1, 0}, {1, 1, 1, 1}, {1, 1, 0, 0}, {1, 1, 1, 1}};
    static const int32_t want_l[4] = {2, 0, 1, 2};
    int32_t ids[24], am[24], lab[4];
    int64_t T = 0;
    cg_data_cursor c;
    cg_data_cursor_init(&c, 3);
    CHECK(cg_textcls_batch(d, false, &c, 4, ids, am, lab, &T) == CG_OK && T == 4, "%s", cg_last_error());
    int seen = 0;
    for (int b = 0; b < 4; b++) {
        int k = find_row(&want[0][0], 4, 4, ids + b * 4);
        CHECK(k >= 0 && same(want_m[k], am + b * 4, 4) && lab[b] == want_l[k], "row %d (example %d)", b, k);
        if (k >= 0) seen |= 1 << k;
    }
    CHECK(seen == 15, "every example once per epoch");

    /* epochs are permutations; a restored cursor on a reloaded file continues identically */
    int order[24];
    cg_data_cursor_init(&c, 77);
    cg_data_cursor mid = c;
    bool perm_ok = true;
    for (int i = 0; i < 8; i++) {
        if (i == 4) mid = c;
        cg_textcls_batch(d, false, &c, 3, ids, am, lab, NULL);
        for (int b = 0; b < 3; b++) order[i * 3 + b] = find_row(&want[0][0], 4, 4, ids + b * 4);
    }
    for (int e = 0; e < 6; e++) {
        int mask = 0;
        for (int j = 0; j < 4; j++) mask |= order[e * 4 + j] >= 0 ? 1 << order[e * 4 + j] : 0;
        perm_ok &= mask == 15;
    }
    CHECK(perm_ok && c.epoch == 6 && c.pos == 0, "each epoch a permutation; epoch %lld pos %lld", (long long)c.epoch,
          (long long)c.pos);
    cg_textcls_data *d2 = cg_textcls_data_load(FIX "cls.tsv", NULL, tok, &o);
    bool resume = d2 != NULL;
    for (int i = 4; resume && i < 8; i++) {
        cg_textcls_batch(d2, false, &mid, 3, ids, am, lab, NULL);
        for (int b = 0; b < 3; b++) resume &= order[i * 3 + b] == find_row(&want[0][0], 4, 4, ids + b * 4);
    }
    CHECK(resume && !memcmp(&mid, &c, sizeof c), "resumed from (rng.state, epoch, pos)");
    cg_textcls_data_free(d2);
    int other[24];
    cg_data_cursor_init(&c, 78);
    for (int i = 0; i < 8; i++) {
        cg_textcls_batch(d, false, &c, 3, ids, am, lab, NULL);
        for (int b = 0; b < 3; b++) other[i * 3 + b] = find_row(&want[0][0], 4, 4, ids + b * 4);
    }
    CHECK(memcmp(order, other, sizeof order) != 0, "another seed, another order");
    CHECK(cg_textcls_batch(d, true, &c, 2, ids, am, lab, NULL) == CG_ERR_ARG && has(cg_last_error(), "1 examples"),
          "%s", cg_last_error());
    cg_textcls_data_free(d);

    /* no [CLS], each batch as long as its longest text */
    o = (cg_textcls_options){.pad_id = 4, .cls_id = -1, .val_fraction = 0.2};
    d = cg_textcls_data_load(FIX "cls.tsv", NULL, tok, &o);
    static const int32_t w6[4][6] = {{1, 2, 4, 4, 4, 4}, {2, 1, 0, 3, 4, 4}, {3, 4, 4, 4, 4, 4}, {1, 2, 3, 1, 2, 3}};
    static const int w6n[4] = {2, 4, 1, 6};
    cg_data_cursor_init(&c, 5);
    CHECK(d && cg_textcls_data_cap(d) == 6 && cg_textcls_batch(d, false, &c, 4, ids, am, lab, &T) == CG_OK && T == 6,
          "%s", cg_last_error());
    for (int b = 0; d && b < 4; b++) {
        int k = find_row(&w6[0][0], 4, 6, ids + b * 6);
        bool ok = k >= 0 && lab[b] == want_l[k];
        for (int t = 0; ok && t < 6; t++) ok = am[b * 6 + t] == (t < w6n[k]);
        CHECK(ok, "row %d (example %d)", b, k);
    }
    cg_data_cursor_init(&c, 5);
    CHECK(d && cg_textcls_batch(d, true, &c, 1, ids, am, lab, &T) == CG_OK && T == 1 && ids[0] == 1 && am[0] == 1 &&
              lab[0] == 0,
          "held-out ' neg \\ta'");
    cg_textcls_data_free(d);

    /* decimal labels sort by value; a held-out file adds its own labels */
    d = cg_textcls_data_load(FIX "cls_num.tsv", FIX "cls_num_val.tsv", tok, &o);
    CHECK(d && cg_textcls_num_labels(d) == 4 && !strcmp(cg_textcls_label_name(d, 0), "1") &&
              !strcmp(cg_textcls_label_name(d, 1), "2") && !strcmp(cg_textcls_label_name(d, 2), "3") &&
              !strcmp(cg_textcls_label_name(d, 3), "10") && cg_textcls_data_count(d, false) == 4 &&
              cg_textcls_data_count(d, true) == 1,
          "numeric label order: %s", cg_last_error());
    const int32_t *ex;
    int64_t n;
    int32_t l = -1;
    CHECK(d && cg_textcls_example(d, false, 0, &ex, &n, &l) == CG_OK && n == 1 && ex[0] == 1 && l == 3,
          "first line '10\\ta' -> label 3");
    CHECK(d && cg_textcls_example(d, true, 0, &ex, &n, &l) == CG_OK && n == 1 && ex[0] == 3 && l == 2,
          "held-out '3\\tc' -> label 2");
    cg_textcls_data_free(d);

    const char *p = write_tmp("crlf.tsv", "a\tab\r\nb\tc\r\n", 11); /* '\r' is not in the vocabulary */
    d = cg_textcls_data_load(p, NULL, tok, &o);
    CHECK(d && cg_textcls_example(d, false, 0, &ex, &n, &l) == CG_OK && n == 2 && ex[1] == 2 &&
              cg_textcls_example(d, false, 1, &ex, &n, &l) == CG_OK && n == 1 && ex[0] == 3 && l == 1,
          "CRLF lines: %s", cg_last_error());
    cg_textcls_data_free(d);
    p = write_tmp("nolabel.tsv", "a\tab\n\tb\n", 8);
    CHECK(!cg_textcls_data_load(p, NULL, tok, &o) && has(cg_last_error(), "nolabel.tsv:2: empty label"), "%s",
          cg_last_error());
    p = write_tmp("notext.tsv", "a\tab\nb\t\n", 8);
    CHECK(!cg_textcls_data_load(p, NULL, tok, &o) && has(cg_last_error(), "notext.tsv:2: empty text"), "%s",
          cg_last_error());
    p = write_tmp("ragged.tsv", "a\tab\nb\tc\nc c\n", 13);
    CHECK(!cg_textcls_data_load(p, NULL, tok, &o) && has(cg_last_error(), "ragged.tsv:3:"), "%s", cg_last_error());
    p = write_tmp("empty.tsv", "", 0);
    CHECK(!cg_textcls_data_load(p, NULL, tok, &o) && has(cg_last_error(), "empty.tsv: empty file"), "%s",
          cg_last_error());
    p = write_tmp("blank.tsv", "\n  \n", 4);
    CHECK(!cg_textcls_data_load(p, NULL, tok, &o) && has(cg_last_error(), "no label"), "%s", cg_last_error());
    p = write_tmp("badutf.tsv", "a\tab\nb\t\xE9t\xE9\n", 11);
    CHECK(!cg_textcls_data_load(p, NULL, tok, &o) && has(cg_last_error(), "badutf.tsv") &&
              has(cg_last_error(), "offset 7"),
          "%s", cg_last_error());
    o.max_len = 1, o.cls_id = 5;
    CHECK(!cg_textcls_data_load(FIX "cls.tsv", NULL, tok, &o) && has(cg_last_error(), "max_len 1"), "%s",
          cg_last_error());
    cg_tokenizer_free(tok);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cgrad_test_data_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_text_files();
    test_check_ids();
    test_lm();
    test_mlm_split();
    test_mlm_batches();
    test_mlm_truncation();
    test_mlm_wordpiece();
    test_seq2seq();
    test_textcls();
    const char *names[] = {"ok.txt", "empty.txt", "bad.txt", "nul.txt", "ragged.tsv", "ragged2.tsv", "nosrc.tsv",
                           "unk.tsv", "one.tsv", "crlf.tsv", "nolabel.tsv", "notext.tsv", "empty.tsv", "blank.tsv", "badutf.tsv", "emptytgt.tsv"};
    char path[256];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(path, sizeof path, "%s/%s", tmpdir, names[i]);
        unlink(path);
    }
    rmdir(tmpdir);
    TEST_END();
}
