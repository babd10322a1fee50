/* SPDX-License-Identifier: MIT */
/* lstm_lm: a new architecture defined in C from public ops alone, an LSTM (Jurafsky & Martin,
 * SLP chapter 9), with no backward written by hand.
 *
 * Per time step, per layer and direction (gate order i, f, g, o and parameter names as in
 * torch.nn.LSTM, so weights move between the two unchanged):
 *     z   = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh          [B, 4H]
 *     i   = sigmoid(z_i)   f = sigmoid(z_f)   g = tanh(z_g)   o = sigmoid(z_o)
 *     c_t = f * c_{t-1} + i * g
 *     h_t = o * tanh(c_t)
 * Sequences are time-major, [T, B, ...]: the input products of all steps are one linear over
 * [T, B, E], and step t's slice of it is a contiguous view, so the recurrence copies nothing.
 * Layers stack (layer l reads layer l-1's outputs); a bidirectional layer runs a second LSTM
 * from t = T-1 down to 0 and joins both outputs along the last axis, [T, B, 2H].
 *
 * The program trains a character-level language model (unidirectional, it must not see the
 * future) on a text file and samples from it, feeding the state back one character at a time
 * through a T = 1 graph. `lstm_lm --reverse` trains the bidirectional variant on a tagging task
 * that needs the future: output the input sequence reversed. A unidirectional LSTM cannot do
 * the first half of it; the bidirectional one can. tests/test_example_lstm.c gradient-checks
 * every variant (float64 build: 1e-6) and runs both tasks.
 * Define LSTM_NO_MAIN to include this file without its main (the test does). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cgrad/cgrad.h>

typedef struct {
    int vocab, embed, hidden, layers;
    bool bidirectional;
} lstm_config;

static int lstm_dirs(const lstm_config *c) { return c->bidirectional ? 2 : 1; }

/* "lstm.weight_ih_l0_reverse" and the like, torch.nn.LSTM's names. */
static const char *lstm_name(char *buf, size_t n, const char *what, int layer, int dir) {
    snprintf(buf, n, "lstm.%s_l%d%s", what, layer, dir ? "_reverse" : "");
    return buf;
}

/* Registers every parameter, initialised as torch does: U(-1/sqrt(H), 1/sqrt(H)) for the LSTM
 * and the head, N(0, 1) for the embedding. */
static cg_status lstm_params(cg_params *ps, const lstm_config *c, cg_rng *r) {
    const int64_t H = c->hidden, G = 4 * H;
    const double k = 1 / sqrt((double)H);
    cg_tensor *t = cg_params_add(ps, "embed.weight", 2, (int64_t[]){c->vocab, c->embed});
    if (!t) return CG_ERR_ARG;
    cg_fill_normal(t, r, 0, 1);
    for (int l = 0; l < c->layers; l++)
        for (int d = 0; d < lstm_dirs(c); d++) {
            const int64_t in = l == 0 ? c->embed : H * lstm_dirs(c);
            char name[64];
            cg_tensor *p[4] = {
                cg_params_add(ps, lstm_name(name, sizeof name, "weight_ih", l, d), 2, (int64_t[]){G, in}),
                cg_params_add(ps, lstm_name(name, sizeof name, "weight_hh", l, d), 2, (int64_t[]){G, H}),
                cg_params_add(ps, lstm_name(name, sizeof name, "bias_ih", l, d), 1, (int64_t[]){G}),
                cg_params_add(ps, lstm_name(name, sizeof name, "bias_hh", l, d), 1, (int64_t[]){G})};
            for (int i = 0; i < 4; i++) {
                if (!p[i]) return CG_ERR_ARG;
                cg_fill_uniform(p[i], r, -k, k);
            }
        }
    cg_tensor *w = cg_params_add(ps, "head.weight", 2, (int64_t[]){c->vocab, H * lstm_dirs(c)});
    cg_tensor *b = cg_params_add(ps, "head.bias", 1, (int64_t[]){c->vocab});
    if (!w || !b) return CG_ERR_ARG;
    const double kh = 1 / sqrt((double)(H * lstm_dirs(c)));
    cg_fill_uniform(w, r, -kh, kh);
    cg_fill_uniform(b, r, -kh, kh);
    return CG_OK;
}

/* One direction of one layer over x[T, B, in]. h0 and c0 ([B, H]) may be NULL for a zero state;
 * the last state goes to *h_last and *c_last when they are not NULL. Returns [T, B, H]. */
static cg_tensor *lstm_direction(cg_graph *g, cg_params *ps, const lstm_config *c, int layer, int dir, cg_tensor *x,
                                 cg_tensor *h0, cg_tensor *c0, cg_tensor **h_last, cg_tensor **c_last) {
    char name[64];
    const int64_t T = cg_dim(x, 0), B = cg_dim(x, 1), H = c->hidden;
    cg_tensor *w_ih = cg_params_find(ps, lstm_name(name, sizeof name, "weight_ih", layer, dir));
    cg_tensor *w_hh = cg_params_find(ps, lstm_name(name, sizeof name, "weight_hh", layer, dir));
    cg_tensor *b_ih = cg_params_find(ps, lstm_name(name, sizeof name, "bias_ih", layer, dir));
    cg_tensor *b_hh = cg_params_find(ps, lstm_name(name, sizeof name, "bias_hh", layer, dir));
    cg_tensor *xw = cg_linear(g, x, w_ih, b_ih); /* every step's input product at once */
    if (!xw || T < 1) return NULL;
    cg_tensor **hs = malloc((size_t)T * sizeof *hs);
    if (!hs) return NULL;
    cg_tensor *h = h0, *cell = c0;
    for (int64_t s = 0; s < T; s++) {
        const int64_t t = dir ? T - 1 - s : s;
        cg_tensor *z = cg_reshape(g, cg_slice(g, xw, 0, t, t + 1), 2, (int64_t[]){B, 4 * H});
        z = h ? cg_add(g, z, cg_linear(g, h, w_hh, b_hh)) : cg_add(g, z, b_hh);
        cg_tensor *i = cg_sigmoid(g, cg_slice(g, z, 1, 0, H));
        cg_tensor *f = cg_sigmoid(g, cg_slice(g, z, 1, H, 2 * H));
        cg_tensor *gg = cg_tanh(g, cg_slice(g, z, 1, 2 * H, 3 * H));
        cg_tensor *o = cg_sigmoid(g, cg_slice(g, z, 1, 3 * H, 4 * H));
        cell = cell ? cg_add(g, cg_mul(g, f, cell), cg_mul(g, i, gg)) : cg_mul(g, i, gg);
        h = cg_mul(g, o, cg_tanh(g, cell));
        hs[t] = cg_reshape(g, h, 3, (int64_t[]){1, B, H});
    }
    cg_tensor *out = cg_concat(g, (int)T, hs, 0);
    free(hs);
    if (h_last) *h_last = h;
    if (c_last) *c_last = cell;
    return out;
}

/* The stack over x[T, B, E]: returns [T, B, H * dirs]. state_in (may be NULL) holds h0, c0 per
 * layer and direction, 2 * layers * dirs tensors; state_out (may be NULL) receives the last
 * ones in the same order. */
static cg_tensor *lstm_stack(cg_graph *g, cg_params *ps, const lstm_config *c, cg_tensor *x, cg_tensor *const *state_in,
                             cg_tensor **state_out) {
    const int dirs = lstm_dirs(c);
    for (int l = 0; l < c->layers && x; l++) {
        cg_tensor *outs[2];
        for (int d = 0; d < dirs; d++) {
            const int k = 2 * (l * dirs + d);
            outs[d] = lstm_direction(g, ps, c, l, d, x, state_in ? state_in[k] : NULL, state_in ? state_in[k + 1] : NULL,
                                     state_out ? &state_out[k] : NULL, state_out ? &state_out[k + 1] : NULL);
        }
        x = dirs == 2 ? cg_concat(g, 2, outs, 2) : outs[0];
    }
    return x;
}

/* Logits [T, B, V] for int32 ids[T, B]. */
static cg_tensor *lstm_logits(cg_graph *g, cg_params *ps, const lstm_config *c, cg_tensor *ids,
                              cg_tensor *const *state_in, cg_tensor **state_out) {
    cg_tensor *x = cg_embedding(g, cg_params_find(ps, "embed.weight"), ids);
    cg_tensor *h = lstm_stack(g, ps, c, x, state_in, state_out);
    return cg_linear(g, h, cg_params_find(ps, "head.weight"), cg_params_find(ps, "head.bias"));
}

/* ---- training ---- */

typedef struct {
    int64_t T, B, steps;
    double lr;
    uint64_t seed;
    bool verbose;
} lstm_train_opts;

/* Fills ids[T, B] and targets[T, B] for step `step`: a language-model batch of random windows
 * from text (targets are the next characters) or, with text NULL, the reversal task. */
typedef void (*lstm_batch_fn)(void *ctx, cg_rng *r, int64_t T, int64_t B, int32_t *ids, int32_t *targets);

/* The reversal task: random tokens in [0, V); the target at t is the token at T-1-t. */
static void lstm_reverse_batch(void *ctx, cg_rng *r, int64_t T, int64_t B, int32_t *ids, int32_t *targets) {
    const int V = *(const int *)ctx;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) ids[t * B + b] = (int32_t)(cg_rng_next(r) % (uint64_t)V);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) targets[t * B + b] = ids[(T - 1 - t) * B + b];
}

/* Trains with AdamW (clip 1.0); the mean loss of the last 20 steps goes to *final_loss.
 * The graph is built once; each step writes new ids and re-runs it. */
static cg_status lstm_train(cg_params *ps, const lstm_config *c, const lstm_train_opts *o, lstm_batch_fn batch,
                            void *ctx, double *final_loss) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){o->T, o->B});
    cg_tensor *tgt = cg_input(g, "targets", CG_INT32, 2, (int64_t[]){o->T, o->B});
    cg_tensor *loss = cg_cross_entropy(g, lstm_logits(g, ps, c, ids, NULL, NULL), tgt, -1);
    cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
    oc.weight_decay = 0;
    cg_optim *opt = loss ? cg_optim_new(ps, &oc) : NULL;
    int32_t *buf = malloc((size_t)(2 * o->T * o->B) * sizeof *buf);
    cg_status st = !loss ? CG_ERR_SHAPE : !opt || !buf ? CG_ERR_NOMEM : CG_OK;
    cg_rng r;
    cg_rng_seed(&r, o->seed);
    double recent = 0;
    int nrecent = 0;
    for (int64_t step = 1; st == CG_OK && step <= o->steps; step++) {
        batch(ctx, &r, o->T, o->B, buf, buf + o->T * o->B);
        if ((st = cg_write_ids(ids, buf)) || (st = cg_write_ids(tgt, buf + o->T * o->B))) break;
        if ((st = cg_graph_forward(g))) break;
        cg_params_zero_grad(ps);
        if ((st = cg_graph_backward(g, loss))) break;
        cg_clip_grad_norm(ps, 1.0);
        if ((st = cg_optim_step(opt, o->lr))) break;
        const double l = cg_item(loss);
        if (step > o->steps - 20) recent += l, nrecent++;
        if (o->verbose && (step % 100 == 0 || step == 1)) printf("step %5lld  loss %.4f\n", (long long)step, l);
    }
    if (final_loss) *final_loss = nrecent ? recent / nrecent : NAN;
    free(buf);
    cg_optim_free(opt);
    cg_graph_free(g);
    return st;
}

/* Fraction of targets the model tags right on `batches` fresh batches of the task. */
static double lstm_accuracy(cg_params *ps, const lstm_config *c, int64_t T, int64_t B, lstm_batch_fn batch, void *ctx,
                            uint64_t seed, int batches, double *first_half) {
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){T, B});
    cg_tensor *logits = lstm_logits(g, ps, c, ids, NULL, NULL);
    int32_t *buf = malloc((size_t)(2 * T * B) * sizeof *buf);
    cg_real *out = malloc((size_t)(T * B * c->vocab) * sizeof *out);
    int64_t hits = 0, total = 0, hits1 = 0, total1 = 0;
    cg_rng r;
    cg_rng_seed(&r, seed);
    for (int k = 0; logits && buf && out && k < batches; k++) {
        batch(ctx, &r, T, B, buf, buf + T * B);
        if (cg_write_ids(ids, buf) || cg_graph_forward(g) || cg_read(logits, out)) break;
        for (int64_t i = 0; i < T * B; i++) {
            int best = 0;
            for (int v = 1; v < c->vocab; v++) best = out[i * c->vocab + v] > out[i * c->vocab + best] ? v : best;
            const bool hit = best == buf[T * B + i];
            hits += hit, total++;
            if (i / B < T / 2) hits1 += hit, total1++;
        }
    }
    free(buf);
    free(out);
    cg_graph_free(g);
    if (first_half) *first_half = total1 ? (double)hits1 / total1 : NAN;
    return total ? (double)hits / total : NAN;
}

#ifndef LSTM_NO_MAIN
typedef struct {
    const unsigned char *text;
    int64_t n;
    const int32_t *id_of; /* byte -> vocabulary id */
} lstm_text;

static void lstm_text_batch(void *ctx, cg_rng *r, int64_t T, int64_t B, int32_t *ids, int32_t *targets) {
    const lstm_text *d = ctx;
    for (int64_t b = 0; b < B; b++) {
        const int64_t at = (int64_t)(cg_rng_next(r) % (uint64_t)(d->n - T - 1));
        for (int64_t t = 0; t < T; t++) {
            ids[t * B + b] = d->id_of[d->text[at + t]];
            targets[t * B + b] = d->id_of[d->text[at + t + 1]];
        }
    }
}

/* Samples n characters from the language model, one step at a time: a T = 1, B = 1 graph whose
 * state inputs are written with the last step's state outputs. */
static void lstm_sample(cg_params *ps, const lstm_config *c, const unsigned char *chars, int n, uint64_t seed) {
    const int S = 2 * c->layers;
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){1, 1});
    cg_tensor *in[64], *out[64];
    for (int k = 0; k < S; k++) in[k] = cg_input(g, "state", CG_REAL, 2, (int64_t[]){1, c->hidden});
    cg_tensor *logits = lstm_logits(g, ps, c, ids, in, out);
    for (int k = 0; k < S; k++) cg_retain(out[k]);
    cg_real probs[256], state[1024];
    int32_t id = 0;
    cg_rng r;
    cg_rng_seed(&r, seed);
    for (int i = 0; logits && i < n && c->hidden <= 1024; i++) {
        if (cg_write_ids(ids, &id) || cg_graph_forward(g) || cg_read(logits, probs)) break;
        for (int k = 0; k < S; k++) { /* the state carries over to the next character */
            cg_read(out[k], state);
            cg_write(in[k], state);
        }
        double mx = probs[0], sum = 0;
        for (int v = 1; v < c->vocab; v++) mx = probs[v] > mx ? probs[v] : mx;
        for (int v = 0; v < c->vocab; v++) sum += probs[v] = (cg_real)exp(probs[v] - mx);
        double u = cg_rng_uniform(&r) * sum;
        for (id = 0; id < c->vocab - 1 && (u -= probs[id]) > 0; id++) {}
        putchar(chars[id]);
    }
    putchar('\n');
    cg_graph_free(g);
}

int main(int argc, char **argv) {
    const bool reverse = argc > 1 && !strcmp(argv[1], "--reverse");
    const char *path = argc > 1 && !reverse ? argv[1] : "data/moby-dick.txt";
    cg_params *ps = cg_params_new();
    cg_rng r;
    cg_rng_seed(&r, 1);
    if (reverse) {
        int V = 8;
        for (int dirs = 1; dirs <= 2; dirs++) {
            lstm_config c = {.vocab = V, .embed = 16, .hidden = 64, .layers = 2, .bidirectional = dirs == 2};
            cg_params *p = cg_params_new();
            lstm_params(p, &c, &r);
            lstm_train_opts o = {.T = 8, .B = 32, .steps = 1500, .lr = 1e-2, .seed = 2, .verbose = false};
            double loss, half;
            if (lstm_train(p, &c, &o, lstm_reverse_batch, &V, &loss)) {
                fprintf(stderr, "lstm_lm: %s\n", cg_last_error());
                return 1;
            }
            double acc = lstm_accuracy(p, &c, o.T, o.B, lstm_reverse_batch, &V, 99, 20, &half);
            printf("%s, 2 layers: loss %.3f, accuracy %.1f%% (first half of the sequence %.1f%%)\n",
                   dirs == 2 ? "bidirectional " : "unidirectional", loss, 100 * acc, 100 * half);
            cg_params_free(p);
        }
        cg_params_free(ps);
        return 0;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "lstm_lm: cannot open %s (run ./setup.sh for data/moby-dick.txt, or pass a text file)\n", path);
        return 2;
    }
    static unsigned char text[1 << 22];
    const int64_t n = (int64_t)fread(text, 1, sizeof text, f);
    fclose(f);
    int32_t id_of[256] = {0};
    unsigned char chars[256];
    bool seen[256] = {false};
    for (int64_t i = 0; i < n; i++) seen[text[i]] = true;
    int V = 0;
    for (int b = 0; b < 256; b++)
        if (seen[b]) chars[V] = (unsigned char)b, id_of[b] = V++;
    if (n < 1000) {
        fprintf(stderr, "lstm_lm: %s holds %lld bytes; need at least 1000\n", path, (long long)n);
        return 2;
    }
    lstm_config c = {.vocab = V, .embed = 32, .hidden = 256, .layers = 2, .bidirectional = false};
    if (lstm_params(ps, &c, &r)) return 1;
    lstm_text d = {text, n, id_of};
    lstm_train_opts o = {.T = 64, .B = 16, .steps = 1000, .lr = 2e-3, .seed = 3, .verbose = true};
    printf("%s: %lld bytes, %d characters; 2-layer LSTM, hidden 256, %lld parameters\n", path, (long long)n, V,
           (long long)cg_params_numel(ps));
    double loss;
    if (lstm_train(ps, &c, &o, lstm_text_batch, &d, &loss)) {
        fprintf(stderr, "lstm_lm: %s\n", cg_last_error());
        return 1;
    }
    printf("mean loss of the last 20 steps: %.4f nats/char\nsample: ", loss);
    lstm_sample(ps, &c, chars, 300, 7);
    cg_params_free(ps);
    return 0;
}
#endif
