/* SPDX-License-Identifier: MIT */
/* IDX arrays (the MNIST family's format: a 4-byte magic 00 00 TYPE NDIM, NDIM big-endian uint32
 * sizes, then the elements row-major) and image-classification sets built from them, such as
 * Fashion-MNIST. Only unsigned-byte elements (TYPE 0x08) are read, which is what image and label
 * files hold. Files may be gzip-compressed (detected by their first two bytes 1f 8b). Every header
 * is checked against the file's length before anything is copied. */
#ifndef CGRAD_IDX_H
#define CGRAD_IDX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../graph/graph.h"
#include "data.h"

CG_BEGIN_DECLS

#define CG_IDX_MAX_DIMS 4 /* most dimensions an IDX array may have here */

/* An IDX array of unsigned bytes. */
typedef struct {
    int ndim;                       /* 1 .. CG_IDX_MAX_DIMS */
    int64_t dims[CG_IDX_MAX_DIMS];  /* sizes, outermost first; each >= 1 */
    int64_t count;                  /* elements: the product of dims */
    uint8_t *data;                  /* count bytes, row-major (owned; cg_idx_free frees) */
} cg_idx;

/* Parses an IDX image of len bytes into *out (data copied); name labels messages. CG_ERR_FORMAT
 * naming name and the field (magic, element type, dimension count, a size, the length) when the
 * header is wrong or the sizes do not account for exactly len bytes; *out is untouched on error. */
cg_status cg_idx_parse(const void *buf, size_t len, const char *name, cg_idx *out);
/* Reads an IDX file (raw or gzip) of at most 2 GiB (inflated) into *out; CG_ERR_IO if unreadable,
 * CG_ERR_FORMAT (naming the file and field) when invalid; *out is untouched on error. */
cg_status cg_idx_read(const char *path, cg_idx *out);
/* Frees the array's data and zeroes it. NULL is a no-op. */
void cg_idx_free(cg_idx *x);

/* Greyscale images with integer labels, e.g. one split of Fashion-MNIST. */
typedef struct {
    int64_t n;           /* images */
    int64_t h;           /* rows of each image */
    int64_t w;           /* columns of each image */
    uint8_t *pixels;     /* [n, h, w] bytes (owned) */
    int32_t *labels;     /* [n] in [0, num_classes) (owned) */
    int32_t num_classes; /* 1 + the largest label */
    void *order;         /* cg_image_batch's epoch-order cache (internal; freed with the set) */
} cg_image_set;

/* Loads images [N, H, W] and labels [N] from two IDX files (raw or gzip); CG_ERR_FORMAT naming
 * the file when ranks or counts disagree or a label exceeds 255 classes. *out untouched on error. */
cg_status cg_image_set_load(const char *images_path, const char *labels_path, cg_image_set *out);
/* Loads one split of an MNIST-layout directory: {train,t10k}-{images-idx3,labels-idx1}-ubyte,
 * each with or without ".gz"; test picks t10k. */
cg_status cg_image_set_load_dir(const char *dir, bool test, cg_image_set *out);
/* Frees the set's arrays and zeroes it. NULL is a no-op. */
void cg_image_set_free(cg_image_set *s);
/* Fills pixels [batch, 1, h, w] with (byte / 255 - mean) / std and labels [batch] from images
 * first .. first + batch - 1 (rows past the end get zero pixels and label -100). */
void cg_image_rows(const cg_image_set *s, int64_t first, int64_t batch, double mean, double std, cg_real *pixels,
                   int32_t *labels);
/* Fills the next batch of c's shuffled epochs (see cg_data_cursor), normalised as cg_image_rows;
 * CG_ERR_ARG if batch exceeds the set's images. Not for two threads at once (the order cache). */
cg_status cg_image_batch(const cg_image_set *s, cg_data_cursor *c, int64_t batch, double mean, double std,
                         cg_real *pixels, int32_t *labels);

CG_END_DECLS
#endif
