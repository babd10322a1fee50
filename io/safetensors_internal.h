/* SPDX-License-Identifier: MIT */
/* What the safetensors reader (io/safetensors_read.c) and writer (io/safetensors_write.c) share,
 * and lend the rest of io/ (the gzip checkpoint reads and writes the same image); not part of the
 * public API. */
#ifndef CGRAD_IO_SAFETENSORS_INTERNAL_H
#define CGRAD_IO_SAFETENSORS_INTERNAL_H

#include <stdlib.h>

#include "io/safetensors.h"

/* The format's dtypes: kind of element, and the table of names and sizes (indexed by DT_*). */
typedef enum { K_REAL, K_INT, K_UINT, K_BOOL } st_kind;

typedef struct {
    const char *name;
    int size;
    st_kind kind;
} st_dtype;

enum { DT_BOOL, DT_U8, DT_I8, DT_F8_E5M2, DT_F8_E4M3, DT_I16, DT_U16, DT_F16, DT_BF16,
       DT_I32, DT_U32, DT_F32, DT_F64, DT_I64, DT_U64, DT_COUNT };

extern const st_dtype cgi_st_dtypes[DT_COUNT];

#ifdef CGRAD_DOUBLE
#define DT_REAL DT_F64 /* cg_real's dtype */
#else
#define DT_REAL DT_F32
/* One more owner of f: the next cg_st_close only drops that owner. */
void cgi_st_retain(cg_st *f);
/* The bytes of tensor i in place (in f's mapping), its dtype name and byte count; NULL if out of range. */
const void *cgi_st_bytes(const cg_st *f, int i, const char **dtype, uint64_t *nbytes);
/* The file name (or label) f's messages use. */
const char *cgi_st_label(const cg_st *f);
/* One view over the tensors of n opened files (it takes them, and closes them when closed, also on
 * failure); FORMAT naming both files when a tensor is stored in two. Metadata: none. */
cg_st *cgi_st_merge(cg_st **parts, int n, const char *label);

#endif

/* Fails with "[safetensors] <label>: <message>"; returns s. */
cg_status cgi_st_fail(const char *label, cg_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Frees n metadata keys and values and the two arrays (a reader's or a writer's). */
static inline void cgi_st_free_metadata(char **keys, char **values, int n) {
    for (int i = 0; i < n; i++) {
        free(keys[i]);
        free(values[i]);
    }
    free(keys);
    free(values);
}

/* Where an image is streamed to: returns CG_OK or the sink's error. */
typedef cg_status (*cgi_st_sink)(void *ctx, const void *p, size_t n);

/* Takes ownership of a malloc'd image (freed on failure too) and validates it. */
cg_st *cgi_st_adopt(void *bytes, size_t len, const char *label);
/* Streams the image (length, padded header, data) into sink; *total gets the bytes, when not NULL. */
cg_status cgi_st_emit(cg_st_writer *w, cgi_st_sink sink, void *ctx, uint64_t *total);

/* Fails (FORMAT, both tensors and their byte ranges named) when two tensors share bytes. The
 * format allows it, but a checkpoint written by cgrad never does: there it means a damaged file. */
cg_status cgi_st_check_disjoint(const cg_st *f);

/* One more owner of f: the next cg_st_close only drops that owner. */
void cgi_st_retain(cg_st *f);
/* The bytes of tensor i in place (in f's mapping), its dtype name and byte count; NULL if out of range. */
const void *cgi_st_bytes(const cg_st *f, int i, const char **dtype, uint64_t *nbytes);
/* One view over the tensors of n opened files (it takes them, and closes them when closed, also on
 * failure); FORMAT naming both files when a tensor is stored in two. Metadata: none. */
cg_st *cgi_st_merge(cg_st **parts, int n, const char *label);
/* A stored tensor as a load sees it: which file, its dtype (DT_*) and shape, and its byte range
 * [begin, end) in the file's data buffer of data_len bytes (owned by the file). A source of
 * weights that is not one cg_st could fill one of these and reuse the load's checks. */
typedef struct {
    const cg_st *file;
    const char *label; /* the file's path (or memory label), for messages */
    const char *name;
    int dtype, ndim;
    const int64_t *shape; /* ndim entries */
    uint64_t begin, end;
    const unsigned char *data;
    uint64_t data_len;
} cgi_st_desc;

/* The path (or memory label) f was opened with. */
const char *cgi_st_label(const cg_st *f);
/* Describes the tensor called name of f into *d; false when f has none. */
bool cgi_st_describe(const cg_st *f, const char *name, cgi_st_desc *d);
/* Converts n values of a floating dtype (DT_*) at p into cg_real. */
void cgi_st_decode(int dtype, const unsigned char *p, uint64_t n, cg_real *dst);

#endif
