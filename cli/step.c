/* SPDX-License-Identifier: MIT */
/* cgrad step: one forward and backward of a zoo model on a batch file, every output dumped to a
 * safetensors file for comparison with any framework; optionally N AdamW steps on the batch. */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cgrad.h"
#include "cli/commands.h"
#include "io/safetensors.h"
#include "models/config_json.h"
#include "models/zoo.h"
#include "optim/optim.h"

const cli_opt cli_step_opts[] = {
    {"--arch", CLI_STR, 0, 0, "gpt2|bert|encdec|classifier|llama"},
    {"--config", CLI_IN, 0, 0, "model config.json"},
    {"--weights", CLI_IN, 0, 0, "safetensors weights"},
    {"--batch", CLI_IN, 0, 0, "safetensors batch (the graph inputs by name)"},
    {"--out", CLI_OUT, 0, 0, "safetensors file the outputs go to"},
    {"--dot", CLI_OUT, 0, 0, "Graphviz DOT file the step's graph goes to (memory plan, CGRAD_PROFILE times)"},
    {"--steps", CLI_INT, 0, 1 << 20, "AdamW steps on the batch after the dump (0)"},
    {"--optim", CLI_STR, 0, 0, "adamw"},
    {"--lr", CLI_NUM, DBL_TRUE_MIN, DBL_MAX, "learning rate (1e-3)"},
    {"--beta1", CLI_NUM, 0, CLI_BELOW_1, "AdamW beta1 (0.9)"},
    {"--beta2", CLI_NUM, 0, CLI_BELOW_1, "AdamW beta2 (0.999)"},
    {"--eps", CLI_NUM, DBL_TRUE_MIN, DBL_MAX, "AdamW epsilon (1e-8)"},
    {"--weight-decay", CLI_NUM, 0, DBL_MAX, "AdamW weight decay (0.01)"},
    {"--threads", CLI_INT, 1, 1024, "threads (CGRAD_THREADS or all cores)"},
    CLI_PRECISION,
    {"--checkpoint-activations", CLI_BARE, 0, 0, "recompute each block's activations in backward"},
    {NULL, CLI_BARE, 0, 0, NULL}};

static int fail(const char *what) {
    fprintf(stderr, "cgrad step: %s%s%s\n", what, *cg_last_error() ? ": " : "", cg_last_error());
    return 1;
}

/* Fills every graph input from the batch tensor of the same name. */
static cg_status fill_inputs(const cg_model_graph *mg, const cg_st *batch) {
    for (int i = 0; i < mg->n_inputs; i++) {
        cg_tensor *in = mg->inputs[i];
        cg_status s = cg_st_read_ids(batch, cg_name(in), cg_idata(in), cg_ndim(in), cg_shape(in));
        if (s) return s;
    }
    return CG_OK;
}

int cmd_step(int argc, char **argv) {
    cli_args a;
    if (!cli_parse("step", cli_step_opts, argc, argv, &a) || !cli_words(&a, 0, 0, NULL)) return 2;
    const char *arch_s = cli_str(&a, "--arch", NULL), *cfg_path = cli_str(&a, "--config", NULL),
               *w_path = cli_str(&a, "--weights", NULL), *b_path = cli_str(&a, "--batch", NULL),
               *out_path = cli_str(&a, "--out", NULL), *dot_path = cli_str(&a, "--dot", NULL);
    if (!cli_require(&a, "--arch", "gpt2|bert|encdec|classifier|llama") || !cli_require(&a, "--config", "config.json") ||
        !cli_require(&a, "--weights", "w.safetensors") || !cli_require(&a, "--batch", "b.safetensors"))
        return 2;
    if (!out_path && !dot_path) {
        fprintf(stderr, "cgrad step: --out o.safetensors or --dot graph.dot is required (cgrad step --help)\n");
        return 2;
    }
    if (cli_has(&a, "--threads")) cg_set_threads((int)cli_int(&a, "--threads", 0));
    const int prc = cli_set_precision(&a, "fp32");
    if (prc) return prc;
    const int steps = (int)cli_int(&a, "--steps", 0);
    const char *optim_s = cli_str(&a, "--optim", NULL);
    cg_arch arch;
    if ((optim_s && strcmp(optim_s, "adamw")) || cg_arch_parse(arch_s, &arch)) {
        fprintf(stderr, "cgrad step: %s\n", optim_s && strcmp(optim_s, "adamw") ? "only --optim adamw is supported" : cg_last_error());
        return 2;
    }
    char *cfg = cgi_read_text(cfg_path, NULL);
    if (!cfg) return fail("cannot read the config");
    cg_params *ps = cg_params_new();
    cg_model *m = cg_model_new(arch, cfg, 0.0, ps, 0);
    free(cfg);
    cg_model_set_full_logits(m, true); /* the dump holds every position's logits */
    cg_st *w = m ? cg_st_open(w_path) : NULL, *batch = w ? cg_st_open(b_path) : NULL;
    int rc = 0;
    cg_graph *g = NULL;
    cg_st_writer *out = NULL;
    cg_optim *opt = NULL;
    cg_real *losses = NULL;
    if (!m || !w || !batch || cg_model_load(m, w)) {
        rc = fail("cannot set up the model");
        goto done;
    }
    /* Batch and sequence sizes come from the batch file itself. */
    int ndim;
    int64_t shape[CG_MAX_DIMS], src_shape[CG_MAX_DIMS] = {0, 0};
    const char *main_name = arch == CG_ARCH_ENCDEC ? "tgt_in" : "input_ids";
    if (cg_st_info(batch, main_name, NULL, &ndim, shape) || ndim != 2 ||
        (arch == CG_ARCH_ENCDEC && (cg_st_info(batch, "src", NULL, &ndim, src_shape) || ndim != 2))) {
        rc = fail("the batch needs 2-D input tensors");
        goto done;
    }
    if (shape[0] < 1 || shape[1] < 1 || (arch == CG_ARCH_ENCDEC && src_shape[1] < 1)) { /* a loss of 0 over nothing */
        fprintf(stderr, "cgrad step: %s: %s is [%lld, %lld]: a batch needs at least one row of at least one token\n",
                b_path, main_name, (long long)shape[0], (long long)shape[1]);
        rc = 1;
        goto done;
    }
    g = cg_graph_new(CG_TRAIN);
    cg_model_graph mg;
    if (!g || cg_model_build(g, m, shape[0], shape[1], src_shape[1], &mg) || fill_inputs(&mg, batch)) {
        rc = fail("cannot build the step");
        goto done;
    }
    cg_graph_set_checkpointing(g, cli_has(&a, "--checkpoint-activations"));
    cg_retain(mg.logits); /* dumped after backward */
    out = cg_st_writer_new();
    cg_params_zero_grad(ps);
    if (cg_graph_forward(g) || cg_graph_backward(g, mg.loss)) {
        rc = fail("step failed");
        goto done;
    }
    /* the graph after one step: its memory plan, and its times under CGRAD_PROFILE */
    if (dot_path && cg_graph_dot(g, dot_path)) {
        rc = fail("cannot write the graph");
        goto done;
    }
    cg_status st = cg_st_add_tensor(out, "logits", mg.logits);
    cg_real loss = (cg_real)cg_item(mg.loss);
    if (!st) st = cg_st_add(out, "loss", 1, (int64_t[]){1}, &loss);
    if (!st && arch == CG_ARCH_BERT && mg.nsp_logits) { /* not a BERT classifier */
        cg_real l[2] = {(cg_real)cg_item(mg.mlm_loss), (cg_real)cg_item(mg.nsp_loss)};
        st = cg_st_add_tensor(out, "seq_relationship_logits", mg.nsp_logits);
        if (!st) st = cg_st_add(out, "mlm_loss", 1, (int64_t[]){1}, &l[0]);
        if (!st) st = cg_st_add(out, "nsp_loss", 1, (int64_t[]){1}, &l[1]);
    }
    for (int i = 0; !st && i < cg_params_count(ps); i++) {
        cg_tensor *p = cg_params_at(ps, i);
        char name[300];
        snprintf(name, sizeof name, "grad.%s", cg_name(p));
        st = cg_st_add(out, name, cg_ndim(p), cg_shape(p), cg_grad(p));
    }
    if (!st && steps > 0) {
        cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
        oc.lr = cli_num(&a, "--lr", 1e-3);
        oc.beta1 = cli_num(&a, "--beta1", 0.9);
        oc.beta2 = cli_num(&a, "--beta2", 0.999);
        oc.eps = cli_num(&a, "--eps", 1e-8);
        oc.weight_decay = cli_num(&a, "--weight-decay", 0.01);
        opt = cg_optim_new(ps, &oc); /* decay on every parameter, as AdamW over model.parameters() */
        losses = malloc((size_t)steps * sizeof *losses);
        if (!opt || !losses) st = CG_ERR_NOMEM;
        for (int k = 0; !st && k < steps; k++) {
            if (k > 0) { /* the first step's gradients are already there */
                cg_params_zero_grad(ps);
                if ((st = cg_graph_forward(g)) || (st = cg_graph_backward(g, mg.loss))) break;
            }
            losses[k] = (cg_real)cg_item(mg.loss);
            st = cg_optim_step(opt, oc.lr);
        }
        if (!st) st = cg_st_add(out, "losses", 1, (int64_t[]){steps}, losses);
        if (!st) st = cg_st_add_params(out, ps);
    }
    if (!st && out_path) st = cg_st_write(out, out_path);
    if (st) rc = fail("cannot write the outputs");
    else fprintf(stderr, "cgrad step: %s loss %.6f, %d parameters, memory plan %zu bytes%s, wrote %s%s%s\n", arch_s,
                 (double)loss, cg_params_count(ps), cg_graph_plan_bytes(g),
                 cg_graph_checkpointing(g) ? " (activations checkpointed)" : "", out_path ? out_path : "",
                 out_path && dot_path ? " and " : "", dot_path ? dot_path : "");
done:
    free(losses);
    cg_optim_free(opt);
    cg_st_writer_free(out);
    cg_graph_free(g);
    cg_st_close(batch);
    cg_st_close(w);
    cg_model_free(m);
    cg_params_free(ps);
    return rc;
}
