/* SPDX-License-Identifier: MIT */
/* Bad input of every kind returns NULL or a status, with a message that names the op and the
 * offending shapes or values; NULL inputs pass through without hiding the first message; nothing
 * crashes. */
#include <math.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define NEEDLES(...) (const char *const[]){__VA_ARGS__, NULL}

/* Every needle must occur in the current error message. */
static void expect_msg(const char *what, const char *const *needles) {
    const char *m = cg_last_error();
    for (int i = 0; needles[i]; i++)
        CHECK(strstr(m, needles[i]) != NULL, "%s: message \"%s\" lacks \"%s\"", what, m, needles[i]);
}

/* An op call that must return NULL with the given words in its message. */
#define FAILS(call, ...)                                                      \
    do {                                                                      \
        cg_clear_error();                                                     \
        const void *r_ = (call);                                              \
        CHECK(r_ == NULL, "%s returned a tensor", #call);                     \
        expect_msg(#call, NEEDLES(__VA_ARGS__));                              \
    } while (0)

/* A call returning a cg_status that must be st, with the given words in its message. */
#define FAILS_WITH(st, call, ...)                                                                     \
    do {                                                                                              \
        cg_clear_error();                                                                             \
        cg_status s_ = (call);                                                                        \
        CHECK(s_ == (st), "%s returned %d (%s), expected %s", #call, (int)s_, cg_status_name(s_), #st); \
        expect_msg(#call, NEEDLES(__VA_ARGS__));                                                      \
    } while (0)

static cg_tensor *real(cg_graph *g, int nd, const int64_t *s) { return cg_input(g, "x", CG_REAL, nd, s); }
static cg_tensor *ints(cg_graph *g, int nd, const int64_t *s) { return cg_input(g, "ids", CG_INT32, nd, s); }

static void test_shapes(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *a23 = real(g, 2, S(2, 3)), *a24 = real(g, 2, S(2, 4)), *b4 = real(g, 1, S(4)), *b45 = real(g, 2, S(4, 5));
    FAILS(cg_add(g, a23, b4), "[add]", "a[2,3]", "b[4]", "broadcast");
    FAILS(cg_mul(g, a23, a24), "[mul]", "[2,3]", "[2,4]");
    FAILS(cg_matmul(g, a23, b45), "[matmul]", "a[2,3]", "b[4,5]", "3 != 4");
    FAILS(cg_matmul(g, b4, b45), "[matmul]", "a[4]", "2 dims");
    FAILS(cg_matmul(g, real(g, 3, S(2, 3, 4)), real(g, 3, S(3, 4, 5))), "[matmul]", "[2,3,4]", "[3,4,5]", "batch");
    FAILS(cg_linear(g, a23, b45, NULL), "[linear]", "x[2,3]", "w[4,5]");
    FAILS(cg_linear(g, a24, real(g, 2, S(5, 4)), real(g, 1, S(4))), "[linear]", "bias[4]", "[5]", "w[5,4]");
    FAILS(cg_linear(g, a24, b4, NULL), "[linear]", "w[4]");
    FAILS(cg_concat(g, 2, (cg_tensor *[]){a23, a24}, 0), "[concat]", "input 1[2,4]", "input 0[2,3]");
    FAILS(cg_concat(g, 2, (cg_tensor *[]){a23, b4}, 1), "[concat]", "input 1[4]");
    FAILS(cg_concat(g, 0, NULL, 0), "[concat]", "at least one");
    FAILS(cg_layernorm(g, a24, real(g, 1, S(5)), NULL, 1e-5), "[layernorm]", "gain[5]", "[4]", "x[2,4]");
    FAILS(cg_layernorm(g, a24, NULL, real(g, 2, S(1, 4)), 1e-5), "[layernorm]", "bias[1,4]");
    FAILS(cg_layernorm(g, a24, NULL, NULL, -1), "[layernorm]", "eps");
    FAILS(cg_layernorm(g, a24, NULL, NULL, NAN), "[layernorm]", "eps");
    cg_tensor *logits = real(g, 3, S(2, 3, 5));
    FAILS(cg_cross_entropy(g, logits, ints(g, 2, S(3, 2)), -100), "[cross_entropy]", "logits[2,3,5]", "[3,2]");
    FAILS(cg_cross_entropy(g, logits, ints(g, 3, S(2, 3, 5)), -100), "[cross_entropy]", "[2,3,5]");
    FAILS(cg_cross_entropy(g, logits, real(g, 2, S(2, 3)), -100), "[cross_entropy]", "real [2,3]");
    cg_tensor *scores = real(g, 4, S(2, 3, 5, 7));
    FAILS(cg_masked_softmax(g, scores, 1, NULL, false, ints(g, 2, S(2, 6))), "[masked_softmax]", "key_padding[2,6]",
          "[2, 7]", "x[2,3,5,7]");
    FAILS(cg_masked_softmax(g, scores, 1, NULL, false, ints(g, 2, S(3, 7))), "[masked_softmax]", "key_padding[3,7]");
    FAILS(cg_masked_softmax(g, scores, 1, NULL, false, real(g, 2, S(2, 7))), "[masked_softmax]", "key_padding[2,7]");
    FAILS(cg_masked_softmax(g, real(g, 2, S(5, 7)), 1, NULL, false, ints(g, 2, S(5, 7))), "[masked_softmax]",
          "x[5,7]");
    FAILS(cg_masked_softmax(g, scores, 1, real(g, 2, S(5, 6)), false, NULL), "[masked_softmax]", "mask[5,6]",
          "x[2,3,5,7]");
    FAILS(cg_masked_softmax(g, scores, 1, real(g, 5, S(2, 2, 3, 5, 7)), false, NULL), "[masked_softmax]",
          "mask[2,2,3,5,7]");
    FAILS(cg_masked_softmax(g, real(g, 1, S(7)), 1, NULL, true, NULL), "[masked_softmax]", "x[7]");
    FAILS(cg_masked_fill(g, a23, ints(g, 2, S(3, 2)), 0), "[masked_fill]", "mask[3,2]", "x[2,3]");
    FAILS(cg_masked_fill(g, a23, real(g, 2, S(2, 3)), 0), "[masked_fill]", "mask[2,3]", "int32");
    FAILS(cg_reshape(g, a23, 2, S(4, 2)), "[reshape]", "x[2,3]", "6 elements", "[4,2]");
    FAILS(cg_reshape(g, a23, 2, S(-1, 4)), "[reshape]", "[-1,4]");
    FAILS(cg_reshape(g, a23, 2, S(-1, -1)), "[reshape]", "[-1,-1]");
    FAILS(cg_reshape(g, a23, 7, S(1, 1, 1, 1, 1, 2, 3)), "[reshape]", "7 dims");
    FAILS(cg_split_heads(g, real(g, 3, S(2, 5, 12)), 5), "[split_heads]", "x[2,5,12]", "H = 5");
    FAILS(cg_split_heads(g, a23, 3), "[split_heads]", "x[2,3]");
    FAILS(cg_merge_heads(g, a23), "[merge_heads]", "x[2,3]");
    FAILS(cg_embedding(g, b4, ints(g, 1, S(3))), "[embedding]", "weight[4]");
    FAILS(cg_input(g, "big", CG_REAL, 7, S(1, 1, 1, 1, 1, 1, 1)), "[input]", "7 dims");
    FAILS(cg_input(g, "neg", CG_REAL, 2, S(2, -3)), "[input]", "[2,-3]");
    FAILS(cg_input(g, "noshape", CG_REAL, 2, NULL), "[input]", "NULL");
    FAILS(cg_input(g, "dtype", (cg_dtype)7, 1, S(2)), "[input]", "dtype 7");
    cg_graph_free(g);
}

static void test_axes(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = real(g, 2, S(2, 3)), *out[3];
    FAILS(cg_sum(g, x, 2, false), "[sum]", "axis 2", "x[2,3]");
    FAILS(cg_mean(g, x, -3, true), "[mean]", "axis -3", "x[2,3]");
    FAILS(cg_sum(g, real(g, 0, NULL), 0, false), "[sum]", "axis 0", "x[]");
    FAILS(cg_slice(g, x, 5, 0, 1), "[slice]", "axis 5", "x[2,3]");
    FAILS(cg_slice(g, x, 1, 2, 5), "[slice]", "x[2,3]", "[2, 5)");
    FAILS(cg_slice(g, x, 1, 2, 1), "[slice]", "[2, 1)");
    FAILS(cg_slice(g, x, 0, -5, 1), "[slice]", "[-5, 1)");
    FAILS(cg_transpose(g, x, 0, 2), "[transpose]", "axis 2", "x[2,3]");
    FAILS(cg_transpose(g, x, -3, 0), "[transpose]", "axis -3");
    FAILS(cg_permute(g, x, (const int[]){0, 0}), "[permute]", "x[2,3]", "perm[1] = 0");
    FAILS(cg_permute(g, x, (const int[]){0, 2}), "[permute]", "perm[1] = 2");
    FAILS(cg_permute(g, x, NULL), "[permute]", "NULL");
    FAILS(cg_concat(g, 2, (cg_tensor *[]){x, x}, 2), "[concat]", "axis 2");
    FAILS_WITH(CG_ERR_SHAPE, cg_split(g, x, 2, 2, NULL, out), "[split]", "axis 2", "x[2,3]");
    CHECK(out[0] == NULL && out[1] == NULL, "a failed split leaves NULL outputs");
    FAILS_WITH(CG_ERR_SHAPE, cg_split(g, x, 1, 2, NULL, out), "[split]", "x[2,3]", "axis 1", "2 parts");
    FAILS_WITH(CG_ERR_SHAPE, cg_split(g, x, 1, 2, S(1, 1), out), "[split]", "x[2,3]");
    FAILS_WITH(CG_ERR_SHAPE, cg_split(g, x, 1, 2, S(5, -2), out), "[slice]", "[0, 5)");
    FAILS_WITH(CG_ERR_ARG, cg_split(g, x, 1, 0, NULL, out), "[split]", "n > 0");
    FAILS(cg_softmax(g, real(g, 0, NULL)), "[softmax]", "x[]");
    FAILS(cg_layernorm(g, real(g, 0, NULL), NULL, NULL, 1e-5), "[layernorm]", "x[]");
    cg_graph_free(g);
}

static void test_null_and_graphs(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN), *other = cg_graph_new(CG_TRAIN);
    cg_tensor *x = real(g, 2, S(2, 3)), *y = real(other, 2, S(2, 3)), *ids = ints(g, 1, S(2)), *out[2];
    cg_params *ps = cg_params_new();
    cg_tensor *w = cg_params_add(ps, "w", 2, S(4, 3));

    FAILS(cg_add(NULL, x, x), "[add]", "graph is NULL");
    FAILS(cg_matmul(NULL, x, w), "[matmul]", "graph is NULL");
    FAILS(cg_input(NULL, "x", CG_REAL, 1, S(2)), "[input]", "graph is NULL");
    FAILS(cg_layernorm(NULL, x, NULL, NULL, 1e-5), "[layernorm]", "graph is NULL");
    FAILS_WITH(CG_ERR_ARG, cg_graph_forward(NULL), "[forward]", "NULL");
    FAILS_WITH(CG_ERR_ARG, cg_graph_backward(NULL, x), "[backward]", "NULL");
    FAILS_WITH(CG_ERR_ARG, cg_split(NULL, x, 0, 2, NULL, out), "[split]", "graph is NULL");

    FAILS(cg_add(g, x, y), "[add]", "input 1[2,3]", "another graph");
    FAILS(cg_linear(g, y, w, NULL), "[linear]", "another graph");
    FAILS(cg_masked_softmax(g, x, 1, y, false, NULL), "[masked_softmax]", "another graph");
    FAILS(cg_concat(g, 2, (cg_tensor *[]){x, y}, 0), "[concat]", "input 1", "another graph");
    FAILS(cg_embedding(other, w, ids), "[embedding]", "input 1[2]", "another graph");
    FAILS_WITH(CG_ERR_ARG, cg_graph_backward(g, cg_sum_all(other, y)), "[backward]", "another graph");

    /* A NULL input: the op returns NULL and keeps the message of the op that failed first. */
    cg_clear_error();
    cg_tensor *bad = cg_matmul(g, x, x);
    CHECK(bad == NULL, "matmul [2,3] @ [2,3] must fail");
    char first[1024];
    snprintf(first, sizeof first, "%s", cg_last_error());
    CHECK(strstr(first, "[matmul]") && strstr(first, "3 != 2"), "first message: %s", first);
    const void *results[] = {
        cg_add(g, bad, x), cg_sub(g, x, bad), cg_mul(g, bad, bad), cg_div(g, bad, x), cg_scale(g, bad, 2),
        cg_add_scalar(g, bad, 1), cg_neg(g, bad), cg_exp(g, bad), cg_log(g, bad), cg_sqrt(g, bad), cg_pow(g, bad, 2),
        cg_square(g, bad), cg_tanh(g, bad), cg_sigmoid(g, bad), cg_relu(g, bad), cg_gelu(g, bad), cg_gelu_tanh(g, bad),
        cg_masked_fill(g, bad, ids, 0), cg_masked_fill(g, x, NULL, 0), cg_dropout(g, bad, 0.1), cg_detach(g, bad),
        cg_sum(g, bad, 0, false), cg_mean(g, bad, 0, true), cg_sum_all(g, bad), cg_mean_all(g, bad),
        cg_reshape(g, bad, 1, S(6)), cg_transpose(g, bad, 0, 1), cg_permute(g, bad, (const int[]){1, 0}),
        cg_contiguous(g, bad), cg_slice(g, bad, 0, 0, 1), cg_concat(g, 2, (cg_tensor *[]){x, bad}, 0),
        cg_split_heads(g, bad, 1), cg_merge_heads(g, bad), cg_matmul(g, x, bad), cg_linear(g, bad, w, NULL),
        cg_linear(g, x, bad, NULL), cg_softmax(g, bad), cg_log_softmax(g, bad),
        cg_masked_softmax(g, bad, 1, NULL, true, NULL), cg_layernorm(g, bad, NULL, NULL, 1e-5),
        cg_embedding(g, bad, ids), cg_embedding(g, w, NULL), cg_cross_entropy(g, bad, ids, -1),
        cg_cross_entropy(g, x, NULL, -1), cg_requires_grad(NULL),
    };
    int not_null = 0;
    for (size_t i = 0; i < sizeof results / sizeof results[0]; i++)
        if (results[i]) not_null++, fprintf(stderr, "  op %zu of the NULL-input list returned a tensor\n", i);
    CHECK(not_null == 0, "%d ops turned a NULL input into a tensor", not_null);
    CHECK(cg_split(g, bad, 0, 2, NULL, out) != CG_OK && out[0] == NULL, "split of NULL");
    CHECK(strcmp(first, cg_last_error()) == 0, "a NULL input overwrote the first message with \"%s\"", cg_last_error());
    CHECK(isnan(cg_item(NULL)) && cg_numel(NULL) == 0 && cg_ndim(NULL) == -1 && cg_dim(NULL, 0) == -1,
          "accessors of NULL");
    CHECK(cg_data(NULL) == NULL && cg_grad(NULL) == NULL && cg_shape(NULL) == NULL && strcmp(cg_name(NULL), "") == 0,
          "more accessors of NULL");
    cg_fill(NULL, 1);
    cg_print(NULL);
    cg_graph_free(NULL);
    cg_params_free(NULL);
    cg_graph_reset(NULL);
    cg_params_zero_grad(NULL);
    cg_param_set_trainable(NULL, false);
    cg_graph_free(g);
    cg_graph_free(other);
    cg_params_free(ps);
}

static void test_dtypes(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *iv = ints(g, 2, S(2, 3)), *x = real(g, 2, S(2, 3)), *w = real(g, 2, S(5, 3));
    FAILS(cg_exp(g, iv), "[exp]", "x[2,3]", "int32");
    FAILS(cg_add(g, x, iv), "[add]", "b[2,3]", "int32");
    FAILS(cg_matmul(g, iv, real(g, 2, S(3, 2))), "[matmul]", "a[2,3]", "int32");
    FAILS(cg_sum(g, iv, 0, false), "[sum]", "int32");
    FAILS(cg_softmax(g, iv), "[softmax]", "int32");
    FAILS(cg_layernorm(g, iv, NULL, NULL, 1e-5), "[layernorm]", "int32");
    FAILS(cg_embedding(g, w, x), "[embedding]", "ids[2,3]", "int32");
    FAILS(cg_embedding(g, iv, iv), "[embedding]", "weight[2,3]", "int32");
    FAILS(cg_cross_entropy(g, iv, ints(g, 1, S(2)), -1), "[cross_entropy]", "logits[2,3]", "int32");
    FAILS(cg_concat(g, 2, (cg_tensor *[]){x, iv}, 0), "[concat]", "int32");
    FAILS(cg_requires_grad(iv), "[requires_grad]", "[2,3]");
    cg_params *ps = cg_params_new();
    FAILS(cg_requires_grad(cg_params_add(ps, "p", 1, S(3))), "[requires_grad]", "param[3]");
    cg_params_free(ps);
    FAILS_WITH(CG_ERR_ARG, cg_write(iv, (const cg_real[]){0, 0, 0, 0, 0, 0}), "[write]", "[2,3]", "int32");
    FAILS_WITH(CG_ERR_ARG, cg_write_ids(x, (const int32_t[]){0, 0, 0, 0, 0, 0}), "[write_ids]", "[2,3]");
    cg_real buf[6];
    FAILS_WITH(CG_ERR_ARG, cg_read(iv, buf), "[read]", "int32");
    FAILS_WITH(CG_ERR_ARG, cg_read(x, NULL), "[read]", "NULL");
    FAILS_WITH(CG_ERR_ARG, cg_write(NULL, buf), "[write]", "NULL");
    FAILS_WITH(CG_ERR_STATE, cg_read_grad(x, buf), "[read_grad]", "[2,3]", "no gradient");
    CHECK(cg_data(iv) == NULL && cg_idata(x) == NULL, "typed accessors return NULL for the other dtype");
    cg_graph_free(g);
}

static void test_data_ranges(void) {
    cg_params *ps = cg_params_new();
    cg_tensor *wte = cg_params_add(ps, "wte", 2, S(5, 3));
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *ids = ints(g, 2, S(2, 2));
    cg_tensor *emb = cg_embedding(g, wte, ids);
    cg_write_ids(ids, (const int32_t[]){0, 4, 9, 1});
    CHECK(emb != NULL, "embedding: %s", cg_last_error());
    FAILS_WITH(CG_ERR_RANGE, cg_graph_forward(g), "[embedding]", "id 9", "position 2", "ids[2,2]", "[0, 5)");
    cg_write_ids(ids, (const int32_t[]){0, -1, 2, 1});
    FAILS_WITH(CG_ERR_RANGE, cg_graph_forward(g), "[embedding]", "id -1", "position 1", "[0, 5)");
    cg_write_ids(ids, (const int32_t[]){0, 4, 2, 1});
    CHECK(cg_graph_forward(g) == CG_OK, "fixed ids run: %s", cg_last_error());
    cg_graph_free(g);

    g = cg_graph_new(CG_TRAIN);
    cg_tensor *logits = cg_requires_grad(real(g, 2, S(3, 4))), *tg = ints(g, 1, S(3));
    cg_tensor *loss = cg_cross_entropy(g, logits, tg, -100);
    cg_write_ids(tg, (const int32_t[]){1, 4, -100});
    FAILS_WITH(CG_ERR_RANGE, cg_graph_forward(g), "[cross_entropy]", "target 4", "position 1", "[0, 4)", "-100");
    cg_write_ids(tg, (const int32_t[]){-7, 0, -100});
    FAILS_WITH(CG_ERR_RANGE, cg_graph_forward(g), "[cross_entropy]", "target -7", "position 0");
    cg_write_ids(tg, (const int32_t[]){3, 0, -100});
    CHECK(cg_graph_forward(g) == CG_OK && fabs(cg_item(loss) - log(4.0)) < 1e-5, "fixed targets: loss %g",
          cg_item(loss));
    cg_graph_free(g);
    cg_params_free(ps);
}

static void test_backward_states(void) {
    cg_params *ps = cg_params_new();
    cg_tensor *w = cg_params_add(ps, "w", 2, S(3, 2));
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = real(g, 2, S(2, 3));
    cg_tensor *h = cg_matmul(g, x, w), *loss = cg_sum_all(g, h), *plain = cg_sum_all(g, x);
    FAILS_WITH(CG_ERR_STATE, cg_graph_backward(g, loss), "[backward]", "forward first");
    CHECK(cg_graph_forward(g) == CG_OK, "forward: %s", cg_last_error());
    FAILS_WITH(CG_ERR_SHAPE, cg_graph_backward(g, h), "[backward]", "scalar", "[2,2]");
    FAILS_WITH(CG_ERR_STATE, cg_graph_backward(g, plain), "[backward]", "no trainable");
    FAILS_WITH(CG_ERR_ARG, cg_graph_backward(g, NULL), "[backward]", "NULL");
    cg_tensor *late = cg_scale(g, loss, 2); /* built after the last forward */
    FAILS_WITH(CG_ERR_STATE, cg_graph_backward(g, late), "[backward]", "forward first");
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, late) == CG_OK, "after a new forward: %s",
          cg_last_error());
    cg_graph_free(g);

    cg_graph *e = cg_graph_new(CG_EVAL);
    x = real(e, 2, S(2, 3));
    loss = cg_sum_all(e, cg_matmul(e, x, w));
    CHECK(cg_graph_forward(e) == CG_OK, "eval forward: %s", cg_last_error());
    FAILS_WITH(CG_ERR_STATE, cg_graph_backward(e, loss), "[backward]", "eval");
    cg_graph_free(e);

    /* gradcheck refuses what it cannot check */
    g = cg_graph_new(CG_TRAIN);
    x = real(g, 2, S(2, 3));
    cg_gradcheck_result res[1];
    FAILS_WITH(CG_ERR_ARG, cg_gradcheck(g, cg_sum_all(g, x), 1, (cg_tensor *[]){x}, 0, res), "[gradcheck]",
               "input 0");
    cg_graph_free(g);
    cg_params_free(ps);
}

static void test_params_and_args(void) {
    cg_params *ps = cg_params_new();
    CHECK(cg_params_add(ps, "w", 2, S(3, 2)) != NULL, "add w: %s", cg_last_error());
    FAILS(cg_params_add(ps, "w", 1, S(4)), "[params_add]", "'w'", "taken");
    FAILS(cg_params_add(ps, "z", 2, S(3, 0)), "[params_add]", "'z'", "[3,0]");
    FAILS(cg_params_add(ps, "n", 1, S(-2)), "[params_add]", "[-2]");
    FAILS(cg_params_add(ps, "big", 7, S(1, 1, 1, 1, 1, 1, 1)), "[params_add]", "7 dims");
    FAILS(cg_params_add(ps, NULL, 1, S(2)), "[params_add]", "NULL");
    FAILS(cg_params_add(NULL, "q", 1, S(2)), "[params_add]", "NULL");
    CHECK(cg_params_count(ps) == 1 && cg_params_numel(ps) == 6, "failed adds leave the set as it was");
    CHECK(cg_params_find(ps, "nope") == NULL && cg_params_at(ps, 1) == NULL && cg_params_at(ps, -1) == NULL,
          "lookups that miss return NULL");

    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = real(g, 2, S(2, 3));
    FAILS(cg_dropout(g, x, 1.5), "[dropout]", "p = 1.5");
    FAILS(cg_dropout(g, x, 1), "[dropout]", "p = 1");
    FAILS(cg_dropout(g, x, -0.1), "[dropout]", "p = -0.1");
    FAILS(cg_dropout(g, x, NAN), "[dropout]", "p = nan");
    cg_graph_free(g);
    CHECK(strcmp(cg_status_name(CG_ERR_SHAPE), "shape error") == 0 && cg_status_name((cg_status)99) != NULL,
          "status names");
    cg_params_free(ps);
}

int main(void) {
    test_shapes();
    test_axes();
    test_null_and_graphs();
    test_dtypes();
    test_data_ranges();
    test_backward_states();
    test_params_and_args();
    TEST_END();
}
