/* SPDX-License-Identifier: MIT */
/* Internals of the Hugging Face tokenizer.json pipeline (the .c files beside this header): the parsed stages
 * and the helpers they share. One file per stage, as Hugging Face tokenizers splits them:
 *   load.c        tokenizer.json -> these structures (every component type checked by name)
 *   text.c        pieces (a list of strings), regexes (PCRE2), Unicode helpers (utf8proc)
 *   normalize.c   normalizers        pretokenize.c  pre-tokenizers
 *   model.c       BPE, WordPiece, Unigram           encode.c  added tokens, the pipeline, decoders
 * Not installed; prefix cgi_hf_. */
#ifndef CGRAD_TOKENIZER_HF_INTERNAL_H
#define CGRAD_TOKENIZER_HF_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "io/tokenizer_internal.h"

/* ---- pieces: an ordered list of strings (the pre-tokenized text, or tokens being decoded) ---- */
typedef struct {
    cgi_buf bytes;   /* the strings back to back */
    size_t *off;     /* piece i is bytes.s[off[i] .. off[i] + len[i]) */
    size_t *len;
    size_t n, cap;
    int32_t *section; /* per piece: the index of the added-token section it came from */
} cgi_hf_pieces;

/* Appends a piece; false (message set) when out of memory. */
bool cgi_hf_pieces_add(cgi_hf_pieces *p, const char *s, size_t len, int32_t section);
/* Empties p, keeping its memory. */
void cgi_hf_pieces_clear(cgi_hf_pieces *p);
void cgi_hf_pieces_free(cgi_hf_pieces *p);
/* Piece i's bytes. */
static inline const char *cgi_hf_piece(const cgi_hf_pieces *p, size_t i) { return p->bytes.s + p->off[i]; }

/* ---- patterns: a literal string or a regex (tokenizer.json's {"String": ...} / {"Regex": ...}) ---- */
typedef struct {
    char *lit;        /* literal, or NULL for a regex */
    size_t lit_len;
    pcre2_code *re;   /* compiled regex (JIT when available) */
    pcre2_match_context *mc; /* its match limits */
} cgi_hf_pattern;

/* Compiles a {"String": s} or {"Regex": r} object; src and what name it in messages. The regex is
 * read as the reference (ECMAScript with the u flag) reads it: \s is ECMAScript's white space, and
 * \p{L}, \p{N} take cgrad's Unicode tables (the reference's version) rather than PCRE2's. */
cg_status cgi_hf_pattern_parse(cgi_hf_pattern *p, const void *json, const char *src, const char *what);
/* Compiles a regex given as text (the built-in patterns). */
cg_status cgi_hf_pattern_regex(cgi_hf_pattern *p, const char *regex, const char *src, const char *what);
void cgi_hf_pattern_free(cgi_hf_pattern *p);
/* Next match of p in s[0..len) at or after *pos: 1 with [*ms, *me), 0 when there is none, -1
 * (message set) when the regex gives up; an empty match moves the search on by one code point
 * (as ECMAScript's matchAll). md: pcre2 match data. */
int cgi_hf_pattern_next(const cgi_hf_pattern *p, pcre2_match_data *md, const char *s, size_t len, size_t *pos,
                         size_t *ms, size_t *me);
/* Every match of p in s replaced by rep, into out (appended). */
cg_status cgi_hf_pattern_replace(const cgi_hf_pattern *p, pcre2_match_data *md, const char *s, size_t len,
                            const char *rep, size_t rep_len, cgi_buf *out);

/* ---- Unicode helpers ---- */
/* ECMAScript's WhiteSpace or LineTerminator (what \s and trim() take in the reference). */
bool cgi_hf_js_space(uint32_t cp);
/* Unicode general category P* (punctuation) or an ASCII punctuation character. */
bool cgi_hf_is_punct(uint32_t cp);
/* Letter, number or mark, or connector punctuation such as '_' (Unicode \w, as Rust's regex has it). */
bool cgi_hf_is_word(uint32_t cp);

/* ---- stages ---- */
typedef enum {
    HF_NFC, HF_NFD, HF_NFKC, HF_NFKD, HF_LOWERCASE, HF_STRIP, HF_REPLACE, HF_PREPEND, HF_STRIP_ACCENTS, HF_BERT_NORM
} cgi_hf_norm_type;

typedef struct {
    cgi_hf_norm_type type;
    bool left, right;          /* Strip; BertNormalizer: clean_text, handle_chinese_chars */
    bool lower, strip_accents; /* BertNormalizer */
    cgi_hf_pattern pat;        /* Replace */
    char *str;                 /* Replace content, Prepend prepend */
    size_t str_len;
} cgi_hf_norm;

typedef enum {
    HF_BYTE_LEVEL, HF_SPLIT, HF_METASPACE, HF_WHITESPACE, HF_WHITESPACE_SPLIT, HF_DIGITS, HF_PUNCTUATION, HF_BERT_PRE
} cgi_hf_pre_type;

/* How a split keeps what its pattern matched (Hugging Face's SplitDelimiterBehavior). */
typedef enum { HF_REMOVED, HF_ISOLATED, HF_MERGED_PREV, HF_MERGED_NEXT, HF_CONTIGUOUS } cgi_hf_behavior;
typedef enum { HF_PREPEND_ALWAYS, HF_PREPEND_FIRST, HF_PREPEND_NEVER } cgi_hf_prepend;

typedef struct {
    cgi_hf_pre_type type;
    bool add_prefix_space, use_regex; /* ByteLevel */
    cgi_hf_pattern pat;               /* Split; ByteLevel's GPT-2 regex */
    cgi_hf_behavior behavior;         /* Split, Punctuation */
    bool invert;                      /* Split */
    bool individual_digits;           /* Digits */
    char *repl;                       /* Metaspace replacement */
    size_t repl_len;
    cgi_hf_prepend prepend;           /* Metaspace */
    bool split;                       /* Metaspace */
} cgi_hf_pre;

typedef enum { HF_DEC_BYTE_LEVEL, HF_DEC_METASPACE, HF_DEC_BYTE_FALLBACK, HF_DEC_FUSE, HF_DEC_STRIP, HF_DEC_REPLACE,
               HF_DEC_WORDPIECE, HF_DEC_BPE } cgi_hf_dec_type;

typedef struct {
    cgi_hf_dec_type type;
    char *a, *b; /* Metaspace replacement; Strip content; Replace content; WordPiece prefix; BPE suffix */
    size_t a_len, b_len;
    cgi_hf_pattern pat;  /* Replace */
    int start, stop;     /* Strip */
    bool flag;           /* WordPiece cleanup; Metaspace: strip the first token's leading space */
} cgi_hf_dec;

typedef enum { HF_MODEL_BPE, HF_MODEL_WORDPIECE, HF_MODEL_UNIGRAM } cgi_hf_model_type;

typedef struct {
    int32_t id;
    char *content;
    size_t len;
    bool special, single_word, lstrip, rstrip, normalized;
} cgi_hf_added;

typedef struct cgi_hf {
    char *src;                    /* the file's name, for messages */
    cgi_hf_model_type model;
    /* model */
    int32_t unk;                  /* unk_token's id, or -1 */
    bool byte_fallback, fuse_unk, ignore_merges;
    char *prefix, *suffix;        /* continuing_subword_prefix, end_of_word_suffix ("" when absent) */
    size_t prefix_len, suffix_len;
    int32_t max_chars;            /* WordPiece max_input_chars_per_word */
    int32_t byte_id[256];         /* <0xXX> tokens for byte_fallback, -1 when absent */
    double *score;                /* Unigram: per id */
    double unk_score;
    int32_t max_piece_bytes;      /* Unigram: the longest piece, in bytes */
    bool *is_piece;               /* Unigram: ids of the model's vocabulary (not added tokens) */
    /* stages */
    cgi_hf_norm *norm;
    int n_norm;
    cgi_hf_pre *pre;
    int n_pre;
    cgi_hf_dec *dec;
    int n_dec;
    /* added tokens, and per first byte the indices of those starting with it, longest first */
    cgi_hf_added *added;
    int n_added;
    int32_t *first_idx, first_start[257];
    bool *is_special;             /* per id: a special added token */
    /* post-processor: ids before and after the sequence */
    int32_t *pre_ids, *post_ids;
    int n_pre_ids, n_post_ids;
    bool *is_hole;                /* per id: no token has this id (a gap in the file's ids) */
    char *json;                   /* the file's text, kept for serialising and saving */
    size_t json_len;
} cgi_hf;

/* The tokenizer from tokenizer.json text (NUL-terminated, json_len bytes); src names it. */
cg_tokenizer *cgi_hf_load(const char *json, size_t json_len, const char *src);
void cgi_hf_free(cgi_hf *h);

/* Normalizes s into out (replaced). */
cg_status cgi_hf_normalize(const cgi_hf *h, pcre2_match_data *md, const char *s, size_t len, cgi_buf *out);
/* Runs the pre-tokenizers over in (one piece per section to start), leaving the pieces in *in;
 * tmp is scratch. */
cg_status cgi_hf_pretokenize(const cgi_hf *h, pcre2_match_data *md, cgi_hf_pieces *in, cgi_hf_pieces *tmp);
/* The model's ids of every piece, appended to out. */
cg_status cgi_hf_model_encode(const cg_tokenizer *t, const cgi_hf_pieces *p, cgi_ids *out);
/* Builds the model's tables once the vocabulary and merges are in t. */
cg_status cgi_hf_model_finish(cg_tokenizer *t);

cg_status cgi_hf_encode(const cg_tokenizer *t, const char *text, size_t len, bool add_special, cgi_ids *out);
cg_status cgi_hf_decode(const cg_tokenizer *t, const int32_t *ids, int64_t n, char **text, size_t *len);

/* The code point ByteLevel writes for byte b (GPT-2's map). */
uint32_t cgi_hf_byte_cp(int b);
/* The byte a code point stands for in ByteLevel, or -1. */
int cgi_hf_char_byte(uint32_t cp);
/* Appends bytes as UTF-8, each ill-formed part replaced by U+FFFD (as from_utf8_lossy). */
bool cgi_hf_add_lossy(cgi_buf *out, const char *s, size_t len);

#endif
