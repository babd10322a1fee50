/* SPDX-License-Identifier: MIT */
/* cgrad train: trains a zoo model from a text or TSV file. One training graph is built once and
 * re-run each step on new batch data; a second, CG_EVAL graph of the same shape measures the
 * held-out loss. Everything a run depends on (parameters, optimizer moments and step, data draws,
 * dropout stream, options) goes into the checkpoint, so stopping and resuming gives the same
 * numbers, bit for bit, as running straight through with the same thread count. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "cli/train.h"
#include "graph/internal.h"
#include "io/file_internal.h"

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
    signal(SIGINT, SIG_DFL); /* a second Ctrl-C ends the process at once */
}

/* --lora-targets' default for arch (cli_lora's default_targets). */
static void default_lora_targets(cg_arch arch, char *buf, size_t n) {
    cli_train_default(cg_arch_name(arch), "--lora-targets", buf, n);
}

double train_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* crc32 and size of a file, so a resumed run can tell its data changed. */
static bool file_crc(const char *path, uint32_t *crc, int64_t *bytes) {
    FILE *f = cgi_fopen_bounded(path, CGI_LIMIT_DATA, "data", NULL);
    if (!f) return false;
    unsigned char buf[1 << 15];
    uLong c = crc32(0L, Z_NULL, 0);
    int64_t n = 0;
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) c = crc32(c, buf, (uInt)k), n += (int64_t)k;
    const bool failed = ferror(f);
    fclose(f);
    if (failed) return cg_set_error(CG_ERR_IO, "[data] %s: read error", path), false;
    *crc = (uint32_t)c;
    *bytes = n;
    return true;
}

/* Held-out evaluation; closes the training-loss window. */
static void evaluate(run *r, bool final) {
    cli_eval e;
    const double t0 = train_now_s();
    /* ranks must run the same collectives: a sharded evaluation always completes */
    cg_status st = cli_task_eval(&r->task, true, r->ge, &r->mge, r->o.eval_batches, r->world > 1 ? NULL : &interrupted, &e);
    if (st) {
        train_clear_bar(r);
        fprintf(stderr, "cgrad train: evaluation failed: %s\n", cg_last_error());
        e.loss = NAN;
    }
    if (interrupted) return; /* a cut-short evaluation is not a result */
    r->eval_s = train_now_s() - t0;
    double exact = -1;
    int64_t tried = 0;
    if (final && r->o.eval_exact > 0 && r->rank == 0) exact = cli_task_exact(&r->task, r->model, r->o.eval_exact, &tried);
    r->last_val = e.loss;
    if (r->win_n) r->last_train = r->win_sum / (double)r->win_n;
    train_log_eval(r, &e, exact, tried);
    r->win_sum = 0, r->win_n = 0;
}

/* Threads per rank under mpirun when neither --threads nor CGRAD_THREADS says: the cores of this
 * machine shared by the ranks on it, so 2 ranks on 2 cores run 1 thread each, not 2. */
static void dist_threads(const run *r, const bool *set) {
    if (r->world == 1 || set[idx_threads] || getenv("CGRAD_THREADS")) return;
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const long local = ls && atoi(ls) > 0 ? atoi(ls) : 1, cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n = (int)(cores / local);
    if (n < 1) n = 1;
    if (n < cg_threads()) cg_set_threads(n);
}

/* Every rank must train the same model on the same data: compares each setting, the data
 * checksums, the parameter count and values and the resumed position with rank 0's. */
static cg_status dist_check(run *r) {
    char v[96];
    cg_status st = CG_OK;
    for (int i = 0; i < N_DEFS && !st; i++) {
        if (i == idx_threads || i == idx_metrics || i == idx_plot) continue; /* free per rank */
        train_value_str(&r->o, i, v, sizeof v);
        st = cg_dist_check(r->d, cli_train_opts[i].flag, v);
    }
    const int64_t np = cg_params_numel(r->ps);
    const uint32_t pcrc = (uint32_t)crc32(0L, (const Bytef *)cg_params_values(r->ps),
                                          (uInt)(cg_params_span(r->ps) * (int64_t)sizeof(cg_real)));
    struct { const char *what, *fmt; uint64_t a, b; } facts[] = {
        {"--data checksum", "crc32 %08" PRIx64 ", %" PRIu64 " bytes", r->data_crc, (uint64_t)r->data_bytes},
        {"--val-data checksum", "crc32 %08" PRIx64 "%.0" PRIu64, r->val_crc, 0},
        {"parameter count", "%" PRIu64 "%.0" PRIu64, (uint64_t)np, 0},
        {"parameter values", "crc32 %08" PRIx64 "%.0" PRIu64, pcrc, 0},
        {"resumed step", "%" PRIu64 " (data rng %" PRIu64 ")", (uint64_t)r->step, r->task.rng.state ^ r->task.cur.rng.state},
    };
    for (size_t i = 0; i < sizeof facts / sizeof facts[0] && !st; i++) {
        snprintf(v, sizeof v, facts[i].fmt, facts[i].a, facts[i].b);
        st = cg_dist_check(r->d, facts[i].what, v);
    }
    return st;
}

/* One micro-batch on this rank. The data stream and the dropout stream are global: rank k of N
 * takes draw m*N + k of the step, so N ranks x B rows see exactly the batches one process with
 * --grad-accum N sees, and the saved positions are one position for all ranks. */
static cg_status shard_step(run *r, int64_t m, double *loss) {
    cg_status st = cg_dist_reducer_begin(r->red, m);
    for (int k = 0; k < r->world && !st; k++) {
        st = cli_task_train_batch(&r->task, &r->mg); /* other ranks' draws only advance the stream */
        if (st || k != r->rank) continue;
        cg_graph_set_rng(r->g, r->dropout_seed, r->drop_step + (uint64_t)(m * r->world + k));
        if (!(st = cg_graph_forward(r->g))) st = cg_graph_backward(r->g, r->mg.loss);
        *loss += cg_item(r->mg.loss);
    }
    return st;
}

int cmd_train(int argc, char **argv) {
    topts o;
    bool set[N_DEFS] = {0};
    const char *resume = NULL;
    cJSON *config = NULL;
    const int parsed = train_parse(argc, argv, &o, set, &resume, &config);
    if (parsed) return parsed;
    const bool named_ckpt = set[idx_checkpoint];
    run r;
    memset(&r, 0, sizeof r);
    r.last_train = r.last_val = NAN;
    cli_ckpt ck;
    memset(&ck, 0, sizeof ck);
    int rc = 1;
    bool all_failed = false; /* an error every rank saw, so none waits for another */
    if (!(r.d = cg_dist_init(set[idx_dist_timeout] ? o.dist_timeout : 300))) return cli_fail("train", "cannot join the MPI job");
    r.rank = cg_dist_rank(r.d), r.world = cg_dist_size(r.d);
    if (r.rank > 0 && !freopen("/dev/null", "w", stdout)) { /* rank 0 reports for all; errors still reach stderr */
        cg_dist_free(r.d);
        return 1;
    }
    if (resume) {
        if (cli_ckpt_load(resume, -1, &ck)) {
            fprintf(stderr, "cgrad train: cannot resume: %s\n", cg_last_error());
            goto done;
        }
        if (!train_merge_saved(&o, set, ck.train, resume)) goto done;
        const int64_t saved_world = cli_json_i64(ck.state, "world_size", 1);
        if (saved_world != r.world) {
            /* the global batch and the data shards follow N: another N would be another run */
            fprintf(stderr, "cgrad train: cannot resume: %s was trained on %lld rank%s (global batch %lld x %lld x %lld), "
                            "this run has %d: start it with mpirun -n %lld\n", resume, (long long)saved_world,
                    saved_world == 1 ? "" : "s", (long long)saved_world, (long long)cli_json_i64(ck.train, "batch", 0),
                    (long long)cli_json_i64(ck.train, "grad_accum", 1), r.world, (long long)saved_world);
            all_failed = true;
            goto done;
        }
        if (!named_ckpt) o.checkpoint = resume, set[idx_checkpoint] = true;
    }
    const bool init = !resume && set[idx_init_from] && *o.init_from;
    static char init_abs[4096];
    cli_lora pre = {0}; /* a LoRA fine-tune of a Hugging Face model: adapters before the weights, which load in place */
    bool pre_lora = false;
    if (init) { /* a new run on a trained model: its shape and tokenizer come with it */
        /* the model takes this run's dropout (0 unless given), not the one its base trained with */
        const double d0 = set[idx_dropout] ? o.dropout : 0; /* Hugging Face layout: a new head may initialise */
        pre_lora = realpath(o.init_from, init_abs) && cli_hf_layout(init_abs) && o.lora_rank > 0;
        if (pre_lora) { /* the seed train_defaults and the stream below would give the adapters */
            char dflt[64];
            cli_train_default("llama", "--seed", dflt, sizeof dflt);
            cg_rng seeds;
            cg_rng_seed(&seeds, set[idx_seed] ? o.seed : strtoull(dflt, NULL, 10));
            pre = (cli_lora){set[idx_lora_targets] ? o.lora_targets : NULL, default_lora_targets, (int)o.lora_rank, set[idx_lora_alpha] ? o.lora_alpha : (double)o.lora_rank,
                             cg_rng_next(&seeds), 0};
        }
        const double load_t0 = train_now_s();
        if (!realpath(o.init_from, init_abs) ||
            (cli_hf_layout(init_abs) ? cli_hf_load_adapted(init_abs, d0, true, pre_lora ? &pre : NULL, &ck)
                                     : cli_ckpt_load(init_abs, d0, &ck))) {
            fprintf(stderr, "cgrad train: --init-from %s: %s\n", o.init_from, cg_last_error());
            goto done;
        }
        printf("  loaded %s in %.2f s\n", init_abs, train_now_s() - load_t0);
        if (cli_json_i64(ck.train, "lora_rank", 0) > 0) {
            fprintf(stderr, "cgrad train: --init-from %s is a LoRA fine-tune: merge it first (cgrad export), or resume it\n",
                    o.init_from);
            goto done;
        }
        o.init_from = init_abs;
        static const char *const shape_keys[] = {"arch", "tokenizer", "tokenizer_path", "vocab_size", "layers",
                                                 "heads", "kv_heads", "dim", "ffn", "context"};
        for (cJSON *v = ck.train ? ck.train->child : NULL, *next; v; v = next) { /* the rest is this run's */
            next = v->next;
            bool keep = false;
            for (size_t i = 0; i < sizeof shape_keys / sizeof *shape_keys; i++) keep |= !strcmp(v->string, shape_keys[i]);
            if (!keep) cJSON_DeleteItemFromObjectCaseSensitive(ck.train, v->string);
        }
        /* a fine-tune may train on shorter rows than the model's longest context (its positions are
         * the model's either way): --context N up to it; without the flag, the whole context */
        const int64_t longest = cg_model_max_len(ck.model);
        if (set[idx_context] && longest > 0 && o.context > longest) {
            const cg_arch a = cg_model_arch(ck.model);
            fprintf(stderr, "cgrad train: --context %lld is longer than %s's %s (%lld)\n", (long long)o.context,
                    o.init_from, a == CG_ARCH_GPT2 ? "n_positions"
                                 : a == CG_ARCH_LLAMA || a == CG_ARCH_BERT ? "max_position_embeddings" : "max_len",
                    (long long)longest);
            goto done;
        }
        if (set[idx_context]) cJSON_DeleteItemFromObjectCaseSensitive(ck.train, "context");
        if (!train_merge_saved(&o, set, ck.train, init_abs)) goto done; /* its strings live as long as ck */
        if (cg_model_num_classes(ck.model) > 0 && cg_model_arch(ck.model) == CG_ARCH_BERT && !set[idx_head])
            o.head = "classify", set[idx_head] = true; /* a BERT classifier goes on classifying */
    }
    rc = 2;
    if (cg_arch_parse(o.arch, &r.arch)) {
        fprintf(stderr, "cgrad train: --arch %s: expected gpt2, bert, encdec, classifier or llama\n", o.arch);
        goto done;
    }
    train_defaults(&o, set);
    if (!train_check_opts(&o)) goto done;
    cg_precision prec;
    if (cg_precision_parse(o.precision, &prec) != CG_OK) {
        fprintf(stderr, "cgrad train: --precision takes fp32 or bf16, got '%s'\n", o.precision);
        goto done;
    }
    if (cg_set_precision(prec) != CG_OK) { /* bf16 where it cannot run: say why before any work */
        fprintf(stderr, "cgrad train: --precision %s: %s\n", o.precision, cg_last_error());
        rc = 1;
        goto done;
    }
    if (*o.val_data && (r.arch == CG_ARCH_GPT2 || r.arch == CG_ARCH_LLAMA || (r.arch == CG_ARCH_BERT && !train_bert_classify(&o)))) {
        fprintf(stderr, "cgrad train: --val-data is for encdec and classifier; %s holds out --val-fraction of --data\n", o.arch);
        goto done;
    }
    if (!*o.data) {
        fprintf(stderr, "cgrad train: --arch %s needs --data FILE.tsv (one \"source<TAB>target\" pair a line)\n", o.arch);
        goto done;
    }
    if (!set[idx_data] && !strncmp(o.data, "data/", 5) && !(o.data = cli_default_data(o.data + 5, "--data FILE"))) {
        fprintf(stderr, "cgrad train: %s\n", cg_last_error());
        goto done;
    }
    /* One directory for the run's files: --out, else runs/ARCH unless --checkpoint (or --resume)
     * names the place; a resumed run directory's model.ckpt keeps its directory. */
    static char run_dir[4096], ckpt_in_dir[4200];
    const char *dir = *o.out ? o.out : NULL;
    const char *base = strrchr(o.checkpoint, '/');
    if (!dir && !set[idx_checkpoint]) snprintf(run_dir, sizeof run_dir, "runs/%s", o.arch), dir = run_dir;
    else if (!dir && base && !strcmp(base + 1, "model.ckpt"))
        snprintf(run_dir, sizeof run_dir, "%.*s", (int)(base - o.checkpoint), o.checkpoint), dir = run_dir;
    if (dir && r.rank == 0 && !cli_make_dirs("train", "--out", dir)) goto done;
    if (!set[idx_checkpoint]) snprintf(ckpt_in_dir, sizeof ckpt_in_dir, "%s/model.ckpt", dir), o.checkpoint = ckpt_in_dir;
    (void)named_ckpt;
    rc = 1;
    r.o = o;
    if (o.threads > 0) cg_set_threads((int)o.threads);
    dist_threads(&r, set);
    train_derive_paths(&r, dir);
    /* The bar redraws one line with \r and ESC[K: only for a terminal. Under a launcher, stdout is
     * the launcher's pseudo-terminal even when the user pipes mpirun's output, so never there. */
    r.tty = isatty(STDOUT_FILENO) && !cg_dist_launched() && !(getenv("TERM") && !strcmp(getenv("TERM"), "dumb"));

    /* Tokenizer: restored, or made from the data. */
    const bool image = r.arch == CG_ARCH_VIT || r.arch == CG_ARCH_CNN;
    if (image) { /* a directory of IDX files: the checksums are of the images and labels as read */
        if (cli_task_open(&r.task, r.arch, NULL, o.data, NULL, 0.0, o.batch, o.context)) {
            cli_fail("train", "cannot load the images");
            goto done;
        }
        for (int v = 0; v < 2; v++) {
            const cg_image_set *s = &r.task.img[v];
            uLong c = crc32(0L, Z_NULL, 0);
            c = crc32_z(c, s->pixels, (size_t)(s->n * s->h * s->w));
            c = crc32_z(c, (const unsigned char *)s->labels, (size_t)s->n * sizeof *s->labels);
            *(v ? &r.val_crc : &r.data_crc) = (uint32_t)c;
        }
        r.data_bytes = r.task.img[0].n * (r.task.img[0].h * r.task.img[0].w + 1);
    } else if (!file_crc(o.data, &r.data_crc, &r.data_bytes)) {
        fprintf(stderr, "cgrad train: cannot read --data %s: %s\n", o.data, cg_last_error());
        goto done;
    }
    int64_t vb = 0;
    if (*o.val_data && !file_crc(o.val_data, &r.val_crc, &vb)) {
        fprintf(stderr, "cgrad train: cannot read --val-data %s: %s\n", o.val_data, cg_last_error());
        goto done;
    }
    if (resume) { /* resuming exactly needs the very same data */
        const uint32_t crc = (uint32_t)cli_json_u64(ck.state, "data_crc32", 0),
                       vcrc = (uint32_t)cli_json_u64(ck.state, "val_data_crc32", 0);
        if (crc != r.data_crc || vcrc != r.val_crc) {
            fprintf(stderr,
                    "cgrad train: cannot resume: the %s file %s differs from the one %s was trained on (crc32 %08x, "
                    "checkpoint %08x)\n",
                    crc != r.data_crc ? "--data" : "--val-data", crc != r.data_crc ? o.data : o.val_data, resume,
                    crc != r.data_crc ? r.data_crc : r.val_crc, crc != r.data_crc ? crc : vcrc);
            goto done;
        }
        r.tok = ck.tok;
        ck.tok = NULL;
    } else if (init) {
        r.tok = ck.tok;
        ck.tok = NULL;
    } else if (image) { /* no text: a placeholder the checkpoint format wants */
        if (!(r.tok = cg_tokenizer_char_new("0123456789", 10))) {
            cli_fail("train", "cannot make the tokenizer");
            goto done;
        }
        r.o.tokenizer = "char";
    } else {
        char *text = NULL;
        size_t len = 0;
        if (cg_read_text_file(o.data, &text, &len)) {
            cli_fail("train", "cannot read the data");
            goto done;
        }
        /* A named tokenizer file decides the kind unless --tokenizer says otherwise. */
        const bool path_decides = *o.tokenizer_path && !set[idx_tokenizer];
        r.tok = cli_tokenizer_make(path_decides ? NULL : o.tokenizer, o.tokenizer_path, o.vocab_size, text, len);
        free(text);
        if (!r.tok) {
            cli_fail("train", "cannot make the tokenizer");
            goto done;
        }
        static const char *const kinds[] = {"char", "bpe", "wordpiece", "hf"};
        r.o.tokenizer = kinds[cg_tokenizer_kind(r.tok)];
    }
    if (cg_tokenizer_serialize(r.tok, &r.tok_json)) {
        cli_fail("train", "cannot serialize the tokenizer");
        goto done;
    }
    if (!image && cli_task_open(&r.task, train_bert_classify(&o) ? CG_ARCH_CLASSIFIER : r.arch, r.tok, o.data, o.val_data, o.val_fraction, o.batch, o.context)) {
        cli_fail("train", "cannot load the data");
        goto done;
    }
    {
        const int64_t n = r.task.s2s || r.task.cls || image ? cli_task_count(&r.task, false) : o.batch;
        if (n < o.batch) {
            fprintf(stderr, "cgrad train: %s: %lld training examples cannot fill a --batch of %lld\n", o.data, (long long)n,
                    (long long)o.batch);
            goto done;
        }
    }
    /* Independent streams for initialisation, data, dropout and held-out draws. */
    cg_rng seeds;
    cg_rng_seed(&seeds, o.seed);
    const uint64_t init_seed = cg_rng_next(&seeds), data_seed = cg_rng_next(&seeds);
    r.dropout_seed = cg_rng_next(&seeds);
    r.task.eval_seed = cg_rng_next(&seeds);
    cg_rng_seed(&r.task.rng, data_seed);
    cg_data_cursor_init(&r.task.cur, data_seed);

    if (init && train_bert_classify(&o) && cg_model_num_classes(ck.model) == 0 && !train_new_head(&ck, &r, init_seed)) goto done;
    if (resume || init) {
        r.ps = ck.ps, r.model = ck.model;
        ck.ps = NULL, ck.model = NULL;
    } else {
        char *cfg = train_model_config(&r);
        r.ps = cg_params_new();
        r.model = cfg && r.ps ? cg_model_new(r.arch, cfg, o.dropout, r.ps, init_seed) : NULL;
        free(cfg);
        if (!r.model) {
            cli_fail("train", "cannot build the model");
            goto done;
        }
    }
    /* --moe-capacity reaches a Mixtral's layers before its graphs are built; the run saves the model's value */
    cg_llama *moe = cg_model_llama(r.model);
    const bool experts = moe && cg_llama_cfg(moe)->num_local_experts > 0;
    if (set[idx_moe_capacity] && (experts ? cg_llama_set_capacity_factor(moe, o.moe_capacity) != CG_OK : o.moe_capacity != 0)) {
        fprintf(stderr, "cgrad train: --moe-capacity %g: %s\n", o.moe_capacity,
                experts ? cg_last_error() : "the model has no mixture-of-experts layers (a Mixtral has)");
        rc = 2;
        goto done;
    }
    r.o.moe_capacity = experts ? cg_llama_cfg(moe)->capacity_factor : 0;
    if (init && o.lora_rank > 0) { /* a resumed fine-tune has its adapters from the checkpoint */
        cg_rng lr;
        cg_rng_seed(&lr, init_seed);
        const int n = pre_lora ? pre.added : cg_lora_apply(r.ps, o.lora_targets, (int)o.lora_rank, o.lora_alpha, &lr);
        if (n < 0) {
            cli_fail("train", "--lora-rank/--lora-targets");
            goto done;
        }
        int64_t trainable = 0;
        for (int i = 0; i < cg_params_count(r.ps); i++)
            if (cg_param_trainable(cg_params_at(r.ps, i))) trainable += cg_numel(cg_params_at(r.ps, i));
        printf("  LoRA: %d adapters of rank %lld (alpha %g) on '%s': %lld trainable parameters\n", n,
               (long long)o.lora_rank, o.lora_alpha, o.lora_targets, (long long)trainable);
    }
    /* frozen weights leave the parameter blocks: no gradient, no moments */
    if (o.lora_rank > 0 && cg_params_compact(r.ps)) {
        cli_fail("train", "LoRA");
        goto done;
    }
    cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
    oc.lr = o.lr, oc.beta1 = o.beta1, oc.beta2 = o.beta2, oc.eps = o.eps, oc.weight_decay = o.weight_decay;
    r.opt = cg_optim_new(r.ps, &oc);
    if (!r.opt) {
        cli_fail("train", "bad optimizer settings");
        goto done;
    }
    cg_optim_decay_matrices_only(r.opt, true); /* as nanoGPT: every >= 2-D parameter, embeddings too */
    if (cg_schedule_parse(o.schedule, &r.sched.kind)) {
        cli_fail("train", "--schedule");
        goto done;
    }
    r.sched.lr = o.lr, r.sched.min_lr = o.min_lr, r.sched.warmup = o.warmup, r.sched.total = o.decay_steps;
    r.sched.d_model = o.dim, r.sched.noam_factor = o.lr;
    if (cg_schedule_check(&r.sched)) {
        cli_fail("train", "bad schedule (--lr, --min-lr, --warmup, --decay-steps)");
        goto done;
    }
    r.g = cg_graph_new(CG_TRAIN);
    r.ge = cg_graph_new(CG_EVAL);
    if (!r.g || !r.ge || cg_model_build(r.g, r.model, o.batch, r.task.t, r.task.s, &r.mg) ||
        cg_model_build(r.ge, r.model, o.batch, r.task.t, r.task.s, &r.mge)) {
        cli_fail("train", "cannot build the training graph");
        goto done;
    }
    cg_graph_set_rng(r.g, r.dropout_seed, 0);
    cg_graph_set_checkpointing(r.g, o.checkpoint_activations);
    if (resume && train_restore(&r, &ck, resume)) {
        fprintf(stderr, "cgrad train: cannot resume: %s\n", cg_last_error());
        goto done;
    }
    if (!(r.red = cg_dist_reducer_new(r.d, r.ps, o.grad_accum, (size_t)o.bucket_kb << 10, o.overlap))) {
        cli_fail("train", "cannot make the gradient reducer");
        goto done;
    }
    cg_dist_reducer_attach(r.red, r.g);
    r.task.dist = r.d;
    if (o.zero && r.world > 1) { /* after restore: the optimizer keeps its own slice of the full moments */
        int64_t lo, hi;
        cg_dist_shard(r.d, r.rank, cg_params_span(r.ps), &lo, &hi);
        if (cg_optim_shard(r.opt, lo, hi)) {
            cli_fail("train", "cannot shard the optimizer");
            goto done;
        }
    }
    if (r.world > 1 && dist_check(&r)) {
        if (r.rank == 0) fprintf(stderr, "cgrad train: the ranks disagree: %s\n", cg_last_error());
        all_failed = true;
        goto done;
    }
    if (r.rank > 0) {
        snprintf(r.metrics_path, sizeof r.metrics_path, "/dev/null");
        snprintf(r.jsonl_path, sizeof r.jsonl_path, "/dev/null");
    }
    if (!(r.metrics = train_open_metrics(r.metrics_path, resume ? r.step : 0, "step,lr,train_loss,val_loss," TOK_COLUMN ",elapsed_s\n"))) {
        fprintf(stderr, "cgrad train: cannot write %s: %s\n", r.metrics_path, strerror(errno));
        goto done;
    }
    if (!(r.jsonl = train_open_metrics(r.jsonl_path, resume ? r.step : 0, NULL))) {
        fprintf(stderr, "cgrad train: cannot write %s: %s\n", r.jsonl_path, strerror(errno));
        goto done;
    }
    if (r.rank == 0 && train_write_run_json(&r)) {
        fprintf(stderr, "cgrad train: cannot write %s: %s\n", r.run_path, cg_last_error());
        goto done;
    }

    /* images: a "token" is an image, so tok/s reads images per second */
    const int64_t tokens_per_step = r.world * o.batch * o.grad_accum *
                                    (image ? 1 : r.task.arch == CG_ARCH_CLASSIFIER ? r.task.t : r.task.t + r.task.s);
    {
        int64_t ntr = r.task.lm ? cg_lm_data_count(r.task.lm, false) : r.task.mlm ? cg_mlm_data_count(r.task.mlm, false)
                      : cli_task_count(&r.task, false);
        int64_t nva = r.task.lm ? cg_lm_data_count(r.task.lm, true) : r.task.mlm ? cg_mlm_data_count(r.task.mlm, true)
                      : cli_task_count(&r.task, true);
        const char *unit = r.task.lm ? "tokens" : r.task.mlm ? "sentences" : r.task.s2s ? "pairs" : image ? "images" : "examples";
        const char *kinds[] = {"char", "bpe", "wordpiece", "hf"};
        const cg_llama *fam = cg_model_llama(r.model); /* the LLaMA arch's family: llama, mistral, qwen2, qwen3 */
        const double mparams = (double)cg_params_numel(r.ps) / 1e6;
        const cg_vit *vit = r.arch == CG_ARCH_VIT ? cg_model_vit(r.model) : NULL;
        const cg_cnn *cnn = r.arch == CG_ARCH_CNN ? cg_model_cnn(r.model) : NULL;
        if (vit) { /* the image models' own shape: no context, no tokenizer */
            const cg_vit_config *v = cg_vit_cfg(vit);
            printf("cgrad train: vit, %lld layers, %lld heads, d %lld, %lldx%lld images in %lldx%lld patches: %.2fM "
                   "parameters\n", (long long)v->n_layer, (long long)v->n_head, (long long)v->d_model,
                   (long long)v->image_size, (long long)v->image_size, (long long)v->patch_size,
                   (long long)v->patch_size, mparams);
        } else if (cnn) {
            const cg_cnn_config *c = cg_cnn_cfg(cnn);
            printf("cgrad train: cnn, %lld conv + pool stages from %lld channels, hidden %lld, %lldx%lld images: "
                   "%.2fM parameters\n", (long long)c->n_layer, (long long)c->channels, (long long)c->hidden,
                   (long long)c->image_size, (long long)c->image_size, mparams);
        } else {
            printf("cgrad train: %s, %lld layers, %lld heads, d %lld, context %lld: %.2fM parameters\n",
                   fam ? cg_llama_family_name(cg_llama_cfg(fam)->family) : cg_arch_name(r.arch),
                   (long long)o.layers, (long long)o.heads, (long long)o.dim, (long long)r.task.t, mparams);
        }
        if (experts) {
            const cg_llama_config *lc = cg_llama_cfg(moe);
            printf("  experts: %lld a layer, top-%lld, capacity_factor %g%s, load-balancing loss x %g%s\n",
                   (long long)lc->num_local_experts, (long long)lc->num_experts_per_tok, lc->capacity_factor,
                   lc->capacity_factor > 0 ? "" : " (dropless)", lc->router_aux_loss_coef,
                   lc->output_router_logits ? "" : " (off: output_router_logits false)");
        }
        if (image)
            printf("  data %s: %lld training / %lld held-out %s\n", o.data, (long long)ntr, (long long)nva, unit);
        else
            printf("  data %s: %lld training / %lld held-out %s; %s tokenizer, %d ids\n", o.data, (long long)ntr,
                   (long long)nva, unit, kinds[cg_tokenizer_kind(r.tok)], (int)cg_tokenizer_vocab_size(r.tok));
        if (resume) printf("  resuming at step %lld of %lld\n", (long long)r.step, (long long)o.steps);
        printf("  %lld steps of %lld x %lld rows, AdamW lr %g (%s, warmup %lld, min %g), wd %g, clip %g, dropout %g, "
               "%d threads%s\n",
               (long long)o.steps, (long long)o.batch, (long long)o.grad_accum, o.lr, o.schedule, (long long)o.warmup,
               o.min_lr, o.weight_decay, o.clip, o.dropout, cg_threads(),
               o.checkpoint_activations ? ", activations checkpointed (each block recomputed in backward)" : "");
        if (r.world > 1) {
            int64_t lo, hi;
            cg_optim_shard_range(r.opt, &lo, &hi);
            printf("  AdamW moments on each rank: %.2f MB%s (%.2f MB unsharded); parameters + gradients %.2f MB%s\n",
                   2e-6 * (double)(hi - lo) * (double)sizeof(cg_real), o.zero ? ", ZeRO-1 shard" : "",
                   2e-6 * (double)cg_params_span(r.ps) * (double)sizeof(cg_real),
                   2e-6 * (double)cg_params_span(r.ps) * (double)sizeof(cg_real),
                   o.grad_accum > 1 ? " + accumulator" : "");
        }
        if (r.world > 1)
            printf("  %d ranks (MPI): global batch %d x %lld x %lld = %lld rows a step, %lld KiB buckets, overlap %s\n",
                   r.world, r.world, (long long)o.batch, (long long)o.grad_accum, (long long)(r.world * o.batch * o.grad_accum),
                   (long long)o.bucket_kb, o.overlap ? "on" : "off");
        printf("  checkpoint %s, metrics %s, plot %s\n", o.checkpoint, r.metrics_path, r.plot_path);
        fflush(stdout);
    }

    struct sigaction sa, old_sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    interrupted = 0;
    sigaction(SIGINT, &sa, &old_sa);

    r.t_start = train_now_s();
    const int64_t first = r.step;
    int64_t last_eval = -1;
    cg_status st = CG_OK;
    if (r.step == 0 && o.eval_every > 0 && o.eval_batches > 0) { /* where a fresh model starts */
        evaluate(&r, false);
        if (!interrupted) {
            train_metrics_row(&r, 0, 0, NULL, r.last_val, NAN, train_now_s() - r.t_start); /* a failure: r.write_failed */
            last_eval = 0;
        }
    }
    bool diverged = false;
    /* The loop allocates nothing: batches go into the graphs' inputs, the optimizer works in place. */
    bool write_stop = false; /* some rank failed a write: all stop together */
    while (r.step < o.steps && !interrupted) {
        const double t0 = train_now_s(), lr = cg_schedule_lr(&r.sched, cg_optim_steps(r.opt));
        double loss = 0;
        for (int64_t a = 0; a < o.grad_accum && !st; a++) st = shard_step(&r, a, &loss);
        /* the mean over every micro-batch of every rank; ranks stop together on a signal */
        double agree[3] = {loss, interrupted ? 1 : 0, r.write_failed ? 1 : 0};
        if (!st) st = cg_dist_reducer_finish(r.red);
        if (!st) st = cg_dist_sum(r.d, agree, 3);
        if (st) break;
        if (agree[2] > 0) { /* a lost metrics row or plot: stop before this step's update, on every rank */
            st = CG_ERR_IO;
            write_stop = true;
            break;
        }
        r.drop_step += (uint64_t)(r.world * o.grad_accum);
        cg_graph_set_rng(r.g, r.dropout_seed, r.drop_step);
        loss = agree[0] / (double)(r.world * o.grad_accum);
        if (agree[1] > 0) interrupted = 1;
        /* After the reduction every rank holds the same gradients, so the same norm, clip and verdict.
         * The norm is measured even without clipping: one pass over the gradients finds a NaN or an
         * infinity before the optimizer spreads it into every parameter and moment. */
        const double gnorm = cg_grad_norm(r.ps);
        if (!isfinite(loss) || !isfinite(gnorm)) {
            int64_t at = -1;
            double v = 0;
            const char *where = train_nonfinite_param(r.ps, false, &at, &v);
            const bool in_values = where != NULL;
            if (!where) where = train_nonfinite_param(r.ps, true, &at, &v);
            char what[400];
            if (where) snprintf(what, sizeof what, "first non-finite %s: %s[%lld] = %g", in_values ? "parameter" : "gradient",
                                where, (long long)at, v);
            else snprintf(what, sizeof what, "the gradients are finite, the loss is not");
            train_clear_bar(&r);
            if (r.skipped < o.skip_nonfinite) {
                r.skipped++;
                r.step++; /* the batch is used up; the optimizer and its schedule do not move */
                fprintf(stderr, "cgrad train: step %lld: loss %g, gradient norm %g (%s): skipped (%lld of --skip-nonfinite %lld)\n",
                        (long long)r.step, loss, gnorm, what, (long long)r.skipped, (long long)o.skip_nonfinite);
                train_metrics_row(&r, r.step, lr, &loss, NAN, NAN, r.elapsed0 + train_now_s() - r.t_start);
                continue;
            }
            fprintf(stderr, "cgrad train: step %lld: loss %g, gradient norm %g: not finite (%s); stopping before the update, "
                            "nothing saved (try a lower --lr, a --clip, or --skip-nonfinite N)\n",
                    (long long)r.step + 1, loss, gnorm, what);
            st = CG_ERR_RANGE;
            diverged = true;
            break;
        }
        /* clipping's factor is applied as the update reads each gradient: no pass rewrites them */
        if ((st = cg_optim_step_scaled(r.opt, lr, o.clip > 0 ? cg_clip_scale(gnorm, o.clip) : 1.0))) break;
        /* ZeRO-1: each rank updated its shard; the new values go to every rank */
        if (o.zero && (st = cg_dist_allgather(r.d, cg_params_values(r.ps), cg_params_span(r.ps)))) break;
        r.step++;
        const double dt = train_now_s() - t0;
        r.train_s += dt;
        r.tokens_run += tokens_per_step;
        cli_rate_add(&r.rate, dt, tokens_per_step);
        const double tok_s = cli_rate_tokens_per_s(&r.rate);
        r.win_sum += loss, r.win_n++;
        r.last_train = loss;
        bool eval_now = (o.eval_every > 0 && r.step % o.eval_every == 0) || r.step == o.steps;
        if (r.tty ? train_now_s() - r.bar_drawn > 0.1 || r.step == o.steps : o.log_every > 0 && r.step % o.log_every == 0) {
            train_progress(&r, loss, lr);
            r.bar_drawn = train_now_s();
        }
        double val = NAN;
        if (eval_now && !interrupted) {
            evaluate(&r, r.step == o.steps);
            if (!interrupted) val = r.last_val, last_eval = r.step;
        }
        train_metrics_row(&r, r.step, lr, &loss, val, tok_s, r.elapsed0 + train_now_s() - r.t_start); /* see write_stop */
        if (r.world > 1 && o.log_every > 0 && r.step % o.log_every == 0) {
            const cg_dist_stats ds = cg_dist_reducer_stats(r.red);
            printf("  all-reduce: %lld buckets, %.2f MB a step; per step %.1f ms from first start to last end, %.1f ms of "
                   "it after backward (%.0f%% behind backward); %lld of %lld buckets started during backward; "
                   "final before an earlier one: %lld in step 1 (memory order), %lld since (backward's order)\n",
                   (long long)ds.buckets, (double)ds.bytes / 1e6, 1e3 * ds.comm_s / (double)ds.steps,
                   1e3 * ds.wait_s / (double)ds.steps, ds.comm_s > ds.wait_s ? 100 * (1 - ds.wait_s / ds.comm_s) : 0.0,
                   (long long)ds.early, (long long)(ds.steps * ds.buckets), (long long)ds.held_first,
                   (long long)ds.held);
        }
        if (o.save_every > 0 && r.step % o.save_every == 0 && r.step < o.steps) {
            if (train_save(&r)) {
                train_clear_bar(&r);
                fprintf(stderr, "cgrad train: cannot save: %s\n", cg_last_error());
            }
            if (r.rank == 0) train_finish_files(&r); /* a failure stops the run at the next step (write_stop) */
        }
    }
    sigaction(SIGINT, &old_sa, NULL);
    train_clear_bar(&r);
    if (st && r.world > 1 && strstr(cg_last_error(), "[dist]")) {
        /* a peer is gone or stuck: the last checkpoint on disk is the state to resume from */
        fprintf(stderr, "cgrad train: rank %d of %d: %s; stopping at step %lld without saving (resume from %s)\n", r.rank,
                r.world, cg_last_error(), (long long)r.step, o.checkpoint);
        cg_dist_abort(r.d, 1);
        goto done;
    }
    if (write_stop || (!st && r.write_failed)) { /* a full disk: the metrics would be silently short */
        if (r.write_failed) fprintf(stderr, "cgrad train: %s; stopping at step %lld\n", r.write_error, (long long)r.step);
        if (!st) st = CG_ERR_IO;
    } else if (st && !diverged) {
        cli_fail("train", "training step failed");
        /* keep what was learned: the last good state is still worth a checkpoint */
    }
    if (!st && !interrupted && last_eval != r.step && r.step > 0 && o.eval_batches > 0 && first == r.step)
        evaluate(&r, true); /* resumed at the end: report where it stands */
    if (r.skipped) fprintf(stderr, "cgrad train: %lld steps skipped for a non-finite loss or gradient\n", (long long)r.skipped);
    /* A diverged run's parameters are finite (the bad update was never applied) but the very next
     * step would repeat the failure: the checkpoint on disk, if any, stays as it was. */
    const cg_status saved = diverged ? CG_ERR_RANGE : train_save(&r);
    if (saved && !diverged) {
        fprintf(stderr, "cgrad train: cannot save the checkpoint: %s\n", cg_last_error());
        if (!st) st = CG_ERR_IO;
    } else if (!saved) printf("saved %s (step %lld)\n", o.checkpoint, (long long)r.step);
    const bool said = r.write_failed; /* said once, where it happened */
    if (!train_close_metrics(&r) && !said) fprintf(stderr, "cgrad train: %s\n", r.write_error);
    else if (r.rank == 0 && !r.write_failed) train_finish_files(&r);
    if (!interrupted && !st && r.rank == 0) cli_task_show(stdout, &r.task, r.model, (int)o.samples, o.seed);
    const char *guard_line = cgi_cores_summary(); /* why steps may have run at one thread's speed */
    if (guard_line) printf("%s\n", guard_line);
    const double train_loss = r.win_n ? r.win_sum / (double)r.win_n : r.last_train;
    if (interrupted) /* the last line says what happened: a cut-short run has no final result */
        printf("interrupted at step %lld, %s %s (continue with: cgrad train --resume %s)\n", (long long)r.step,
               saved ? "not saved: the checkpoint on disk is" : "saved", o.checkpoint, o.checkpoint);
    else
        printf("final step=%lld train_loss=%.4f val_loss=%.4f tokens_per_s=%.1f\n", (long long)r.step, train_loss,
               r.last_val, r.train_s > 0 ? (double)r.tokens_run / r.train_s : 0.0);
    fflush(stdout);
    rc = interrupted ? 130 : st || r.write_failed ? 1 : 0;
done:
    if (rc && r.world > 1 && !all_failed) cg_dist_abort(r.d, rc); /* the others would wait for this rank */
    cg_dist_reducer_free(r.red);
    if (r.metrics) fclose(r.metrics);
    if (r.jsonl) fclose(r.jsonl);
    cJSON_Delete(config);
    cg_graph_free(r.g);
    cg_graph_free(r.ge);
    cg_optim_free(r.opt);
    cli_task_free(&r.task);
    cg_model_free(r.model);
    cg_params_free(r.ps);
    cg_tokenizer_free(r.tok);
    free(r.tok_json);
    cli_ckpt_free(&ck);
    cg_dist_free(r.d);
    return rc;
}
