/* SPDX-License-Identifier: MIT */
/* Internals shared by the tokenizer files (io/tokenizer*.c): the handle, the token table with its
 * hash index, UTF-8 decoding and the Unicode classes. Not installed; prefix cgi_. */
#ifndef CGRAD_TOKENIZER_INTERNAL_H
#define CGRAD_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graph/internal.h"
#include "io/tokenizer.h"

/* Open-addressing index from a token's bytes to its id; the bytes live in the tokenizer. */
typedef struct {
    int32_t *slot; /* -1 when empty */
    size_t mask;   /* capacity - 1, capacity a power of two */
} cgi_tokmap;

/* Open-addressing map from a pair of ids to a value (BPE merges: rank and merged id). */
typedef struct {
    uint64_t *key; /* (a << 32 | b); UINT64_MAX when empty */
    int64_t *val;
    size_t mask, count;
} cgi_pairmap;

struct cg_tokenizer {
    cg_tok_kind kind;
    int32_t n;         /* vocabulary size */
    char *pool;        /* every token string, NUL-terminated, back to back */
    size_t pool_len, pool_cap;
    int64_t *off;      /* token i starts at pool + off[i] */
    int32_t *len;      /* its length in bytes */
    size_t tok_cap;    /* room in off and len */
    cgi_tokmap index;  /* token string -> id */
    /* char: the vocabulary's code points, ascending (id = position) */
    uint32_t *cps;
    /* bpe */
    int32_t byte_tok[256]; /* id of the one-byte token of each byte */
    uint8_t *raw;          /* bytes each token stands for, back to back */
    int64_t *raw_off;      /* token i's bytes: raw[raw_off[i] .. raw_off[i + 1]) */
    int32_t nmerges, merge_cap;
    int32_t *merge;        /* merge r joins tokens merge[2r] and merge[2r + 1] */
    cgi_pairmap ranks;     /* (a, b) -> rank << 32 | merged id */
    /* wordpiece */
    int32_t unk;
    /* a Hugging Face tokenizer.json pipeline (io/tokenizer_hf/) */
    struct cgi_hf *hf;
};

/* ---- token table ---- */
/* New empty tokenizer of a kind; NULL (message set) when out of memory. */
cg_tokenizer *cgi_tok_new(cg_tok_kind kind);
/* Appends a token string as the next id; false (message set) when out of memory. */
bool cgi_tok_push(cg_tokenizer *t, const char *s, size_t len);
/* Builds the hash index once every token is pushed (later duplicates win, as in Python dicts). */
bool cgi_tok_index(cg_tokenizer *t);
/* Empties the index and sizes it for up to expected tokens; false (message set) when out of memory. */
bool cgi_tok_reserve(cg_tokenizer *t, size_t expected);
/* Adds token id to the index (it must have room: cgi_tok_reserve), replacing equal bytes. */
void cgi_tokmap_put(cg_tokenizer *t, int32_t id);
/* Hash of a byte string (FNV-1a, mixed). */
uint64_t cgi_hash_bytes(const char *s, size_t len);
/* Token i's string. */
static inline const char *cgi_tok_str(const cg_tokenizer *t, int32_t i) { return t->pool + t->off[i]; }
/* Id of the token with these bytes, or -1. */
int32_t cgi_tokmap_get(const cg_tokenizer *t, const char *s, size_t len);

bool cgi_pairmap_init(cgi_pairmap *m, size_t expected);
void cgi_pairmap_free(cgi_pairmap *m);
/* Inserts or overwrites; false when out of memory. */
bool cgi_pairmap_put(cgi_pairmap *m, int32_t a, int32_t b, int64_t val);
/* Pointer to the value of (a, b), or NULL. */
int64_t *cgi_pairmap_get(const cgi_pairmap *m, int32_t a, int32_t b);

/* ---- UTF-8 ---- */
/* Offset of the first byte that is not well-formed UTF-8 (overlong forms, surrogates and code
 * points past U+10FFFF included), or len when the text is valid. */
size_t cgi_utf8_check(const char *s, size_t len);
/* Decodes the valid UTF-8 at s (cgi_utf8_check first); returns the bytes used. */
int cgi_utf8_next(const unsigned char *s, uint32_t *cp);
/* Writes cp as UTF-8 into out (4 bytes room); returns the bytes written. */
int cgi_utf8_put(uint32_t cp, char *out);
/* Sets the "[tokenizer] encode: ... byte N" message for invalid UTF-8 at that offset. */
cg_status cgi_utf8_fail(const char *what, const char *s, size_t len, size_t at);

/* ---- files ---- */
/* Whole file, NUL-terminated, malloc'd; NULL with an i/o message naming the path. */
char *cgi_read_file(const char *path, size_t *len);
/* Writes bytes to a file; an i/o status naming the path on failure. */
cg_status cgi_write_file(const char *path, const char *data, size_t len);

/* ---- Unicode classes (io/tokenizer_unicode.c, generated) ---- */
bool cgi_uc_is_letter(uint32_t cp);  /* \p{L} */
bool cgi_uc_is_number(uint32_t cp);  /* \p{N} */
bool cgi_uc_is_punct(uint32_t cp);   /* \p{P} */
bool cgi_uc_is_zs(uint32_t cp);      /* Zs */
bool cgi_uc_is_control(uint32_t cp); /* Cc or Cf */
bool cgi_uc_is_mn(uint32_t cp);      /* Mn */
/* The \p{L} and \p{N} tables as sorted inclusive ranges (*r) and their count: tokenizer.json's
 * regexes use them in place of PCRE2's own (older) Unicode data. */
size_t cgi_uc_letter_ranges(const uint32_t (**r)[2]);
size_t cgi_uc_number_ranges(const uint32_t (**r)[2]);
/* Unicode White_Space (what \s matches in GPT-2's regex). */
static inline bool cgi_uc_is_space(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}
/* BERT's uncased folding of one code point (lower-case, NFD, drop Mn): writes 0 to 3 code
 * points into out and returns how many. */
int cgi_uc_fold(uint32_t cp, uint32_t out[3]);

/* ---- per-kind parts (io/tokenizer_bpe.c, io/tokenizer_wordpiece.c) ---- */
/* Parses one merge "a b" (a vocab.bpe line or a serialised merge) and appends it to t->merge;
 * errors name src, what ("line", "merge") and where. */
cg_status cgi_bpe_add_merge(cg_tokenizer *t, const char *s, size_t len, const char *src, const char *what,
                            int64_t where);
/* Builds byte_tok, raw and the merge ranks from the token table and t->merge; names src in errors. */
cg_status cgi_bpe_finish(cg_tokenizer *t, const char *src);
cg_status cgi_bpe_encode(const cg_tokenizer *t, const char *text, size_t len, int32_t **ids, int64_t *n);
cg_status cgi_bpe_decode(const cg_tokenizer *t, const int32_t *ids, int64_t n, char **text, size_t *len);
cg_status cgi_bpe_save(const cg_tokenizer *t, const char *dir, const char *vocab_name, const char *merges_name);
/* Finds [UNK]; names src in errors. */
cg_status cgi_wordpiece_finish(cg_tokenizer *t, const char *src);
cg_status cgi_wordpiece_encode(const cg_tokenizer *t, const char *text, size_t len, int32_t **ids, int64_t *n);
cg_status cgi_wordpiece_decode(const cg_tokenizer *t, const int32_t *ids, int64_t n, char **text, size_t *len);

/* ---- a growable id array for the encoders ---- */
typedef struct {
    int32_t *v;
    int64_t n, cap;
} cgi_ids;
/* Appends x; false (message set) when out of memory. */
bool cgi_ids_push(cgi_ids *a, int32_t x);

/* A growable byte string, NUL-terminated once anything was added. */
typedef struct {
    char *s;
    size_t n, cap;
} cgi_buf;
/* Appends n bytes; false (message set) when out of memory. */
bool cgi_buf_add(cgi_buf *b, const void *p, size_t n);

#endif
