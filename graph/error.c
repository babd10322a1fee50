/* SPDX-License-Identifier: MIT */
/* Errors are values: a status code plus a thread-local message naming the op and the shapes. */
#include <stdio.h>
#include <string.h>

#include "graph/internal.h"

static _Thread_local char last_error[1024];
static _Thread_local cg_status last_status;

const char *cg_last_error(void) { return last_error; }

cg_status cg_last_status(void) { return last_status; }

void cg_clear_error(void) { last_error[0] = 0, last_status = CG_OK; }

const char *cg_status_name(cg_status s) {
    switch (s) {
    case CG_OK: return "ok";
    case CG_ERR_ARG: return "bad argument";
    case CG_ERR_SHAPE: return "shape error";
    case CG_ERR_RANGE: return "value out of range";
    case CG_ERR_NOMEM: return "out of memory";
    case CG_ERR_STATE: return "invalid state";
    case CG_ERR_IO: return "i/o error";
    case CG_ERR_FORMAT: return "bad file format";
    }
    return "unknown error";
}

/* Formats into a scratch buffer first: callers wrap the previous message ("...: %s",
 * cg_last_error()), and vsnprintf onto its own argument is undefined (it garbled them). */
cg_status cg_set_error(cg_status s, const char *fmt, ...) {
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof msg);
    last_status = s;
    return s;
}

cg_status cgi_fail_headed(cg_status s, const char *head, const char *fmt, va_list ap) {
    char msg[768];
    vsnprintf(msg, sizeof msg, fmt, ap);
    return cgi_fail(s, "%s%s", head, msg);
}

const char *cg_dims_str(int ndim, const int64_t *shape) {
    static _Thread_local char ring[8][96];
    static _Thread_local int next;
    char *b = ring[next++ & 7];
    int n = snprintf(b, 96, "[");
    for (int i = 0; i < ndim && n < 90; i++)
        n += snprintf(b + n, 96 - n, i ? ",%lld" : "%lld", (long long)shape[i]);
    snprintf(b + n, 96 - n, "]");
    return b;
}

const char *cg_shape_str(const cg_tensor *t) { return t ? cg_dims_str(t->ndim, t->shape) : "(null)"; }
