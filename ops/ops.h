/* SPDX-License-Identifier: MIT */
/* cgrad ops: every function adds one node to graph g and returns it, or returns NULL and sets
 * cg_last_error() to a message naming the op and the shapes. A NULL input makes the op return
 * NULL without overwriting the first message, so a whole model can be built and checked once.
 * Outputs belong to g. Inputs may be nodes of g or parameters. Negative axes count from the end. */
#ifndef CGRAD_OPS_H
#define CGRAD_OPS_H

#include "../graph/graph.h"

CG_BEGIN_DECLS

/* ---- elementwise, NumPy broadcasting ---- */

/* a + b, broadcast. */
cg_tensor *cg_add(cg_graph *g, cg_tensor *a, cg_tensor *b);
/* a - b, broadcast. */
cg_tensor *cg_sub(cg_graph *g, cg_tensor *a, cg_tensor *b);
/* a * b, broadcast. */
cg_tensor *cg_mul(cg_graph *g, cg_tensor *a, cg_tensor *b);
/* a / b, broadcast. */
cg_tensor *cg_div(cg_graph *g, cg_tensor *a, cg_tensor *b);
/* Elementwise min(a, b), broadcast; a tie sends half the gradient to each side; NaN propagates. */
cg_tensor *cg_minimum(cg_graph *g, cg_tensor *a, cg_tensor *b);
/* Elementwise max(a, b), broadcast; a tie sends half the gradient to each side; NaN propagates. */
cg_tensor *cg_maximum(cg_graph *g, cg_tensor *a, cg_tensor *b);
/* a where the int32 cond is nonzero, else b; cond, a and b broadcast together. */
cg_tensor *cg_where(cg_graph *g, cg_tensor *cond, cg_tensor *a, cg_tensor *b);
/* s * x. */
cg_tensor *cg_scale(cg_graph *g, cg_tensor *x, double s);
/* x + s. */
cg_tensor *cg_add_scalar(cg_graph *g, cg_tensor *x, double s);
/* -x. */
cg_tensor *cg_neg(cg_graph *g, cg_tensor *x);
/* e^x. */
cg_tensor *cg_exp(cg_graph *g, cg_tensor *x);
/* Natural log of x. */
cg_tensor *cg_log(cg_graph *g, cg_tensor *x);
/* Square root of x. */
cg_tensor *cg_sqrt(cg_graph *g, cg_tensor *x);
/* x^p for a scalar exponent p. */
cg_tensor *cg_pow(cg_graph *g, cg_tensor *x, double p);
/* x * x. */
cg_tensor *cg_square(cg_graph *g, cg_tensor *x);
/* tanh(x). */
cg_tensor *cg_tanh(cg_graph *g, cg_tensor *x);
/* 1 / (1 + e^-x). */
cg_tensor *cg_sigmoid(cg_graph *g, cg_tensor *x);
/* max(x, 0). */
cg_tensor *cg_relu(cg_graph *g, cg_tensor *x);
/* Exact GELU: x * Phi(x) with the erf form (BERT). */
cg_tensor *cg_gelu(cg_graph *g, cg_tensor *x);
/* Tanh-approximated GELU (GPT-2). */
cg_tensor *cg_gelu_tanh(cg_graph *g, cg_tensor *x);
/* SiLU (swish): x * sigmoid(x). */
cg_tensor *cg_silu(cg_graph *g, cg_tensor *x);
/* Fused SwiGLU gate silu(gate) * up (same shapes; views of one packed projection are read in place). */
cg_tensor *cg_swiglu(cg_graph *g, cg_tensor *gate, cg_tensor *up);
/* log(1 + e^(beta x)) / beta (beta > 0), linear where beta x > 20, as torch.nn.Softplus. */
cg_tensor *cg_softplus(cg_graph *g, cg_tensor *x, double beta);
/* x for x > 0, alpha (e^x - 1) otherwise. */
cg_tensor *cg_elu(cg_graph *g, cg_tensor *x, double alpha);
/* x for x > 0, slope * x otherwise. */
cg_tensor *cg_leaky_relu(cg_graph *g, cg_tensor *x, double slope);
/* |x|; the gradient at 0 is 0. */
cg_tensor *cg_abs(cg_graph *g, cg_tensor *x);
/* x limited to [lo, hi] (either may be -inf / +inf); the gradient passes where lo <= x <= hi. */
cg_tensor *cg_clamp(cg_graph *g, cg_tensor *x, double lo, double hi);
/* x where mask == 0, value where mask != 0; mask is int32 and broadcasts to x. */
cg_tensor *cg_masked_fill(cg_graph *g, cg_tensor *x, cg_tensor *mask, double value);
/* Inverted dropout with probability p, seeded by the graph; identity in CG_EVAL or if p == 0. */
cg_tensor *cg_dropout(cg_graph *g, cg_tensor *x, double p);
/* int32 x as real values (masks into weights); no gradient flows into x. */
cg_tensor *cg_cast(cg_graph *g, cg_tensor *x);
/* The same values, cut off from backward. */
cg_tensor *cg_detach(cg_graph *g, cg_tensor *x);

/* ---- reductions ---- */

/* Sum over one axis; keepdim leaves it with size 1. */
cg_tensor *cg_sum(cg_graph *g, cg_tensor *x, int axis, bool keepdim);
/* Mean over one axis; keepdim leaves it with size 1. */
cg_tensor *cg_mean(cg_graph *g, cg_tensor *x, int axis, bool keepdim);
/* Max over one axis (keepdim leaves it with size 1); the gradient goes to the first maximum. */
cg_tensor *cg_max(cg_graph *g, cg_tensor *x, int axis, bool keepdim);
/* Min over one axis (keepdim leaves it with size 1); the gradient goes to the first minimum. */
cg_tensor *cg_min(cg_graph *g, cg_tensor *x, int axis, bool keepdim);
/* int32 position of the first maximum along one axis; carries no gradient. */
cg_tensor *cg_argmax(cg_graph *g, cg_tensor *x, int axis, bool keepdim);
/* log(sum(e^x)) over one axis, computed shifted by the max (no overflow). */
cg_tensor *cg_logsumexp(cg_graph *g, cg_tensor *x, int axis, bool keepdim);
/* Variance over one axis, dividing by n - correction (1: unbiased, as torch.var; 0: population). */
cg_tensor *cg_var(cg_graph *g, cg_tensor *x, int axis, bool keepdim, int correction);
/* L2 norm sqrt(sum(x^2)) over one axis; the gradient at a zero norm is 0. */
cg_tensor *cg_norm(cg_graph *g, cg_tensor *x, int axis, bool keepdim);
/* Sum of every element, a 0-d scalar. */
cg_tensor *cg_sum_all(cg_graph *g, cg_tensor *x);
/* Mean of every element, a 0-d scalar. */
cg_tensor *cg_mean_all(cg_graph *g, cg_tensor *x);

/* ---- movement: views share storage, copies say so ---- */

/* Same elements in a new shape (one entry may be -1); a view when x is contiguous, else a copy. */
cg_tensor *cg_reshape(cg_graph *g, cg_tensor *x, int ndim, const int64_t *shape);
/* View with axes a0 and a1 swapped. */
cg_tensor *cg_transpose(cg_graph *g, cg_tensor *x, int a0, int a1);
/* View with axes reordered: output axis i is input axis perm[i]. */
cg_tensor *cg_permute(cg_graph *g, cg_tensor *x, const int *perm);
/* x itself if contiguous, else a contiguous copy. */
cg_tensor *cg_contiguous(cg_graph *g, cg_tensor *x);
/* View of x[start:end] along axis (Python-style negative indices). */
cg_tensor *cg_slice(cg_graph *g, cg_tensor *x, int axis, int64_t start, int64_t end);
/* Splits x along axis into n views of the given sizes (NULL: n equal parts) into out[n]. */
cg_status cg_split(cg_graph *g, cg_tensor *x, int axis, int n, const int64_t *sizes, cg_tensor **out);
/* Joins n tensors along axis (all other dims equal) into a new contiguous tensor. */
cg_tensor *cg_concat(cg_graph *g, int n, cg_tensor *const *xs, int axis);
/* Writes x into input leaf buf at [at, at + x's size) along axis and returns buf up to there, a
 * view of buf's storage (a KV cache grows in place); inference only, no gradients. */
cg_tensor *cg_append_into(cg_graph *g, cg_tensor *buf, int64_t at, cg_tensor *x, int axis);
/* cg_append_into at an offset read from int32 at (one element) at each run, so the graph replays for
 * every decode step; returns all of buf (its first at + x's size entries along axis are meant). A run
 * whose offset does not fit fails with CG_ERR_RANGE. */
cg_tensor *cg_append_into_at(cg_graph *g, cg_tensor *buf, cg_tensor *at, cg_tensor *x, int axis);
/* View of x with a new axis of size 1 at axis (in [-ndim-1, ndim]); any strides, never a copy. */
cg_tensor *cg_unsqueeze(cg_graph *g, cg_tensor *x, int axis);
/* View of x without axis, which must have size 1; never a copy. */
cg_tensor *cg_squeeze(cg_graph *g, cg_tensor *x, int axis);
/* Joins n same-shaped tensors along a new axis (in [-ndim-1, ndim]) into a contiguous tensor. */
cg_tensor *cg_stack(cg_graph *g, int n, cg_tensor *const *xs, int axis);
/* x with before[d] and after[d] elements of value added on each side of axis d (arrays of ndim
 * entries, NULL for none). */
cg_tensor *cg_pad(cg_graph *g, cg_tensor *x, const int64_t *before, const int64_t *after, double value);
/* View [B, T, H*D] -> [B, H, T, D] for attention heads. */
cg_tensor *cg_split_heads(cg_graph *g, cg_tensor *x, int heads);
/* [B, H, T, D] -> contiguous [B, T, H*D]. */
cg_tensor *cg_merge_heads(cg_graph *g, cg_tensor *x);

/* ---- matrix products (BLIS, strided: transposed views cost no copy) ---- */

/* a[..., M, K] @ b[..., K, N] -> [..., M, N], leading dims broadcast. */
cg_tensor *cg_matmul(cg_graph *g, cg_tensor *a, cg_tensor *b);
/* x[..., in] @ w[out, in]^T + bias[out] (bias may be NULL), as torch.nn.Linear. */
cg_tensor *cg_linear(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias);
/* gelu(x @ w^T + bias) as one op (GELU's tanh form when tanh_form): bias and GELU in one pass over the
 * product, and backward's GELU gradient and bias sum in one; equal to cg_gelu(cg_linear(...)), which
 * it builds instead in a graph already set to bf16 (so the product runs in bf16). */
cg_tensor *cg_linear_gelu(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias, bool tanh_form);
/* relu(x @ w^T + bias) as one op: bias and ReLU applied to each strip of the product while it is in
 * cache, and backward's ReLU gradient (from the output's sign; no pre-activation kept) and bias sum
 * in one pass; equal to cg_relu(cg_linear(...)) bit for bit, which it builds instead in a bf16 graph. */
cg_tensor *cg_linear_relu(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias);
/* r + (x @ w^T + bias) as one op (a residual add after a projection; r has the output's shape): r
 * added to each strip of the product while it is in cache, and backward reads the sum's gradient as
 * the product's; equal bit for bit to cg_add(r, cg_linear(...)), which it builds instead in a bf16
 * graph or for a weight with a LoRA adapter. */
cg_tensor *cg_linear_add(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias, cg_tensor *r);

/* ---- normalisation and softmax (last axis) ---- */

/* Softmax over the last axis. */
cg_tensor *cg_softmax(cg_graph *g, cg_tensor *x);
/* Log-softmax over the last axis. */
cg_tensor *cg_log_softmax(cg_graph *g, cg_tensor *x);
/* Softmax over any axis, read in place through its stride. */
cg_tensor *cg_softmax_axis(cg_graph *g, cg_tensor *x, int axis);
/* Log-softmax over any axis, read in place through its stride. */
cg_tensor *cg_log_softmax_axis(cg_graph *g, cg_tensor *x, int axis);
/* Fused softmax(scale * x + mask) over the last axis of x[B, ..., Tq, Tk]: mask (real, may be
 * NULL) broadcasts to x; causal hides keys j > i + Tk - Tq; key_padding (int32 [B, Tk], may be
 * NULL) hides keys whose entry is 0. Rows with every key hidden come out as zeros. */
cg_tensor *cg_masked_softmax(cg_graph *g, cg_tensor *x, double scale, cg_tensor *mask, bool causal,
                             cg_tensor *key_padding);
/* Fused attention softmax(q k^T * scale + masks) v for q[B, H, Tq, D], k, v[B, H, Tk, D] (last
 * dims dense), masks as cg_masked_softmax: keys are visited in blocks with an online softmax, so
 * no [Tq, Tk] matrix is ever stored (memory linear in the sequence); backward recomputes the
 * blocks from the saved log-sum-exp. Returns [B, H, Tq, D]. */
cg_tensor *cg_sdpa(cg_graph *g, cg_tensor *q, cg_tensor *k, cg_tensor *v, double scale, bool causal,
                   cg_tensor *key_padding);
/* Options of cg_sdpa_ex; zero-initialise, then set what you need. */
typedef struct {
    double scale;           /* multiplies q k^T, usually 1 / sqrt(D) */
    bool causal;            /* hide keys j > i + Tk - Tq */
    cg_tensor *key_padding; /* int32 [B, Tk], 0 hides a key; or NULL */
    int64_t window;         /* sliding window: a query at position p sees keys in (p - window, p], and also up to
                               p + window - 1 when not causal (Mistral's local attention); 0: all keys */
    bool alibi;             /* ALiBi: adds -m_h |j - p| to the scores of query head h, with the paper's slopes
                               m_h = 2^(-8 (h + 1) / Hq) and BLOOM's for an Hq that is not a power of two */
    cg_tensor *rel_bias;    /* T5's relative position bias: a real table [num_buckets, Hq] (a parameter, it
                               gets a gradient), indexed by T5's bucket of j - p, bidirectional unless causal */
    int64_t rel_max_distance; /* T5's relative_attention_max_distance (0: 128) */
    cg_tensor *bias;        /* an additive real bias broadcastable to [B, Hq, Tq, Tk], or NULL; gets a gradient */
    double dropout;         /* drops attention weights with this probability in training graphs (0: none); the
                               mask is cg_dropout's counter-based hash, drawn again in backward, never stored */
    cg_tensor *past;        /* int32 [1] (any shape of one element), read at each run: only keys [0, past + Tq)
                               exist and query i sits at position past + i, so one decode graph over a whole KV
                               cache replays for every token; no gradients, bias options or key_padding; or NULL */
} cg_sdpa_opts;
/* cg_sdpa with options, and grouped-query / multi-query heads: k and v may have Hk heads with Hk
 * dividing q's Hq, query head h reading key head h / (Hq / Hk). Still no [Tq, Tk] buffer; p above
 * is the query's position i + Tk - Tq. */
cg_tensor *cg_sdpa_ex(cg_graph *g, cg_tensor *q, cg_tensor *k, cg_tensor *v, const cg_sdpa_opts *opts);
/* Settings of cg_rope; zero-initialise, then set theta (NULL config: theta 10000, all of D, half-split). */
typedef struct {
    int dims;                  /* features rotated, from the start of D (0: all of D); even */
    double theta;              /* base of the frequencies: 10000 (LLaMA 1 and 2), 500000 (LLaMA 3) */
    double linear_factor;      /* linear position scaling: positions divided by it (0 or 1: none) */
    bool interleaved;          /* pairs (2i, 2i+1), the original RoPE and Meta's LLaMA; false: (i, i + dims/2), GPT-NeoX and Hugging Face */
    double llama3_factor;      /* LLaMA 3.1 frequency scaling (Hugging Face rope_type "llama3"): factor, 0 for off */
    double llama3_low_freq_factor;  /* its low_freq_factor (1 in LLaMA 3.1) */
    double llama3_high_freq_factor; /* its high_freq_factor (4 in LLaMA 3.1) */
    int64_t llama3_original_context; /* its original_max_position_embeddings (8192 in LLaMA 3.1) */
} cg_rope_config;
/* Rotary position embedding of x[..., T, D] (e.g. [B, H, T, D] heads, strided views of a packed
 * QKV included) at positions pos_offset + t (the KV cache's length during generation); the table
 * is computed inside the op. Returns a contiguous tensor shaped as x. */
cg_tensor *cg_rope(cg_graph *g, cg_tensor *x, int64_t pos_offset, const cg_rope_config *cfg);
/* cg_rope with the offset read from the int32 pos_offset (one element) each time the graph runs, so one
 * decode graph serves every position; a negative value fails the run with CG_ERR_RANGE. */
cg_tensor *cg_rope_at(cg_graph *g, cg_tensor *x, cg_tensor *pos_offset, const cg_rope_config *cfg);
/* Fused layer norm over the last axis with gain and bias [D] (either may be NULL). */
cg_tensor *cg_layernorm(cg_graph *g, cg_tensor *x, cg_tensor *gain, cg_tensor *bias, double eps);
/* Fused RMS norm over the last axis, x / sqrt(mean(x^2) + eps) * gain (gain [D] may be NULL). */
cg_tensor *cg_rmsnorm(cg_graph *g, cg_tensor *x, cg_tensor *gain, double eps);
/* layernorm(x + r) as one op (a post-LN block's residual; r has x's shape): the sum is formed row by
 * row inside the norm's passes and backward adds the input gradient into both; equal bit for bit to
 * cg_layernorm(cg_add(x, r)), which it builds instead in a bf16 graph. */
cg_tensor *cg_add_layernorm(cg_graph *g, cg_tensor *x, cg_tensor *r, cg_tensor *gain, cg_tensor *bias, double eps);

/* ---- lookup and loss ---- */

/* Rows of weight[V, D] picked by int32 ids of any shape -> [ids..., D]; forward fails on ids
 * outside [0, V). */
cg_tensor *cg_embedding(cg_graph *g, cg_tensor *weight, cg_tensor *ids);
/* x's slices index[k] along axis (int32 index [K]) -> x's shape with K there; forward fails on
 * indices outside the axis; backward scatter-adds, deterministically. */
cg_tensor *cg_index_select(cg_graph *g, cg_tensor *x, int axis, cg_tensor *index);
/* torch.gather: out[.., j, ..] = x[.., index[.., j, ..], ..] along axis; int32 index shaped as x
 * except along axis; forward fails on indices out of range; backward scatter-adds, deterministically. */
cg_tensor *cg_gather(cg_graph *g, cg_tensor *x, int axis, cg_tensor *index);
/* Fused mean cross-entropy of logits[..., C] against int32 targets[...]; targets equal to
 * ignore_index are skipped (the mean is over the rest; 0 if none is left). Forward fails on
 * targets outside [0, C) that are not ignore_index. */
cg_tensor *cg_cross_entropy(cg_graph *g, cg_tensor *logits, cg_tensor *targets, int ignore_index);
/* cg_cross_entropy with label smoothing in [0, 1]: (1 - s) * NLL + s * mean over classes of
 * -log_softmax, as torch's CrossEntropyLoss(label_smoothing = s). */
cg_tensor *cg_cross_entropy_smooth(cg_graph *g, cg_tensor *logits, cg_tensor *targets, int ignore_index,
                                   double smoothing);
/* Mean over rows of -sum(probs * log_softmax(logits)) for real soft targets probs shaped as
 * logits[..., C]; gradients flow into both. */
cg_tensor *cg_cross_entropy_soft(cg_graph *g, cg_tensor *logits, cg_tensor *probs);
/* Mean squared error mean((pred - target)^2), same shapes; gradients flow into both. */
cg_tensor *cg_mse_loss(cg_graph *g, cg_tensor *pred, cg_tensor *target);
/* Binary cross-entropy with logits, mean over elements, real targets in [0, 1] of the same shape;
 * stable for any logit (torch's BCEWithLogitsLoss). */
cg_tensor *cg_bce_with_logits(cg_graph *g, cg_tensor *logits, cg_tensor *target);

/* Fused cross_entropy(linear(x, w, bias), targets): mean over the rows whose target is not
 * ignore_index, computed in chunks of rows so the [rows, V] logits never exist whole; rows with
 * ignored targets cost nothing (a masked-LM head touches only its 15%). Backward recomputes each
 * chunk's logits. x[..., D], w[V, D], bias[V] or NULL, int32 targets[...]. */
cg_tensor *cg_linear_cross_entropy(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias, cg_tensor *targets,
                                   int ignore_index);


/* ---- comparisons, casts, one_hot: int32 results that carry no gradient ---- */

/* int32 mask a == b (1 or 0), broadcast; a and b both real or both int32; NaN is unequal to all. */
cg_tensor *cg_eq(cg_graph *g, cg_tensor *a, cg_tensor *b);
/* int32 mask a != b, broadcast; true where either is NaN. */
cg_tensor *cg_ne(cg_graph *g, cg_tensor *a, cg_tensor *b);
/* int32 mask a < b, broadcast; false where either is NaN. */
cg_tensor *cg_lt(cg_graph *g, cg_tensor *a, cg_tensor *b);
/* int32 mask a <= b, broadcast; false where either is NaN. */
cg_tensor *cg_le(cg_graph *g, cg_tensor *a, cg_tensor *b);
/* int32 mask a > b, broadcast; false where either is NaN. */
cg_tensor *cg_gt(cg_graph *g, cg_tensor *a, cg_tensor *b);
/* int32 mask a >= b, broadcast; false where either is NaN. */
cg_tensor *cg_ge(cg_graph *g, cg_tensor *a, cg_tensor *b);
/* Real x to int32, truncated toward zero (torch's x.to(torch.int32)); forward fails on NaN, inf or a value outside int32. */
cg_tensor *cg_to_int(cg_graph *g, cg_tensor *x);
/* int32 x to real values: cg_cast under torch's name; no gradient flows into x. */
cg_tensor *cg_to_real(cg_graph *g, cg_tensor *x);
/* int32 ids[...] -> [..., num_classes] of dtype CG_REAL or CG_INT32, 1 at each id; forward fails on ids outside [0, num_classes). */
cg_tensor *cg_one_hot(cg_graph *g, cg_tensor *ids, int64_t num_classes, cg_dtype dtype);

/* ---- scans, selection and scatters along one axis ---- */

/* Running sum along axis (reverse: from the end, torch.flip(cumsum(flip(x)))), summed in double. */
cg_tensor *cg_cumsum(cg_graph *g, cg_tensor *x, int axis, bool reverse);
/* The k largest (or smallest) entries along axis, best first; NaN ranks above every number, as in
 * torch; ties go to the lower index (torch leaves their order unspecified). *values (real, may be NULL to skip) gathers x, so its
 * gradient reaches the chosen positions; *indices (int32, may be NULL) holds their positions. */
cg_status cg_topk(cg_graph *g, cg_tensor *x, int64_t k, int axis, bool largest, cg_tensor **values,
                  cg_tensor **indices);
/* torch.scatter_add: x with src[.., j, ..] added at x[.., index[.., j, ..], ..] along axis; int32 index
 * shaped as src, src shaped as x except along axis; forward fails on indices out of range; repeated
 * indices add in index order (deterministic on any thread count). */
cg_tensor *cg_scatter_add(cg_graph *g, cg_tensor *x, int axis, cg_tensor *index, cg_tensor *src);
/* torch.index_add: x with src's slice k added at slice index[k] along axis (int32 index [K], src
 * shaped as x with K along axis); forward fails on indices out of range; deterministic. */
cg_tensor *cg_index_add(cg_graph *g, cg_tensor *x, int axis, cg_tensor *index, cg_tensor *src);
/* torch's expand / broadcast_to: x's size-1 axes repeated to shape (-1 keeps an axis; new axes go
 * in front), as a view with stride 0 on the repeated axes (no copy); ops that cannot read it in place
 * get a contiguous copy, and backward sums the repeats back. Writes into it are refused. */
cg_tensor *cg_expand(cg_graph *g, cg_tensor *x, int ndim, const int64_t *shape);

/* ---- batched products ---- */

/* a[B, M, K] @ b[B, K, N] -> [B, M, N] (torch.bmm): cg_matmul's batched path, strided views read in place. */
cg_tensor *cg_bmm(cg_graph *g, cg_tensor *a, cg_tensor *b);
/* One linear per group (experts): x[E, T, in] @ w[E, out, in]^T + bias[E, out] (may be NULL) -> [E, T, out]. */
cg_tensor *cg_grouped_linear(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias);
/* One linear per segment of rows (torch._grouped_mm with offsets): rows [ends[e-1], ends[e]) of x[M, in]
 * times w[e]^T of w[E, out, in] -> [M, out], rows from ends[E-1] on 0; int32 ends[E] is read when the graph
 * runs (forward fails unless 0 <= ends[0] <= ... <= M), so the work follows the rows each segment has. */
cg_tensor *cg_segment_linear(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *ends);
/* cg_segment_linear with segment e's weight w[e][out, in] a tensor of its own (n of them), each read in place:
 * experts stored as separate parameters run without being copied into a stack. Weights that are not
 * parameters (or views of them) are stacked by cg_concat first. Reads values, not LoRA adapters. */
cg_tensor *cg_segment_linear_each(cg_graph *g, cg_tensor *x, int n, cg_tensor *const *w, cg_tensor *ends);

/* ---- convolution and pooling ---- */

/* Settings of the convolutions and cg_unfold; zero-initialise (or pass NULL) for stride 1, no
 * padding, dilation 1, one group. Index 0 is height, 1 width; conv1d reads index 0 only. */
typedef struct {
    int64_t stride[2];   /* step between windows (0: 1) */
    int64_t padding[2];  /* zeros added on both sides (conv1d: of the length) */
    int64_t dilation[2]; /* spacing of the kernel's taps (0: 1) */
    int64_t groups;      /* channels split into this many independent groups (0: 1); depthwise: groups = C */
    bool causal;         /* conv1d: pad dilation * (k - 1) zeros on the left only, so out[t] sees x up to t */
    bool relu;           /* conv2d and conv1d: max(0, .) after the bias, fused into the product when groups is 1 */
} cg_conv_opts;
/* x[N, C, L] * w[O, C/groups, k] + bias[O] (may be NULL) -> [N, O, L'], as torch's conv1d (cross-correlation). */
cg_tensor *cg_conv1d(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias, const cg_conv_opts *opts);
/* x[N, C, H, W] * w[O, C/groups, kh, kw] + bias[O] (may be NULL) -> [N, O, H', W'], as torch's conv2d. */
cg_tensor *cg_conv2d(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias, const cg_conv_opts *opts);
/* torch's F.unfold (im2col): x[N, C, H, W] -> [N, C*kh*kw, H'*W'], every kh x kw window a column
 * (opts: stride, padding, dilation; groups and causal unused). */
cg_tensor *cg_unfold(cg_graph *g, cg_tensor *x, int64_t kh, int64_t kw, const cg_conv_opts *opts);
/* Max over kernel[2] windows of x[N, C, H, W] (stride NULL or 0: the kernel; padding NULL: none, at
 * most half the kernel); the gradient goes to each window's first maximum. */
cg_tensor *cg_max_pool2d(cg_graph *g, cg_tensor *x, const int64_t *kernel, const int64_t *stride, const int64_t *padding);
/* Mean over kernel[2] windows of x[N, C, H, W], padding counted as zeros (torch's count_include_pad=True). */
cg_tensor *cg_avg_pool2d(cg_graph *g, cg_tensor *x, const int64_t *kernel, const int64_t *stride, const int64_t *padding);

CG_END_DECLS
#endif
