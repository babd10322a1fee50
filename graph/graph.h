/* SPDX-License-Identifier: MIT */
/* cgrad graph module: tensors, computation graphs, parameters, errors, threads, RNG.
 *
 * Ownership in one paragraph: a cg_graph owns every tensor built on it (nodes, their values,
 * their gradients) and frees them in cg_graph_free or cg_graph_reset. A cg_params owns the
 * parameter tensors, their values and their gradients; graphs only borrow them. */
#ifndef CGRAD_GRAPH_H
#define CGRAD_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "export.h"

CG_BEGIN_DECLS

#ifdef CGRAD_DOUBLE
typedef double cg_real; /* element type of real tensors: double in the f64 build */
#else
typedef float cg_real; /* element type of real tensors: float in the default build */
#endif

#define CG_MAX_DIMS 6 /* most dimensions a tensor can have */

/* The element type is fixed when the library is compiled, so a program compiled for the other one
 * would link and then read garbage: every file that includes this header references a symbol that
 * only the matching library defines, and a mismatch fails to link ("undefined reference to
 * cg_abi_f64": compile with -DCGRAD_DOUBLE, or link libcgrad instead of libcgrad_f64). */
#ifdef CGRAD_DOUBLE
#define CGRAD_ABI cg_abi_f64 /* the symbol libcgrad_f64 defines */
#else
#define CGRAD_ABI cg_abi_f32 /* the symbol libcgrad (float32) defines */
#endif
/* Defined only by the library whose cg_real matches this header's. */
extern const int CGRAD_ABI;
/* The reference that makes a mismatched library fail to link (one per file, kept by the compiler). */
__attribute__((used)) static const int *const cgrad_abi_ref = &CGRAD_ABI;

/* What a fallible call returns; the message is in cg_last_error(). */
typedef enum {
    CG_OK = 0,     /* success */
    CG_ERR_ARG,    /* NULL or out-of-range argument */
    CG_ERR_SHAPE,  /* shapes that do not fit the op */
    CG_ERR_RANGE,  /* a data value out of range (token id, target class) */
    CG_ERR_NOMEM,  /* allocation failed */
    CG_ERR_STATE,  /* call not valid in the object's current state */
    CG_ERR_IO,     /* file could not be read or written */
    CG_ERR_FORMAT  /* file contents are malformed */
} cg_status;

/* Element type of a tensor. */
typedef enum {
    CG_REAL = 0, /* cg_real elements */
    CG_INT32 = 1 /* int32_t elements: token ids, targets, masks */
} cg_dtype;

/* Arithmetic of a graph's matrix products (linear, matmul, the LM heads). Everything else, and
 * parameters, gradients and optimizer moments, stays cg_real whatever the setting. */
typedef enum {
    CG_FP32 = 0, /* products in cg_real on BLIS: the default, bit for bit as without the setting */
    CG_BF16 = 1  /* products take bfloat16 operands and accumulate in float (oneDNN, avx512_bf16) */
} cg_precision;

/* What a graph is built for. */
typedef enum {
    CG_TRAIN = 0, /* records what backward needs; dropout active */
    CG_EVAL = 1   /* records nothing for backward; dropout is the identity */
} cg_mode;

typedef struct cg_tensor cg_tensor; /* a node or parameter: shape, strides, value, gradient (opaque) */
typedef struct cg_graph cg_graph;   /* a computation graph and the arena its nodes live in (opaque) */
typedef struct cg_params cg_params; /* a set of named parameters in one contiguous block (opaque) */

/* ---- errors ---- */

/* Message of the last failed call on this thread ("[op] ..."); never NULL. */
const char *cg_last_error(void);
/* Status that went with cg_last_error() (CG_OK after cg_clear_error): for callers handed only a NULL. */
cg_status cg_last_status(void);
/* Clears this thread's error message and status. */
void cg_clear_error(void);
/* Short name of a status code ("shape error"). */
const char *cg_status_name(cg_status s);
/* Sets this thread's message (printf-style; "[op] shapes: reason" by convention) and returns s. */
cg_status cg_set_error(cg_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* t's shape as "[2,3]" ("(null)" for NULL), in a thread-local ring of 8 buffers: for messages. */
const char *cg_shape_str(const cg_tensor *t);
/* The sizes shape[0..ndim) as "[2,3]", in the same ring of buffers as cg_shape_str. */
const char *cg_dims_str(int ndim, const int64_t *shape);

/* ---- threads ---- */

/* Sets the threads used by every kernel and by BLIS (n <= 0: CGRAD_THREADS or the core count). */
void cg_set_threads(int n);
/* Threads kernels use now. */
int cg_threads(void);
/* Runs body(ctx) with every thread held in one team across the graph runs it makes (a loop of small
 * runs, such as token-by-token generation): thread 0 runs the graphs, the others share their
 * products and wait in between, resting when that measures slower. Returns body's status. */
cg_status cg_run_with_team(cg_status (*body)(void *ctx), void *ctx);
/* BLIS's kernel set in use ("skx", "haswell", "zen3", ...); cgrad picks it from the CPU's features
 * before BLIS's first use unless BLIS_ARCH_TYPE is set. Static storage. */
const char *cg_blas_kernels(void);
/* How the kernel set was chosen (BLIS_ARCH_TYPE, BLIS's choice, or cgrad's and why). Static storage. */
const char *cg_blas_kernels_reason(void);
/* One line for a user timing steps: cgrad and BLIS versions, kernel set and why, threads, OpenMP
 * wait policy. Static storage, rewritten by each call. */
const char *cg_runtime_info(void);
/* cgrad's version, "MAJOR.MINOR.PATCH". */
const char *cg_version(void);
/* How this library was built (precision, CPU target, compiler, OpenMP, BLIS, bf16), one line that
 * never changes for a given binary: nothing is timed or probed. Static storage. */
const char *cg_build_info(void);

/* ---- random numbers (splitmix64: one word of state, so checkpoints can store it) ---- */

/* A random generator: one word of state, copied by value. */
typedef struct {
    uint64_t state; /* the splitmix64 counter */
} cg_rng;

/* Seeds a generator. */
void cg_rng_seed(cg_rng *r, uint64_t seed);
/* Next 64 random bits. */
uint64_t cg_rng_next(cg_rng *r);
/* Uniform double in [0, 1). */
double cg_rng_uniform(cg_rng *r);
/* Standard normal double (Box-Muller). */
double cg_rng_normal(cg_rng *r);

/* ---- graphs ---- */

/* New empty graph in the given mode; NULL on allocation failure. Free with cg_graph_free. */
cg_graph *cg_graph_new(cg_mode mode);
/* Frees the graph, its nodes and all their buffers. NULL is a no-op. */
void cg_graph_free(cg_graph *g);
/* Drops every node but keeps the memory, so a rebuilt graph of the same size allocates nothing. */
void cg_graph_reset(cg_graph *g);
/* The graph's mode. */
cg_mode cg_graph_mode(const cg_graph *g);
/* Computes every node in build order; errors for data out of range (token ids, targets). */
cg_status cg_graph_forward(cg_graph *g);
/* Accumulates d(loss)/d(p) into the gradient of every trainable parameter the scalar loss
 * depends on; requires-grad inputs and all other graph gradients are recomputed from zero. */
cg_status cg_graph_backward(cg_graph *g, cg_tensor *loss);
/* Told during cg_graph_backward that param's gradient is final for this pass: the backward rule
 * of every node reading it (directly or through views) has run. Runs on the calling thread. */
typedef void (*cg_grad_ready_fn)(cg_tensor *param, void *ctx);
/* Installs fn (NULL removes it): each trainable parameter the loss depends on is reported once per
 * backward, in the order its gradient becomes final, so its reduction can start early. */
void cg_graph_on_grad_ready(cg_graph *g, cg_grad_ready_fn fn, void *ctx);
/* Sets the dropout stream: seed and step counter (each training forward advances the step). */
void cg_graph_set_rng(cg_graph *g, uint64_t seed, uint64_t step);
/* Current dropout step counter (to checkpoint it). */
uint64_t cg_graph_rng_step(const cg_graph *g);
/* Sets the precision of g's matrix products; CG_ERR_STATE (message says why) when this build or
 * CPU cannot run bf16. Primitives and bf16 scratch are made on first use and kept across resets. */
cg_status cg_graph_set_precision(cg_graph *g, cg_precision p);
/* The precision of g's matrix products. */
cg_precision cg_graph_precision(const cg_graph *g);
/* Sets the precision every graph made after this call starts with (library-made graphs too,
 * such as cg_gpt_generate's); same errors as cg_graph_set_precision. */
cg_status cg_set_precision(cg_precision p);
/* The precision new graphs start with (CG_FP32 unless cg_set_precision changed it). */
cg_precision cg_default_precision(void);
/* Why bf16 cannot run here ("this build has no oneDNN ..."), or NULL when it can. */
const char *cg_bf16_unavailable(void);
/* GFLOP/s of the bf16 product kernel in use on n x n operands (best of reps): the reference the
 * bf16 products are measured against. NAN when bf16 is unavailable. */
double cg_bf16_gemm_gflops(int64_t n, int reps);
/* The same for oneDNN's bf16 matmul whatever the kernel in use (NAN without avx512_bf16). */
double cg_bf16_onednn_gemm_gflops(int64_t n, int reps);
/* The kernel bf16 products run on: "onednn" (vdpbf16ps or AMX tiles) or "fp32" (the fp32 FMA units,
 * operands widened as they are packed); NULL when bf16 is unavailable. Decided once per process. */
const char *cg_bf16_kernel(void);
/* The measured rate of vdpbf16ps over the fp32 FMA's that decided the kernel (NAN if not measured). */
double cg_bf16_dot_ratio(void);
/* The measured rate of AMX's tdpbf16ps over the fp32 FMA's (NAN where AMX is absent or not allowed). */
double cg_bf16_amx_ratio(void);
/* Why that kernel ("vdpbf16ps slower than the fp32 FMA (measured)", "CGRAD_BF16_GEMM=fp32", ...). */
const char *cg_bf16_kernel_why(void);
/* Parses "fp32" or "bf16"; CG_ERR_ARG otherwise. */
cg_status cg_precision_parse(const char *name, cg_precision *p);
/* "fp32" or "bf16". */
const char *cg_precision_name(cg_precision p);
/* Number of nodes built so far. */
int cg_graph_size(const cg_graph *g);
/* Bytes of the block the memory plan places every value, gradient and scratch buffer in (0 before
 * the first forward plans the graph). */
size_t cg_graph_plan_bytes(const cg_graph *g);

/* ---- gradient checkpointing ---- */

/* Starts a checkpoint segment: the nodes built until cg_checkpoint_end form it (mark each
 * transformer block). Segments do not nest: CG_ERR_STATE if one is open. */
cg_status cg_checkpoint_begin(cg_graph *g);
/* Ends the open segment; CG_ERR_STATE if none is open. Forward refuses a graph with one still open. */
cg_status cg_checkpoint_end(cg_graph *g);
/* On: the plan keeps only what each segment reads from outside it through forward, and backward
 * recomputes the segment's values just before its rules run (same gradients, bit for bit, for
 * one more forward of the segments, in less memory). Off (the default): segments are ignored.
 * Either way the graph is planned anew at its next forward. */
void cg_graph_set_checkpointing(cg_graph *g, bool on);
/* Whether checkpointing is on for g. */
bool cg_graph_checkpointing(const cg_graph *g);
/* Bytes the graph holds for nodes, values and gradients. */
size_t cg_graph_bytes(const cg_graph *g);
/* Writes the graph as Graphviz DOT to path (render: dot -Tpng path -o graph.png): ops, shapes,
 * the nodes a gradient flows through, after a forward the memory plan's buffer offsets and
 * reuse, after a run under CGRAD_PROFILE each node's last times. CG_ERR_IO if path fails. */
cg_status cg_graph_dot(const cg_graph *g, const char *path);
/* True if g is not NULL and none of xs[0..n) is NULL or a node of another graph; else false, with
 * the message naming what (a NULL input keeps the message of the call that made it). */
bool cg_graph_check_inputs(cg_graph *g, const char *what, int n, cg_tensor *const *xs);

/* ---- tensors ---- */

/* New input leaf of the graph, zero-filled; fill it through cg_data/cg_idata before forward. */
cg_tensor *cg_input(cg_graph *g, const char *name, cg_dtype dtype, int ndim, const int64_t *shape);
/* Leaf that reads caller-owned memory in place (strides NULL: contiguous); data must stay valid
 * while the graph runs. For caches and zero-copy inputs. */
cg_tensor *cg_wrap(cg_graph *g, const char *name, cg_dtype dtype, int ndim, const int64_t *shape,
                   const int64_t *strides, void *data);
/* Keeps t's value (and gradient) readable after forward/backward; intermediate values otherwise
 * share memory once their last reader has run (outputs and leaves are always kept). Returns t. */
cg_tensor *cg_retain(cg_tensor *t);
/* Marks an input leaf as needing its gradient; call before using it in ops (NULL and a message
 * after: the ops built on it decided that no gradient flows). Returns t. */
cg_tensor *cg_requires_grad(cg_tensor *t);
/* Number of dimensions (0 for a scalar). */
int cg_ndim(const cg_tensor *t);
/* Size of dimension axis (negative counts from the end); -1 if out of range. */
int64_t cg_dim(const cg_tensor *t, int axis);
/* Pointer to the shape array (cg_ndim entries). */
const int64_t *cg_shape(const cg_tensor *t);
/* Pointer to the strides array, in elements. */
const int64_t *cg_strides(const cg_tensor *t);
/* Number of elements. */
int64_t cg_numel(const cg_tensor *t);
/* Element type. */
cg_dtype cg_tensor_dtype(const cg_tensor *t);
/* True when the elements are laid out row-major without gaps. */
bool cg_is_contiguous(const cg_tensor *t);
/* Name given at creation ("" for unnamed nodes). */
const char *cg_name(const cg_tensor *t);
/* First element of a real tensor (apply cg_strides); NULL before the graph is planned and for
 * intermediate nodes that are not retained. */
cg_real *cg_data(cg_tensor *t);
/* First element of an int32 tensor; NULL for real tensors. */
int32_t *cg_idata(cg_tensor *t);
/* First element of the gradient (same strides as the data): parameters, requires-grad inputs
 * and retained nodes; NULL otherwise. */
cg_real *cg_grad(cg_tensor *t);
/* Copies the elements in row-major order into dst (cg_numel entries), whatever the strides. */
cg_status cg_read(cg_tensor *t, cg_real *dst);
/* Copies the gradient in row-major order into dst; CG_ERR_STATE if it has none. */
cg_status cg_read_grad(cg_tensor *t, cg_real *dst);
/* Copies n = cg_numel values from src into a real tensor in row-major order; CG_ERR_ARG for an
 * expanded view (cg_expand), whose repeated elements share one memory location. */
cg_status cg_write(cg_tensor *t, const cg_real *src);
/* Copies n = cg_numel ids from src into an int32 tensor. */
cg_status cg_write_ids(cg_tensor *t, const int32_t *src);
/* Value of a one-element tensor; NAN, with cg_last_error saying why, if t has more elements, has no
 * value yet, or is an intermediate value that was not cg_retain'ed (NULL t: NAN). */
double cg_item(cg_tensor *t);
/* Prints shape, strides and up to 16 values to stderr. */
void cg_print(cg_tensor *t);

/* ---- parameters ---- */

/* New empty parameter set. Free with cg_params_free. */
cg_params *cg_params_new(void);
/* Frees the set and every parameter in it. NULL is a no-op. */
void cg_params_free(cg_params *ps);
/* Adds a zero-filled parameter with a gradient; NULL if the name is taken or the shape bad.
 * The set owns it. Add every parameter before building graphs on the set. */
cg_tensor *cg_params_add(cg_params *ps, const char *name, int ndim, const int64_t *shape);
/* The parameter of that name, or NULL. */
cg_tensor *cg_params_find(const cg_params *ps, const char *name);
/* Number of parameters. */
int cg_params_count(const cg_params *ps);
/* The i-th parameter in insertion order, or NULL. */
cg_tensor *cg_params_at(const cg_params *ps, int i);
/* Total number of scalar elements over all parameters. */
int64_t cg_params_numel(const cg_params *ps);
/* All values in one contiguous block, parameters in insertion order. */
cg_real *cg_params_values(cg_params *ps);
/* All gradients in one contiguous block, same order as cg_params_values. */
cg_real *cg_params_grads(cg_params *ps);
/* Elements in the values/grads blocks, padding between parameters included (padding stays 0). */
int64_t cg_params_span(const cg_params *ps);
/* Marks the set's values as changed, so bf16 copies of them are remade before their next use.
 * Optimizers, cg_write, cg_fill and cg_data (which hands out writable storage) call it. */
void cg_params_touch(cg_params *ps);
/* Zeroes every gradient of the set (lazily: the next backward overwrites instead of adding). */
void cg_params_zero_grad(cg_params *ps);
/* For gradient reducers (libcgrad_dist): zeroes the gradients cg_params_zero_grad left stale in
 * parameters first .. first + n - 1 (n < 0: all, 0: none) and returns the gradient block without
 * handing it out as cg_params_grads does, so zeroing stays lazy. Valid until the next zero_grad. */
cg_real *cg_params_grads_settled(cg_params *ps, int first, int n);
/* Freezes (false) or unfreezes (true) a parameter; call before building graphs that use it: backward
 * on a graph built while it was frozen fails with a message (rebuild it). */
void cg_param_set_trainable(cg_tensor *p, bool trainable);
/* True when t is a parameter that receives gradients. */
bool cg_param_trainable(const cg_tensor *p);

/* How a parameter's value is stored outside its set's blocks (cg_param_map). */
typedef enum {
    CG_MAP_F32 = 0,  /* float32 elements (cg_real in the default build) */
    CG_MAP_BF16 = 1, /* bfloat16 elements: the products widen them as they pack them */
    CG_MAP_F16 = 2   /* IEEE binary16 elements: likewise (F16C's conversion where the CPU has it) */
} cg_map_dtype;
/* Makes frozen parameter p read its value in place from data (its elements, row-major, in dtype),
 * which must stay valid and unchanged while the set lives (cg_params_keep). p then has no gradient
 * and can no longer be made trainable. bf16 and fp16 values are read as they are by the products of
 * linear (forward and dX, fp32 and bf16 graphs), the embedding gather and the fused LM head; a float
 * copy is made once, only when some other op reads the value (or in the float64 build).
 * A write (cg_write, cg_data) gives p a float copy of its own first. */
cg_status cg_param_map(cg_tensor *p, const void *data, cg_map_dtype dtype);
/* CG_MAP_BF16 / CG_MAP_F16 while p's value is read in place as half and has no float copy, else CG_MAP_F32. */
cg_map_dtype cg_param_storage(const cg_tensor *p);
/* Calls release(obj) when ps is freed (after its parameters): ties the storage of mapped
 * parameters (an open file) to the set's life. */
cg_status cg_params_keep(cg_params *ps, void (*release)(void *), void *obj);
/* Moves every frozen parameter out of the value and gradient blocks into storage of its own with
 * no gradient, and packs the trainable ones into new blocks: cg_params_span and the moments of an
 * optimizer made afterwards cover trainable parameters alone. Frozen parameters stay frozen for
 * good. Block pointers handed out before (cg_params_values, cg_params_grads) are stale after it. */
cg_status cg_params_compact(cg_params *ps);
/* Bytes of parameter values the set holds in memory of its own (its blocks' parameters, moved ones,
 * float copies of mapped ones); *mapped (may be NULL) gets the bytes read in place from files. */
int64_t cg_params_value_bytes(const cg_params *ps, int64_t *mapped);
/* Bytes of gradient storage the set's parameters hold (frozen ones out of the blocks hold none). */
int64_t cg_params_grad_bytes(const cg_params *ps);
/* While on, cg_fill* on the set's parameters records the fill instead of writing (advancing the
 * generator as it would); a value loaded or written meanwhile cancels it. Turning it off runs the
 * fills still pending, drawing exactly what they would have drawn. Loaders use it so that a model
 * about to be read from a file does not first draw every weight. */
void cg_params_defer_init(cg_params *ps, bool on);

/* ---- initialisation ---- */

/* Fills a real tensor (any strides) with a constant; an expanded view (cg_expand) is refused with a
 * message in cg_last_error() and left unchanged, as by the two below. */
void cg_fill(cg_tensor *t, double value);
/* Fills with normal(mean, std) draws from r, in row-major order. */
void cg_fill_normal(cg_tensor *t, cg_rng *r, double mean, double std);
/* Fills with uniform draws in [lo, hi) from r, in row-major order. */
void cg_fill_uniform(cg_tensor *t, cg_rng *r, double lo, double hi);

CG_END_DECLS
#endif
