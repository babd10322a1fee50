/* SPDX-License-Identifier: MIT */
/* cgrad tokenizers: text <-> token ids. Four kinds behind one opaque handle:
 *   char       one token per Unicode code point seen in a training text (ids in code point order);
 *   bpe        GPT-2's byte-level BPE (encoder.json + vocab.bpe), loadable or trained here;
 *   wordpiece  bert-base-uncased's WordPiece (vocab.txt) with BERT's basic tokenizer;
 *   hf         a Hugging Face tokenizer.json: its normalizers, pre-tokenizers, BPE, WordPiece or
 *              Unigram model, added tokens, post-processor and decoders (docs/tokenizers.md).
 * Text is UTF-8 in and out; invalid UTF-8 is an error naming the byte offset. A tokenizer is
 * read-only once built, so one handle may encode and decode on several threads at once. */
#ifndef CGRAD_TOKENIZER_H
#define CGRAD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "../graph/graph.h"

CG_BEGIN_DECLS

typedef struct cg_tokenizer cg_tokenizer; /* text <-> ids, of one of the kinds below (opaque) */

/* The tokenizer algorithms. */
typedef enum {
    CG_TOK_CHAR = 0,     /* code points */
    CG_TOK_BPE = 1,      /* byte-level BPE, as GPT-2 */
    CG_TOK_WORDPIECE = 2, /* WordPiece, as bert-base-uncased */
    CG_TOK_HF = 3         /* a Hugging Face tokenizer.json pipeline */
} cg_tok_kind;

/* ---- building ---- */

/* Character tokenizer whose vocabulary is the distinct code points of text, ascending; NULL if the
 * text is empty or not UTF-8. Free with cg_tokenizer_free. */
cg_tokenizer *cg_tokenizer_char_new(const char *text, size_t len);
/* GPT-2 BPE from its encoder.json (token -> id) and vocab.bpe (merges, best first); NULL on an
 * unreadable or malformed file, with the file and line named. Free with cg_tokenizer_free. */
cg_tokenizer *cg_tokenizer_bpe_load(const char *encoder_json, const char *vocab_bpe);
/* As cg_tokenizer_bpe_load from the bytes of the two files (not kept, need no NUL); enc_name and
 * bpe_name name them in messages (NULL: "encoder.json", "vocab.bpe"). */
cg_tokenizer *cg_tokenizer_bpe_from_memory(const char *encoder_json, size_t enc_len, const char *vocab_bpe,
                                           size_t bpe_len, const char *enc_name, const char *bpe_name);
/* Byte-level BPE trained on text with GPT-2's pre-tokenizer: ids 0-255 are the bytes (in GPT-2's
 * order), then one token per merge, most frequent pair first (ties: lower ids first), then
 * "<|endoftext|>" as the last id; at most vocab_size (>= 257) tokens, fewer if the text runs out
 * of pairs. NULL if the text is not UTF-8. Free with cg_tokenizer_free. */
cg_tokenizer *cg_tokenizer_bpe_train(const char *text, size_t len, int32_t vocab_size);
/* WordPiece from a BERT vocab.txt (one token a line, id = line number, must hold [UNK]); text is
 * lower-cased and stripped of accents. NULL on an unreadable or malformed file. Free with
 * cg_tokenizer_free. */
cg_tokenizer *cg_tokenizer_wordpiece_load(const char *vocab_txt);
/* As cg_tokenizer_wordpiece_load from the len bytes of a vocab.txt (not kept, need no NUL); name
 * names it in messages (NULL: "vocab.txt"). */
cg_tokenizer *cg_tokenizer_wordpiece_from_memory(const char *vocab_txt, size_t len, const char *name);
/* A Hugging Face tokenizer.json (NULL on an unreadable file, malformed JSON, or a component type
 * cgrad does not implement, which the message names). Free with cg_tokenizer_free. */
cg_tokenizer *cg_tokenizer_hf_load(const char *tokenizer_json);
/* As cg_tokenizer_hf_load from len bytes of tokenizer.json text (not kept, need no NUL); name names
 * it in messages (NULL: "tokenizer.json"). */
cg_tokenizer *cg_tokenizer_hf_from_memory(const char *json, size_t len, const char *name);
/* Loads by path: a directory holding tokenizer.json, cg_tokenizer.json, encoder.json + vocab.bpe,
 * vocab.json + merges.txt (the Hugging Face hub's names), or vocab.txt (tried in that order), one
 * file of a BPE pair (its partner beside it), a *.txt vocab file, a tokenizer.json, or a *.json
 * file from cg_tokenizer_serialize. NULL on failure. Free with cg_tokenizer_free. */
cg_tokenizer *cg_tokenizer_load(const char *path);
/* Writes the tokenizer into directory dir (created if missing) in the form cg_tokenizer_load reads:
 * bpe -> encoder.json + vocab.bpe (GPT-2's exact format), wordpiece -> vocab.txt, char ->
 * cg_tokenizer.json, hf -> tokenizer.json (the file it was read from, unchanged). */
cg_status cg_tokenizer_save(const cg_tokenizer *tok, const char *dir);
/* As cg_tokenizer_save with the Hugging Face hub's file names: bpe -> vocab.json + merges.txt. */
cg_status cg_tokenizer_save_hf(const cg_tokenizer *tok, const char *dir);
/* The whole tokenizer as one JSON string for a checkpoint ({"kind": "char", "codepoints": [...]},
 * {"kind": "bpe", "vocab": [...], "merges": ["a b", ...]}, {"kind": "wordpiece", "vocab": [...]}
 * or {"kind": "hf", "tokenizer": {the tokenizer.json}}); *json is malloc'd, the caller frees it. */
cg_status cg_tokenizer_serialize(const cg_tokenizer *tok, char **json);
/* Tokenizer from a cg_tokenizer_serialize string; NULL if malformed. Free with cg_tokenizer_free. */
cg_tokenizer *cg_tokenizer_deserialize(const char *json);
/* Frees the tokenizer. NULL is a no-op. */
void cg_tokenizer_free(cg_tokenizer *tok);

/* ---- using ---- */

/* The tokenizer's kind (CG_TOK_CHAR for NULL). */
cg_tok_kind cg_tokenizer_kind(const cg_tokenizer *tok);
/* The kind's name: "char", "bpe", "wordpiece" or "hf" (static; "?" for a value out of range). */
const char *cg_tokenizer_kind_name(cg_tok_kind kind);
/* Number of token ids (ids run from 0 to this minus 1); 0 for NULL. */
int32_t cg_tokenizer_vocab_size(const cg_tokenizer *tok);
/* Token ids of len bytes of UTF-8 text into *ids (malloc'd, never NULL on success, the caller
 * frees it) and their count into *n. WordPiece adds no [CLS]/[SEP] and gives [UNK] for words it
 * cannot spell; char fails on a code point outside its vocabulary (naming the byte offset). */
cg_status cg_tokenizer_encode(const cg_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                              int64_t *n);
/* As cg_tokenizer_encode, then, for an hf tokenizer, the special tokens its post-processor puts
 * around a single sequence (LLaMA-2's \<s\>, BERT's [CLS] ... [SEP]), as the reference encode() does
 * by default; the same as cg_tokenizer_encode for the other kinds. */
cg_status cg_tokenizer_encode_special(const cg_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                                      int64_t *n);
/* Text of n ids into *text (malloc'd, NUL-terminated, the caller frees it), its length without
 * the NUL into *len (may be NULL); fails on an id outside the vocabulary. bpe gives back the exact
 * bytes (decode(encode(s)) == s; a cut multi-byte character stays cut), wordpiece joins tokens
 * with spaces and "##" pieces to the previous token, hf runs the file's decoders (the text is UTF-8,
 * an ill-formed byte sequence becoming U+FFFD). */
cg_status cg_tokenizer_decode(const cg_tokenizer *tok, const int32_t *ids, int64_t n, char **text,
                              size_t *len);
/* Id of a token given as spelled in the vocabulary ("[MASK]", "##ing", "Ġthe", "é"), or -1. */
int32_t cg_tokenizer_token_id(const cg_tokenizer *tok, const char *token);
/* Vocabulary spelling of token id (owned by tok), or NULL if out of range ("" for an id of a
 * tokenizer.json that no token has). */
const char *cg_tokenizer_token_str(const cg_tokenizer *tok, int32_t id);

CG_END_DECLS
#endif
