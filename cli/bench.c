/* SPDX-License-Identifier: MIT */
/* cgrad bench: times full training steps (zero grads, forward, loss, backward, AdamW update) of
 * zoo models on random token data, and greedy generation with and without the KV cache.
 *
 * Each config runs in a forked child so its peak resident memory is its own: ru_maxrss is a
 * high-water mark, and one process running every config would report the largest for all. The
 * parent never enters an OpenMP region (libgomp's pool does not survive fork), so the sgemm
 * reference is measured in a child too. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <blis.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cgrad.h"
#include "graph/internal.h"
#include "cli/commands.h"
#include "models/zoo.h"
#include "optim/optim.h"

typedef struct {
    const char *name;
    cg_arch arch;
    const char *json;
    int64_t batch, t, s;        /* s: source length (encdec) */
    const char *lookup_only[3]; /* embedding tables used only as lookups: no matmul FLOPs */
} bench_config;

static const bench_config configs[] = {
    {"gpt-tiny", CG_ARCH_GPT2,
     "{\"vocab_size\": 256, \"n_positions\": 256, \"n_embd\": 256, \"n_layer\": 4, \"n_head\": 4}", 16, 256, 0,
     {"wpe.weight"}},
    {"gpt-small", CG_ARCH_GPT2,
     "{\"vocab_size\": 50304, \"n_positions\": 1024, \"n_embd\": 768, \"n_layer\": 12, \"n_head\": 12}", 4, 256, 0,
     {"wpe.weight"}},
    {"bert-small", CG_ARCH_BERT,
     "{\"vocab_size\": 30522, \"hidden_size\": 256, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, "
     "\"intermediate_size\": 1024, \"max_position_embeddings\": 512, \"type_vocab_size\": 2}",
     16, 128, 0, {"bert.embeddings.position_embeddings.weight", "bert.embeddings.token_type_embeddings.weight"}},
    {"encdec-base", CG_ARCH_ENCDEC,
     "{\"src_vocab_size\": 8000, \"tgt_vocab_size\": 8000, \"d_model\": 512, \"n_head\": 8, "
     "\"num_encoder_layers\": 3, \"num_decoder_layers\": 3, \"dim_feedforward\": 2048, \"max_len\": 512, "
     "\"pad_id\": 0, \"bos_id\": 1, \"eos_id\": 2}",
     16, 64, 64, {"src_emb.weight", "tgt_emb.weight"}},
    {"gpt-tiny-4k", CG_ARCH_GPT2,
     "{\"vocab_size\": 256, \"n_positions\": 4096, \"n_embd\": 256, \"n_layer\": 4, \"n_head\": 4}", 1, 4096, 0,
     {"wpe.weight"}},
    /* gpt-tiny as LLaMA: SwiGLU width 688 (8/3 d, to 16) matches its MLP parameters; 2 key/value heads */
    {"llama-tiny", CG_ARCH_LLAMA,
     "{\"vocab_size\": 256, \"hidden_size\": 256, \"intermediate_size\": 688, \"num_hidden_layers\": 4, "
     "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 256}",
     16, 256, 0, {"model.embed_tokens.weight"}},
    /* nanoGPT's CPU recipe for character-level tiny-shakespeare (examples/shakespeare_char.sh): one step */
    {"nanogpt-char", CG_ARCH_GPT2,
     "{\"vocab_size\": 65, \"n_positions\": 64, \"n_embd\": 128, \"n_layer\": 4, \"n_head\": 4}", 12, 64, 0,
     {"wpe.weight"}},
};
#define N_CONFIGS (int)(sizeof configs / sizeof configs[0])

const cli_opt cli_bench_opts[] = {{"--config", CLI_STR, 0, 0, "a config name, or all"},
                                  {"--threads", CLI_INT, 1, 1024, "threads (CGRAD_THREADS or all cores)"},
                                  {"--steps", CLI_INT, 1, 1e6, "timed steps per config (5)"},
                                  {"--warmup", CLI_INT, 0, 1e6, "untimed steps first (1)"},
                                  {"--gen", CLI_BARE, 0, 0, "also time generation with and without the KV cache"},
                                  CLI_PRECISION,
                                  {"--checkpoint-activations", CLI_BARE, 0, 0, "recompute each block's activations in backward"},
                                  {"--separate-step", CLI_BARE, 0, 0, "AdamW after backward, every gradient kept whole (as with clipping)"},
                                  {"--context", CLI_INT, 2, 1 << 20, "tokens per row instead of the config's"},
                                  {"--batch", CLI_INT, 1, 1 << 20, "rows instead of the config's"},
                                  {NULL, CLI_BARE, 0, 0, NULL}};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of every thread of the process: on a loaded machine a step waits for the cores, and
 * the CPU time it used moves much less than its wall time (threads wait passively). */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Each timed step's model GFLOP/s over the reference product timed right after it (flops a step,
 * time[k] s, ref[k] GFLOP/s) into fr, sorted; returns their median. Pairing each step with its own
 * reference cancels the drift of a shared machine across the run, which a ratio of the two medians
 * keeps: on a Xeon whose speed swung by a third, three runs of bert-small (1 thread, 7 steps) gave
 * paired medians of 0.815-0.834 and ratios of medians of 0.768-0.829. */
static double paired_fraction(double flops, const double *time, const double *ref, int n, double *fr) {
    for (int k = 0; k < n; k++) fr[k] = flops / time[k] / 1e9 / ref[k];
    return median(fr, n);
}

/* The 1, 5 and 15 minute load averages as /proc/loadavg has them, with a newline. */
static const char *loadavg(void) {
    static char buf[64];
    FILE *f = fopen("/proc/loadavg", "r");
    int n = 0;
    if (f) {
        for (int fields = 0; n < (int)sizeof buf - 2 && fields < 3;) {
            int ch = fgetc(f);
            if (ch == EOF) break;
            if (ch == ' ') fields++;
            if (fields < 3) buf[n++] = (char)ch;
        }
        fclose(f);
    }
    if (!n) n = snprintf(buf, sizeof buf, "unknown");
    buf[n] = '\n', buf[n + 1] = 0;
    return buf;
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* Linux reports kilobytes */
}

/* An n^3 product's operands, made once, so that the product can also run between training steps. */
typedef struct {
    int64_t n;
    float *a, *b, *c;
} sgemm_ref;

/* The operands are mapped, not malloc'ed, so that freeing them gives their pages back whatever
 * malloc did in between (BLIS's pool lands after them on the heap): the peak memory read after
 * the last step must not count them. */
static float *ref_map(int64_t n) {
    void *p = mmap(NULL, (size_t)(n * n) * sizeof(float), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void ref_unmap(float *p, int64_t n) {
    if (p) munmap(p, (size_t)(n * n) * sizeof(float));
}

static void sgemm_ref_free(sgemm_ref *s) {
    ref_unmap(s->a, s->n), ref_unmap(s->b, s->n), ref_unmap(s->c, s->n);
    *s = (sgemm_ref){0};
}

static bool sgemm_ref_init(sgemm_ref *s, int64_t n) {
    *s = (sgemm_ref){n, ref_map(n), ref_map(n), ref_map(n)};
    if (!s->a || !s->b || !s->c) {
        sgemm_ref_free(s);
        return false;
    }
    cg_rng r;
    cg_rng_seed(&r, 7);
    for (int64_t i = 0; i < n * n; i++) s->a[i] = (float)cg_rng_uniform(&r) - 0.5f, s->b[i] = (float)cg_rng_uniform(&r) - 0.5f;
    return true;
}

/* GFLOP/s of one product C = A B: through cgrad's driver, threaded as cgrad threads its own
 * products (the reference the fraction is taken against), or (blis) BLIS's own threaded sgemm on
 * the same kernels, which is what a plain call of BLIS gets */
static double sgemm_ref_run(const sgemm_ref *s, bool blis) {
    const int64_t n = s->n;
    float one = 1.0f, zero = 0.0f;
    double t0 = now_s();
#ifdef CGRAD_DOUBLE
    blis = true;
#endif
    if (blis) bli_sgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, n, n, n, &one, s->a, n, 1, s->b, n, 1, &zero, s->c, n, 1);
#ifndef CGRAD_DOUBLE
    else cgi_gemm(n, n, n, s->a, n, 1, s->b, n, 1, one, zero, s->c, n, 1, cg_threads());
#endif
    return 2.0 * (double)n * (double)n * (double)n / (now_s() - t0) / 1e9;
}

/* Best GFLOP/s of an n^3 product over reps timed runs after one warm-up. */
static double sgemm_gflops(int64_t n, int reps) {
    sgemm_ref s;
    if (!sgemm_ref_init(&s, n)) return NAN;
    double best = 0;
    for (int k = 0; k <= reps; k++) {
        const double g = sgemm_ref_run(&s, false);
        if (k > 0 && g > best) best = g;
    }
    sgemm_ref_free(&s);
    return best;
}

/* Resident memory now, in MB (/proc/self/statm's second field, in pages). */
static double rss_now_mb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &res) != 2) res = 0;
        fclose(f);
    }
    return (double)res * (double)sysconf(_SC_PAGESIZE) / 1048576.0;
}

/* Runs fn(arg) in a child process; the child's stdout follows the parent's. Returns false (and
 * says why) if the child failed or died. */
static bool in_child(int (*fn)(const void *, int, double), const void *arg, int threads, double sgemm,
                     const char *what) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "cgrad bench: fork failed for %s\n", what);
        return false;
    }
    if (pid == 0) {
        cg_set_threads(threads);
        int rc = fn(arg, threads, sgemm);
        fflush(stdout);
        fflush(stderr);
        _exit(rc);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0) return false;
    if (WIFSIGNALED(status)) {
        fprintf(stderr, "cgrad bench: %s crashed with signal %d (%s)\n", what, WTERMSIG(status), strsignal(WTERMSIG(status)));
        /* the JSON's GFLOP/s carry three decimals, so its fractions can be recomputed from it within 1e-3 */
    printf("{\"config\":\"%s\", \"threads\":%d, \"error\":\"crashed with signal %d\"}\n", what, threads, WTERMSIG(status));
        fflush(stdout);
        return false;
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* ---- the sgemm reference, measured in a child and sent back through a pipe ---- */

typedef struct {
    int64_t n;
    int fd;    /* the pipe's write end */
    int bf16; /* 1: the bf16 kernel in use, 2: oneDNN's bf16 matmul, instead of bli_sgemm */
} sgemm_job;

static int sgemm_child(const void *arg, int threads, double unused) {
    const sgemm_job *job = arg;
    double g = job->bf16 == 1 ? cg_bf16_gemm_gflops(job->n, 3)
               : job->bf16 == 2 ? cg_bf16_onednn_gemm_gflops(job->n, 3)
                                : sgemm_gflops(job->n, 3);
    return write(job->fd, &g, sizeof g) == (ssize_t)sizeof g ? 0 : 1;
}

static double measure_sgemm(int64_t n, int threads, int bf16) {
    int fds[2];
    if (pipe(fds)) return NAN;
    double g = NAN;
    bool ok = in_child(sgemm_child, &(sgemm_job){n, fds[1], bf16}, threads, 0, bf16 ? "bf16-gemm" : "sgemm");
    close(fds[1]);
    if (!ok || read(fds[0], &g, sizeof g) != (ssize_t)sizeof g) g = NAN;
    close(fds[0]);
    return g;
}

/* ---- training steps ---- */

static int fail(const char *cfg, int threads, const char *what) {
    char msg[400];
    snprintf(msg, sizeof msg, "%s%s%s", what, *cg_last_error() ? ": " : "", cg_last_error());
    for (char *p = msg; *p; p++)
        if (*p == '"' || *p == '\\') *p = '\'';
    fprintf(stderr, "cgrad bench: %s: %s\n", cfg, msg);
    printf("{\"config\":\"%s\", \"threads\":%d, \"error\":\"%s\"}\n", cfg, threads, msg);
    return 1;
}

static void fill_ids(cg_tensor *t, cg_rng *r, int32_t lo, int32_t hi) {
    int32_t *d = cg_idata(t);
    for (int64_t i = 0; i < cg_numel(t); i++) d[i] = lo + (int32_t)(cg_rng_next(r) % (uint64_t)(hi - lo));
}

static void fill_const(cg_tensor *t, int32_t v) {
    int32_t *d = cg_idata(t);
    for (int64_t i = 0; i < cg_numel(t); i++) d[i] = v;
}

/* Random batch for the arch: ids uniform over the vocabulary, no padding; BERT labels on 15% of
 * positions (-100 elsewhere), segments A then B, random next-sentence labels. */
static void fill_batch(const bench_config *c, const cg_model_graph *mg, int64_t vocab, cg_rng *r) {
    switch (c->arch) {
    case CG_ARCH_GPT2:
    case CG_ARCH_LLAMA:
        fill_ids(cg_model_graph_input(mg, "input_ids"), r, 0, (int32_t)vocab);
        fill_ids(cg_model_graph_input(mg, "targets"), r, 0, (int32_t)vocab);
        break;
    case CG_ARCH_BERT: {
        fill_ids(cg_model_graph_input(mg, "input_ids"), r, 0, (int32_t)vocab);
        int32_t *tt = cg_idata(cg_model_graph_input(mg, "token_type_ids"));
        int32_t *lb = cg_idata(cg_model_graph_input(mg, "labels"));
        for (int64_t i = 0; i < c->batch * c->t; i++) {
            tt[i] = (i % c->t) >= c->t / 2;
            lb[i] = cg_rng_uniform(r) < 0.15 ? (int32_t)(cg_rng_next(r) % (uint64_t)vocab) : -100;
        }
        fill_const(cg_model_graph_input(mg, "attention_mask"), 1);
        fill_ids(cg_model_graph_input(mg, "next_sentence_label"), r, 0, 2);
        break;
    }
    case CG_ARCH_ENCDEC:
        fill_ids(cg_model_graph_input(mg, "src"), r, 3, (int32_t)vocab);
        fill_const(cg_model_graph_input(mg, "src_mask"), 1);
        fill_ids(cg_model_graph_input(mg, "tgt_in"), r, 3, (int32_t)vocab);
        fill_ids(cg_model_graph_input(mg, "tgt_out"), r, 3, (int32_t)vocab);
        break;
    case CG_ARCH_CLASSIFIER:
    case CG_ARCH_VIT: /* no bench config has an image model */
    case CG_ARCH_CNN: break;
    }
}

typedef struct {
    int steps, warmup;
    bool checkpoint;      /* gradient checkpointing on */
    bool separate_step;   /* cg_optim_step after backward instead of the update inside backward */
    int64_t batch, t;     /* overrides of the config's shape (0: the config's) */
} run_opts;
static run_opts opts;

/* Model FLOPs of one training step (see the header printed by cmd_bench). */
/* BERT's masked-LM decoder (its tied word embeddings) runs only on the labelled rows, head_rows of
 * them; every other matmul parameter on every token. */
static double step_flops(const bench_config *c, cg_params *ps, int64_t d, int64_t attn_len_sum, int64_t head_rows,
                         int64_t *n_matmul) {
    int64_t n = cg_params_numel(ps);
    for (int k = 0; k < 3 && c->lookup_only[k]; k++) {
        cg_tensor *p = cg_params_find(ps, c->lookup_only[k]);
        if (p) n -= cg_numel(p);
        else fprintf(stderr, "cgrad bench: %s: no parameter %s (FLOP count includes nothing for it)\n", c->name, c->lookup_only[k]);
    }
    *n_matmul = n;
    const double tokens = (double)(c->batch * c->t);
    cg_tensor *decoder = c->arch == CG_ARCH_BERT ? cg_params_find(ps, "bert.embeddings.word_embeddings.weight") : NULL;
    const double on_labelled = decoder ? (double)cg_numel(decoder) : 0;
    return (6.0 * ((double)n - on_labelled) + 12.0 * (double)d * (double)attn_len_sum) * tokens +
           6.0 * on_labelled * (double)head_rows;
}

/* The rows BERT's masked-LM head runs on: the batch's labelled positions. */
static int64_t labelled_rows(const cg_model_graph *mg) {
    cg_tensor *labels = cg_model_graph_input(mg, "labels");
    if (!labels || cg_tensor_dtype(labels) != CG_INT32) return 0;
    const int32_t *l = cg_idata(labels);
    int64_t n = 0;
    for (int64_t i = 0; i < cg_numel(labels); i++) n += l[i] != -100;
    return n;
}

static double bf16_ref = NAN;   /* the bf16 GEMM reference of this config's run (bf16 only): the kernel in use */
static double onednn_ref = NAN; /* oneDNN's, beside it (the same when oneDNN is the kernel) */

static int train_child(const void *arg, int threads, double sgemm) {
    bench_config shaped = *(const bench_config *)arg;
    if (opts.batch) shaped.batch = opts.batch;
    if (opts.t) shaped.t = opts.t;
    const bench_config *c = &shaped;
    cg_params *ps = cg_params_new();
    cg_model *m = cg_model_new(c->arch, c->json, 0.0, ps, 1234);
    if (!m) return fail(c->name, threads, "cannot make the model");
    int64_t vocab = 0, d = 0, attn = 0; /* attn: summed key length over attention blocks */
    if (c->arch == CG_ARCH_GPT2) {
        const cg_gpt_config *g = cg_gpt_cfg(cg_model_gpt(m));
        vocab = g->vocab_size, d = g->n_embd, attn = g->n_layer * c->t;
    } else if (c->arch == CG_ARCH_LLAMA) {
        const cg_llama_config *l = cg_llama_cfg(cg_model_llama(m));
        vocab = l->vocab_size, d = l->num_attention_heads * l->head_dim, attn = l->num_hidden_layers * c->t;
    } else if (c->arch == CG_ARCH_BERT) {
        const cg_bert_config *b = cg_bert_cfg(cg_model_bert(m));
        vocab = b->vocab_size, d = b->hidden_size, attn = b->num_hidden_layers * c->t;
    } else {
        const cg_encdec_config *e = cg_encdec_cfg(cg_model_encdec(m));
        vocab = e->tgt_vocab_size, d = e->d_model;
        attn = e->num_encoder_layers * c->s + e->num_decoder_layers * (c->t + c->s);
    }
    double t_build = now_s();
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_model_graph mg;
    if (!g || cg_model_build(g, m, c->batch, c->t, c->s, &mg)) return fail(c->name, threads, "cannot build the graph");
    cg_graph_set_checkpointing(g, opts.checkpoint);
    cg_rng r;
    cg_rng_seed(&r, 42);
    fill_batch(c, &mg, vocab, &r);
    cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
    oc.lr = 1e-4;
    cg_optim *opt = cg_optim_new(ps, &oc);
    if (!opt) return fail(c->name, threads, "cannot make the optimizer");
    if (!opts.separate_step && cg_optim_attach(opt, g)) return fail(c->name, threads, "cannot attach the optimizer");
    t_build = now_s() - t_build;

    const int total = opts.warmup + opts.steps;
    /* the per-step arrays in one block: step times, CPU times, the references after them (cgrad's
     * and BLIS's), the step each follows, and the paired fractions (sgemm's, then BLIS's) */
    const size_t per_step = (size_t)(opts.steps > 0 ? opts.steps : 1);
    double *times = malloc(7 * per_step * sizeof *times);
    if (!times) return fail(c->name, threads, "out of memory");
    double *cpu = times + per_step, *refs = cpu + per_step, *blis_refs = refs + per_step,
           *ref_times = blis_refs + per_step, *fr = ref_times + per_step;
    double first_loss = NAN, last_loss = NAN, rss = 0;
    int nrefs = 0;
    sgemm_ref ref = {0};
    double blis_pool_mb = 0;
    for (int k = 0; k < total; k++) {
        /* The reference product runs after each timed step too, so that it sees the machine the
         * steps see (the speed of these shared machines drifts). Its 48 MB come after the first
         * step, which has made every buffer a step uses: the peak is read before them (and checked
         * against what stays resident after the last step). */
        if (k == (opts.warmup > 0 ? opts.warmup : 1) && !ref.a) {
            rss = peak_rss_mb();
            if (sgemm_ref_init(&ref, 2048)) {
                sgemm_ref_run(&ref, false); /* the warm-ups */
                /* BLIS keeps the packing blocks of its own driver in a pool for good: not the step's */
                const double before = rss_now_mb();
                sgemm_ref_run(&ref, true);
                blis_pool_mb = rss_now_mb() - before;
            }
        }
        double t0 = now_s(), c0 = cpu_s();
        cg_params_zero_grad(ps);
        cg_status st = cg_graph_forward(g);
        if (!st && opts.separate_step) st = cg_graph_backward(g, mg.loss);
        if (!st) st = opts.separate_step ? cg_optim_step(opt, oc.lr) : cg_optim_backward_step(opt, g, mg.loss, oc.lr);
        double dt = now_s() - t0, dc = cpu_s() - c0;
        if (st) return fail(c->name, threads, "training step failed");
        last_loss = cg_item(mg.loss);
        if (k == 0) first_loss = last_loss;
        if (!isfinite(last_loss)) return fail(c->name, threads, "loss is not finite");
        if (k >= opts.warmup) times[k - opts.warmup] = dt, cpu[k - opts.warmup] = dc;
        /* twice: the first finds its operands evicted by the step (12% slower for encdec-base here),
         * the second runs warm, as the best of 3 before the config does */
        if (k >= opts.warmup && ref.a) {
            sgemm_ref_run(&ref, false);
            ref_times[nrefs] = dt;
            refs[nrefs] = sgemm_ref_run(&ref, false);
            blis_refs[nrefs++] = sgemm_ref_run(&ref, true);
        }
    }
    sgemm_ref_free(&ref);
    if (!rss) rss = peak_rss_mb(); /* no reference ran: the peak is the step's */
    else {
        const double now = rss_now_mb() - blis_pool_mb;
        if (now > rss) rss = now;
    }
    const double sgemm_best = sgemm; /* best of 3 before the config, in a child of its own */
    int64_t n_matmul;
    const double flops = step_flops(c, ps, d, attn, labelled_rows(&mg), &n_matmul);
    /* before the medians sort refs (a run without warm-ups times its first step before any reference) */
    const double frac_paired = nrefs ? paired_fraction(flops, ref_times, refs, nrefs, fr) : NAN,
                 blis_frac = nrefs ? paired_fraction(flops, ref_times, blis_refs, nrefs, fr + nrefs) : NAN;
    if (nrefs) sgemm = median(refs, nrefs);
    const double blis_sgemm = nrefs ? median(blis_refs, nrefs) : NAN;
    double med = median(times, opts.steps), med_cpu = median(cpu, opts.steps);
    double tokens = (double)(c->batch * c->t), gflops = flops / med / 1e9;
    const double frac = nrefs ? frac_paired : gflops / sgemm; /* without references: against the best of 3 before */
    printf("%-12s batch %lld x %lld%s, %.2fM params (%.2fM in matmuls), graph %d nodes / %.0f MB (plan %.0f MB%s), "
           "build %.2f s\n",
           c->name, (long long)c->batch, (long long)c->t, c->arch == CG_ARCH_ENCDEC ? " (+ source 64)" : "",
           (double)cg_params_numel(ps) / 1e6, (double)n_matmul / 1e6, cg_graph_size(g),
           (double)cg_graph_bytes(g) / 1048576.0, (double)cg_graph_plan_bytes(g) / 1048576.0,
           opts.checkpoint ? ", checkpointing activations" : "", t_build);
    printf("%-12s loss %.4f -> %.4f over %d steps; median %.1f ms/step (min %.1f, max %.1f), %.0f tokens/s, "
           "%.1f GFLOP/s = %.2f of sgemm, peak RSS %.0f MB\n",
           c->name, first_loss, last_loss, total, med * 1e3, times[0] * 1e3, times[opts.steps - 1] * 1e3,
           tokens / med, gflops, frac, rss);
    long long runs_all, runs_one, probes;
    cgi_cores_counts(&runs_all, &runs_one, &probes);
    const char *guard_line = cgi_cores_summary();
    if (guard_line) printf("%-12s %s\n", c->name, guard_line);
    if (nrefs)
        printf("%-12s sgemm between the timed steps: median %.1f GFLOP/s of %d (min %.1f, max %.1f); each step against "
               "the one after it: %.2f (min %.2f, max %.2f); against the best of 3 before the config, %.1f: %.2f\n",
               c->name, sgemm, nrefs, refs[0], refs[nrefs - 1], frac, fr[0], fr[nrefs - 1], sgemm_best,
               gflops / sgemm_best);
    if (nrefs)
        printf("%-12s BLIS's own threaded sgemm on the same kernels (bli_sgemm), after each of those: median %.1f GFLOP/s "
               "(min %.1f, max %.1f); against it: %.2f\n",
               c->name, blis_sgemm, blis_refs[0], blis_refs[nrefs - 1], blis_frac);
    const bool bf16 = cg_default_precision() == CG_BF16;
    if (bf16) printf("%-12s %.2f of the bf16 GEMM reference (%.1f GFLOP/s)\n", c->name, gflops / bf16_ref, bf16_ref);
    printf("{\"config\":\"%s\", \"threads\":%d, \"precision\":\"%s\", \"batch\":%lld, \"context\":%lld, "
           "\"checkpoint_activations\":%d, \"separate_step\":%d, \"ms_per_step\":%.3f, \"tokens_per_s\":%.1f, \"gflops\":%.3f, \"sgemm_fraction\":%.4f, "
           "\"sgemm_gflops\":%.3f, \"sgemm_fraction_best_before\":%.4f, \"sgemm_gflops_best_before\":%.3f, ",
           c->name, threads, cg_precision_name(cg_default_precision()), (long long)c->batch, (long long)c->t,
           opts.checkpoint, opts.separate_step, med * 1e3, tokens / med, gflops, frac, sgemm, gflops / sgemm_best, sgemm_best);
    if (nrefs) printf("\"sgemm_fraction_min\":%.4f, \"sgemm_fraction_max\":%.4f, ", fr[0], fr[nrefs - 1]);
    if (bf16) {
        char amx[32] = "null"; /* no AMX: JSON has no NaN */
        if (isfinite(cg_bf16_amx_ratio())) snprintf(amx, sizeof amx, "%.3f", cg_bf16_amx_ratio());
        printf("\"bf16_kernel\":\"%s\", \"bf16_dot_ratio\":%.3f, \"bf16_amx_ratio\":%s, \"bf16_gemm_fraction\":%.4f, "
               "\"bf16_gemm_gflops\":%.1f, \"onednn_gemm_gflops\":%.1f, ",
               cg_bf16_kernel(), cg_bf16_dot_ratio(), amx, gflops / bf16_ref, bf16_ref, onednn_ref);
    }
    if (nrefs) printf("\"blis_sgemm_gflops\":%.3f, \"blis_sgemm_fraction\":%.4f, ", blis_sgemm, blis_frac);
    printf("\"peak_rss_mb\":%.1f, \"plan_mb\":%.1f, \"cpu_ms_per_step\":%.3f, \"runs_one_thread\":%lld}\n", rss,
           (double)cg_graph_plan_bytes(g) / 1048576.0, med_cpu * 1e3, runs_one);
    free(times);
    cg_optim_free(opt);
    cg_graph_free(g);
    cg_model_free(m);
    cg_params_free(ps);
    return 0;
}

/* ---- generation ---- */

enum { GEN_REPS = 5 };

/* Greedy generation of a decoder config (gpt-tiny, llama-tiny) with and without the KV cache. */
static int gen_child(const void *arg, int threads, double unused) {
    const bench_config *c = arg;
    const int64_t n_prompt = 16, n_new = 200;
    char name[64];
    snprintf(name, sizeof name, "%s-gen", c->name);
    cg_params *ps = cg_params_new();
    cg_model *m = cg_model_new(c->arch, c->json, 0.0, ps, 1234);
    if (!m) return fail(name, threads, "cannot make the model");
    int32_t prompt[16], out[2][16 + 200];
    cg_rng r;
    cg_rng_seed(&r, 42);
    for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)(cg_rng_next(&r) % 256);
    cg_sampling greedy = {0.0, 0, 0.0};
    double tps[2];
    for (int cache = 1; cache >= 0; cache--) {
        if (cg_model_generate(m, prompt, n_prompt, 8, &greedy, 1, cache, out[cache])) /* warm-up */
            return fail(name, threads, "generation failed");
        /* the cached run is short, so a busy machine moves it most: the median of GEN_REPS */
        double secs[GEN_REPS];
        const int reps = cache ? GEN_REPS : 1;
        for (int rep = 0; rep < reps; rep++) {
            double t0 = now_s();
            if (cg_model_generate(m, prompt, n_prompt, n_new, &greedy, 1, cache, out[cache]))
                return fail(name, threads, "generation failed");
            secs[rep] = now_s() - t0;
        }
        tps[cache] = (double)n_new / median(secs, reps);
        printf("%s %s KV cache: %d-token prompt + %d new tokens (greedy), %.1f tokens/s\n", name,
               cache ? "with   " : "without", (int)n_prompt, (int)n_new, tps[cache]);
    }
    /* Greedy decoding is deterministic, so the cache must not change a token (float ties aside). */
    int same = 0;
    while (same < n_prompt + n_new && out[0][same] == out[1][same]) same++;
    if (same < n_prompt + n_new)
        printf("%s WARNING: cached and uncached generation differ from token %d on\n", name, same - (int)n_prompt);
    printf("{\"config\":\"%s\", \"threads\":%d, \"precision\":\"%s\", \"tokens_per_s\":%.1f, \"tokens_per_s_nocache\":%.1f}\n",
           name, threads, cg_precision_name(cg_default_precision()), tps[1], tps[0]);
    cg_model_free(m);
    cg_params_free(ps);
    return 0;
}

int cmd_bench(int argc, char **argv) {
    cli_args a;
    const bool ok_args = cli_parse("bench", cli_bench_opts, argc, argv, &a) && cli_words(&a, 0, 0, NULL);
    const char *name = ok_args ? cli_str(&a, "--config", NULL) : NULL;
    const int64_t th = ok_args ? cli_int(&a, "--threads", 0) : 0;
    opts.steps = ok_args ? (int)cli_int(&a, "--steps", 5) : 0;
    opts.warmup = ok_args ? (int)cli_int(&a, "--warmup", 1) : 0;
    const bool gen = ok_args && cli_has(&a, "--gen");
    opts.checkpoint = ok_args && cli_has(&a, "--checkpoint-activations");
    opts.separate_step = ok_args && cli_has(&a, "--separate-step");
    opts.batch = ok_args ? cli_int(&a, "--batch", 0) : 0;
    opts.t = ok_args ? cli_int(&a, "--context", 0) : 0;
    if (!ok_args) {
        fprintf(stderr, "configs:");
        for (int i = 0; i < N_CONFIGS; i++) fprintf(stderr, " %s", configs[i].name);
        fprintf(stderr, "\n");
        return 2;
    }
    const int prc = cli_set_precision(&a, "fp32"); /* decides from cpuid only: still fork-safe */
    if (prc) return prc;
    /* Setting the count starts no thread, so the parent stays fork-safe. */
    cg_set_threads((int)th);
    const int threads = cg_threads();
    bool any = false, ok = true;
    if (!name && gen) name = "none";
    if (!name) name = "all";
    for (int i = 0; i < N_CONFIGS; i++) any |= !strcmp(name, "all") || !strcmp(name, configs[i].name);
    if (!any && strcmp(name, "none")) {
        fprintf(stderr, "cgrad bench: unknown config '%s' (all", name);
        for (int i = 0; i < N_CONFIGS; i++) fprintf(stderr, ", %s", configs[i].name);
        fprintf(stderr, ")\n");
        return 2;
    }
    printf("# cgrad bench: %d thread(s), %d warm-up + %d timed steps per config (median reported)%s, precision %s\n",
           threads, opts.warmup, opts.steps, sizeof(cg_real) == 8 ? ", float64 build" : ", float32",
           cg_precision_name(cg_default_precision()));
    printf("# %s\n", cg_runtime_info());
    if (cg_default_precision() == CG_BF16) cli_print_bf16_kernel("# ");
    printf("# step = zero grads + forward + loss + backward + AdamW update (%s); dropout 0; random token data%s\n",
           opts.separate_step ? "a separate step after backward" : "each parameter's inside backward, once its gradient is final",
           opts.checkpoint ? "; activations checkpointed per block (backward recomputes them)" : "");
    printf("# model FLOPs/step = (6*N + 12*d*sum_attn(keys)) * tokens  (nanoGPT estimate_mfu: 6N + 12*L*H*Q*T per token)\n"
           "#   N = parameters used in matmuls (position/segment tables and untied input embeddings excluded),\n"
           "#   sum_attn(keys) = key length summed over attention blocks (L*T; encdec: Le*S + Ld*(T+S)), tokens = B*T\n");
    printf("# sgemm fraction = model GFLOP/s / GFLOP/s of a 2048^3 product on the kernel set in use: the median over the\n"
           "#   timed steps of each step's against the warm run right after it (interleaved, so both see the same\n"
           "#   machine; the run before it, with operands the step evicted, is not counted); the best of 3 just before\n"
           "#   the config is shown beside it; BLIS's own threaded sgemm of the same operands and kernels (bli_sgemm)\n"
           "#   runs after each, for comparison\n");
    for (int i = 0; i < N_CONFIGS; i++) {
        if (strcmp(name, "all") && strcmp(name, configs[i].name)) continue;
        const double sgemm = measure_sgemm(2048, threads, false);
        if (cg_default_precision() == CG_BF16) {
            const bool onednn = !strcmp(cg_bf16_kernel(), "onednn");
            bf16_ref = measure_sgemm(2048, threads, 1);
            onednn_ref = onednn ? bf16_ref : measure_sgemm(2048, threads, 2);
            printf("%-12s bf16 GEMM reference (the kernel in use, %s: bf16 in, float out, 2048^3) %.1f GFLOP/s; oneDNN's "
                   "matmul %.1f\n", configs[i].name, onednn ? "oneDNN's matmul" : "the fp32 units", bf16_ref, onednn_ref);
        }
        printf("%-12s sgemm reference %.1f GFLOP/s before (best of 3, %d threads); load average %s", configs[i].name, sgemm, threads,
               loadavg());
        ok &= in_child(train_child, &configs[i], threads, sgemm, configs[i].name);
    }
    for (int i = 0; gen && i < N_CONFIGS; i++) /* the decoders of gpt-tiny's size */
        if (!strcmp(configs[i].name, "gpt-tiny") || !strcmp(configs[i].name, "llama-tiny"))
            ok &= in_child(gen_child, &configs[i], threads, 0, configs[i].name);
    return ok ? 0 : 1;
}
