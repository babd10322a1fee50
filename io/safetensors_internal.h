/* What io/safetensors.c lends the rest of io/ (the gzip checkpoint reads and writes the same
 * image); not part of the public API. */
#ifndef CGRAD_IO_SAFETENSORS_INTERNAL_H
#define CGRAD_IO_SAFETENSORS_INTERNAL_H

#include "io/safetensors.h"

/* Where an image is streamed to: returns CG_OK or the sink's error. */
typedef cg_status (*cgi_st_sink)(void *ctx, const void *p, size_t n);

/* Takes ownership of a malloc'd image (freed on failure too) and validates it. */
cg_st *cgi_st_adopt(void *bytes, size_t len, const char *label);
/* Streams the image (length, padded header, data) into sink; *total gets the bytes, when not NULL. */
cg_status cgi_st_emit(cg_st_writer *w, cgi_st_sink sink, void *ctx, uint64_t *total);

/* Fails (FORMAT, both tensors and their byte ranges named) when two tensors share bytes. The
 * format allows it, but a checkpoint written by cgrad never does: there it means a damaged file. */
cg_status cgi_st_check_disjoint(const cg_st *f);

#endif
