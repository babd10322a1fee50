/* SPDX-License-Identifier: MIT */
/* The LSTM example (examples/lstm_lm.c) as a test: its forward against a plain-C LSTM written
 * from SLP chapter 9's equations, its gradients against finite differences in every variant
 * (1 and 2 layers, one and two directions, a given initial state), and the bidirectional
 * variant doing what a unidirectional one cannot. */
#include "check.h"
#define LSTM_NO_MAIN
#include "../examples/lstm_lm.c"

enum { T = 4, B = 2, V = 5, E = 3, HID = 4 };

static double sigm(double x) { return 1 / (1 + exp(-x)); }

/* Reads parameter `name` into a double array. */
static double *param(cg_params *ps, const char *name) {
    cg_tensor *t = cg_params_find(ps, name);
    cg_real *v = cg_data(t);
    double *d = malloc((size_t)cg_numel(t) * sizeof *d);
    for (int64_t i = 0; i < cg_numel(t); i++) d[i] = v[i];
    return d;
}

/* One direction of one layer in plain C: x[T][B][in] -> out[T][B][H] at column offset off of an
 * output row `width` wide. */
static void ref_direction(cg_params *ps, int layer, int dir, int in, const double *x, double *out, int width, int off) {
    char name[64];
    double *wih = param(ps, lstm_name(name, sizeof name, "weight_ih", layer, dir));
    double *whh = param(ps, lstm_name(name, sizeof name, "weight_hh", layer, dir));
    double *bih = param(ps, lstm_name(name, sizeof name, "bias_ih", layer, dir));
    double *bhh = param(ps, lstm_name(name, sizeof name, "bias_hh", layer, dir));
    double h[B][HID] = {{0}}, c[B][HID] = {{0}};
    for (int s = 0; s < T; s++) {
        const int t = dir ? T - 1 - s : s;
        for (int b = 0; b < B; b++) {
            double z[4 * HID];
            for (int r = 0; r < 4 * HID; r++) {
                z[r] = bih[r] + bhh[r];
                for (int k = 0; k < in; k++) z[r] += wih[r * in + k] * x[(t * B + b) * in + k];
                for (int k = 0; k < HID; k++) z[r] += whh[r * HID + k] * h[b][k];
            }
            for (int j = 0; j < HID; j++) {
                const double i = sigm(z[j]), f = sigm(z[HID + j]), g = tanh(z[2 * HID + j]), o = sigm(z[3 * HID + j]);
                c[b][j] = f * c[b][j] + i * g;
                h[b][j] = o * tanh(c[b][j]);
                out[(t * B + b) * width + off + j] = h[b][j];
            }
        }
    }
    free(wih), free(whh), free(bih), free(bhh);
}

static void test_forward_matches_equations(bool bidir, int layers) {
    lstm_config c = {.vocab = V, .embed = E, .hidden = HID, .layers = layers, .bidirectional = bidir};
    cg_params *ps = cg_params_new();
    cg_rng r;
    cg_rng_seed(&r, 11);
    CHECK(lstm_params(ps, &c, &r) == CG_OK, "params: %s", cg_last_error());
    int32_t ids[T * B];
    for (int i = 0; i < T * B; i++) ids[i] = (int32_t)((i * 3 + 1) % V);

    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *in = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){T, B});
    cg_tensor *logits = lstm_logits(g, ps, &c, in, NULL, NULL);
    cg_real got[T * B * V];
    CHECK(logits && !cg_write_ids(in, ids) && !cg_graph_forward(g) && !cg_read(logits, got), "run: %s",
          cg_last_error());

    const int dirs = bidir ? 2 : 1, width = HID * dirs;
    double *emb = param(ps, "embed.weight"), x[T * B * 2 * HID], y[T * B * 2 * HID];
    for (int i = 0; i < T * B; i++)
        for (int k = 0; k < E; k++) x[i * E + k] = emb[ids[i] * E + k];
    int in_dim = E;
    for (int l = 0; l < layers; l++) {
        for (int d = 0; d < dirs; d++) ref_direction(ps, l, d, in_dim, x, y, width, d * HID);
        memcpy(x, y, sizeof(double) * T * B * width);
        in_dim = width;
    }
    double *hw = param(ps, "head.weight"), *hb = param(ps, "head.bias"), worst = 0;
    for (int i = 0; i < T * B; i++)
        for (int v = 0; v < V; v++) {
            double want = hb[v];
            for (int k = 0; k < width; k++) want += hw[v * width + k] * x[i * width + k];
            worst = fmax(worst, fabs(want - got[i * V + v]));
        }
    CHECK(worst < 1e-5, "%s %d-layer LSTM logits differ from the equations by %g", bidir ? "bidirectional" : "forward",
          layers, worst);
    free(emb), free(hw), free(hb);
    cg_graph_free(g);
    cg_params_free(ps);
}

/* float32 central differences with a 1e-2 step carry about 1e-2 of truncation error through
 * the sigmoids and tanhs of a recurrence, so there the check only catches gross errors (a wrong
 * rule is off by O(1)); the float64 build checks the same gradients at 1e-6. */
#ifdef CGRAD_DOUBLE
#define LSTM_TOL CG_GRADCHECK_TOL
#else
#define LSTM_TOL 3e-2
#endif

/* Every parameter (and, when given, the initial state) against central differences. */
static void test_gradients(bool bidir, int layers, bool with_state) {
    lstm_config c = {.vocab = V, .embed = E, .hidden = HID, .layers = layers, .bidirectional = bidir};
    cg_params *ps = cg_params_new();
    cg_rng r;
    cg_rng_seed(&r, 5);
    lstm_params(ps, &c, &r);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){T, B});
    cg_tensor *tgt = cg_input(g, "targets", CG_INT32, 2, (int64_t[]){T, B});
    const int S = 2 * layers * (bidir ? 2 : 1);
    cg_tensor *state[8];
    for (int k = 0; k < S; k++) {
        state[k] = cg_requires_grad(cg_input(g, k % 2 ? "c0" : "h0", CG_REAL, 2, (int64_t[]){B, HID}));
        cg_fill_uniform(state[k], &r, -0.5, 0.5);
    }
    cg_tensor *loss = cg_cross_entropy(g, lstm_logits(g, ps, &c, ids, with_state ? state : NULL, NULL), tgt, -1);
    int32_t buf[T * B];
    for (int i = 0; i < T * B; i++) buf[i] = (int32_t)((i * 7 + 2) % V);
    cg_write_ids(ids, buf);
    for (int i = 0; i < T * B; i++) buf[i] = (int32_t)((i * 5 + 3) % V);
    cg_write_ids(tgt, buf);

    cg_tensor *inputs[64];
    int n = 0;
    for (int p = 0; p < cg_params_count(ps); p++) inputs[n++] = cg_params_at(ps, p);
    if (with_state)
        for (int k = 0; k < S; k++) inputs[n++] = state[k];
    cg_gradcheck_result res[64];
    cg_status st = loss ? cg_gradcheck(g, loss, n, inputs, 0, res) : CG_ERR_SHAPE;
    CHECK(st == CG_OK, "gradcheck: %s", cg_last_error());
    for (int i = 0; st == CG_OK && i < n; i++)
        CHECK(res[i].max_rel_err < LSTM_TOL, "%s %d-layer%s: d loss / d %s: rel err %g",
              bidir ? "bidirectional" : "forward", layers, with_state ? " with state" : "", res[i].name,
              res[i].max_rel_err);
    cg_graph_free(g);
    cg_params_free(ps);
}

/* Reversing a sequence needs the future: the bidirectional stack learns it, the unidirectional
 * one is near chance (1/8) on the first half, where the target has not been read yet. */
static void test_reversal_needs_both_directions(void) {
    int vocab = 8;
    double acc[2], half[2];
    for (int dirs = 1; dirs <= 2; dirs++) {
        lstm_config c = {.vocab = vocab, .embed = 16, .hidden = 32, .layers = 1, .bidirectional = dirs == 2};
        cg_params *ps = cg_params_new();
        cg_rng r;
        cg_rng_seed(&r, 1);
        lstm_params(ps, &c, &r);
        lstm_train_opts o = {.T = 6, .B = 32, .steps = 600, .lr = 1e-2, .seed = 2};
        double loss;
        CHECK(lstm_train(ps, &c, &o, lstm_reverse_batch, &vocab, &loss) == CG_OK, "train: %s", cg_last_error());
        acc[dirs - 1] = lstm_accuracy(ps, &c, o.T, o.B, lstm_reverse_batch, &vocab, 99, 10, &half[dirs - 1]);
        printf("%s: loss %.3f, accuracy %.3f, first half %.3f\n", dirs == 2 ? "bidirectional" : "unidirectional", loss,
               acc[dirs - 1], half[dirs - 1]);
        cg_params_free(ps);
    }
    CHECK(acc[1] > 0.9, "bidirectional accuracy %.3f", acc[1]);
    CHECK(half[0] < 0.35, "unidirectional first-half accuracy %.3f (chance is 0.125)", half[0]);
}

int main(void) {
    cg_set_threads(1); /* tiny matrices: threads only add waiting */
    for (int layers = 1; layers <= 2; layers++)
        for (int bidir = 0; bidir <= 1; bidir++) {
            test_forward_matches_equations(bidir, layers);
            test_gradients(bidir, layers, false);
        }
    test_gradients(true, 2, true);
    test_gradients(false, 1, true);
    test_reversal_needs_both_directions();
    TEST_END();
}
