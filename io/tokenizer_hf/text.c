/* SPDX-License-Identifier: MIT */
/* What the tokenizer.json stages share: lists of pieces, patterns (PCRE2, read with the reference's
 * ECMAScript meaning of \s), Unicode classes from utf8proc, GPT-2's byte map and lossy UTF-8. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <utf8proc.h>

#include "io/tokenizer_hf/internal.h"

/* ---------------------------------------------------------------- pieces */

bool cgi_hf_pieces_add(cgi_hf_pieces *p, const char *s, size_t len, int32_t section) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        size_t *off = realloc(p->off, cap * sizeof *off);
        if (off) p->off = off;
        size_t *ln = realloc(p->len, cap * sizeof *ln);
        if (ln) p->len = ln;
        int32_t *sec = realloc(p->section, cap * sizeof *sec);
        if (sec) p->section = sec;
        if (!off || !ln || !sec) {
            cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory for %zu pieces", cap);
            return false;
        }
        p->cap = cap;
    }
    p->off[p->n] = p->bytes.n;
    p->len[p->n] = len;
    p->section[p->n] = section;
    if (!cgi_buf_add(&p->bytes, s, len)) return false;
    p->n++;
    return true;
}

void cgi_hf_pieces_clear(cgi_hf_pieces *p) {
    p->n = 0;
    p->bytes.n = 0;
}

void cgi_hf_pieces_free(cgi_hf_pieces *p) {
    free(p->bytes.s);
    free(p->off);
    free(p->len);
    free(p->section);
    memset(p, 0, sizeof *p);
}

/* ---------------------------------------------------------------- Unicode classes */

bool cgi_hf_js_space(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

/* Letters, numbers and punctuation come from cgrad's Unicode tables (io/tokenizer_unicode.c, the
 * reference's Unicode version), marks from utf8proc. */
bool cgi_hf_is_punct(uint32_t cp) {
    if (cp < 128) return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126);
    return cgi_uc_is_punct(cp);
}

bool cgi_hf_is_word(uint32_t cp) {
    if (cp < 128) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    if (cgi_uc_is_letter(cp) || cgi_uc_is_number(cp)) return true;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_MN && c <= UTF8PROC_CATEGORY_ME) || c == UTF8PROC_CATEGORY_PC;
}

/* ---------------------------------------------------------------- GPT-2's byte map */

/* Printable bytes stand for themselves; the other 68 take 256 + their rank among them. */
static uint16_t byte_char(int b) {
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return (uint16_t)b;
    if (b <= 32) return (uint16_t)(256 + b);
    if (b >= 127 && b <= 160) return (uint16_t)(256 + 33 + (b - 127));
    return 256 + 33 + 34; /* 0xAD */
}


int cgi_hf_char_byte(uint32_t cp) {
    if ((cp >= '!' && cp <= '~') || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp >= 256 && cp <= 288) return (int)cp - 256;
    if (cp >= 289 && cp <= 322) return (int)cp - 289 + 127;
    if (cp == 323) return 0xAD;
    return -1;
}

/* The code point ByteLevel writes for byte b. */
uint32_t cgi_hf_byte_cp(int b) { return byte_char(b); }

/* ---------------------------------------------------------------- lossy UTF-8 */

bool cgi_hf_add_lossy(cgi_buf *out, const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        size_t good = cgi_utf8_check(str + i, len - i);
        if (good && !cgi_buf_add(out, str + i, good)) return false;
        i += good;
        if (i >= len) break;
        /* the maximal ill-formed subpart: the lead byte and the continuation bytes it accepts */
        unsigned c = s[i];
        size_t need = 0, k = 1;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c >= 0xE0 && c <= 0xEF) need = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4) need = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        if (need && i + 1 < len && s[i + 1] >= lo && s[i + 1] <= hi) {
            k = 2;
            while (k <= need && i + k < len && s[i + k] >= 0x80 && s[i + k] <= 0xBF) k++;
        }
        if (!cgi_buf_add(out, "\xEF\xBF\xBD", 3)) return false;
        i += k;
    }
    return true;
}

/* ---------------------------------------------------------------- patterns */

/* ECMAScript's \s, as the inside of a character class. */
static const char JS_SPACE[] = "\\t\\n\\x{0B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
                               "\\x{205F}\\x{3000}\\x{FEFF}";

/* The ranges of \p{L} or \p{N} as the inside of a character class, from cgrad's Unicode tables
 * (the reference's Unicode version; PCRE2's own data may be older). */
static bool add_class(cgi_buf *b, bool letter) {
    const uint32_t(*r)[2];
    size_t n = letter ? cgi_uc_letter_ranges(&r) : cgi_uc_number_ranges(&r);
    char item[40];
    for (size_t i = 0; i < n; i++) {
        int k = r[i][0] == r[i][1] ? snprintf(item, sizeof item, "\\x{%X}", (unsigned)r[i][0])
                                   : snprintf(item, sizeof item, "\\x{%X}-\\x{%X}", (unsigned)r[i][0], (unsigned)r[i][1]);
        if (!cgi_buf_add(b, item, (size_t)k)) return false;
    }
    return true;
}

/* The reference rewrites a few Python-only spellings before compiling (createPattern); the same
 * rewrites here keep (?i:'s|...) from also matching U+017F and U+212A as PCRE2's caseless mode would. */
static char *rewrite_regex(const char *re) {
    static const char *const from[] = {"(?i:'s|'t|'re|'ve|'m|'ll|'d)"};
    static const char *const to[] = {"(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))"};
    cgi_buf b = {0};
    size_t n = strlen(re);
    bool in_class = false, ok = true;
    for (size_t i = 0; ok && i < n;) {
        bool hit = false;
        for (size_t k = 0; k < sizeof from / sizeof *from; k++) {
            size_t fl = strlen(from[k]);
            if (!in_class && !strncmp(re + i, from[k], fl)) {
                ok = cgi_buf_add(&b, to[k], strlen(to[k]));
                i += fl;
                hit = true;
                break;
            }
        }
        if (hit) continue;
        char c = re[i];
        if (c == '\\' && i + 1 < n) {
            char d = re[i + 1];
            if (d == 's' || d == 'S') {
                if (in_class && d == 's') ok = cgi_buf_add(&b, JS_SPACE, sizeof JS_SPACE - 1);
                else if (in_class) ok = cgi_buf_add(&b, "\\S", 2); /* rare: PCRE2's own \S */
                else {
                    ok = cgi_buf_add(&b, d == 's' ? "[" : "[^", d == 's' ? 1 : 2) &&
                         cgi_buf_add(&b, JS_SPACE, sizeof JS_SPACE - 1) && cgi_buf_add(&b, "]", 1);
                }
            } else if ((d == 'p' || d == 'P') && (!strncmp(re + i + 2, "{L}", 3) || !strncmp(re + i + 2, "{N}", 3)) &&
                       !(in_class && d == 'P')) {
                bool letter = re[i + 3] == 'L';
                if (in_class) ok = add_class(&b, letter);
                else ok = cgi_buf_add(&b, d == 'p' ? "[" : "[^", d == 'p' ? 1 : 2) && add_class(&b, letter) &&
                          cgi_buf_add(&b, "]", 1);
                i += 5;
                continue;
            } else if (d == '#' || d == '&' || d == '~') ok = cgi_buf_add(&b, &re[i + 1], 1);
            else ok = cgi_buf_add(&b, re + i, 2);
            i += 2;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = true;
            ok = cgi_buf_add(&b, re + i, 1);
            i++;
            /* a ] or ^] right after [ is literal */
            if (i < n && re[i] == '^') ok = ok && cgi_buf_add(&b, re + i, 1), i++;
            if (i < n && re[i] == ']') ok = ok && cgi_buf_add(&b, re + i, 1), i++;
            continue;
        }
        if (c == ']' && in_class) in_class = false;
        ok = cgi_buf_add(&b, re + i, 1);
        i++;
    }
    if (ok && !b.s) ok = cgi_buf_add(&b, "", 0);
    if (!ok) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

cg_status cgi_hf_pattern_regex(cgi_hf_pattern *p, const char *regex, const char *src, const char *what) {
    memset(p, 0, sizeof *p);
    char *re = rewrite_regex(regex);
    if (!re) return CG_ERR_NOMEM;
    int err = 0;
    PCRE2_SIZE at = 0;
    p->re = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &err, &at, NULL);
    free(re);
    if (!p->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: %s: regex \"%.80s\" does not compile near offset %zu: %s", src,
                        what, regex, (size_t)at, (const char *)msg);
    }
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* without JIT, matching is slower but the same */
    p->mc = pcre2_match_context_create(NULL);
    if (!p->mc) return cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
    /* a pathological pattern fails with a message instead of running for hours */
    pcre2_set_match_limit(p->mc, 10000000);
    pcre2_set_depth_limit(p->mc, 100000);
    return CG_OK;
}

cg_status cgi_hf_pattern_parse(cgi_hf_pattern *p, const void *json, const char *src, const char *what) {
    memset(p, 0, sizeof *p);
    const cJSON *j = json;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "String");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "Regex");
    if (cJSON_IsString(s)) {
        p->lit_len = strlen(s->valuestring);
        if (!p->lit_len) return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: %s: the pattern string is empty", src, what);
        p->lit = strdup(s->valuestring);
        return p->lit ? CG_OK : cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
    }
    if (cJSON_IsString(r)) return cgi_hf_pattern_regex(p, r->valuestring, src, what);
    return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: %s: \"pattern\" is not {\"String\": ...} or {\"Regex\": ...}", src,
                    what);
}

void cgi_hf_pattern_free(cgi_hf_pattern *p) {
    free(p->lit);
    if (p->re) pcre2_code_free(p->re);
    if (p->mc) pcre2_match_context_free(p->mc);
    memset(p, 0, sizeof *p);
}

int cgi_hf_pattern_next(const cgi_hf_pattern *p, pcre2_match_data *md, const char *s, size_t len, size_t *pos,
                        size_t *ms, size_t *me) {
    if (*pos > len) return 0;
    if (p->lit) {
        if (len - *pos < p->lit_len) return 0;
        const char *hit = NULL; /* memmem is not C11/POSIX: a first-byte scan */
        for (const char *c = s + *pos, *e = s + len - p->lit_len; c <= e && (c = memchr(c, p->lit[0], (size_t)(e - c) + 1));
             c++)
            if (!memcmp(c, p->lit, p->lit_len)) {
                hit = c;
                break;
            }
        if (!hit) return 0;
        *ms = (size_t)(hit - s);
        *me = *ms + p->lit_len;
        *pos = *me;
        return 1;
    }
    int rc = pcre2_match(p->re, (PCRE2_SPTR)s, len, *pos, PCRE2_NO_UTF_CHECK, md, p->mc);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(rc, msg, sizeof msg);
        cgi_fail(CG_ERR_RANGE, "[tokenizer] encode: regex match failed at byte %zu: %s", *pos, (const char *)msg);
        return -1;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1] < ov[0] ? ov[0] : ov[1]; /* \K can end a match before its start */
    if (*me > *ms) *pos = *me;
    else if (*me >= len) *pos = len + 1;
    else {
        uint32_t cp;
        *pos = *me + (size_t)cgi_utf8_next((const unsigned char *)s + *me, &cp);
    }
    return 1;
}

cg_status cgi_hf_pattern_replace(const cgi_hf_pattern *p, pcre2_match_data *md, const char *s, size_t len,
                                 const char *rep, size_t rep_len, cgi_buf *out) {
    size_t pos = 0, last = 0, ms, me;
    int r;
    while ((r = cgi_hf_pattern_next(p, md, s, len, &pos, &ms, &me)) > 0) {
        if (!cgi_buf_add(out, s + last, ms - last) || !cgi_buf_add(out, rep, rep_len)) return CG_ERR_NOMEM;
        last = me;
    }
    if (r < 0) return CG_ERR_RANGE;
    return cgi_buf_add(out, s + last, len - last) ? CG_OK : CG_ERR_NOMEM;
}
