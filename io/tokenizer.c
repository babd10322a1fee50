/* SPDX-License-Identifier: MIT */
/* Tokenizers: the character tokenizer and the kind-independent API (encode/decode dispatch,
 * lookups, load/save, JSON serialisation). The byte-level BPE lives in io/tokenizer_bpe.c,
 * WordPiece in io/tokenizer_wordpiece.c, the token table, UTF-8 and the other internals they share
 * in io/tokenizer_shared.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "io/file_internal.h"
#include "io/tokenizer_internal.h"
#include "io/tokenizer_hf/internal.h"

/* ---------------------------------------------------------------- character tokenizer */

static cg_tokenizer *char_from_codepoints(const uint32_t *cps, int32_t n) {
    cg_tokenizer *t = cgi_tok_new(CG_TOK_CHAR);
    if (!t) return NULL;
    t->cps = malloc((size_t)n * sizeof *t->cps);
    if (!t->cps) {
        cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
        cg_tokenizer_free(t);
        return NULL;
    }
    for (int32_t i = 0; i < n; i++) {
        char u[4];
        t->cps[i] = cps[i];
        if (!cgi_tok_push(t, u, (size_t)cgi_utf8_put(cps[i], u))) {
            cg_tokenizer_free(t);
            return NULL;
        }
    }
    if (!cgi_tok_index(t)) {
        cg_tokenizer_free(t);
        return NULL;
    }
    return t;
}

cg_tokenizer *cg_tokenizer_char_new(const char *text, size_t len) {
    if (!text || len == 0) {
        cgi_fail(CG_ERR_ARG, "[tokenizer] char_new: empty text");
        return NULL;
    }
    size_t bad = cgi_utf8_check(text, len);
    if (bad < len) {
        cgi_utf8_fail("char_new", text, len, bad);
        return NULL;
    }
    uint8_t *seen = calloc(0x110000 / 8, 1); /* one bit per code point */
    if (!seen) {
        cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
        return NULL;
    }
    int32_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += (size_t)cgi_utf8_next((const unsigned char *)text + i, &cp);
        n += !(seen[cp >> 3] >> (cp & 7) & 1);
        seen[cp >> 3] |= (uint8_t)(1u << (cp & 7));
    }
    uint32_t *cps = malloc((size_t)n * sizeof *cps);
    if (!cps) {
        free(seen);
        cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
        return NULL;
    }
    n = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++)
        if (seen[cp >> 3] >> (cp & 7) & 1) cps[n++] = cp;
    cg_tokenizer *t = char_from_codepoints(cps, n);
    free(seen);
    free(cps);
    return t;
}

static int32_t char_id(const cg_tokenizer *t, uint32_t cp) {
    int32_t lo = 0, hi = t->n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (t->cps[mid] == cp) return mid;
        if (t->cps[mid] < cp) lo = mid + 1; else hi = mid;
    }
    return -1;
}

static cg_status char_encode(const cg_tokenizer *t, const char *text, size_t len, cgi_ids *out) {
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = cgi_utf8_next((const unsigned char *)text + i, &cp);
        int32_t id = char_id(t, cp);
        if (id < 0)
            return cgi_fail(CG_ERR_RANGE,
                            "[tokenizer] encode: character U+%04X at byte %zu is not in the %d-character "
                            "vocabulary", (unsigned)cp, i, (int)t->n);
        if (!cgi_ids_push(out, id)) return CG_ERR_NOMEM;
        i += (size_t)k;
    }
    return CG_OK;
}

/* Concatenates token strings: the char tokenizer's decode. */
static cg_status concat_decode(const cg_tokenizer *t, const int32_t *ids, int64_t n, char **text,
                               size_t *len) {
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) total += (size_t)t->len[ids[i]];
    char *s = malloc(total + 1);
    if (!s) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] decode: out of memory for %zu bytes", total);
    size_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        memcpy(s + k, cgi_tok_str(t, ids[i]), (size_t)t->len[ids[i]]);
        k += (size_t)t->len[ids[i]];
    }
    s[k] = 0;
    *text = s;
    if (len) *len = k;
    return CG_OK;
}

/* ---------------------------------------------------------------- common API */

void cg_tokenizer_free(cg_tokenizer *t) {
    if (!t) return;
    free(t->pool);
    free(t->off);
    free(t->len);
    free(t->index.slot);
    free(t->cps);
    free(t->raw);
    free(t->raw_off);
    free(t->merge);
    cgi_pairmap_free(&t->ranks);
    cgi_hf_free(t->hf);
    free(t);
}

cg_tok_kind cg_tokenizer_kind(const cg_tokenizer *t) { return t ? t->kind : CG_TOK_CHAR; }

int32_t cg_tokenizer_vocab_size(const cg_tokenizer *t) { return t ? t->n : 0; }

int32_t cg_tokenizer_token_id(const cg_tokenizer *t, const char *token) {
    return t && token ? cgi_tokmap_get(t, token, strlen(token)) : -1;
}

const char *cg_tokenizer_token_str(const cg_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n ? cgi_tok_str(t, id) : NULL;
}

static cg_status encode(const cg_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids,
                        int64_t *n) {
    if (!t || !ids || !n || (!text && len))
        return cgi_fail(CG_ERR_ARG, "[tokenizer] encode: NULL argument");
    *ids = NULL;
    *n = 0;
    size_t bad = cgi_utf8_check(text, len);
    if (bad < len) return cgi_utf8_fail("encode", text, len, bad);
    cgi_ids out = {0};
    cg_status st = CG_OK;
    if (t->kind == CG_TOK_HF) st = cgi_hf_encode(t, text, len, add_special, &out);
    else if (len) {
        switch (t->kind) {
        case CG_TOK_CHAR: st = char_encode(t, text, len, &out); break;
        case CG_TOK_BPE: st = cgi_bpe_encode(t, text, len, &out.v, &out.n); break;
        case CG_TOK_WORDPIECE: st = cgi_wordpiece_encode(t, text, len, &out.v, &out.n); break;
        case CG_TOK_HF: break;
        }
    }
    if (st == CG_OK && !out.v) { /* never hand back NULL on success */
        out.v = malloc(sizeof *out.v);
        if (!out.v) st = cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
    }
    if (st != CG_OK) {
        free(out.v);
        return st;
    }
    *ids = out.v;
    *n = out.n;
    return CG_OK;
}

cg_status cg_tokenizer_encode(const cg_tokenizer *t, const char *text, size_t len, int32_t **ids, int64_t *n) {
    return encode(t, text, len, false, ids, n);
}

cg_status cg_tokenizer_encode_special(const cg_tokenizer *t, const char *text, size_t len, int32_t **ids,
                                      int64_t *n) {
    return encode(t, text, len, true, ids, n);
}

cg_status cg_tokenizer_decode(const cg_tokenizer *t, const int32_t *ids, int64_t n, char **text,
                              size_t *len) {
    if (!t || !text || n < 0 || (!ids && n))
        return cgi_fail(CG_ERR_ARG, "[tokenizer] decode: NULL argument or negative count");
    *text = NULL;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n)
            return cgi_fail(CG_ERR_RANGE,
                            "[tokenizer] decode: id %d at position %lld is outside the vocabulary [0, %d)",
                            (int)ids[i], (long long)i, (int)t->n);
    switch (t->kind) {
    case CG_TOK_BPE: return cgi_bpe_decode(t, ids, n, text, len);
    case CG_TOK_WORDPIECE: return cgi_wordpiece_decode(t, ids, n, text, len);
    case CG_TOK_HF: return cgi_hf_decode(t, ids, n, text, len);
    default: return concat_decode(t, ids, n, text, len);
    }
}

/* ---------------------------------------------------------------- serialisation */

const char *cg_tokenizer_kind_name(cg_tok_kind k) {
    static const char *const names[] = {"char", "bpe", "wordpiece", "hf"};
    return (unsigned)k < sizeof names / sizeof *names ? names[k] : "?";
}

static const char *kind_name(cg_tok_kind k) { return cg_tokenizer_kind_name(k); }

/* An hf tokenizer is its file: {"kind": "hf", "tokenizer": <the tokenizer.json as it was read>}. */
static cg_status serialize_hf(const cg_tokenizer *t, char **json) {
    static const char head[] = "{\"kind\":\"hf\",\"tokenizer\":";
    size_t n = sizeof head - 1 + t->hf->json_len + 2;
    char *s = malloc(n);
    if (!s) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] serialize: out of memory");
    memcpy(s, head, sizeof head - 1);
    memcpy(s + sizeof head - 1, t->hf->json, t->hf->json_len);
    memcpy(s + n - 2, "}", 2);
    *json = s;
    return CG_OK;
}

cg_status cg_tokenizer_serialize(const cg_tokenizer *t, char **json) {
    if (!t || !json) return cgi_fail(CG_ERR_ARG, "[tokenizer] serialize: NULL argument");
    *json = NULL;
    if (t->kind == CG_TOK_HF) return serialize_hf(t, json);
    cJSON *root = cJSON_CreateObject();
    bool ok = root && cJSON_AddStringToObject(root, "kind", kind_name(t->kind));
    if (ok && t->kind == CG_TOK_CHAR) {
        cJSON *a = cJSON_AddArrayToObject(root, "codepoints");
        ok = a != NULL;
        for (int32_t i = 0; ok && i < t->n; i++) {
            cJSON *v = cJSON_CreateNumber(t->cps[i]);
            ok = v && cJSON_AddItemToArray(a, v);
        }
    } else if (ok) {
        cJSON *a = cJSON_AddArrayToObject(root, "vocab");
        ok = a != NULL;
        for (int32_t i = 0; ok && i < t->n; i++) {
            cJSON *v = cJSON_CreateString(cgi_tok_str(t, i));
            ok = v && cJSON_AddItemToArray(a, v);
        }
        if (ok && t->kind == CG_TOK_BPE) {
            cJSON *m = cJSON_AddArrayToObject(root, "merges");
            ok = m != NULL;
            for (int32_t r = 0; ok && r < t->nmerges; r++) {
                const char *x = cgi_tok_str(t, t->merge[2 * r]), *y = cgi_tok_str(t, t->merge[2 * r + 1]);
                size_t lx = strlen(x), ly = strlen(y);
                char *s = malloc(lx + ly + 2);
                ok = s != NULL;
                if (!ok) break;
                memcpy(s, x, lx);
                s[lx] = ' ';
                memcpy(s + lx + 1, y, ly + 1);
                cJSON *v = cJSON_CreateString(s);
                free(s);
                ok = v && cJSON_AddItemToArray(m, v);
            }
        }
    }
    char *s = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!s) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] serialize: out of memory");
    *json = s;
    return CG_OK;
}

/* Tokenizer from a parsed cg_tokenizer_serialize object; src names it in messages. */
static cg_tokenizer *from_json(const cJSON *root, const char *src) {
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(root, "kind");
    if (!cJSON_IsString(kind)) {
        cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: no \"kind\" string", src);
        return NULL;
    }
    if (strcmp(kind->valuestring, "char") == 0) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "codepoints");
        int n = cJSON_GetArraySize(a);
        if (!cJSON_IsArray(a) || n == 0) {
            cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: \"codepoints\" is not a non-empty array", src);
            return NULL;
        }
        uint32_t *cps = malloc((size_t)n * sizeof *cps);
        if (!cps) {
            cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
            return NULL;
        }
        int i = 0;
        for (const cJSON *v = a->child; v; v = v->next, i++) {
            double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
            bool ok = d >= 0 && d < 0x110000 && d == (double)(uint32_t)d && !(d >= 0xD800 && d <= 0xDFFF) &&
                      (i == 0 || (uint32_t)d > cps[i - 1]);
            if (!ok) {
                free(cps);
                cgi_fail(CG_ERR_FORMAT,
                         "[tokenizer] %s: codepoints[%d] is not a code point above the previous one", src, i);
                return NULL;
            }
            cps[i] = (uint32_t)d;
        }
        cg_tokenizer *t = char_from_codepoints(cps, n);
        free(cps);
        return t;
    }
    if (strcmp(kind->valuestring, "hf") == 0) {
        const cJSON *tj = cJSON_GetObjectItemCaseSensitive(root, "tokenizer");
        char *text = cJSON_IsObject(tj) ? cJSON_PrintUnformatted(tj) : NULL;
        if (!text) {
            cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: kind hf: \"tokenizer\" is not a tokenizer.json object", src);
            return NULL;
        }
        cg_tokenizer *t = cgi_hf_load(text, strlen(text), src);
        free(text);
        return t;
    }
    cg_tok_kind k;
    if (strcmp(kind->valuestring, "bpe") == 0) k = CG_TOK_BPE;
    else if (strcmp(kind->valuestring, "wordpiece") == 0) k = CG_TOK_WORDPIECE;
    else {
        cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: unknown kind \"%s\" (char, bpe, wordpiece or hf)", src,
                 kind->valuestring);
        return NULL;
    }
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(root, "vocab");
    if (!cJSON_IsArray(vocab) || !vocab->child) {
        cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: \"vocab\" is not a non-empty array", src);
        return NULL;
    }
    cg_tokenizer *t = cgi_tok_new(k);
    if (!t) return NULL;
    int i = 0;
    for (const cJSON *v = vocab->child; v; v = v->next, i++) {
        if (!cJSON_IsString(v)) {
            cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: vocab[%d] is not a string", src, i);
            goto fail;
        }
        if (!cgi_tok_push(t, v->valuestring, strlen(v->valuestring))) goto fail;
    }
    if (!cgi_tok_index(t)) goto fail;
    if (k == CG_TOK_WORDPIECE) {
        if (cgi_wordpiece_finish(t, src) != CG_OK) goto fail;
        return t;
    }
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(root, "merges");
    if (!cJSON_IsArray(merges)) {
        cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: \"merges\" is not an array", src);
        goto fail;
    }
    i = 0;
    for (const cJSON *v = merges->child; v; v = v->next, i++) {
        if (!cJSON_IsString(v)) {
            cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: merges[%d] is not a string", src, i);
            goto fail;
        }
        if (cgi_bpe_add_merge(t, v->valuestring, strlen(v->valuestring), src, "merge", i) != CG_OK) goto fail;
    }
    if (cgi_bpe_finish(t, src) != CG_OK) goto fail;
    return t;
fail:
    cg_tokenizer_free(t);
    return NULL;
}

/* Parses JSON text, naming src and the byte where parsing stopped on failure. */
static cJSON *parse_json(const char *s, const char *src) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(s, &end, true);
    if (!root) {
        size_t at = end ? (size_t)(end - s) : 0;
        cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: malformed JSON near byte %zu", src, at);
    }
    return root;
}

cg_tokenizer *cg_tokenizer_deserialize(const char *json) {
    if (!json) {
        cgi_fail(CG_ERR_ARG, "[tokenizer] deserialize: NULL argument");
        return NULL;
    }
    cJSON *root = parse_json(json, "deserialize");
    if (!root) return NULL;
    cg_tokenizer *t = from_json(root, "deserialize");
    cJSON_Delete(root);
    return t;
}

/* ---------------------------------------------------------------- load and save by path */

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* dir + "/" + name into a malloc'd string, NULL (message set) when out of memory. */
static char *join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) {
        cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
        return NULL;
    }
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

/* A .json file: cgrad's own serialised form ("kind"), or a Hugging Face tokenizer.json ("model"). */
static cg_tokenizer *load_serialized(const char *path) {
    size_t len = 0;
    char *s = cgi_read_file(path, &len);
    if (!s) return NULL;
    cg_tokenizer *t = NULL;
    if (ends_with(path, "tokenizer.json") && !ends_with(path, "cg_tokenizer.json")) t = cgi_hf_load(s, len, path);
    else {
        cJSON *root = parse_json(s, path);
        if (root && !cJSON_GetObjectItemCaseSensitive(root, "kind") && cJSON_GetObjectItemCaseSensitive(root, "model"))
            t = cgi_hf_load(s, len, path);
        else if (root) t = from_json(root, path);
        cJSON_Delete(root);
    }
    free(s);
    return t;
}

cg_tokenizer *cg_tokenizer_hf_load(const char *path) {
    if (!path) {
        cgi_fail(CG_ERR_ARG, "[tokenizer] load: NULL path");
        return NULL;
    }
    size_t len = 0;
    char *s = cgi_read_file(path, &len);
    cg_tokenizer *t = s ? cgi_hf_load(s, len, path) : NULL;
    free(s);
    return t;
}

cg_tokenizer *cg_tokenizer_hf_from_memory(const char *json, size_t len, const char *name) {
    if (!json) {
        cgi_fail(CG_ERR_ARG, "[tokenizer] tokenizer.json: NULL text");
        return NULL;
    }
    return cgi_hf_load(json, len, name ? name : "tokenizer.json");
}

/* The BPE pair in dir under either naming: GPT-2's release (encoder.json + vocab.bpe) or the
 * Hugging Face hub's (vocab.json + merges.txt); NULL (no message) when dir holds neither pair. */
static cg_tokenizer *load_bpe_pair(const char *dir, bool *found) {
    static const char *const pairs[2][2] = {{"encoder.json", "vocab.bpe"}, {"vocab.json", "merges.txt"}};
    *found = false;
    cg_tokenizer *t = NULL;
    for (int k = 0; k < 2 && !*found; k++) {
        char *enc = join(dir, pairs[k][0]), *bpe = join(dir, pairs[k][1]);
        if (enc && bpe && is_file(enc) && is_file(bpe)) {
            *found = true;
            t = cg_tokenizer_bpe_load(enc, bpe);
        }
        free(enc);
        free(bpe);
    }
    return t;
}

/* The directory part of path ("." when it has none), malloc'd. */
static char *dir_part(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *d = malloc(n + 1);
    if (d) memcpy(d, path, n), d[n] = 0;
    return d;
}

cg_tokenizer *cg_tokenizer_load(const char *path) {
    if (!path) {
        cgi_fail(CG_ERR_ARG, "[tokenizer] load: NULL path");
        return NULL;
    }
    bool found = false;
    cg_tokenizer *t = NULL;
    if (!is_dir(path)) {
        if (!is_file(path)) {
            cgi_fail(CG_ERR_IO, "[tokenizer] load: %s: no such file or directory", path);
            return NULL;
        }
        /* one file of a BPE pair names the pair: the other one sits beside it */
        static const char *const members[] = {"/encoder.json", "/vocab.bpe", "/vocab.json", "/merges.txt"};
        for (int k = 0; k < 4; k++)
            if (ends_with(path, members[k] + 1) && (!strcmp(path, members[k] + 1) || ends_with(path, members[k]))) {
                char *dir = dir_part(path);
                t = dir ? load_bpe_pair(dir, &found) : NULL;
                if (dir && !found)
                    cgi_fail(CG_ERR_IO, "[tokenizer] load: %s: its BPE partner (%s) is not beside it", path,
                             k < 2 ? "encoder.json + vocab.bpe" : "vocab.json + merges.txt");
                free(dir);
                return t;
            }
        if (ends_with(path, ".txt")) return cg_tokenizer_wordpiece_load(path);
        if (ends_with(path, ".json")) return load_serialized(path);
        cgi_fail(CG_ERR_ARG, "[tokenizer] load: %s: expected a directory, a vocab .txt or a .json file", path);
        return NULL;
    }
    char *ser = join(path, "cg_tokenizer.json"), *txt = join(path, "vocab.txt"), *hf = join(path, "tokenizer.json");
    if (ser && txt && hf) {
        if (is_file(hf)) t = cg_tokenizer_hf_load(hf);
        else if (is_file(ser)) t = load_serialized(ser);
        else if ((t = load_bpe_pair(path, &found)) || found) {
        } else if (is_file(txt)) t = cg_tokenizer_wordpiece_load(txt);
        else
            cgi_fail(CG_ERR_IO, "[tokenizer] load: %s holds no cg_tokenizer.json, tokenizer.json, encoder.json + "
                     "vocab.bpe, vocab.json + merges.txt or vocab.txt", path);
    }
    free(ser);
    free(txt);
    free(hf);
    return t;
}

/* hub: BPE under the Hugging Face hub's names (vocab.json + merges.txt) instead of GPT-2's. */
static cg_status save_as(const cg_tokenizer *t, const char *dir, bool hub) {
    if (!t || !dir) return cgi_fail(CG_ERR_ARG, "[tokenizer] save: NULL argument");
    if (!is_dir(dir) && mkdir(dir, 0777) != 0)
        return cgi_fail(CG_ERR_IO, "[tokenizer] save: cannot create directory %s: %s", dir, strerror(errno));
    if (t->kind == CG_TOK_BPE)
        return cgi_bpe_save(t, dir, hub ? "vocab.json" : "encoder.json", hub ? "merges.txt" : "vocab.bpe");
    if (t->kind == CG_TOK_HF) {
        char *p = join(dir, "tokenizer.json");
        cg_status st = p ? cgi_write_file(p, t->hf->json, t->hf->json_len) : CG_ERR_NOMEM;
        free(p);
        return st;
    }
    char *path = join(dir, t->kind == CG_TOK_WORDPIECE ? "vocab.txt" : "cg_tokenizer.json");
    if (!path) return CG_ERR_NOMEM;
    cg_status st;
    if (t->kind == CG_TOK_WORDPIECE) {
        /* The pool already holds the tokens NUL-separated: turn the NULs into line ends. */
        char *s = malloc(t->pool_len + 1);
        if (!s) {
            free(path);
            return cgi_fail(CG_ERR_NOMEM, "[tokenizer] save: out of memory");
        }
        memcpy(s, t->pool, t->pool_len);
        for (size_t i = 0; i < t->pool_len; i++)
            if (s[i] == 0) s[i] = '\n';
        st = cgi_write_file(path, s, t->pool_len);
        free(s);
    } else {
        char *s = NULL;
        st = cg_tokenizer_serialize(t, &s);
        if (st == CG_OK) st = cgi_write_file(path, s, strlen(s));
        free(s);
    }
    free(path);
    return st;
}

cg_status cg_tokenizer_save(const cg_tokenizer *t, const char *dir) { return save_as(t, dir, false); }

cg_status cg_tokenizer_save_hf(const cg_tokenizer *t, const char *dir) { return save_as(t, dir, true); }
