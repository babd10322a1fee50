/* SPDX-License-Identifier: MIT */
/* safetensors files: an 8-byte little-endian header length N, N bytes of JSON header
 * {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the
 * byte buffer the offsets point into. Readers validate the whole header when they open a file, so
 * later reads only fail on a caller's shape or dtype mismatch. Assumes a little-endian host (checked
 * at compile time). Every message names the file (or the label of a memory image). */
#ifndef CGRAD_SAFETENSORS_H
#define CGRAD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../graph/graph.h"

CG_BEGIN_DECLS

/* ---- reading ---- */

typedef struct cg_st cg_st; /* an opened safetensors file or memory image, read-only */

/* Opens and validates a file, memory-mapped (so it must not be truncated while open); NULL +
 * cg_last_error() if unreadable or corrupt. */
cg_st *cg_st_open(const char *path);
/* Validates a copy of the len bytes (the caller keeps bytes); label names it in messages, NULL
 * gives "<memory>". NULL + cg_last_error() if corrupt. */
cg_st *cg_st_open_memory(const void *bytes, size_t len, const char *label);
/* Opens a sharded model: the index (model.safetensors.index.json) and every shard its "weight_map"
 * names, beside it, as one view (tensors from all shards; no metadata). Fails naming the index and
 * the shard when a shard is missing, a tensor is not where the index says, sits in two shards or
 * is listed twice. Close with cg_st_close. */
cg_st *cg_st_open_index(const char *index);
/* Opens the weights of a Hugging Face model directory: model.safetensors, else the sharded
 * model.safetensors.index.json. */
cg_st *cg_st_open_model(const char *dir);
/* Closes f and frees everything it holds (names from cg_st_name die with it). NULL is a no-op. */
void cg_st_close(cg_st *f);
/* Number of tensors (the __metadata__ entry is not one). */
int cg_st_count(const cg_st *f);
/* Name of the i-th tensor, tensors sorted by name (strcmp); NULL if i is out of range. */
const char *cg_st_name(const cg_st *f, int i);
/* Index of the tensor called name, or -1. */
int cg_st_find(const cg_st *f, const char *name);
/* Stores the dtype ("F32", static string), ndim and shape (CG_MAX_DIMS entries) of a tensor; any
 * output may be NULL. CG_ERR_ARG if absent, CG_ERR_SHAPE if it has more than CG_MAX_DIMS dims. */
cg_status cg_st_info(const cg_st *f, const char *name, const char **dtype, int *ndim, int64_t *shape);
/* The __metadata__ value for key (owned by f), or NULL. */
const char *cg_st_metadata(const cg_st *f, const char *key);
/* Reads a F32/F64/F16/BF16/F8_E4M3/F8_E5M2 tensor into dst (numel cg_real, row-major), converting;
 * fails (naming file, tensor, expected and found shape) unless the shape equals ndim/shape; ndim < 0
 * skips the check. */
cg_status cg_st_read(const cg_st *f, const char *name, cg_real *dst, int ndim, const int64_t *shape);
/* Reads an integer tensor (I64, I32, I16, I8, U64, U32, U16, U8, BOOL) into int32 dst, failing
 * (dst then partly written) on a value outside int32; shape check as cg_st_read. */
cg_status cg_st_read_ids(const cg_st *f, const char *name, int32_t *dst, int ndim, const int64_t *shape);
/* Reads every parameter of ps from the tensor of the same name through one cg_st_load (every
 * check below), so on failure no parameter has changed. Tensors without a parameter are ignored. */
cg_status cg_st_read_params(const cg_st *f, cg_params *ps);

/* ---- loading parameters: one set of checks for every source ----
 * Every weight load (a .ckpt, a Hugging Face directory, a LoRA adapter file) lists which stored
 * tensor fills which parameter, and which stored tensors are tied twins of a parameter, then runs
 * the list. cg_st_load_run checks every entry before it writes a byte: the tensor exists, has a
 * floating dtype and the parameter's exact shape, its byte range lies inside its file's data and
 * overlaps no other entry's range in that file, its values are finite, no parameter is filled
 * twice, and a tied twin equals the tensor that fills its parameter in shape and value. Only then
 * are the values converted into the parameters; a refused load leaves every parameter as it was.
 * A new source of weights (several shard files, an adapter format) plugs in by opening its files
 * with cg_st_open and adding one entry per parameter, each naming its own file; one that reads
 * the bytes in place calls cg_st_load_check instead of cg_st_load_run. */
typedef struct cg_st_load cg_st_load; /* a planned weight load: its entries are checked together, then written */

/* A new empty load; NULL on allocation failure. Free with cg_st_load_free. */
cg_st_load *cg_st_load_new(void);
/* Plans filling parameter p from the tensor called name in f (f must stay open until the run;
 * name is copied). CG_ERR_ARG on a NULL argument, CG_ERR_NOMEM; nothing is checked yet. */
cg_status cg_st_load_add(cg_st_load *l, cg_tensor *p, const cg_st *f, const char *name);
/* Plans checking that the tensor called name in f (a tied duplicate, as GPT-2's lm_head.weight)
 * equals, in shape and value, the tensor the load fills p from; it is not written anywhere. */
cg_status cg_st_load_tie(cg_st_load *l, cg_tensor *p, const cg_st *f, const char *name);
/* Checks every entry (see above) and writes nothing: for a source that then uses the checked
 * bytes in place (a memory-mapped file) instead of converting them. Errors as cg_st_load_run. */
cg_status cg_st_load_check(cg_st_load *l);
/* Checks every entry (see above), then writes the parameters. Errors name the file, the tensor,
 * the parameter and the offending shape, dtype, byte range or value; then nothing was written.
 * A frozen parameter (cg_param_set_trainable false) whose tensor is BF16, or F32 in the float32
 * build, is not copied: it reads the file's mapping in place (cg_param_map), and its set keeps the
 * file open until it is freed. */
cg_status cg_st_load_run(cg_st_load *l);
/* Frees the load (not the files or parameters). NULL is a no-op. */
void cg_st_load_free(cg_st_load *l);

/* ---- writing ---- */

/* Collects tensors and metadata, then writes them; data is copied when added. Real tensors are
 * written as cg_real: F32 in the default build, F64 in the CGRAD_DOUBLE build, so a round trip is
 * exact in both. The header lists __metadata__ first, then tensors sorted by name, their data laid
 * out in the same order, and is space-padded to a multiple of 8 bytes. */
typedef struct cg_st_writer cg_st_writer;

/* New empty writer; NULL on allocation failure. Free with cg_st_writer_free. */
cg_st_writer *cg_st_writer_new(void);
/* Adds a real tensor, copying numel values from data now (F32, or F64 in the f64 build). */
cg_status cg_st_add(cg_st_writer *w, const char *name, int ndim, const int64_t *shape, const cg_real *data);
/* Adds t's current values (any strides); int32 tensors are written as I32. */
cg_status cg_st_add_tensor(cg_st_writer *w, const char *name, cg_tensor *t);
/* Adds an int32 tensor as I32, copying data now. */
cg_status cg_st_add_ids(cg_st_writer *w, const char *name, int ndim, const int64_t *shape, const int32_t *data);
/* Adds every parameter of ps under its own name. */
cg_status cg_st_add_params(cg_st_writer *w, cg_params *ps);
/* Sets a __metadata__ entry (both strings copied), replacing an earlier value for key. */
cg_status cg_st_set_metadata(cg_st_writer *w, const char *key, const char *value);
/* Writes the image to path (plain, not atomic); on failure path may hold a partial file. */
cg_status cg_st_write(cg_st_writer *w, const char *path);
/* Stores the whole image in *bytes (malloc'd, the caller frees) and its size in *len. */
cg_status cg_st_serialize(cg_st_writer *w, void **bytes, size_t *len);
/* Frees the writer and its copies of the data. NULL is a no-op. */
void cg_st_writer_free(cg_st_writer *w);

CG_END_DECLS
#endif
