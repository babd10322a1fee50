/* SPDX-License-Identifier: MIT */
/* Tokenizers against references: GPT-2 ids from the npm package gpt-3-encoder, WordPiece ids from
 * a transcription of google-research/bert tokenization.py (tests/make_tokenizer_fixtures.py),
 * hand-derived vocabularies and BPE merges, a naive BPE trainer, and round trips. The GPT-2 and
 * BERT vocabularies come from ./setup.sh (data/, not committed): without them this test fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "graph/graph.h"
#include "io/tokenizer.h"
#include "check.h"

#define FIX CGRAD_TEST_DIR "/fixtures/tokenizer/"
#define DATA CGRAD_TEST_DIR "/../data/"

static char tmpdir[64];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void spit(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    fputs(s, f);
    fclose(f);
}

/* A file that must come from ./setup.sh: a failed check naming it when it is missing. */
static bool need(const char *path) {
    bool ok = access(path, R_OK) == 0;
    CHECK(ok, "%s is missing: run ./setup.sh to download the data", path);
    return ok;
}

/* Ids of a fixture: a "# ..." header (optionally holding bytes=N) then whitespace-separated ints. */
static int32_t *read_ids(const char *path, int64_t *n, long *bytes) {
    char *s = test_slurp(path, NULL);
    CHECK(s != NULL, "cannot read fixture %s", path);
    if (!s) return NULL;
    char *p = s;
    if (*p == '#') {
        char *b = strstr(p, "bytes=");
        char *nl = strchr(p, '\n');
        if (bytes && b && b < nl) *bytes = strtol(b + 6, NULL, 10);
        p = nl + 1;
    }
    int64_t cap = 1024, k = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    for (;;) {
        char *e;
        long x = strtol(p, &e, 10);
        if (e == p) break;
        if (k == cap) v = realloc(v, (size_t)(cap *= 2) * sizeof *v);
        v[k++] = (int32_t)x;
        p = e;
    }
    free(s);
    *n = k;
    return v;
}

/* Equal id lists, or a failed check showing the first difference. */
static void check_ids(const char *what, const int32_t *got, int64_t ng, const int32_t *want, int64_t nw) {
    int64_t i = 0;
    while (i < ng && i < nw && got[i] == want[i]) i++;
    bool same = i == ng && i == nw;
    CHECK(same, "%s: %lld ids vs %lld expected, first difference at %lld: got %d, expected %d", what,
          (long long)ng, (long long)nw, (long long)i, i < ng ? got[i] : -1, i < nw ? want[i] : -1);
}

static void check_list(const char *what, const cg_tokenizer *t, const char *text, const int32_t *want, int64_t nw) {
    int32_t *ids = NULL;
    int64_t n = 0;
    cg_status st = cg_tokenizer_encode(t, text, strlen(text), &ids, &n);
    CHECK(st == CG_OK, "%s: encode failed: %s", what, cg_last_error());
    if (st == CG_OK) check_ids(what, ids, n, want, nw);
    free(ids);
}

/* decode(encode(text)) == text, byte for byte. */
static bool round_trip(const cg_tokenizer *t, const char *text, size_t len) {
    int32_t *ids = NULL;
    int64_t n = 0;
    char *back = NULL;
    size_t blen = 0;
    bool ok = cg_tokenizer_encode(t, text, len, &ids, &n) == CG_OK &&
              cg_tokenizer_decode(t, ids, n, &back, &blen) == CG_OK && blen == len && memcmp(back, text, len) == 0;
    free(ids);
    free(back);
    return ok;
}

/* Each line of a fixture: text as UTF-8 hex, a tab, the reference ids; all must match. */
static void check_random_fixture(const cg_tokenizer *t, const char *path, const char *what) {
    char *s = test_slurp(path, NULL);
    CHECK(s != NULL, "cannot read fixture %s", path);
    if (!s) return;
    int cases = 0, bad = 0;
    char *text = malloc(strlen(s) / 2 + 1);
    int32_t want[4096];
    for (char *line = s; *line;) {
        char *tab = strchr(line, '\t'), *nl = strchr(line, '\n');
        if (!tab || !nl) break;
        size_t len = 0;
        for (char *h = line; h + 1 < tab; h += 2) {
            unsigned v;
            sscanf(h, "%2x", &v);
            text[len++] = (char)v;
        }
        int64_t nw = 0;
        for (char *p = tab + 1; p < nl && nw < 4096;) {
            char *e;
            long x = strtol(p, &e, 10);
            if (e == p) break;
            want[nw++] = (int32_t)x;
            p = e;
        }
        int32_t *ids = NULL;
        int64_t n = 0;
        bool ok = cg_tokenizer_encode(t, text, len, &ids, &n) == CG_OK && n == nw &&
                  (n == 0 || memcmp(ids, want, (size_t)n * sizeof *ids) == 0);
        if (!ok && bad++ < 3) {
            fprintf(stderr, "%s case %d (%.*s):", what, cases, (int)(tab - line), line);
            for (int64_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n");
        }
        free(ids);
        cases++;
        line = nl + 1;
    }
    CHECK(cases == 400 && bad == 0, "%s: %d of %d random texts differ from the reference", what, bad, cases);
    free(text);
    free(s);
}

/* Random valid UTF-8: ASCII, whitespace runs, apostrophes, Latin, Greek, Cyrillic, CJK, emoji
 * and any code point. */
static size_t random_utf8(cg_rng *r, char *out, int max_cps) {
    static const uint32_t ws[] = {' ', ' ', '\n', '\t', '\r', 0xA0, 0x3000, 0x2028, 0x85};
    int n = (int)(cg_rng_next(r) % (uint64_t)(max_cps + 1));
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        uint64_t u = cg_rng_next(r) % 100;
        uint32_t cp;
        if (u < 40) cp = 32 + (uint32_t)(cg_rng_next(r) % 95);
        else if (u < 50) cp = ws[cg_rng_next(r) % 9];
        else if (u < 55) cp = '\'';
        else if (u < 65) cp = 0xA0 + (uint32_t)(cg_rng_next(r) % 0x1B0);
        else if (u < 75) cp = 0x370 + (uint32_t)(cg_rng_next(r) % 0x190);
        else if (u < 85) cp = 0x4E00 + (uint32_t)(cg_rng_next(r) % 0x5200);
        else if (u < 95) cp = 0x1F300 + (uint32_t)(cg_rng_next(r) % 0x800);
        else {
            do cp = (uint32_t)(cg_rng_next(r) % 0x110000); while (cp >= 0xD800 && cp <= 0xDFFF);
        }
        if (cp < 0x80) out[k++] = (char)cp;
        else if (cp < 0x800) {
            out[k++] = (char)(0xC0 | cp >> 6);
            out[k++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out[k++] = (char)(0xE0 | cp >> 12);
            out[k++] = (char)(0x80 | (cp >> 6 & 0x3F));
            out[k++] = (char)(0x80 | (cp & 0x3F));
        } else {
            out[k++] = (char)(0xF0 | cp >> 18);
            out[k++] = (char)(0x80 | (cp >> 12 & 0x3F));
            out[k++] = (char)(0x80 | (cp >> 6 & 0x3F));
            out[k++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    out[k] = 0;
    return k;
}

static void check_error_has(const char *what, const char *needle) {
    CHECK(strstr(cg_last_error(), needle) != NULL, "%s: message \"%s\" lacks \"%s\"", what, cg_last_error(), needle);
}

static void rm_tmp(void) {
    static const char *names[] = {"encoder.json", "vocab.bpe", "vocab.txt", "cg_tokenizer.json", "t.json", "vocab.json", "merges.txt"};
    char p[128];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(p, sizeof p, "%s/%s", tmpdir, names[i]);
        unlink(p);
    }
}

/* ------------------------------------------------------------------ UTF-8 validation */

static void test_invalid_utf8(void) {
    static const struct { const char *s; size_t len; const char *at; } bad[] = {
        {"ab\xff" "cd", 5, "byte 2"},
        {"a\xc0\xaf", 3, "byte 1"},          /* overlong '/' */
        {"xy\xed\xa0\x80", 5, "byte 2"},     /* surrogate U+D800 */
        {"abc\xe2\x82", 5, "byte 3"},        /* cut at the end */
        {"\xf4\x90\x80\x80", 4, "byte 0"},   /* past U+10FFFF */
        {"ok \x80", 4, "byte 3"},            /* stray continuation */
        {"\xe2\x28\xa1", 3, "byte 0"},       /* bad second byte */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cg_tokenizer *t = cg_tokenizer_char_new(bad[i].s, bad[i].len);
        CHECK(t == NULL, "char_new accepted invalid UTF-8 case %zu", i);
        cg_tokenizer_free(t);
        check_error_has("invalid UTF-8", bad[i].at);
    }
    const char *good = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
    cg_tokenizer *t = cg_tokenizer_char_new(good, strlen(good));
    CHECK(t && cg_tokenizer_vocab_size(t) == 4, "4 code points: a, U+00E9, U+20AC, U+1F600");
    int32_t *ids = NULL;
    int64_t n = 0;
    CHECK(cg_tokenizer_encode(t, "a\xe9", 2, &ids, &n) == CG_ERR_FORMAT, "encode takes Latin-1 for UTF-8");
    check_error_has("encode", "byte 1 (0xe9)");
    cg_tokenizer_free(t);
}

/* ------------------------------------------------------------------ character level */

static void test_char(void) {
    cg_tokenizer *t = cg_tokenizer_char_new("hello", 5);
    CHECK(t && cg_tokenizer_kind(t) == CG_TOK_CHAR && cg_tokenizer_vocab_size(t) == 4, "hello: 4 letters");
    check_list("hello", t, "hello", (const int32_t[]){1, 0, 2, 2, 3}, 5); /* e h l o */
    CHECK(strcmp(cg_tokenizer_token_str(t, 3), "o") == 0 && cg_tokenizer_token_id(t, "l") == 2, "lookups");
    CHECK(cg_tokenizer_token_str(t, 4) == NULL && cg_tokenizer_token_id(t, "x") == -1, "misses");
    int32_t *ids = NULL;
    int64_t n = 0;
    CHECK(cg_tokenizer_encode(t, "hex", 3, &ids, &n) == CG_ERR_RANGE, "x is not in the vocabulary");
    check_error_has("unknown character", "U+0078 at byte 2");
    cg_tokenizer_free(t);

    /* Code points, not bytes: ids follow code point order. */
    const char *s = "na\xc3\xafve caf\xc3\xa9 \xe2\x98\x95\xf0\x9f\x98\x80"; /* naïve café ☕😀 */
    t = cg_tokenizer_char_new(s, strlen(s));
    CHECK(t && cg_tokenizer_vocab_size(t) == 11, "11 distinct code points, got %d", cg_tokenizer_vocab_size(t));
    /* ' '=0 a=1 c=2 e=3 f=4 n=5 v=6 é=7 ï=8 ☕=9 😀=10 */
    check_list("café", t, "caf\xc3\xa9", (const int32_t[]){2, 1, 4, 7}, 4);
    check_list("emoji", t, "\xf0\x9f\x98\x80\xe2\x98\x95 \xc3\xaf", (const int32_t[]){10, 9, 0, 8}, 4);
    CHECK(round_trip(t, s, strlen(s)), "char round trip");
    char *json = NULL;
    CHECK(cg_tokenizer_serialize(t, &json) == CG_OK, "serialize: %s", cg_last_error());
    CHECK(json && strstr(json, "\"codepoints\":[32,97,99,101,102,110,118,233,239,9749,128512]"), "json: %s", json);
    cg_tokenizer *u = cg_tokenizer_deserialize(json);
    CHECK(u && cg_tokenizer_kind(u) == CG_TOK_CHAR && cg_tokenizer_vocab_size(u) == 11, "deserialize");
    check_list("café after deserialize", u, "caf\xc3\xa9", (const int32_t[]){2, 1, 4, 7}, 4);
    free(json);
    cg_tokenizer_free(u);
    CHECK(cg_tokenizer_save(t, tmpdir) == CG_OK, "save char: %s", cg_last_error());
    u = cg_tokenizer_load(tmpdir);
    CHECK(u && cg_tokenizer_vocab_size(u) == 11, "load char from its directory: %s", cg_last_error());
    check_list("café after load", u, "caf\xc3\xa9", (const int32_t[]){2, 1, 4, 7}, 4);
    cg_tokenizer_free(u);
    cg_tokenizer_free(t);
    rm_tmp();
    CHECK(cg_tokenizer_deserialize("{\"kind\":\"char\",\"codepoints\":[98,97]}") == NULL, "unsorted code points");
    check_error_has("unsorted", "codepoints[1]");

    if (!need(DATA "moby-dick.txt")) return;
    size_t len;
    char *moby = test_slurp(DATA "moby-dick.txt", &len);
    t = cg_tokenizer_char_new(moby, len);
    CHECK(t && cg_tokenizer_vocab_size(t) > 70 && cg_tokenizer_vocab_size(t) < 200, "Moby Dick has %d characters",
          cg_tokenizer_vocab_size(t));
    CHECK(cg_tokenizer_token_id(t, "\xe2\x80\x94") >= 0, "the em dash is a character of Moby Dick");
    CHECK(round_trip(t, moby, len), "Moby Dick round trip, char level");
    cg_tokenizer_free(t);
    free(moby);
}

/* ------------------------------------------------------------------ GPT-2 BPE */

static void test_gpt2(void) {
    if (!need(DATA "gpt2/encoder.json") || !need(DATA "gpt2/vocab.bpe")) return;
    double t0 = now();
    cg_tokenizer *t = cg_tokenizer_bpe_load(DATA "gpt2/encoder.json", DATA "gpt2/vocab.bpe");
    double t_load = now() - t0;
    CHECK(t != NULL, "load GPT-2: %s", cg_last_error());
    if (!t) return;
    printf("GPT-2 vocabulary loaded in %.1f ms\n", 1e3 * t_load);
    CHECK(cg_tokenizer_kind(t) == CG_TOK_BPE && cg_tokenizer_vocab_size(t) == 50257, "50257 tokens");
    CHECK(cg_tokenizer_token_id(t, "<|endoftext|>") == 50256, "<|endoftext|> = 50256");
    CHECK(cg_tokenizer_token_id(t, "\xc4\xa0the") == 262 && strcmp(cg_tokenizer_token_str(t, 262), "\xc4\xa0the") == 0,
          "\"Ġthe\" = 262");
    check_list("Hello world", t, "Hello world", (const int32_t[]){15496, 995}, 2);

    size_t len;
    char *sample = test_slurp(FIX "sample.txt", &len);
    int64_t nw;
    int32_t *want = read_ids(FIX "gpt2_sample.ids", &nw, NULL);
    int32_t *ids = NULL;
    int64_t n = 0;
    t0 = now();
    CHECK(cg_tokenizer_encode(t, sample, len, &ids, &n) == CG_OK, "encode sample: %s", cg_last_error());
    check_ids("GPT-2 sample vs gpt-3-encoder", ids, n, want, nw);
    char *back = NULL;
    size_t blen = 0;
    CHECK(cg_tokenizer_decode(t, want, nw, &back, &blen) == CG_OK && blen == len && memcmp(back, sample, len) == 0,
          "decode(reference ids) == sample");
    free(back);
    free(ids);
    free(want);

    if (need(DATA "moby-dick.txt")) {
        long bytes = 0;
        char *moby = test_slurp(DATA "moby-dick.txt", NULL);
        want = read_ids(FIX "gpt2_moby.ids", &nw, &bytes);
        CHECK(bytes > 0, "the fixture names its prefix length");
        t0 = now();
        CHECK(cg_tokenizer_encode(t, moby, (size_t)bytes, &ids, &n) == CG_OK, "encode Moby Dick prefix");
        printf("GPT-2 encodes %ld bytes of Moby Dick in %.1f ms (%lld tokens)\n", bytes, 1e3 * (now() - t0),
               (long long)n);
        check_ids("GPT-2 Moby Dick prefix vs gpt-3-encoder", ids, n, want, nw);
        free(ids);
        free(want);
        free(moby);
    }

    check_random_fixture(t, FIX "gpt2_random.tsv", "GPT-2 vs gpt-3-encoder");

    /* Any UTF-8 text comes back byte for byte. */
    cg_rng r;
    cg_rng_seed(&r, 7);
    char buf[64 * 4 + 1];
    int bad = 0;
    for (int i = 0; i < 300; i++) {
        size_t k = random_utf8(&r, buf, 64);
        if (!round_trip(t, buf, k) && bad++ == 0) fprintf(stderr, "round trip fails for \"%s\"\n", buf);
    }
    CHECK(bad == 0, "%d of 300 random UTF-8 strings do not round-trip", bad);
    CHECK(round_trip(t, "", 0) && round_trip(t, "   ", 3) && round_trip(t, "\n\n\n", 3), "empty and space-only");

    /* A decoded piece of a character stays cut, and ids outside the vocabulary are errors. */
    CHECK(cg_tokenizer_decode(t, (const int32_t[]){15496, 50257}, 2, &back, NULL) == CG_ERR_RANGE, "id 50257");
    check_error_has("decode", "id 50257 at position 1");
    CHECK(cg_tokenizer_decode(t, (const int32_t[]){-3}, 1, &back, NULL) == CG_ERR_RANGE, "id -3");

    /* Saved files are GPT-2's own, byte for byte, and load back. */
    CHECK(cg_tokenizer_save(t, tmpdir) == CG_OK, "save GPT-2: %s", cg_last_error());
    char p[128];
    size_t la, lb;
    snprintf(p, sizeof p, "%s/encoder.json", tmpdir);
    char *a = test_slurp(p, &la), *b = test_slurp(DATA "gpt2/encoder.json", &lb);
    CHECK(a && b && la == lb && memcmp(a, b, la) == 0, "saved encoder.json is GPT-2's (%zu vs %zu bytes)", la, lb);
    free(a), free(b);
    snprintf(p, sizeof p, "%s/vocab.bpe", tmpdir);
    a = test_slurp(p, &la), b = test_slurp(DATA "gpt2/vocab.bpe", &lb);
    CHECK(a && b && la == lb && memcmp(a, b, la) == 0, "saved vocab.bpe is GPT-2's (%zu vs %zu bytes)", la, lb);
    free(a), free(b);
    cg_tokenizer *u = cg_tokenizer_load(tmpdir);
    CHECK(u && cg_tokenizer_kind(u) == CG_TOK_BPE, "load saved GPT-2: %s", cg_last_error());
    if (u) check_list("Hello world after save", u, "Hello world", (const int32_t[]){15496, 995}, 2);
    cg_tokenizer_free(u);
    rm_tmp();

    /* The Hugging Face hub's names: the same bytes as vocab.json + merges.txt, read from the
     * directory or from either file of the pair. */
    CHECK(cg_tokenizer_save_hf(t, tmpdir) == CG_OK, "save GPT-2 under the hub's names: %s", cg_last_error());
    snprintf(p, sizeof p, "%s/vocab.json", tmpdir);
    a = test_slurp(p, &la), b = test_slurp(DATA "gpt2/encoder.json", &lb);
    CHECK(a && b && la == lb && memcmp(a, b, la) == 0, "vocab.json is GPT-2's encoder.json (%zu vs %zu bytes)", la, lb);
    free(a), free(b);
    static const char *const hub[] = {"", "/vocab.json", "/merges.txt"};
    for (int k = 0; k < 3; k++) {
        snprintf(p, sizeof p, "%s%s", tmpdir, hub[k]);
        u = cg_tokenizer_load(p);
        CHECK(u && cg_tokenizer_kind(u) == CG_TOK_BPE, "load %s: %s", p, cg_last_error());
        if (u) check_list("Hello world from the hub's names", u, "Hello world", (const int32_t[]){15496, 995}, 2);
        cg_tokenizer_free(u);
    }
    snprintf(p, sizeof p, "%s/merges.txt", tmpdir);
    unlink(p);
    snprintf(p, sizeof p, "%s/vocab.json", tmpdir);
    CHECK(!cg_tokenizer_load(p), "vocab.json without merges.txt");
    check_error_has("lone vocab.json", "its BPE partner (vocab.json + merges.txt) is not beside it");
    rm_tmp();

    char *json = NULL;
    CHECK(cg_tokenizer_serialize(t, &json) == CG_OK, "serialize GPT-2");
    u = cg_tokenizer_deserialize(json);
    CHECK(u && cg_tokenizer_vocab_size(u) == 50257, "deserialize GPT-2: %s", cg_last_error());
    if (u) {
        want = read_ids(FIX "gpt2_sample.ids", &nw, NULL);
        check_list("sample after deserialize", u, sample, want, nw);
        free(want);
    }
    free(json);
    cg_tokenizer_free(u);
    free(sample);
    cg_tokenizer_free(t);
}

/* ------------------------------------------------------------------ BPE training */

/* The merges of a trained tokenizer, read back from its saved vocab.bpe ("a b" lines). */
static char *saved_merges(const cg_tokenizer *t) {
    char p[128];
    CHECK(cg_tokenizer_save(t, tmpdir) == CG_OK, "save: %s", cg_last_error());
    snprintf(p, sizeof p, "%s/vocab.bpe", tmpdir);
    return test_slurp(p, NULL);
}

/* Naive BPE on words of lower-case letters after optional spaces (GPT-2's pieces for such text):
 * recount every pair each step, take the most frequent, ties to the lower ids, as documented. */
static int naive_merges(const char *text, int nmerges, char (*out)[64]) {
    enum { MAXT = 512 };
    static char tok[MAXT][64];
    static int64_t cnt[MAXT][MAXT];
    int ntok = 256;
    for (int b = 0; b < 256; b++) tok[b][0] = 0;
    int id_of[256];
    for (int b = 'a'; b <= 'z'; b++) id_of[b] = b - 33, snprintf(tok[b - 33], 64, "%c", b);
    id_of[' '] = 220, snprintf(tok[220], 64, "\xc4\xa0"); /* Ġ */
    /* words: every piece as a separate id sequence (duplicates kept; counts come out the same) */
    static int32_t sym[1 << 20];
    static int32_t start[1 << 17], wl[1 << 17];
    int nw = 0, at = 0;
    for (const char *s = text; *s;) {
        start[nw] = at;
        const char *e = s + (*s == ' ');
        while (*e >= 'a' && *e <= 'z') e++;
        for (const char *c = s; c < e; c++) sym[at++] = id_of[(unsigned char)*c];
        wl[nw] = (int)(e - s);
        nw++;
        s = e;
    }
    for (int m = 0; m < nmerges; m++) {
        memset(cnt, 0, sizeof cnt);
        for (int w = 0; w < nw; w++)
            for (int i = 0; i + 1 < wl[w]; i++) cnt[sym[start[w] + i]][sym[start[w] + i + 1]]++;
        int ba = -1, bb = -1;
        int64_t best = 0;
        for (int a = 0; a < ntok; a++)
            for (int b = 0; b < ntok; b++)
                if (cnt[a][b] > best) best = cnt[a][b], ba = a, bb = b;
        if (best == 0) return m;
        snprintf(out[m], 64, "%s %s", tok[ba], tok[bb]);
        char merged[64];
        snprintf(merged, 64, "%s%s", tok[ba], tok[bb]);
        int c = -1;
        for (int i = 0; i < ntok; i++)
            if (strcmp(tok[i], merged) == 0) c = i;
        if (c < 0) c = ntok, snprintf(tok[ntok++], 64, "%s", merged);
        for (int w = 0; w < nw; w++) {
            int32_t *s = sym + start[w];
            int o = 0;
            for (int i = 0; i < wl[w];) {
                if (i + 1 < wl[w] && s[i] == ba && s[i + 1] == bb) s[o++] = c, i += 2;
                else s[o++] = s[i++];
            }
            wl[w] = o;
        }
    }
    return nmerges;
}

static void test_bpe_train(void) {
    /* Sennrich et al.'s example. With GPT-2's pieces: "low" x1, " low" x4, " lower" x2,
     * " newest" x6, " widest" x3. Pair counts: e s 9, s t 9, w e 8, l o 7, o w 7, ...; ties go to
     * the lower ids (bytes in GPT-2's order: 'd' 67, 'e' 68, 'l' 75, 'n' 77, 'o' 78, 's' 82, 'w' 86,
     * then 'Ġ' (space) 220, then merged tokens 256, 257, ...). */
    const char *corpus = "low low low low low lower lower newest newest newest newest newest newest "
                         "widest widest widest";
    cg_tokenizer *t = cg_tokenizer_bpe_train(corpus, strlen(corpus), 257 + 10);
    CHECK(t && cg_tokenizer_vocab_size(t) == 267, "10 merges + 256 bytes + <|endoftext|>: %s", cg_last_error());
    if (!t) return;
    char *m = saved_merges(t);
    const char *expect = "#version: 0.2\n"
                         "e s\n"                   /* 9 (ties with s t: e < s) */
                         "es t\n"                  /* 9 */
                         "l o\n"                   /* 7 (ties with o w: l < o) */
                         "lo w\n"                  /* 7 */
                         "e w\n"                   /* 6: e w, n e, \xc4\xa0 n, \xc4\xa0 low, w est tie; e lowest */
                         "n ew\n"                  /* 6 */
                         "\xc4\xa0 low\n"          /* 6: \xc4\xa0 (220) < new (261) */
                         "\xc4\xa0 new\n"          /* 6: low 259 < new 261 as second */
                         "\xc4\xa0new est\n"       /* 6 */
                         "d est\n";                /* 3: d 67 lowest of \xc4\xa0 w, w i, i d, d est */
    CHECK(m && strcmp(m, expect) == 0, "merges:\n%s\nexpected:\n%s", m, expect);
    free(m);
    CHECK(cg_tokenizer_token_id(t, "es") == 256 && cg_tokenizer_token_id(t, "low") == 259 &&
          cg_tokenizer_token_id(t, "\xc4\xa0newest") == 264 && cg_tokenizer_token_id(t, "<|endoftext|>") == 266,
          "merged tokens take ids in merge order");
    CHECK(cg_tokenizer_token_id(t, "!") == 0 && cg_tokenizer_token_id(t, "\xc4\xa0") == 220, "GPT-2's byte ids");
    check_list("lowest", t, "lowest", (const int32_t[]){259, 257}, 2);        /* low + est */
    check_list(" newest", t, " newest", (const int32_t[]){264}, 1);
    check_list("widest!", t, "widest!", (const int32_t[]){86, 72, 265, 0}, 4); /* w i dest ! */
    const char *odd = "Unseen bytes: caf\xc3\xa9 \xf0\x9f\x98\x80\t\n  end";
    CHECK(round_trip(t, odd, strlen(odd)), "a trained tokenizer round-trips text it never saw");
    int32_t *ids = NULL;
    int64_t n = 0;
    CHECK(cg_tokenizer_encode(t, "ok\xff", 3, &ids, &n) == CG_ERR_FORMAT, "invalid UTF-8 in encode");
    check_error_has("bpe encode", "byte 2");

    /* Saved and reloaded, serialised and restored: the same tokenizer. */
    CHECK(cg_tokenizer_save(t, tmpdir) == CG_OK, "save trained");
    char e[128], v[128];
    snprintf(e, sizeof e, "%s/encoder.json", tmpdir);
    snprintf(v, sizeof v, "%s/vocab.bpe", tmpdir);
    cg_tokenizer *u = cg_tokenizer_bpe_load(e, v);
    CHECK(u && cg_tokenizer_vocab_size(u) == 267, "reload trained: %s", cg_last_error());
    if (u) check_list("lowest after reload", u, "lowest", (const int32_t[]){259, 257}, 2);
    cg_tokenizer_free(u);
    char *json = NULL;
    CHECK(cg_tokenizer_serialize(t, &json) == CG_OK, "serialize trained");
    u = cg_tokenizer_deserialize(json);
    CHECK(u && cg_tokenizer_vocab_size(u) == 267, "deserialize trained: %s", cg_last_error());
    if (u) check_list(" newest after deserialize", u, " newest", (const int32_t[]){264}, 1);
    cg_tokenizer_free(u);
    free(json);

    /* The same files from memory (what the fuzz harness feeds): the same tokenizer; the label names
     * them in messages; bytes after the JSON object, even after a NUL, are refused. */
    size_t le, lb;
    char *eb = test_slurp(e, &le), *bb = test_slurp(v, &lb);
    u = eb && bb ? cg_tokenizer_bpe_from_memory(eb, le, bb, lb, NULL, NULL) : NULL;
    CHECK(u && cg_tokenizer_vocab_size(u) == 267, "bpe from memory: %s", cg_last_error());
    if (u) check_list("lowest from memory", u, "lowest", (const int32_t[]){259, 257}, 2);
    cg_tokenizer_free(u);
    CHECK(cg_tokenizer_bpe_from_memory("{\"a\": 0}\0{", 10, bb, lb, "mem.json", NULL) == NULL, "a NUL and more");
    check_error_has("after NUL", "mem.json: bytes after the JSON object at byte 8");
    CHECK(cg_tokenizer_bpe_from_memory("{\"a\": 0} \n", 10, "a b", 3, NULL, "mem.bpe") == NULL, "merge of unknown");
    check_error_has("merge label", "mem.bpe line 1: token \"b\" is not in the vocabulary");
    CHECK(cg_tokenizer_bpe_from_memory(NULL, 0, NULL, 0, NULL, NULL) == NULL, "nothing");
    check_error_has("empty", "encoder.json: malformed JSON");
    free(eb), free(bb);
    u = cg_tokenizer_wordpiece_from_memory("[PAD]\n[UNK]\nhi", 14, NULL);
    CHECK(u && cg_tokenizer_vocab_size(u) == 3 && cg_tokenizer_token_id(u, "hi") == 2, "wordpiece from memory: %s",
          cg_last_error());
    cg_tokenizer_free(u);
    CHECK(cg_tokenizer_wordpiece_from_memory("[PAD]\nhi", 8, NULL) == NULL, "no [UNK] in memory");
    check_error_has("wordpiece label", "vocab.txt: the vocabulary has no [UNK] token");

    /* Malformed files, built from the trained ones. */
    char *vb = test_slurp(v, NULL);
    size_t lv = strlen(vb);
    char *bad = malloc(lv + 64);
    snprintf(bad, lv + 64, "%szz q\n", vb);
    spit(v, bad);
    u = cg_tokenizer_bpe_load(e, v);
    CHECK(u == NULL, "unknown token in vocab.bpe");
    check_error_has("vocab.bpe", "vocab.bpe line 12: token \"zz\" is not in the vocabulary");
    snprintf(bad, lv + 64, "%sab\n", vb);
    spit(v, bad);
    CHECK(cg_tokenizer_bpe_load(e, v) == NULL, "line without a space");
    check_error_has("vocab.bpe", "line 12: expected two tokens separated by one space");
    spit(v, vb);
    free(bad);
    free(vb);
    spit(e, "{\"a\": 0, \"b\": }");
    CHECK(cg_tokenizer_bpe_load(e, v) == NULL, "malformed JSON");
    check_error_has("encoder.json", "encoder.json: malformed JSON near byte 14");
    spit(e, "{\"a\": 0, \"b\": 0}");
    CHECK(cg_tokenizer_bpe_load(e, v) == NULL, "duplicate id");
    check_error_has("encoder.json", "id 0 is given to both \"a\" and \"b\"");
    spit(e, "{\"a\": 0, \"b\": 2}");
    CHECK(cg_tokenizer_bpe_load(e, v) == NULL, "id out of range");
    check_error_has("encoder.json", "token \"b\" has id out of range");
    spit(e, "{\"!\": 0}");
    spit(v, "#version: 0.2\n");
    CHECK(cg_tokenizer_bpe_load(e, v) == NULL, "no byte tokens");
    check_error_has("encoder.json", "no token for byte 0x00");
    rm_tmp();
    CHECK(cg_tokenizer_bpe_load(DATA "no/such/encoder.json", v) == NULL, "missing file");
    check_error_has("missing", "cannot open " DATA "no/such/encoder.json");
    CHECK(cg_tokenizer_bpe_train("abc", 3, 256) == NULL, "vocab_size below 257");
    CHECK(cg_tokenizer_bpe_train("a\xe2\x82", 3, 300) == NULL, "train on invalid UTF-8");
    check_error_has("train", "bpe_train: text is not valid UTF-8 at byte 1");
    cg_tokenizer_free(t);

    /* The incremental trainer against the naive one on a few thousand Zipf-ish words. */
    static const char *syl[] = {"ka", "ri", "to", "mo", "an", "el", "sh", "qu", "ing", "er", "the", "st",
                                "o", "a", "ne", "lo", "wi", "ve", "th", "re", "ion", "x", "zz", "pe"};
    enum { NSYL = sizeof syl / sizeof *syl };
    char *text = malloc(1 << 16);
    size_t k = 0;
    cg_rng r;
    cg_rng_seed(&r, 11);
    for (int w = 0; w < 4000; w++) {
        if (w) text[k++] = ' ';
        int ns = 1 + (int)(cg_rng_next(&r) % 4);
        for (int s = 0; s < ns; s++) {
            double u2 = cg_rng_uniform(&r);
            const char *x = syl[(int)(u2 * u2 * NSYL)]; /* skewed towards the first syllables */
            size_t lx = strlen(x);
            memcpy(text + k, x, lx);
            k += lx;
        }
    }
    text[k] = 0;
    enum { NM = 120 };
    static char ref[NM][64];
    int nref = naive_merges(text, NM, ref);
    CHECK(nref == NM, "naive trainer found %d merges", nref);
    t = cg_tokenizer_bpe_train(text, k, 257 + NM);
    m = t ? saved_merges(t) : NULL;
    char *line = m ? strchr(m, '\n') + 1 : NULL;
    int same = 0;
    for (int i = 0; line && i < nref; i++) {
        char *nl = strchr(line, '\n');
        if (!nl || (size_t)(nl - line) != strlen(ref[i]) || memcmp(line, ref[i], strlen(ref[i])) != 0) {
            fprintf(stderr, "merge %d: got \"%.*s\", naive \"%s\"\n", i, nl ? (int)(nl - line) : 0, line, ref[i]);
            break;
        }
        same++;
        line = nl + 1;
    }
    CHECK(same == nref, "first %d of %d merges agree with the naive trainer", same, nref);
    CHECK(t && round_trip(t, text, k), "round trip of the training text");
    free(m);
    free(text);
    cg_tokenizer_free(t);
    rm_tmp();

    if (!need(DATA "moby-dick.txt")) return;
    size_t len;
    char *moby = test_slurp(DATA "moby-dick.txt", &len);
    double t0 = now();
    t = cg_tokenizer_bpe_train(moby, len, 2048);
    double dt = now() - t0;
    CHECK(t && cg_tokenizer_vocab_size(t) == 2048, "2048 tokens from Moby Dick: %s", cg_last_error());
    n = 0;
    if (t) {
        t0 = now();
        CHECK(cg_tokenizer_encode(t, moby, len, &ids, &n) == CG_OK, "encode Moby Dick");
        double de = now() - t0;
        char *back = NULL;
        size_t blen;
        CHECK(cg_tokenizer_decode(t, ids, n, &back, &blen) == CG_OK && blen == len && memcmp(back, moby, len) == 0,
              "Moby Dick round trip with its own BPE");
        free(back);
        free(ids);
        printf("BPE trained on Moby Dick (%zu bytes, 2048 tokens) in %.0f ms; encodes it in %.0f ms into %lld "
               "tokens (%.2f bytes/token)\n", len, 1e3 * dt, 1e3 * de, (long long)n, (double)len / (double)n);
        CHECK((double)len / (double)n > 3.0, "2048-token BPE compresses English over 3 bytes per token");
    }
    cg_tokenizer_free(t);
    free(moby);
}

/* ------------------------------------------------------------------ WordPiece */

static void test_wordpiece(void) {
    /* BERT's own unit test vocabulary (tokenization_test.py), plus a few tokens. */
    cg_tokenizer *t = cg_tokenizer_wordpiece_load(FIX "tiny_vocab.txt");
    CHECK(t && cg_tokenizer_kind(t) == CG_TOK_WORDPIECE && cg_tokenizer_vocab_size(t) == 18, "tiny vocab: %s",
          cg_last_error());
    if (!t) return;
    CHECK(cg_tokenizer_token_id(t, "[MASK]") == 4 && cg_tokenizer_token_id(t, "[UNK]") == 1, "special ids");
    /* [UNK]=1 want=5 ##want=6 ##ed=7 un=9 runn=10 ##ing=11 ,=12 cafe=13 中=14 ##aff=16 ##able=17 */
    check_list("unaffable", t, "unaffable", (const int32_t[]){9, 16, 17}, 3);
    check_list("UNwantéd,running", t, "UNwant\xc3\xa9" "d,running", (const int32_t[]){9, 6, 7, 12, 10, 11}, 6);
    check_list("unwantedX running", t, "unwantedX running", (const int32_t[]){1, 10, 11}, 3);
    check_list("Café 中文", t, "Caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87", (const int32_t[]){13, 14, 1}, 3);
    check_list("spaces only", t, " \t\n ", NULL, 0);
    char *s = NULL;
    CHECK(cg_tokenizer_decode(t, (const int32_t[]){9, 6, 7, 12, 10, 11}, 6, &s, NULL) == CG_OK &&
          strcmp(s, "unwanted , running") == 0, "decode joins ## pieces: \"%s\"", s);
    free(s);
    char many[202];
    memset(many, 'a', 201);
    many[201] = 0;
    memcpy(many, "un", 2);
    check_list("201 characters", t, many, (const int32_t[]){1}, 1);
    cg_tokenizer_free(t);

    char p[128];
    snprintf(p, sizeof p, "%s/vocab.txt", tmpdir);
    spit(p, "[PAD]\nhello\n");
    CHECK(cg_tokenizer_wordpiece_load(p) == NULL, "vocab without [UNK]");
    check_error_has("no unk", "has no [UNK] token");
    spit(p, "[UNK]\nok\nbad\xc3(\n");
    CHECK(cg_tokenizer_wordpiece_load(p) == NULL, "vocab.txt with invalid UTF-8");
    check_error_has("utf8 vocab", "not valid UTF-8 at byte 12 (line 3)");
    rm_tmp();

    if (!need(DATA "bert/vocab.txt")) return;
    double t0 = now();
    t = cg_tokenizer_wordpiece_load(DATA "bert/vocab.txt");
    CHECK(t && cg_tokenizer_vocab_size(t) == 30522, "bert-base-uncased: %s", cg_last_error());
    if (!t) return;
    printf("BERT vocabulary loaded in %.1f ms\n", 1e3 * (now() - t0));
    CHECK(cg_tokenizer_token_id(t, "[PAD]") == 0 && cg_tokenizer_token_id(t, "[UNK]") == 100 &&
          cg_tokenizer_token_id(t, "[CLS]") == 101 && cg_tokenizer_token_id(t, "[SEP]") == 102 &&
          cg_tokenizer_token_id(t, "[MASK]") == 103, "special tokens at 0, 100, 101, 102, 103");
    CHECK(cg_tokenizer_token_id(t, "the") == 1996 && cg_tokenizer_token_id(t, "##s") == 2015, "the, ##s");
    check_list("i like strawberries", t, "I like strawberries", (const int32_t[]){1045, 2066, 13137, 20968}, 4);

    size_t len;
    char *sample = test_slurp(FIX "sample.txt", &len);
    int64_t nw, n;
    int32_t *want = read_ids(FIX "bert_sample.ids", &nw, NULL);
    int32_t *ids = NULL;
    CHECK(cg_tokenizer_encode(t, sample, len, &ids, &n) == CG_OK, "encode sample: %s", cg_last_error());
    check_ids("WordPiece sample vs BERT's tokenization.py", ids, n, want, nw);
    char *dec = NULL, *ref = test_slurp(FIX "bert_sample.decoded", NULL);
    CHECK(cg_tokenizer_decode(t, ids, n, &dec, NULL) == CG_OK && ref && strcmp(dec, ref) == 0,
          "decode matches BERT's join");
    free(dec), free(ref), free(ids), free(want), free(sample);
    check_random_fixture(t, FIX "bert_random.tsv", "WordPiece vs BERT's tokenization.py");

    /* Decoding gives normalised text that encodes to the same ids. */
    const char *text = "The Whale's jaw, ten feet long -- Ahab's \"hunt\"; naïve ÉTUDES!";
    int32_t *a = NULL, *b = NULL;
    int64_t na = 0, nb = 0;
    CHECK(cg_tokenizer_encode(t, text, strlen(text), &a, &na) == CG_OK &&
          cg_tokenizer_decode(t, a, na, &dec, NULL) == CG_OK, "encode + decode");
    CHECK(strcmp(dec, "the whale ' s jaw , ten feet long - - ahab ' s \" hunt \" ; naive etudes !") == 0,
          "decoded: \"%s\"", dec);
    CHECK(cg_tokenizer_encode(t, dec, strlen(dec), &b, &nb) == CG_OK, "re-encode");
    check_ids("encode(decode(ids))", b, nb, a, na);
    free(a), free(b), free(dec);

    /* Saved vocab.txt is the original; the directory loads as WordPiece. */
    CHECK(cg_tokenizer_save(t, tmpdir) == CG_OK, "save WordPiece");
    size_t la, lb;
    char *x = test_slurp(p, &la), *y = test_slurp(DATA "bert/vocab.txt", &lb);
    CHECK(x && y && la == lb && memcmp(x, y, la) == 0, "saved vocab.txt is the original");
    free(x), free(y);
    cg_tokenizer *u = cg_tokenizer_load(tmpdir);
    CHECK(u && cg_tokenizer_kind(u) == CG_TOK_WORDPIECE && cg_tokenizer_token_id(u, "[MASK]") == 103, "load dir");
    cg_tokenizer_free(u);
    char *json = NULL;
    CHECK(cg_tokenizer_serialize(t, &json) == CG_OK, "serialize WordPiece");
    snprintf(p, sizeof p, "%s/t.json", tmpdir);
    spit(p, json);
    u = cg_tokenizer_load(p);
    CHECK(u && cg_tokenizer_kind(u) == CG_TOK_WORDPIECE && cg_tokenizer_vocab_size(u) == 30522,
          "load a serialised .json: %s", cg_last_error());
    if (u) check_list("after load", u, "I like strawberries", (const int32_t[]){1045, 2066, 13137, 20968}, 4);
    cg_tokenizer_free(u);
    free(json);
    rm_tmp();
    cg_tokenizer_free(t);
}

static void test_misc_errors(void) {
    CHECK(cg_tokenizer_deserialize("{\"kind\":") == NULL, "truncated JSON");
    check_error_has("deserialize", "malformed JSON near byte 8");
    CHECK(cg_tokenizer_deserialize("{\"kind\":\"sentencepiece\"}") == NULL, "unknown kind");
    check_error_has("deserialize", "unknown kind \"sentencepiece\"");
    CHECK(cg_tokenizer_load(tmpdir) == NULL, "empty directory");
    check_error_has("load", "holds no cg_tokenizer.json");
    CHECK(cg_tokenizer_char_new("", 0) == NULL, "empty text");
    int32_t *ids = NULL;
    int64_t n = 0;
    CHECK(cg_tokenizer_encode(NULL, "a", 1, &ids, &n) == CG_ERR_ARG, "NULL tokenizer");
    CHECK(cg_tokenizer_vocab_size(NULL) == 0, "NULL vocab size");
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cg_tokenizer_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_invalid_utf8();
    test_char();
    test_gpt2();
    test_bpe_train();
    test_wordpiece();
    test_misc_errors();
    rm_tmp();
    rmdir(tmpdir);
    TEST_END();
}
