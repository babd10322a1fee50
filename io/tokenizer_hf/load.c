/* SPDX-License-Identifier: MIT */
/* Reads a Hugging Face tokenizer.json into a cg_tokenizer: the model's vocabulary (and merges or
 * scores), the added tokens, and every stage (normalizer, pre-tokenizer, post-processor, decoder)
 * with Sequences flattened. A component of a type cgrad does not implement is refused by name. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/tokenizer_hf/internal.h"

#define HF_MAX_IDS (1 << 26) /* the largest id a file may use: bounds what a file can make us allocate */
#define HF_MAX_DEPTH 16      /* nested Sequences */

static const cJSON *item(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static bool flag(const cJSON *o, const char *k, bool dflt) {
    const cJSON *v = item(o, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* A string field into a malloc'd copy (dflt when absent or null); false (message set) when it is
 * present but not a string. */
static bool str_field(const cJSON *o, const char *k, const char *dflt, char **out, size_t *len, const char *src,
                      const char *what) {
    const cJSON *v = item(o, k);
    const char *s = dflt;
    if (cJSON_IsString(v)) s = v->valuestring;
    else if (v && !cJSON_IsNull(v)) {
        cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: %s: \"%s\" is not a string", src, what, k);
        return false;
    }
    if (!s) s = "";
    *out = strdup(s);
    if (!*out) {
        cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
        return false;
    }
    if (len) *len = strlen(s);
    return true;
}

static const char *type_of(const cJSON *o) {
    const cJSON *t = item(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static void *grow(void *p, int n, size_t size) { return realloc(p, (size_t)(n + 1) * size); }

/* ---------------------------------------------------------------- normalizers */

static cg_status add_normalizer(cgi_hf *h, const cJSON *o, int depth) {
    const char *src = h->src, *type = type_of(o);
    if (!cJSON_IsObject(o) || !type) return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: a normalizer has no \"type\"", src);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = item(o, "normalizers");
        if (!cJSON_IsArray(list) || depth > HF_MAX_DEPTH)
            return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: normalizer Sequence: \"normalizers\" is not a list", src);
        for (const cJSON *c = list->child; c; c = c->next) {
            cg_status st = add_normalizer(h, c, depth + 1);
            if (st) return st;
        }
        return CG_OK;
    }
    cgi_hf_norm *a = grow(h->norm, h->n_norm, sizeof *a);
    if (!a) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
    h->norm = a;
    cgi_hf_norm *n = &a[h->n_norm];
    memset(n, 0, sizeof *n);
    static const struct { const char *name; cgi_hf_norm_type type; } simple[] = {
        {"NFC", HF_NFC}, {"NFD", HF_NFD}, {"NFKC", HF_NFKC}, {"NFKD", HF_NFKD}, {"Lowercase", HF_LOWERCASE},
        {"StripAccents", HF_STRIP_ACCENTS}};
    for (size_t k = 0; k < sizeof simple / sizeof *simple; k++)
        if (!strcmp(type, simple[k].name)) {
            n->type = simple[k].type;
            h->n_norm++;
            return CG_OK;
        }
    cg_status st = CG_OK;
    if (!strcmp(type, "Strip")) {
        n->type = HF_STRIP;
        n->left = flag(o, "strip_left", true);
        n->right = flag(o, "strip_right", true);
    } else if (!strcmp(type, "Replace")) {
        n->type = HF_REPLACE;
        if ((st = cgi_hf_pattern_parse(&n->pat, item(o, "pattern"), src, "normalizer Replace"))) return st;
        if (!str_field(o, "content", "", &n->str, &n->str_len, src, "normalizer Replace")) st = CG_ERR_FORMAT;
    } else if (!strcmp(type, "Prepend")) {
        n->type = HF_PREPEND;
        if (!str_field(o, "prepend", "", &n->str, &n->str_len, src, "normalizer Prepend")) st = CG_ERR_FORMAT;
    } else if (!strcmp(type, "BertNormalizer")) {
        n->type = HF_BERT_NORM;
        n->left = flag(o, "clean_text", true);
        n->right = flag(o, "handle_chinese_chars", true);
        n->lower = flag(o, "lowercase", true);
        const cJSON *sa = item(o, "strip_accents");
        n->strip_accents = cJSON_IsBool(sa) ? cJSON_IsTrue(sa) : n->lower;
    } else
        return cgi_fail(CG_ERR_FORMAT,
                        "[tokenizer] %s: normalizer type \"%s\" is not supported (NFC, NFD, NFKC, NFKD, Lowercase, "
                        "Strip, StripAccents, Replace, Prepend, BertNormalizer, Sequence)", src, type);
    h->n_norm++; /* counted even on failure, so that cgi_hf_free frees what it holds */
    return st;
}

/* ---------------------------------------------------------------- pre-tokenizers */

static const char GPT2_REGEX[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static bool parse_behavior(const cJSON *o, cgi_hf_behavior dflt, cgi_hf_behavior *out, const char *src, const char *what) {
    const cJSON *v = item(o, "behavior");
    *out = dflt;
    if (!v || cJSON_IsNull(v)) return true;
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int k = 0; cJSON_IsString(v) && k < 5; k++)
        if (!strcmp(v->valuestring, names[k])) {
            *out = (cgi_hf_behavior)k;
            return true;
        }
    cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: %s: behavior \"%s\" is not one of Removed, Isolated, MergedWithPrevious, "
             "MergedWithNext, Contiguous", src, what, cJSON_IsString(v) ? v->valuestring : "?");
    return false;
}

static cg_status add_pretokenizer(cgi_hf *h, const cJSON *o, int depth) {
    const char *src = h->src, *type = type_of(o);
    if (!cJSON_IsObject(o) || !type) return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: a pre-tokenizer has no \"type\"", src);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = item(o, "pretokenizers");
        if (!cJSON_IsArray(list) || depth > HF_MAX_DEPTH)
            return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: pre-tokenizer Sequence: \"pretokenizers\" is not a list", src);
        for (const cJSON *c = list->child; c; c = c->next) {
            cg_status st = add_pretokenizer(h, c, depth + 1);
            if (st) return st;
        }
        return CG_OK;
    }
    cgi_hf_pre *a = grow(h->pre, h->n_pre, sizeof *a);
    if (!a) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
    h->pre = a;
    cgi_hf_pre *p = &a[h->n_pre];
    memset(p, 0, sizeof *p);
    cg_status st = CG_OK;
    if (!strcmp(type, "ByteLevel")) {
        p->type = HF_BYTE_LEVEL;
        p->add_prefix_space = flag(o, "add_prefix_space", true);
        p->use_regex = flag(o, "use_regex", true);
        if (p->use_regex) st = cgi_hf_pattern_regex(&p->pat, GPT2_REGEX, src, "pre-tokenizer ByteLevel");
    } else if (!strcmp(type, "Split")) {
        p->type = HF_SPLIT;
        p->invert = flag(o, "invert", false);
        if (!parse_behavior(o, HF_ISOLATED, &p->behavior, src, "pre-tokenizer Split")) st = CG_ERR_FORMAT;
        else st = cgi_hf_pattern_parse(&p->pat, item(o, "pattern"), src, "pre-tokenizer Split");
    } else if (!strcmp(type, "Metaspace")) {
        p->type = HF_METASPACE;
        if (!str_field(o, "replacement", "\xE2\x96\x81", &p->repl, &p->repl_len, src, "pre-tokenizer Metaspace"))
            return h->n_pre++, CG_ERR_FORMAT;
        if (!p->repl_len) st = cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: pre-tokenizer Metaspace: empty replacement", src);
        const cJSON *ps = item(o, "prepend_scheme");
        p->prepend = flag(o, "add_prefix_space", true) ? HF_PREPEND_ALWAYS : HF_PREPEND_NEVER;
        if (cJSON_IsString(ps)) {
            if (!strcmp(ps->valuestring, "always")) p->prepend = HF_PREPEND_ALWAYS;
            else if (!strcmp(ps->valuestring, "first")) p->prepend = HF_PREPEND_FIRST;
            else if (!strcmp(ps->valuestring, "never")) p->prepend = HF_PREPEND_NEVER;
            else st = cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: pre-tokenizer Metaspace: prepend_scheme \"%s\" is not "
                               "always, first or never", src, ps->valuestring);
        }
        p->split = flag(o, "split", true);
    } else if (!strcmp(type, "Whitespace")) {
        p->type = HF_WHITESPACE;
        st = cgi_hf_pattern_regex(&p->pat, "(*UCP)\\w+|[^\\w\\s]+", src, "pre-tokenizer Whitespace");
    } else if (!strcmp(type, "WhitespaceSplit")) p->type = HF_WHITESPACE_SPLIT;
    else if (!strcmp(type, "Digits")) {
        p->type = HF_DIGITS;
        p->individual_digits = flag(o, "individual_digits", false);
    } else if (!strcmp(type, "Punctuation")) {
        p->type = HF_PUNCTUATION;
        if (!parse_behavior(o, HF_ISOLATED, &p->behavior, src, "pre-tokenizer Punctuation")) st = CG_ERR_FORMAT;
    } else if (!strcmp(type, "BertPreTokenizer")) p->type = HF_BERT_PRE;
    else
        return cgi_fail(CG_ERR_FORMAT,
                        "[tokenizer] %s: pre-tokenizer type \"%s\" is not supported (ByteLevel, Split, Metaspace, "
                        "Whitespace, WhitespaceSplit, Digits, Punctuation, BertPreTokenizer, Sequence)", src, type);
    h->n_pre++;
    return st;
}

/* ---------------------------------------------------------------- decoders */

static cg_status add_decoder(cgi_hf *h, const cJSON *o, int depth) {
    const char *src = h->src, *type = type_of(o);
    if (!cJSON_IsObject(o) || !type) return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: a decoder has no \"type\"", src);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = item(o, "decoders");
        if (!cJSON_IsArray(list) || depth > HF_MAX_DEPTH)
            return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: decoder Sequence: \"decoders\" is not a list", src);
        for (const cJSON *c = list->child; c; c = c->next) {
            cg_status st = add_decoder(h, c, depth + 1);
            if (st) return st;
        }
        return CG_OK;
    }
    cgi_hf_dec *a = grow(h->dec, h->n_dec, sizeof *a);
    if (!a) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
    h->dec = a;
    cgi_hf_dec *d = &a[h->n_dec];
    memset(d, 0, sizeof *d);
    cg_status st = CG_OK;
    bool ok = true;
    if (!strcmp(type, "ByteLevel")) d->type = HF_DEC_BYTE_LEVEL;
    else if (!strcmp(type, "ByteFallback")) d->type = HF_DEC_BYTE_FALLBACK;
    else if (!strcmp(type, "Fuse")) d->type = HF_DEC_FUSE;
    else if (!strcmp(type, "Metaspace")) {
        d->type = HF_DEC_METASPACE;
        ok = str_field(o, "replacement", "\xE2\x96\x81", &d->a, &d->a_len, src, "decoder Metaspace");
        const cJSON *ps = item(o, "prepend_scheme");
        d->flag = flag(o, "add_prefix_space", true) && !(cJSON_IsString(ps) && !strcmp(ps->valuestring, "never"));
        if (ok && !d->a_len) st = cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: decoder Metaspace: empty replacement", src);
    } else if (!strcmp(type, "Strip")) {
        d->type = HF_DEC_STRIP;
        ok = str_field(o, "content", " ", &d->a, &d->a_len, src, "decoder Strip");
        const cJSON *s = item(o, "start"), *e = item(o, "stop");
        d->start = cJSON_IsNumber(s) && s->valuedouble > 0 ? (s->valuedouble > 1e6 ? 1000000 : (int)s->valuedouble) : 0;
        d->stop = cJSON_IsNumber(e) && e->valuedouble > 0 ? (e->valuedouble > 1e6 ? 1000000 : (int)e->valuedouble) : 0;
        if (ok && !d->a_len) st = cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: decoder Strip: empty content", src);
    } else if (!strcmp(type, "Replace")) {
        d->type = HF_DEC_REPLACE;
        st = cgi_hf_pattern_parse(&d->pat, item(o, "pattern"), src, "decoder Replace");
        ok = !st && str_field(o, "content", "", &d->a, &d->a_len, src, "decoder Replace");
    } else if (!strcmp(type, "WordPiece")) {
        d->type = HF_DEC_WORDPIECE;
        ok = str_field(o, "prefix", "##", &d->a, &d->a_len, src, "decoder WordPiece");
        d->flag = flag(o, "cleanup", true);
    } else if (!strcmp(type, "BPEDecoder")) {
        d->type = HF_DEC_BPE;
        ok = str_field(o, "suffix", "</w>", &d->a, &d->a_len, src, "decoder BPEDecoder");
        if (ok && !d->a_len) st = cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: decoder BPEDecoder: empty suffix", src);
    } else
        return cgi_fail(CG_ERR_FORMAT,
                        "[tokenizer] %s: decoder type \"%s\" is not supported (ByteLevel, Metaspace, ByteFallback, "
                        "Fuse, Strip, Replace, WordPiece, BPEDecoder, Sequence)", src, type);
    h->n_dec++;
    return ok ? st : CG_ERR_FORMAT;
}

/* ---------------------------------------------------------------- post-processor */

static bool push_list(int32_t **v, int *n, int32_t id) {
    int32_t *a = realloc(*v, (size_t)(*n + 1) * sizeof *a);
    if (!a) return false;
    a[(*n)++] = id;
    *v = a;
    return true;
}

/* The id a special token of the post-processor stands for: from "special_tokens" (TemplateProcessing)
 * or the vocabulary. */
static cg_status special_id(const cg_tokenizer *t, const cJSON *specials, const char *name, int32_t *out, int *count,
                            int32_t ids[8]) {
    const cgi_hf *h = t->hf;
    const cJSON *s = item(specials, name), *list = item(s, "ids");
    *count = 0;
    if (cJSON_IsArray(list)) {
        for (const cJSON *v = list->child; v; v = v->next) {
            if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= t->n || *count == 8 ||
                h->is_hole[(int32_t)v->valuedouble])
                return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: post_processor: special token \"%s\" has an id outside "
                                "the vocabulary", h->src, name);
            ids[(*count)++] = (int32_t)v->valuedouble;
        }
        return CG_OK;
    }
    int32_t id = cgi_tokmap_get(t, name, strlen(name));
    if (id < 0)
        return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: post_processor: special token \"%s\" is not in the vocabulary",
                        h->src, name);
    ids[0] = id;
    *count = 1;
    (void)out;
    return CG_OK;
}

static cg_status add_post(cg_tokenizer *t, const cJSON *o, int depth) {
    cgi_hf *h = t->hf;
    const char *src = h->src, *type = type_of(o);
    if (!cJSON_IsObject(o) || !type) return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: the post_processor has no \"type\"", src);
    if (!strcmp(type, "ByteLevel")) return CG_OK; /* only trims offsets, which cgrad does not return */
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = item(o, "processors");
        if (!cJSON_IsArray(list) || depth > HF_MAX_DEPTH)
            return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: post_processor Sequence: \"processors\" is not a list", src);
        for (const cJSON *c = list->child; c; c = c->next) {
            cg_status st = add_post(t, c, depth + 1);
            if (st) return st;
        }
        return CG_OK;
    }
    if (h->n_pre_ids || h->n_post_ids)
        return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: post_processor: two processors add special tokens", src);
    if (!strcmp(type, "TemplateProcessing")) {
        const cJSON *single = item(o, "single"), *specials = item(o, "special_tokens");
        if (!cJSON_IsArray(single))
            return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: post_processor TemplateProcessing: \"single\" is not a list", src);
        bool seen_a = false;
        for (const cJSON *it = single->child; it; it = it->next) {
            const cJSON *sp = item(it, "SpecialToken"), *seq = item(it, "Sequence");
            if (seq) {
                const cJSON *id = item(seq, "id");
                if (!cJSON_IsString(id) || strcmp(id->valuestring, "A") || seen_a)
                    return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: post_processor TemplateProcessing: \"single\" must "
                                    "hold sequence A once", src);
                seen_a = true;
                continue;
            }
            const cJSON *name = item(sp, "id");
            if (!cJSON_IsString(name))
                return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: post_processor TemplateProcessing: an item of \"single\" "
                                "is neither a SpecialToken nor a Sequence", src);
            int32_t ids[8];
            int count;
            cg_status st = special_id(t, specials, name->valuestring, NULL, &count, ids);
            if (st) return st;
            for (int k = 0; k < count; k++)
                if (!(seen_a ? push_list(&h->post_ids, &h->n_post_ids, ids[k]) : push_list(&h->pre_ids, &h->n_pre_ids, ids[k])))
                    return cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
        }
        if (!seen_a)
            return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: post_processor TemplateProcessing: \"single\" has no "
                            "sequence A", src);
        return CG_OK;
    }
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        const cJSON *cls = item(o, "cls"), *sep = item(o, "sep");
        const cJSON *ci = cJSON_GetArrayItem(cls, 1), *si = cJSON_GetArrayItem(sep, 1);
        if (!cJSON_IsNumber(ci) || !cJSON_IsNumber(si) || ci->valuedouble < 0 || ci->valuedouble >= t->n ||
            si->valuedouble < 0 || si->valuedouble >= t->n || h->is_hole[(int32_t)ci->valuedouble] ||
            h->is_hole[(int32_t)si->valuedouble])
            return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: post_processor %s: \"cls\" and \"sep\" must be [token, id] "
                            "with an id in the vocabulary", src, type);
        if (!push_list(&h->pre_ids, &h->n_pre_ids, (int32_t)ci->valuedouble) ||
            !push_list(&h->post_ids, &h->n_post_ids, (int32_t)si->valuedouble))
            return cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
        return CG_OK;
    }
    return cgi_fail(CG_ERR_FORMAT,
                    "[tokenizer] %s: post_processor type \"%s\" is not supported (TemplateProcessing, ByteLevel, "
                    "BertProcessing, RobertaProcessing, Sequence)", src, type);
}

/* ---------------------------------------------------------------- vocabulary */

/* The id of every token string (model vocabulary, then added tokens over it), in id order. */
typedef struct {
    const char **str;
    double *score;
    int32_t n;     /* ids 0 .. n-1 */
    int32_t model; /* ids the model's vocabulary holds */
} vocab_table;

static bool number_id(const cJSON *v, double *d) {
    if (!cJSON_IsNumber(v)) return false;
    *d = v->valuedouble;
    return *d >= 0 && *d < HF_MAX_IDS && *d == floor(*d);
}

static cg_status read_vocab(cgi_hf *h, const cJSON *model, const cJSON *added, vocab_table *vt) {
    const char *src = h->src;
    const cJSON *vocab = item(model, "vocab");
    int32_t count = 0, max_id = -1;
    if (h->model == HF_MODEL_UNIGRAM) {
        if (!cJSON_IsArray(vocab)) return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: model Unigram: \"vocab\" is not a list", src);
        count = cJSON_GetArraySize(vocab);
        max_id = count - 1;
    } else {
        if (!cJSON_IsObject(vocab)) return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: model: \"vocab\" is not an object", src);
        for (const cJSON *v = vocab->child; v; v = v->next) {
            double d;
            if (!number_id(v, &d))
                return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: model vocab: \"%.60s\" has no id in [0, %d)", src,
                                v->string ? v->string : "", HF_MAX_IDS);
            if ((int32_t)d > max_id) max_id = (int32_t)d;
            count++;
        }
    }
    vt->model = max_id + 1;
    int n_added = cJSON_GetArraySize(added);
    for (const cJSON *a = cJSON_IsArray(added) ? added->child : NULL; a; a = a->next) {
        double d;
        if (!number_id(item(a, "id"), &d) || !cJSON_IsString(item(a, "content")))
            return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: added_tokens: an entry has no \"content\" string or no id in "
                            "[0, %d)", src, HF_MAX_IDS);
        if ((int32_t)d > max_id) max_id = (int32_t)d;
    }
    if (max_id < 0) return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: the vocabulary is empty", src);
    if ((int64_t)max_id >= (int64_t)count + n_added + (1 << 20))
        return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: id %d leaves over a million ids without a token (%d tokens)", src,
                        (int)max_id, (int)(count + n_added));
    vt->n = max_id + 1;
    vt->str = calloc((size_t)vt->n, sizeof *vt->str);
    vt->score = calloc((size_t)vt->n, sizeof *vt->score);
    if (!vt->str || !vt->score) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory for %d tokens", (int)vt->n);
    if (h->model == HF_MODEL_UNIGRAM) {
        int32_t i = 0;
        for (const cJSON *v = vocab->child; v; v = v->next, i++) {
            const cJSON *p = cJSON_GetArrayItem(v, 0), *s = cJSON_GetArrayItem(v, 1);
            if (!cJSON_IsString(p) || !cJSON_IsNumber(s) || !isfinite(s->valuedouble))
                return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: model Unigram: vocab[%d] is not [piece, score]", src, (int)i);
            vt->str[i] = p->valuestring;
            vt->score[i] = s->valuedouble;
        }
    } else
        for (const cJSON *v = vocab->child; v; v = v->next) {
            int32_t id = (int32_t)v->valuedouble;
            if (vt->str[id])
                return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: model vocab: \"%.60s\" and \"%.60s\" share id %d", src,
                                vt->str[id], v->string, (int)id);
            vt->str[id] = v->string ? v->string : "";
        }
    return CG_OK;
}

static cg_status read_added(cgi_hf *h, const cJSON *added, vocab_table *vt) {
    int n = cJSON_GetArraySize(added);
    if (!n) return CG_OK;
    h->added = calloc((size_t)n, sizeof *h->added);
    h->first_idx = malloc((size_t)n * sizeof *h->first_idx);
    if (!h->added || !h->first_idx) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
    for (const cJSON *a = added->child; a; a = a->next) {
        cgi_hf_added *x = &h->added[h->n_added];
        x->id = (int32_t)item(a, "id")->valuedouble;
        x->content = strdup(item(a, "content")->valuestring);
        if (!x->content) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
        h->n_added++;
        x->len = strlen(x->content);
        if (!x->len) return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: added_tokens: token %d is empty", h->src, (int)x->id);
        x->special = flag(a, "special", false);
        x->single_word = flag(a, "single_word", false);
        x->lstrip = flag(a, "lstrip", false);
        x->rstrip = flag(a, "rstrip", false);
        x->normalized = flag(a, "normalized", !x->special);
        vt->str[x->id] = x->content;
    }
    /* per first byte, longest first (ties: file order) */
    int k = 0;
    for (int c = 0; c < 256; c++) {
        h->first_start[c] = k;
        int from = k;
        for (int i = 0; i < h->n_added; i++)
            if ((unsigned char)h->added[i].content[0] == c) {
                int j = k++;
                while (j > from && h->added[h->first_idx[j - 1]].len < h->added[i].len) {
                    h->first_idx[j] = h->first_idx[j - 1];
                    j--;
                }
                h->first_idx[j] = i;
            }
    }
    h->first_start[256] = k;
    return CG_OK;
}

static bool add_merge(cg_tokenizer *t, int32_t a, int32_t b) {
    if (t->nmerges == t->merge_cap) {
        int32_t cap = t->merge_cap ? 2 * t->merge_cap : 1024;
        int32_t *m = realloc(t->merge, 2 * (size_t)cap * sizeof *m);
        if (!m) return false;
        t->merge = m;
        t->merge_cap = cap;
    }
    t->merge[2 * t->nmerges] = a;
    t->merge[2 * t->nmerges + 1] = b;
    t->nmerges++;
    return true;
}

static cg_status read_merges(cg_tokenizer *t, const cJSON *merges) {
    const char *src = t->hf->src;
    if (!cJSON_IsArray(merges)) return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: model BPE: \"merges\" is not a list", src);
    int i = 0;
    for (const cJSON *m = merges->child; m; m = m->next, i++) {
        int32_t a, b;
        if (cJSON_IsString(m)) {
            const char *s = m->valuestring, *sp = strchr(s, ' ');
            if (!sp) return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: merges[%d] \"%.60s\" is not two tokens", src, i, s);
            /* as the reference: the first two space-separated parts */
            const char *e = strchr(sp + 1, ' ');
            size_t lb = e ? (size_t)(e - sp - 1) : strlen(sp + 1);
            a = cgi_tokmap_get(t, s, (size_t)(sp - s));
            b = cgi_tokmap_get(t, sp + 1, lb);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) {
            a = cgi_tokmap_get(t, m->child->valuestring, strlen(m->child->valuestring));
            b = cgi_tokmap_get(t, m->child->next->valuestring, strlen(m->child->next->valuestring));
        } else
            return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: merges[%d] is neither \"a b\" nor [a, b]", src, i);
        if (a < 0 || b < 0)
            return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: merges[%d] uses a token not in the vocabulary", src, i);
        if (!add_merge(t, a, b)) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory for %d merges", i);
    }
    return CG_OK;
}

/* ---------------------------------------------------------------- the whole file */

static cg_status read_model(cgi_hf *h, const cJSON *model) {
    const char *src = h->src, *type = type_of(model);
    if (!cJSON_IsObject(model)) return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: no \"model\" object", src);
    if (!type) { /* older files: the type follows from the fields, as the reference infers it */
        if (cJSON_IsArray(item(model, "vocab"))) type = "Unigram";
        else if (item(model, "merges")) type = "BPE";
        else if (item(model, "continuing_subword_prefix")) type = "WordPiece";
        else return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: the model has no \"type\"", src);
    }
    if (!strcmp(type, "BPE")) h->model = HF_MODEL_BPE;
    else if (!strcmp(type, "WordPiece")) h->model = HF_MODEL_WORDPIECE;
    else if (!strcmp(type, "Unigram")) h->model = HF_MODEL_UNIGRAM;
    else return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: model type \"%s\" is not supported (BPE, WordPiece, Unigram)", src, type);
    const cJSON *dropout = item(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble != 0)
        return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: model BPE: dropout %g is not supported (encoding would be "
                        "random)", src, dropout->valuedouble);
    h->byte_fallback = flag(model, "byte_fallback", false);
    h->fuse_unk = h->model == HF_MODEL_UNIGRAM || flag(model, "fuse_unk", false);
    h->ignore_merges = flag(model, "ignore_merges", false);
    const char *dp = h->model == HF_MODEL_WORDPIECE ? "##" : "";
    if (!str_field(model, "continuing_subword_prefix", dp, &h->prefix, &h->prefix_len, src, "model") ||
        !str_field(model, "end_of_word_suffix", "", &h->suffix, &h->suffix_len, src, "model"))
        return CG_ERR_FORMAT;
    const cJSON *mc = item(model, "max_input_chars_per_word");
    h->max_chars = cJSON_IsNumber(mc) && mc->valuedouble >= 0 && mc->valuedouble < 1e9 ? (int32_t)mc->valuedouble : 100;
    return CG_OK;
}

static cg_status read_unk(cg_tokenizer *t, const cJSON *model, const vocab_table *vt) {
    cgi_hf *h = t->hf;
    h->unk = -1;
    if (h->model == HF_MODEL_UNIGRAM) {
        const cJSON *u = item(model, "unk_id");
        if (cJSON_IsNumber(u)) {
            if (u->valuedouble < 0 || u->valuedouble >= vt->model)
                return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: model Unigram: unk_id %g is outside the vocabulary", h->src,
                                u->valuedouble);
            h->unk = (int32_t)u->valuedouble;
        }
        double lo = INFINITY;
        h->score = calloc((size_t)t->n, sizeof *h->score);
        h->is_piece = calloc((size_t)t->n, sizeof *h->is_piece);
        if (!h->score || !h->is_piece) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
        for (int32_t i = 0; i < vt->model; i++) {
            h->score[i] = vt->score[i];
            h->is_piece[i] = true;
            if (vt->score[i] < lo) lo = vt->score[i];
            if (t->len[i] > h->max_piece_bytes) h->max_piece_bytes = t->len[i];
        }
        h->unk_score = lo - 10.0;
        return CG_OK;
    }
    const cJSON *u = item(model, "unk_token");
    if (cJSON_IsString(u)) {
        h->unk = cgi_tokmap_get(t, u->valuestring, strlen(u->valuestring));
        if (h->unk < 0 && h->model == HF_MODEL_WORDPIECE)
            return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: model: unk_token \"%.60s\" is not in the vocabulary", h->src,
                            u->valuestring);
    } else if (h->model == HF_MODEL_WORDPIECE)
        return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: model WordPiece: no \"unk_token\"", h->src);
    return CG_OK;
}

cg_tokenizer *cgi_hf_load(const char *json, size_t json_len, const char *src) {
    const char *nul = memchr(json, 0, json_len);
    if (nul) { /* JSON has no raw NUL; cJSON would keep one inside a string, which C strings then cut */
        cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: a NUL byte at byte %zu", src, (size_t)(nul - json));
        return NULL;
    }
    size_t bad = cgi_utf8_check(json, json_len); /* every string the stages use is then UTF-8 too */
    if (bad < json_len) {
        cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: not UTF-8 at byte %zu", src, bad);
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, json_len, &end, false);
    size_t stop = end ? (size_t)(end - json) : 0;
    while (root && stop < json_len && (json[stop] == ' ' || json[stop] == '\n' || json[stop] == '\r' || json[stop] == '\t'))
        stop++;
    if (!root || stop < json_len) {
        cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: malformed JSON near byte %zu%s", src, stop,
                 root ? " (bytes after the object)" : "");
        cJSON_Delete(root);
        return NULL;
    }
    cg_tokenizer *t = cgi_tok_new(CG_TOK_HF);
    cgi_hf *h = t ? calloc(1, sizeof *h) : NULL;
    vocab_table vt = {0};
    cg_status st = CG_OK;
    if (!h) {
        st = cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
        goto done;
    }
    t->hf = h;
    h->src = strdup(src);
    h->json = malloc(json_len + 1);
    if (!h->src || !h->json) {
        st = cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
        goto done;
    }
    memcpy(h->json, json, json_len);
    h->json[json_len] = 0;
    h->json_len = json_len;
    if (!cJSON_IsObject(root)) {
        st = cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: not a JSON object", src);
        goto done;
    }
    const cJSON *model = item(root, "model"), *added = item(root, "added_tokens");
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added)) {
        st = cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: \"added_tokens\" is not a list", src);
        goto done;
    }
    if ((st = read_model(h, model)) || (st = read_vocab(h, model, added, &vt)) || (st = read_added(h, added, &vt)))
        goto done;
    /* the token table: every id, holes as empty strings left out of the index */
    h->is_hole = calloc((size_t)vt.n, sizeof *h->is_hole);
    h->is_special = calloc((size_t)vt.n, sizeof *h->is_special);
    if (!h->is_hole || !h->is_special) {
        st = cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
        goto done;
    }
    for (int32_t i = 0; i < vt.n; i++) {
        h->is_hole[i] = !vt.str[i];
        if (!cgi_tok_push(t, vt.str[i] ? vt.str[i] : "", vt.str[i] ? strlen(vt.str[i]) : 0)) {
            st = CG_ERR_NOMEM;
            goto done;
        }
    }
    if (!cgi_tok_reserve(t, (size_t)t->n)) {
        st = CG_ERR_NOMEM;
        goto done;
    }
    for (int32_t i = 0; i < t->n; i++)
        if (!h->is_hole[i]) cgi_tokmap_put(t, i);
    for (int i = 0; i < h->n_added; i++) { /* added tokens win over an equal string of the model's */
        cgi_tokmap_put(t, h->added[i].id);
        if (h->added[i].special) h->is_special[h->added[i].id] = true;
    }
    if ((st = read_unk(t, model, &vt))) goto done;
    if (h->model == HF_MODEL_BPE && (st = read_merges(t, item(model, "merges")))) goto done;
    if ((st = cgi_hf_model_finish(t))) goto done;
    const cJSON *norm = item(root, "normalizer"), *pre = item(root, "pre_tokenizer"), *post = item(root, "post_processor"),
                *dec = item(root, "decoder");
    if (norm && !cJSON_IsNull(norm) && (st = add_normalizer(h, norm, 0))) goto done;
    if (pre && !cJSON_IsNull(pre) && (st = add_pretokenizer(h, pre, 0))) goto done;
    if (post && !cJSON_IsNull(post) && (st = add_post(t, post, 0))) goto done;
    if (dec && !cJSON_IsNull(dec) && (st = add_decoder(h, dec, 0))) goto done;
done:
    free(vt.str);
    free(vt.score);
    cJSON_Delete(root);
    if (st) {
        cg_tokenizer_free(t);
        return NULL;
    }
    return t;
}

void cgi_hf_free(cgi_hf *h) {
    if (!h) return;
    for (int i = 0; i < h->n_norm; i++) cgi_hf_pattern_free(&h->norm[i].pat), free(h->norm[i].str);
    for (int i = 0; i < h->n_pre; i++) cgi_hf_pattern_free(&h->pre[i].pat), free(h->pre[i].repl);
    for (int i = 0; i < h->n_dec; i++) cgi_hf_pattern_free(&h->dec[i].pat), free(h->dec[i].a), free(h->dec[i].b);
    for (int i = 0; i < h->n_added; i++) free(h->added[i].content);
    free(h->norm), free(h->pre), free(h->dec), free(h->added), free(h->first_idx), free(h->is_special);
    free(h->pre_ids), free(h->post_ids), free(h->is_hole), free(h->json), free(h->src);
    free(h->prefix), free(h->suffix), free(h->score), free(h->is_piece);
    free(h);
}
