/* SPDX-License-Identifier: MIT */
/* Internals shared by the data loaders (io/data*.c): sequence lists, unbiased draws, splits,
 * epoch orders and the TSV reader. Not installed; prefix cgi_. */
#ifndef CGRAD_DATA_INTERNAL_H
#define CGRAD_DATA_INTERNAL_H

#include "graph/internal.h"
#include "io/data.h"

/* Many int32 sequences in one block: sequence i is ids[off[i] .. off[i+1]). */
typedef struct {
    int32_t *ids;
    int64_t *off; /* n + 1 entries once anything is pushed */
    int64_t n, n_ids, cap, cap_ids;
} cgi_seqs;

/* Appends a copy of ids[0..n); false (message set) when memory runs out. */
bool cgi_seqs_push(cgi_seqs *s, const int32_t *ids, int64_t n);
void cgi_seqs_free(cgi_seqs *s);
static inline int64_t cgi_seqs_len(const cgi_seqs *s, int64_t i) { return s->off[i + 1] - s->off[i]; }
static inline const int32_t *cgi_seqs_at(const cgi_seqs *s, int64_t i) { return s->ids + s->off[i]; }

/* Uniform integer in [0, n), n >= 1, without modulo bias. */
uint64_t cgi_rng_below(cg_rng *r, uint64_t n);
/* Held-out size round(frac * n); CG_ERR_ARG (naming who) unless frac is in [0, 1). */
cg_status cgi_val_count(const char *who, int64_t n, double frac, int64_t *n_val);
/* First byte offset in s[0..len) that is not valid UTF-8 (overlong forms, surrogates and code
 * points past U+10FFFF rejected), or len when it is all valid. */
size_t cgi_data_utf8_check(const char *s, size_t len);

/* Cached epoch order of one split: perm is the shuffle drawn from state key, after which the
 * generator stands at next. */
typedef struct {
    uint64_t key, next;
    int64_t n;
    int64_t *perm;
} cgi_order;

/* Split-local indices of the next batch examples in cursor c's order over n examples, advancing c;
 * on any error c is unchanged. who names the caller in messages. */
cg_status cgi_order_take(cgi_order *o, cg_data_cursor *c, int64_t n, int64_t batch, int64_t *rows, const char *who);
void cgi_order_free(cgi_order *o);

/* Called for each non-blank line "a\tb" of a TSV file (1-based line number). */
typedef cg_status (*cgi_tsv_fn)(void *ctx, const char *path, int64_t line, const char *a, size_t na,
                                const char *b, size_t nb);
/* Reads path (cg_read_text_file rules) and calls fn on every non-blank line; a line without
 * exactly one tab fails naming file, line and the fields expected (what, e.g. "label\\ttext"). */
cg_status cgi_tsv_read(const char *path, const char *what, cgi_tsv_fn fn, void *ctx);
/* Tokenizes one TSV field; a tokenizer error is reported as "[data] path:line: field: message". */
cg_status cgi_tsv_encode(const cg_tokenizer *tok, const char *path, int64_t line, const char *field,
                         const char *s, size_t n, int32_t **ids, int64_t *n_ids);

#endif
