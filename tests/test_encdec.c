/* SPDX-License-Identifier: MIT */
/* Encoder-decoder decoding: greedy decoding equals an argmax loop over the full teacher-forced
 * forward, beam search with one beam equals greedy, and a wider beam never finds a worse
 * length-normalised score than greedy (scores recomputed independently from full forwards). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "../models/encdec.h"
#include "check.h"

static cg_encdec_config tiny(void) {
    cg_encdec_config c = {.src_vocab_size = 12, .tgt_vocab_size = 9, .d_model = 16, .n_head = 2,
                          .num_encoder_layers = 2, .num_decoder_layers = 2, .dim_feedforward = 32, .max_len = 24,
                          .pad_id = 0, .bos_id = 1, .eos_id = 2, .layer_norm_eps = 1e-5};
    return c;
}

/* log-probabilities of every next token after bos + prefix, from a full forward */
static void next_logp(const cg_encdec *m, const int32_t *src, int64_t ns, const int32_t *prefix, int64_t np,
                      double *logp) {
    const cg_encdec_config *c = cg_encdec_cfg(m);
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *s = cg_input(g, "src", CG_INT32, 2, (int64_t[]){1, ns});
    cg_tensor *t = cg_input(g, "tgt", CG_INT32, 2, (int64_t[]){1, np + 1});
    memcpy(cg_idata(s), src, (size_t)ns * sizeof(int32_t));
    cg_idata(t)[0] = (int32_t)c->bos_id;
    memcpy(cg_idata(t) + 1, prefix, (size_t)np * sizeof(int32_t));
    cg_tensor *lp = cg_log_softmax(g, cg_encdec_logits(g, m, s, NULL, t));
    CHECK(lp && cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
    for (int64_t j = 0; j < c->tgt_vocab_size; j++) logp[j] = cg_data(lp)[np * c->tgt_vocab_size + j];
    cg_graph_free(g);
}

static double score(const cg_encdec *m, const int32_t *src, int64_t ns, const int32_t *out, int64_t n, bool ended) {
    double lp[64], total = 0;
    int32_t seq[64];
    memcpy(seq, out, (size_t)n * sizeof *seq);
    int64_t len = n + (ended ? 1 : 0);
    if (ended) seq[n] = (int32_t)cg_encdec_cfg(m)->eos_id;
    for (int64_t i = 0; i < len; i++) {
        next_logp(m, src, ns, seq, i, lp);
        total += lp[seq[i]];
    }
    return total / (double)(len ? len : 1);
}

int main(void) {
    cg_encdec_config c = tiny();
    cg_params *ps = cg_params_new();
    cg_encdec *m = cg_encdec_new(&c, ps, 3);
    CHECK(m != NULL, "%s", cg_last_error());
    cg_rng r;
    cg_rng_seed(&r, 9);
    for (int i = 0; i < cg_params_count(ps); i++) { /* spread the distributions */
        cg_tensor *p = cg_params_at(ps, i);
        if (cg_ndim(p) == 2) cg_fill_normal(p, &r, 0, 0.5);
    }
    const int32_t srcs[3][6] = {{3, 4, 5, 6, 7, 8}, {9, 3, 3, 10, 11, 4}, {5, 5, 5, 6, 6, 6}};
    for (int k = 0; k < 3; k++) {
        int32_t greedy[24], beam1[24], beam4[24], manual[24];
        int64_t ng = 0, nb1 = 0, nb4 = 0, nm = 0;
        CHECK(cg_encdec_translate(m, srcs[k], 6, 1, 10, greedy, &ng) == CG_OK, "%s", cg_last_error());
        CHECK(cg_encdec_translate(m, srcs[k], 6, 1, 10, beam1, &nb1) == CG_OK, "%s", cg_last_error());
        CHECK(cg_encdec_translate(m, srcs[k], 6, 4, 10, beam4, &nb4) == CG_OK, "%s", cg_last_error());
        bool ended = false;
        for (; nm < 10; nm++) { /* argmax over full forwards */
            double lp[16];
            next_logp(m, srcs[k], 6, manual, nm, lp);
            int32_t best = 0;
            for (int j = 1; j < c.tgt_vocab_size; j++)
                if (lp[j] > lp[best]) best = j;
            if (best == c.eos_id) {
                ended = true;
                break;
            }
            manual[nm] = best;
        }
        CHECK(ng == nm && !memcmp(greedy, manual, (size_t)ng * sizeof *greedy), "source %d: greedy (%lld tokens) differs from the argmax loop (%lld)", k, (long long)ng, (long long)nm);
        CHECK(nb1 == ng && !memcmp(beam1, greedy, (size_t)ng * sizeof *greedy), "source %d: one beam must equal greedy", k);
        bool ended4 = nb4 < 10;
        double sg = score(m, srcs[k], 6, greedy, ng, ended), s4 = score(m, srcs[k], 6, beam4, nb4, ended4);
        CHECK(s4 >= sg - 1e-4, "source %d: beam 4 score %g below greedy %g", k, s4, sg);
    }
    /* A beam wider than the target vocabulary: each hypothesis has only 9 extensions, and the
     * search must use those, never an id past them (it once decoded id -1). */
    for (int k = 0; k < 3; k++) {
        int32_t wide[24], greedy[24];
        int64_t nw = 0, ng = 0;
        CHECK(cg_encdec_translate(m, srcs[k], 6, 20, 10, wide, &nw) == CG_OK, "beam 20 over 9 ids: %s", cg_last_error());
        CHECK(cg_encdec_translate(m, srcs[k], 6, 1, 10, greedy, &ng) == CG_OK, "%s", cg_last_error());
        bool in_range = nw >= 0 && nw <= 10;
        for (int64_t i = 0; in_range && i < nw; i++) in_range = wide[i] >= 0 && wide[i] < c.tgt_vocab_size;
        CHECK(in_range, "source %d: beam 20 decoded %lld tokens, ids outside [0, %lld)", k, (long long)nw,
              (long long)c.tgt_vocab_size);
        if (in_range) {
            const double sw = score(m, srcs[k], 6, wide, nw, nw < 10), sg = score(m, srcs[k], 6, greedy, ng, ng < 10);
            CHECK(sw >= sg - 1e-4, "source %d: beam 20 score %g below greedy %g", k, sw, sg);
        }
    }
    int32_t out[4];
    int64_t n;
    CHECK(cg_encdec_translate(m, srcs[0], 100, 1, 4, out, &n) == CG_ERR_ARG && strstr(cg_last_error(), "max_len"),
          "%s", cg_last_error());
    cg_encdec_free(m);
    cg_params_free(ps);
    TEST_END();
}
