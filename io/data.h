/* SPDX-License-Identifier: MIT */
/* cgrad data loaders: token streams and example files -> int32 batch arrays named as the model zoo
 * expects (models/zoo.h). Every random choice is drawn from a caller-owned cg_rng, so a run is
 * reproducible and resumable. What a checkpoint must store to resume exactly:
 *   lm, mlm          the cg_rng's one state word (rng.state) used for the batches;
 *   seq2seq, textcls the cg_data_cursor's three integers (rng.state, epoch, pos).
 * Restoring those words and rebuilding the data object from the same inputs gives the same batches.
 * Batch arrays are row-major and caller-owned; ignored label positions hold -100; masks are 1
 * (keep) / 0 (pad). A batch call that fails changes nothing: no rng draw, no cursor step. Data
 * objects are read-only after construction except for the epoch-order cache of seq2seq and
 * textcls, so those two must not be used from two threads at once. */
#ifndef CGRAD_DATA_H
#define CGRAD_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../graph/graph.h"
#include "tokenizer.h"

CG_BEGIN_DECLS

#define CG_IGNORE_INDEX (-100) /* label value the losses skip */

/* ---- files and ids ---- */

/* Reads a whole UTF-8 text file into *text (malloc'd, NUL-terminated, caller frees; a leading
 * byte-order mark is dropped) and its byte count into *len. CG_ERR_IO if unreadable, CG_ERR_FORMAT
 * if empty, not UTF-8 or holding a NUL byte (the message names the file and the byte offset). */
cg_status cg_read_text_file(const char *path, char **text, size_t *len);
/* CG_OK if every ids[i] is in [0, vocab_size) (or is -100 when allow_ignore); else CG_ERR_RANGE
 * naming what, the position ([row,col] when row_len > 0, else [i]) and the value. */
cg_status cg_check_ids(const char *what, const int32_t *ids, int64_t n, int32_t vocab_size,
                       int64_t row_len, bool allow_ignore);

/* ---- language-model windows (GPT pre-training: x = input_ids, y = targets) ---- */

typedef struct cg_lm_data cg_lm_data; /* a token stream split into training and held-out parts (opaque) */

/* Copies n ids; the held-out split is the last round(val_fraction * n) tokens (nanoGPT keeps the
 * last 10%), val_fraction in [0, 1). NULL with a message on bad arguments. Free with cg_lm_data_free. */
cg_lm_data *cg_lm_data_new(const int32_t *ids, int64_t n, double val_fraction);
/* Frees the data. NULL is a no-op. */
void cg_lm_data_free(cg_lm_data *d);
/* Number of tokens in the training (val false) or held-out (val true) split. */
int64_t cg_lm_data_count(const cg_lm_data *d, bool val);
/* Fills x and y [batch, context]: each row starts at an offset o drawn uniformly from r over the
 * split's context+1-token windows, x = ids[o .. o+context), y = ids[o+1 .. o+context]. CG_ERR_ARG
 * if the split holds fewer than context + 1 tokens. */
cg_status cg_lm_batch(const cg_lm_data *d, bool val, cg_rng *r, int64_t batch, int64_t context,
                      int32_t *x, int32_t *y);

/* ---- masked LM with next-sentence pairs (BERT pre-training) ---- */

/* How masked-LM rows are made. */
typedef struct {
    int32_t cls_id;      /* [CLS], first in every row */
    int32_t sep_id;      /* [SEP], after each sentence */
    int32_t mask_id;     /* [MASK], written over 80% of the tokens to predict */
    int32_t pad_id;      /* [PAD], fills the row after the second [SEP] */
    int32_t vocab_size;  /* random replacements come from [0, vocab_size) minus special tokens */
    double mask_prob;    /* share of the A and B tokens to predict, at least one a row (BERT: 0.15) */
    double val_fraction; /* the last round(val_fraction * sentences) form the held-out split */
} cg_mlm_options;

typedef struct cg_mlm_data cg_mlm_data; /* sentences of documents, for masked LM and next-sentence rows (opaque) */

/* Fills o from tok: its [CLS] [SEP] [MASK] [PAD] ids and vocab size, mask_prob 0.15,
 * val_fraction 0. CG_ERR_ARG naming the first special token tok lacks. */
cg_status cg_mlm_options_default(const cg_tokenizer *tok, cg_mlm_options *o);
/* Splits text into documents (at blank lines) and sentences (after . ! or ?, optionally followed
 * by closing quotes or brackets, then whitespace), collapses whitespace runs to one space and
 * tokenizes each sentence with tok, which is not kept. Special tokens are o's four ids and every
 * token spelled "[word]" ([UNK], [unused0]). NULL with a message on bad options, invalid UTF-8, a
 * tokenizer error (naming the sentence's byte offset) or a training split that cannot make both
 * kinds of pair. Free with cg_mlm_data_free. */
cg_mlm_data *cg_mlm_data_new(const char *text, size_t len, const cg_tokenizer *tok, const cg_mlm_options *o);
/* Frees the data. NULL is a no-op. */
void cg_mlm_data_free(cg_mlm_data *d);
/* Number of sentences in the training or held-out split. */
int64_t cg_mlm_data_count(const cg_mlm_data *d, bool val);
/* Sentence i of the whole text (training split first): its ids (owned by d), count and document
 * number (a document cut by the split counts as two); CG_ERR_ARG if i is out of range. */
cg_status cg_mlm_sentence(const cg_mlm_data *d, int64_t i, const int32_t **ids, int64_t *n, int64_t *doc);
/* Fills one BERT pre-training batch of rows of seq_len (>= 5) tokens: A is a random sentence that
 * has a successor in its document; B is that successor (next_sentence_label 0 = IsNext) with
 * probability 1/2, else a random sentence of another document (1 = NotNext; of the same document,
 * never A or its successor, when the split has one document). Row: [CLS] A [SEP] B [SEP] [PAD]...,
 * the longer of A and B cut from its end until it fits; token_type_ids 1 on B and its [SEP];
 * attention_mask 0 on padding. max(1, round(mask_prob * (|A|+|B|))) A/B positions are chosen:
 * 80% become [MASK], 10% a random non-special id, 10% stay; labels hold their original ids, -100
 * everywhere else. Arrays are [batch, seq_len] except next_sentence_label [batch]. */
cg_status cg_mlm_batch(const cg_mlm_data *d, bool val, cg_rng *r, int64_t batch, int64_t seq_len,
                       int32_t *input_ids, int32_t *token_type_ids, int32_t *attention_mask,
                       int32_t *labels, int32_t *next_sentence_label);

/* ---- shuffled epochs over examples (seq2seq, classification) ---- */

/* Where a reader stands in its endless sequence of shuffled epochs; plain data, so a checkpoint
 * stores the three integers. Epoch e's order is a Fisher-Yates shuffle drawn from rng as it stands
 * at the start of e; when the epoch ends rng moves past that shuffle, epoch grows by one and pos
 * returns to 0. Use one cursor per split. */
typedef struct {
    cg_rng rng;    /* generator state at the start of the current epoch */
    int64_t epoch; /* epochs completed */
    int64_t pos;   /* examples of the current epoch already served */
} cg_data_cursor;

/* Seeds the cursor's rng and sets epoch and pos to 0. */
void cg_data_cursor_init(cg_data_cursor *c, uint64_t seed);

/* ---- sequence-to-sequence pairs ("source<TAB>target" lines) ---- */

/* How source/target pairs become batches. */
typedef struct {
    int32_t pad_id;      /* fills src and tgt_in after the tokens */
    int32_t bos_id;      /* starts tgt_in */
    int32_t eos_id;      /* ends tgt_out */
    int64_t max_src;     /* S cap: sources cut to this many tokens; 0 = the longest source */
    int64_t max_tgt;     /* T cap (target tokens + 1): targets cut to T-1 tokens; 0 = the longest */
    bool pad_to_max;     /* true: every batch is [B, S cap] / [B, T cap]; false: the batch's longest */
    double val_fraction; /* without a held-out file, the last round(val_fraction * lines) lines */
} cg_seq2seq_options;

typedef struct cg_seq2seq_data cg_seq2seq_data; /* tokenized source/target pairs (opaque) */

/* Reads train_tsv (and val_tsv, which may be NULL) with one "source\ttarget" pair a line (blank
 * lines skipped, CRLF accepted), tokenizing sources with src_tok and targets with tgt_tok (NULL:
 * src_tok); neither is kept. NULL with a message naming file and line for a line without exactly
 * one tab, an empty source or a tokenizer error. Free with cg_seq2seq_data_free. */
cg_seq2seq_data *cg_seq2seq_data_load(const char *train_tsv, const char *val_tsv, const cg_tokenizer *src_tok,
                                      const cg_tokenizer *tgt_tok, const cg_seq2seq_options *o);
/* Frees the data. NULL is a no-op. */
void cg_seq2seq_data_free(cg_seq2seq_data *d);
/* Number of pairs in the training or held-out split. */
int64_t cg_seq2seq_data_count(const cg_seq2seq_data *d, bool val);
/* The S and T caps in effect (the options' maxima, or the longest in the data when 0): batch
 * arrays need batch * S (src, src_mask) and batch * T (tgt_in, tgt_out) elements. */
void cg_seq2seq_data_caps(const cg_seq2seq_data *d, int64_t *src_cap, int64_t *tgt_cap);
/* Pair i of a split, untruncated, in file order: ids owned by d. CG_ERR_ARG if i is out of range. */
cg_status cg_seq2seq_example(const cg_seq2seq_data *d, bool val, int64_t i, const int32_t **src,
                             int64_t *n_src, const int32_t **tgt, int64_t *n_tgt);
/* Next batch pairs in c's order: src [batch, S] padded with pad_id, src_mask 1/0, tgt_in = bos +
 * target, tgt_out = target + eos with -100 after it; S and T go to *src_len and *tgt_len (either
 * may be NULL). CG_ERR_ARG if batch exceeds the split's pairs, CG_ERR_STATE if c->pos does. */
cg_status cg_seq2seq_batch(cg_seq2seq_data *d, bool val, cg_data_cursor *c, int64_t batch, int32_t *src,
                           int32_t *src_mask, int32_t *tgt_in, int32_t *tgt_out, int64_t *src_len,
                           int64_t *tgt_len);

/* ---- text classification ("label<TAB>text" lines) ---- */

/* How labelled texts become batches. */
typedef struct {
    int32_t pad_id;      /* fills input_ids after the text */
    int32_t cls_id;      /* prefixed to every row when >= 0 (BERT's [CLS]); -1: none */
    int64_t max_len;     /* T cap, [CLS] included: texts are cut to fit; 0 = the longest */
    bool pad_to_max;     /* true: every batch is [B, T cap]; false: the batch's longest */
    double val_fraction; /* without a held-out file, the last round(val_fraction * lines) lines */
} cg_textcls_options;

typedef struct cg_textcls_data cg_textcls_data; /* tokenized labelled texts (opaque) */

/* Fills o for tok: pad_id = [PAD] (else 0), cls_id = [CLS] (else -1), max_len 0, pad_to_max
 * false, val_fraction 0. */
void cg_textcls_options_default(const cg_tokenizer *tok, cg_textcls_options *o);
/* Reads train_tsv (and val_tsv, which may be NULL) with one "label\ttext" line per example (blank
 * lines skipped, CRLF accepted). Labels of both files get ids in sorted order: numeric when every
 * label is a decimal integer, else byte order. NULL with a message naming file and line for a line
 * without exactly one tab, an empty label or text, or a tokenizer error. Free with cg_textcls_data_free. */
cg_textcls_data *cg_textcls_data_load(const char *train_tsv, const char *val_tsv, const cg_tokenizer *tok,
                                      const cg_textcls_options *o);
/* Frees the data. NULL is a no-op. */
void cg_textcls_data_free(cg_textcls_data *d);
/* Number of examples in the training or held-out split. */
int64_t cg_textcls_data_count(const cg_textcls_data *d, bool val);
/* The T cap in effect: batch arrays need batch * T elements (labels: batch). */
int64_t cg_textcls_data_cap(const cg_textcls_data *d);
/* Number of distinct labels (the classifier's num_classes). */
int32_t cg_textcls_num_labels(const cg_textcls_data *d);
/* Name of label id (owned by d), or NULL if out of range. */
const char *cg_textcls_label_name(const cg_textcls_data *d, int32_t id);
/* Id of a label name, or -1. */
int32_t cg_textcls_label_id(const cg_textcls_data *d, const char *name);
/* Example i of a split, untruncated and without [CLS], in file order: ids owned by d. */
cg_status cg_textcls_example(const cg_textcls_data *d, bool val, int64_t i, const int32_t **ids, int64_t *n,
                             int32_t *label);
/* Next batch examples in c's order: input_ids [batch, T] ([CLS] + text, cut, pad_id after),
 * attention_mask 1/0, labels [batch]; T goes to *seq_len (may be NULL). CG_ERR_ARG if batch exceeds
 * the split's examples, CG_ERR_STATE if c->pos does. */
cg_status cg_textcls_batch(cg_textcls_data *d, bool val, cg_data_cursor *c, int64_t batch, int32_t *input_ids,
                           int32_t *attention_mask, int32_t *labels, int64_t *seq_len);

CG_END_DECLS
#endif
