/* SPDX-License-Identifier: MIT */
/* IDX arrays and the image sets made of them. The file is read whole (bounded), inflated when it
 * is gzip (bounded), and its header is checked against the length before the elements are copied. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "io/data_internal.h"
#include "io/file_internal.h"
#include "io/idx.h"

#define IDX_LIMIT CGI_LIMIT_DATA /* largest IDX image, compressed or inflated */

static const char *type_name(unsigned t) {
    switch (t) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return "unknown";
    }
}

cg_status cg_idx_parse(const void *buf, size_t len, const char *name, cg_idx *out) {
    if (!name) name = "(buffer)";
    if (!buf || !out) return cgi_fail(CG_ERR_ARG, "[idx] %s: NULL buffer or output", name);
    const uint8_t *p = buf;
    if (len < 4)
        return cgi_fail(CG_ERR_FORMAT, "[idx] %s: %zu bytes is too short for the 4-byte magic", name, len);
    if (p[0] != 0 || p[1] != 0)
        return cgi_fail(CG_ERR_FORMAT, "[idx] %s: magic starts with bytes %02x %02x, expected 00 00 (not an IDX file)",
                        name, p[0], p[1]);
    if (p[2] != 0x08)
        return cgi_fail(CG_ERR_FORMAT, "[idx] %s: element type 0x%02x (%s) is not supported (only 0x08, unsigned byte)",
                        name, p[2], type_name(p[2]));
    const int nd = p[3];
    if (nd < 1 || nd > CG_IDX_MAX_DIMS)
        return cgi_fail(CG_ERR_FORMAT, "[idx] %s: dimension count %d is out of range (1 .. %d)", name, nd, CG_IDX_MAX_DIMS);
    const size_t header = 4 + 4 * (size_t)nd;
    if (len < header)
        return cgi_fail(CG_ERR_FORMAT, "[idx] %s: %zu bytes cannot hold the header of %d sizes (%zu bytes)", name, len, nd,
                        header);
    cg_idx x = {.ndim = nd, .count = 1};
    const uint64_t avail = (uint64_t)(len - header);
    for (int i = 0; i < nd; i++) {
        const uint8_t *q = p + 4 + 4 * i;
        x.dims[i] = (int64_t)((uint32_t)q[0] << 24 | (uint32_t)q[1] << 16 | (uint32_t)q[2] << 8 | q[3]);
        if (x.dims[i] < 1) return cgi_fail(CG_ERR_FORMAT, "[idx] %s: size %d is 0", name, i);
        /* each size < 2^32 and the running product <= avail < 2^63: no overflow */
        if ((uint64_t)x.dims[i] > avail / (uint64_t)x.count)
            return cgi_fail(CG_ERR_FORMAT, "[idx] %s: sizes up to size %d (%lld) need more than the %llu element bytes "
                            "after the header", name, i, (long long)x.dims[i], (unsigned long long)avail);
        x.count *= x.dims[i];
    }
    if ((uint64_t)x.count != avail)
        return cgi_fail(CG_ERR_FORMAT, "[idx] %s: the sizes give %lld elements but the file holds %llu bytes after the "
                        "header (length %zu)", name, (long long)x.count, (unsigned long long)avail, len);
    if (!(x.data = malloc((size_t)x.count)))
        return cgi_fail(CG_ERR_NOMEM, "[idx] %s: cannot allocate %lld bytes", name, (long long)x.count);
    memcpy(x.data, p + header, (size_t)x.count);
    *out = x;
    return CG_OK;
}

/* Inflates a gzip image in memory into *out (malloc'd), at most IDX_LIMIT bytes. */
static cg_status gunzip(const uint8_t *in, size_t n, const char *path, uint8_t **out, size_t *out_len) {
    z_stream z = {0};
    if (inflateInit2(&z, 15 + 16) != Z_OK) return cgi_fail(CG_ERR_NOMEM, "[idx] %s: inflateInit2 failed", path);
    size_t cap = n * 4 + 1024, done = 0;
    if (cap > IDX_LIMIT) cap = IDX_LIMIT;
    uint8_t *buf = malloc(cap);
    cg_status s = buf ? CG_OK : cgi_fail(CG_ERR_NOMEM, "[idx] %s: cannot allocate %zu bytes", path, cap);
    z.next_in = (Bytef *)in;
    size_t left = n;
    while (!s) {
        if (z.avail_in == 0 && left > 0) {
            z.avail_in = (uInt)(left > UINT32_MAX ? UINT32_MAX : left);
            left -= z.avail_in;
        }
        if (done == cap) {
            if (cap >= IDX_LIMIT) {
                s = cgi_fail(CG_ERR_RANGE, "[idx] %s: inflates to more than %s", path, cgi_bytes_str(IDX_LIMIT));
                break;
            }
            size_t ncap = cap * 2 > IDX_LIMIT ? IDX_LIMIT : cap * 2;
            uint8_t *b = realloc(buf, ncap);
            if (!b) {
                s = cgi_fail(CG_ERR_NOMEM, "[idx] %s: cannot allocate %zu bytes", path, ncap);
                break;
            }
            buf = b, cap = ncap;
        }
        z.next_out = buf + done;
        z.avail_out = (uInt)(cap - done > UINT32_MAX ? UINT32_MAX : cap - done);
        int r = inflate(&z, Z_NO_FLUSH);
        done = (size_t)(z.next_out - buf);
        if (r == Z_STREAM_END) {
            if (z.avail_in > 0 || left > 0) s = cgi_fail(CG_ERR_FORMAT, "[idx] %s: trailing bytes after the gzip stream", path);
            break;
        }
        if (r == Z_OK || (r == Z_BUF_ERROR && done == cap)) continue;
        if (r == Z_BUF_ERROR) s = cgi_fail(CG_ERR_FORMAT, "[idx] %s: truncated gzip stream", path);
        else s = cgi_fail(CG_ERR_FORMAT, "[idx] %s: corrupt gzip data (%s)", path, z.msg ? z.msg : "inflate error");
    }
    inflateEnd(&z);
    if (s) {
        free(buf);
        return s;
    }
    *out = buf, *out_len = done;
    return CG_OK;
}

cg_status cg_idx_read(const char *path, cg_idx *out) {
    if (!path || !out) return cgi_fail(CG_ERR_ARG, "[idx] NULL path or output");
    size_t len = 0;
    char *raw = cgi_read_bounded(path, IDX_LIMIT, "idx", &len);
    if (!raw) return CG_ERR_IO;
    const uint8_t *p = (const uint8_t *)raw;
    cg_status s;
    if (len >= 2 && p[0] == 0x1f && p[1] == 0x8b) {
        uint8_t *img = NULL;
        size_t n = 0;
        s = gunzip(p, len, path, &img, &n);
        if (!s) s = cg_idx_parse(img, n, path, out);
        free(img);
    } else s = cg_idx_parse(p, len, path, out);
    free(raw);
    return s;
}

void cg_idx_free(cg_idx *x) {
    if (!x) return;
    free(x->data);
    memset(x, 0, sizeof *x);
}

/* ---- image sets ---- */

cg_status cg_image_set_load(const char *images_path, const char *labels_path, cg_image_set *out) {
    if (!images_path || !labels_path || !out) return cgi_fail(CG_ERR_ARG, "[idx] NULL path or output");
    cg_idx im = {0}, lb = {0};
    cg_status s = cg_idx_read(images_path, &im);
    if (!s) s = cg_idx_read(labels_path, &lb);
    if (!s && im.ndim != 3)
        s = cgi_fail(CG_ERR_FORMAT, "[idx] %s: images need 3 dimensions [N, H, W], the file has %d", images_path, im.ndim);
    if (!s && lb.ndim != 1)
        s = cgi_fail(CG_ERR_FORMAT, "[idx] %s: labels need 1 dimension [N], the file has %d", labels_path, lb.ndim);
    if (!s && lb.dims[0] != im.dims[0])
        s = cgi_fail(CG_ERR_FORMAT, "[idx] %s holds %lld labels for the %lld images of %s", labels_path,
                     (long long)lb.dims[0], (long long)im.dims[0], images_path);
    int32_t *labels = s ? NULL : malloc((size_t)lb.count * sizeof *labels);
    if (!s && !labels) s = cgi_fail(CG_ERR_NOMEM, "[idx] %s: out of memory", labels_path);
    int32_t classes = 0;
    for (int64_t i = 0; !s && i < lb.count; i++) {
        labels[i] = lb.data[i];
        if (labels[i] + 1 > classes) classes = labels[i] + 1;
    }
    if (s) {
        free(labels);
        cg_idx_free(&im);
        cg_idx_free(&lb);
        return s;
    }
    cg_idx_free(&lb);
    *out = (cg_image_set){.n = im.dims[0], .h = im.dims[1], .w = im.dims[2], .pixels = im.data, .labels = labels,
                          .num_classes = classes};
    return CG_OK;
}

cg_status cg_image_set_load_dir(const char *dir, bool test, cg_image_set *out) {
    if (!dir || !out) return cgi_fail(CG_ERR_ARG, "[idx] NULL directory or output");
    const char *split = test ? "t10k" : "train", *kind[2] = {"images-idx3", "labels-idx1"};
    char path[2][4096];
    for (int k = 0; k < 2; k++) {
        bool found = false;
        for (int gz = 1; gz >= 0 && !found; gz--) {
            int n = snprintf(path[k], sizeof path[k], "%s/%s-%s-ubyte%s", dir, split, kind[k], gz ? ".gz" : "");
            if (n < 0 || (size_t)n >= sizeof path[k]) return cgi_fail(CG_ERR_ARG, "[idx] directory name too long: %s", dir);
            FILE *f = fopen(path[k], "rb");
            if (f) fclose(f), found = true;
        }
        if (!found)
            return cgi_fail(CG_ERR_IO, "[idx] %s: no %s-%s-ubyte (or .gz) in this directory", dir, split, kind[k]);
    }
    return cg_image_set_load(path[0], path[1], out);
}

void cg_image_set_free(cg_image_set *s) {
    if (!s) return;
    free(s->pixels);
    free(s->labels);
    if (s->order) cgi_order_free(s->order);
    free(s->order);
    memset(s, 0, sizeof *s);
}

static void image_row(const cg_image_set *s, int64_t i, double mean, double std, cg_real *px, int32_t *label) {
    const int64_t hw = s->h * s->w;
    const uint8_t *src = s->pixels + i * hw;
    const double scale = 1.0 / (255.0 * std), shift = mean / std;
    for (int64_t j = 0; j < hw; j++) px[j] = (cg_real)((double)src[j] * scale - shift);
    *label = s->labels[i];
}

void cg_image_rows(const cg_image_set *s, int64_t first, int64_t batch, double mean, double std, cg_real *pixels,
                   int32_t *labels) {
    const int64_t hw = s->h * s->w;
    for (int64_t b = 0; b < batch; b++) {
        if (first + b < s->n) image_row(s, first + b, mean, std, pixels + b * hw, &labels[b]);
        else {
            memset(pixels + b * hw, 0, (size_t)hw * sizeof *pixels);
            labels[b] = CG_IGNORE_INDEX;
        }
    }
}

cg_status cg_image_batch(const cg_image_set *s, cg_data_cursor *c, int64_t batch, double mean, double std,
                         cg_real *pixels, int32_t *labels) {
    if (!s || !pixels || !labels) return cgi_fail(CG_ERR_ARG, "[data] image_batch: NULL argument");
    cg_image_set *m = (cg_image_set *)s; /* the order cache is the only state a batch changes */
    if (!m->order && !(m->order = calloc(1, sizeof(cgi_order))))
        return cgi_fail(CG_ERR_NOMEM, "[data] image_batch: out of memory");
    int64_t local[256], *rows = batch <= 256 ? local : malloc((size_t)(batch > 0 ? batch : 1) * sizeof *rows);
    if (!rows) return cgi_fail(CG_ERR_NOMEM, "[data] image_batch: out of memory");
    cg_status st = cgi_order_take(m->order, c, s->n, batch, rows, "image_batch");
    const int64_t hw = s->h * s->w;
    for (int64_t b = 0; !st && b < batch; b++) image_row(s, rows[b], mean, std, pixels + b * hw, &labels[b]);
    if (rows != local) free(rows);
    return st;
}
