/* SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "io/file_internal.h"
#include "models/config_json.h"

cJSON *cgi_json_object(const char *text, const char *what) {
    if (!text) {
        cg_set_error(CG_ERR_ARG, "[%s] no JSON text", what);
        return NULL;
    }
    cJSON *o = cJSON_Parse(text);
    if (!o || !cJSON_IsObject(o)) {
        const char *at = cJSON_GetErrorPtr();
        cg_set_error(CG_ERR_FORMAT, "[%s] not a JSON object%s%.20s", what, at ? " near: " : "", at ? at : "");
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static const cJSON *field(const cJSON *o, const char *key, bool required, const char *what, bool *ok) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, key);
    *ok = true;
    if (!f || cJSON_IsNull(f)) {
        if (required) {
            cg_set_error(CG_ERR_FORMAT, "[%s] missing required field \"%s\"", what, key);
            *ok = false;
        }
        return NULL;
    }
    if (!cJSON_IsNumber(f)) {
        cg_set_error(CG_ERR_FORMAT, "[%s] field \"%s\" must be a number", what, key);
        *ok = false;
        return NULL;
    }
    return f;
}

bool cgi_json_int(const cJSON *o, const char *key, bool required, int64_t dflt, int64_t *out, const char *what) {
    bool ok;
    const cJSON *f = field(o, key, required, what, &ok);
    if (!ok) return false;
    if (!f) {
        *out = dflt;
        return true;
    }
    double v = f->valuedouble;
    if (v != floor(v) || fabs(v) > 9.0e15) {
        cg_set_error(CG_ERR_FORMAT, "[%s] field \"%s\" = %g must be an integer", what, key, v);
        return false;
    }
    *out = (int64_t)v;
    return true;
}

bool cgi_json_num(const cJSON *o, const char *key, bool required, double dflt, double *out, const char *what) {
    bool ok;
    const cJSON *f = field(o, key, required, what, &ok);
    if (!ok) return false;
    /* JSON has no inf, but cJSON reads 1e999 as one; a config must survive its own save (%.17g
     * writes "inf", which no JSON parser reads back) */
    if (f && !isfinite(f->valuedouble)) {
        cg_set_error(CG_ERR_FORMAT, "[%s] field \"%s\" = %g must be a finite number", what, key, f->valuedouble);
        return false;
    }
    *out = f ? f->valuedouble : dflt;
    return true;
}

char *cgi_read_text(const char *path, size_t *len) {
    return cgi_read_bounded(path ? path : "(null)", CGI_LIMIT_JSON, "config", len);
}
