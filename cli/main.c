/* SPDX-License-Identifier: MIT */
/* The cgrad command: one binary, one subcommand per job. Every subcommand is one row of the table
 * below (its usage line, what it does, its option table), so `--help`, `cgrad help` and the README's
 * command table all come from the same place. */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cgrad.h"
#include "cli/commands.h"

const cli_opt cli_gradcheck_opts[] = {{"--op", CLI_STR, 0, 0, "only ops whose name contains this (no match: an error)"},
                                      {"--tol", CLI_NUM, 0, DBL_MAX, "relative tolerance (0: each op's own)"},
                                      {"--threads", CLI_INT, 1, 1024, "threads (CGRAD_THREADS or all cores)"},
                                      {NULL, CLI_BARE, 0, 0, NULL}};

static int cmd_gradcheck(int argc, char **argv) {
    cli_args a;
    if (cli_arg(argc, argv, "--precision")) { /* not in the table: say why rather than "unknown option" */
        fprintf(stderr, "cgrad gradcheck: --precision does not apply: gradient checks stay in fp32/fp64\n");
        return 2;
    }
    if (!cli_parse("gradcheck", cli_gradcheck_opts, argc, argv, &a) || !cli_words(&a, 0, 0, NULL)) return 2;
    if (cli_has(&a, "--threads")) cg_set_threads((int)cli_int(&a, "--threads", 0));
    const char *only = cli_str(&a, "--op", NULL);
    bool known = !only;
    for (int op = 0; cg_op_name(op) && !known; op++) known = strstr(cg_op_name(op), only) != NULL;
    if (!known) { /* a filter that matches nothing would print an empty table and pass */
        fprintf(stderr, "cgrad gradcheck: --op '%s' is part of no op's name (cgrad gradcheck lists them all)\n", only);
        return 2;
    }
    int failed = cg_gradcheck_ops(stdout, cli_num(&a, "--tol", 0), only);
    printf("%s: %d failed\n", failed ? "FAIL" : "PASS", failed);
    return failed ? 1 : 0;
}

static int cmd_flags(int argc, char **argv);
static int cmd_help(int argc, char **argv);

/* One subcommand: its name, entry point, option table, usage (after "cgrad NAME"), a one-line
 * summary, and notes printed after the options. */
typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const cli_opt *opts;
    const char *usage, *summary, *notes;
} command;

static const cli_opt no_opts[] = {{NULL, CLI_BARE, 0, 0, NULL}};

static const command commands[] = {
    {"train", cmd_train, cli_train_opts, "[--config run.json] [--resume [CKPT]] [options]",
     "train a model (no options: a character-level GPT on moby-dick.txt, a few minutes on 2 cores)",
     "Defaults shown are --arch's (cgrad train --arch bert --help: BERT's). --config FILE reads options from a\n"
     "JSON object whose keys are the flags without dashes (\"grad_accum\" or \"grad-accum\"); flags given here win.\n"
     "Written beside the checkpoint NAME.ckpt: NAME_run.json (the resolved options, a --config file for the run);\n"
     "beside the metrics CSV: the same rows as JSON lines (.jsonl). Default data (moby-dick.txt, sentiment/,\n"
     "gpt2/, bert/vocab.txt) is looked up in $CGRAD_DATA, then ./data.\n"
     "Last line: final step=N train_loss=X val_loss=Y tokens_per_s=Z (train_loss: mean since the previous\n"
     "evaluation; tokens_per_s: training tokens over training seconds). Ctrl-C saves a checkpoint, exits 130."},
    {"sample", cmd_sample, cli_sample_opts, "--checkpoint CKPT [--prompt TEXT] [options]",
     "generate text from a GPT or LLaMA checkpoint", NULL},
    {"translate", cmd_translate, cli_translate_opts, "--checkpoint CKPT [--beam N] [TEXT...]",
     "decode with an encoder-decoder checkpoint (greedy or --beam N)",
     "TEXT: the words form one source sentence; no TEXT: one sentence per stdin line."},
    {"fill-mask", cmd_fill_mask, cli_fill_mask_opts, "--checkpoint CKPT [--top-k K] TEXT-with-[MASK]",
     "a BERT checkpoint's top tokens for [MASK]", "The words form one text; it must hold [MASK]."},
    {"classify", cmd_classify, cli_classify_opts, "--checkpoint CKPT [TEXT...]",
     "label and class probabilities from a classifier checkpoint",
     "One row per TEXT argument (quote a text that has spaces), or per stdin line when no TEXT is given:\n"
     "  label <TAB> label=probability ... <TAB> text"},
    {"eval", cmd_eval, cli_eval_opts, "--checkpoint CKPT --data FILE [options]",
     "loss, perplexity, bits per character (accuracy, exact match) over a file",
     "gpt2, llama: loss, perplexity and bits per character over the whole text; bert: masked-LM loss over --batches\n"
     "batches (50); encdec: loss and greedy exact match (--exact pairs, all); classifier: loss, accuracy and\n"
     "the majority-class rate."},
    {"info", cmd_info, cli_info_opts, "CKPT | --checkpoint CKPT | --system", "what a checkpoint holds, or (--system) this machine's kernels and threads",
     "--system: BLIS's version and kernel set and why, threads, the OpenMP wait policy, the cores guard, and the\n"
     "kernel bf16 products run on (it times a few products to choose, so it takes a moment)."},
    {"export", cmd_export, cli_export_opts, "CKPT DIR",
     "a checkpoint as a Hugging Face model directory: model.safetensors, config.json, tokenizer files",
     "DIR loads in transformers (gpt2: GPT2LMHeadModel, bert: BertForPreTraining) and back into cgrad:\n"
     "every CKPT argument (--checkpoint, --init-from, info) also takes such a DIR or its .safetensors file."},
    {"plot", cmd_plot, cli_plot_opts, "METRICS [METRICS...] [--out FILE.svg] [--labels A,B,...] [options]",
     "draw runs' metrics as SVG panels: loss, learning rate, tokens/s; several runs overlaid",
     "Each METRICS is a run's metrics CSV or JSON lines (NAME_metrics.csv, NAME_metrics.jsonl). One colour a run;\n"
     "the learning-rate and throughput panels appear when the files have lr and tok_per_s_... columns."},
    {"gradcheck", cmd_gradcheck, cli_gradcheck_opts, "[--op NAME] [--tol REL] [--threads N]",
     "check every op's gradient against finite differences (table; exit 1 on a failure)", NULL},
    {"step", cmd_step, cli_step_opts,
     "--arch A --config config.json --weights w.safetensors --batch b.safetensors (--out o.safetensors | --dot g.dot) [options]",
     "one forward/backward (and AdamW steps) of a zoo model on a batch file, outputs dumped", NULL},
    {"bench", cmd_bench, cli_bench_opts, "[--config NAME|all] [--steps N] [--warmup N] [--gen] [--threads N] [--precision fp32|bf16]",
     "time training steps (and --gen generation) of the benchmark configs, JSON lines", NULL},
    {"flags", cmd_flags, no_opts, "", "every command's options: command, flag, kind and range, one a line", NULL},
    {"help", cmd_help, no_opts, "[COMMAND | --markdown]",
     "the list of commands, or one command's help (as cgrad COMMAND --help)",
     "--markdown: the command table as Markdown, as the README has it."},
};
#define N_COMMANDS (int)(sizeof commands / sizeof commands[0])

static const command *find_command(const char *name) {
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(name, commands[i].name)) return &commands[i];
    return NULL;
}

static int cmd_flags(int argc, char **argv) {
    cli_args a;
    if (!cli_parse("flags", no_opts, argc, argv, &a) || !cli_words(&a, 0, 0, NULL)) return 2;
    for (int i = 0; i < N_COMMANDS; i++)
        if (commands[i].opts != no_opts) cli_print_opts(stdout, commands[i].name, commands[i].opts);
    return 0;
}

/* "cgrad NAME USAGE": the first line of a command's help. */
static void usage_line(FILE *f, const command *c) { fprintf(f, "usage: cgrad %s%s%s\n", c->name, *c->usage ? " " : "", c->usage); }

/* A command's --help: usage line, summary, the option table (value kind, default, help), notes. */
static void command_help(FILE *f, const command *c, int argc, char **argv) {
    usage_line(f, c);
    fprintf(f, "%c%s.\n", c->summary[0] >= 'a' && c->summary[0] <= 'z' ? c->summary[0] - 'a' + 'A' : c->summary[0],
            c->summary + 1);
    if (c->opts[0].flag) fprintf(f, "options:\n");
    const char *arch = cli_arg(argc, argv, "--arch");
    for (int k = 0; c->opts[k].flag; k++) {
        const cli_opt *o = &c->opts[k];
        static const char *const arg[] = {"", "S", "N", "X", "N", "FILE", "FILE"};
        char left[64], dflt[96] = "";
        snprintf(left, sizeof left, "%s %s", o->flag, arg[o->kind]);
        if (c->fn == cmd_train) cli_train_default(arch, o->flag, dflt, sizeof dflt);
        fprintf(f, "  %-22s %s", left, o->help);
        if (*dflt) fprintf(f, " [default: %s]", dflt);
        fprintf(f, "\n");
    }
    if (c->notes) fprintf(f, "%s\n", c->notes);
}

/* The list of commands, each with its usage line and summary. */
static void overview(FILE *f) {
    fprintf(f, "usage: cgrad COMMAND [ARGS]   (cgrad COMMAND --help, or cgrad help COMMAND: its options)\n");
    for (int i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "  --version  cgrad's version and how it was built (cgrad info --system: kernels, threads, bf16)\n");
    fprintf(f, "Commands that run a model take --precision fp32|bf16 (default fp32): bf16 runs the matrix products\n"
               "on bfloat16 operands with float accumulation (needs a build with oneDNN; on vdpbf16ps where it\n"
               "outruns the fp32 FMA units, else on those units with the operands widened: cgrad --version says which).\n");
}

/* The README's command table: command, first line of its --help, summary. */
static void markdown(FILE *f) {
    fprintf(f, "| command | first line of `--help` | what it does |\n|---|---|---|\n");
    for (int i = 0; i < N_COMMANDS; i++) {
        char line[512];
        snprintf(line, sizeof line, "usage: cgrad %s%s%s", commands[i].name, *commands[i].usage ? " " : "",
                 commands[i].usage);
        fprintf(f, "| `%s` | `", commands[i].name);
        for (const char *p = line; *p; p++) fprintf(f, *p == '|' ? "\\|" : "%c", *p); /* a cell's own bars are escaped */
        fprintf(f, "` | %s |\n", commands[i].summary);
    }
}

static int cmd_help(int argc, char **argv) {
    if (argc == 0) {
        overview(stdout);
        return 0;
    }
    if (argc == 1 && !strcmp(argv[0], "--markdown")) {
        markdown(stdout);
        return 0;
    }
    const command *c = !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h") ? find_command("help") : find_command(argv[0]);
    if (argc == 1 && c) {
        command_help(stdout, c, 0, NULL);
        return 0;
    }
    if (!c && argv[0][0] != '-') fprintf(stderr, "cgrad help: unknown command '%s' (cgrad help lists them)\n", argv[0]);
    else fprintf(stderr, "cgrad help: unexpected argument '%s' (usage: cgrad help [COMMAND | --markdown])\n",
                 argv[c ? 1 : 0]);
    return 2;
}

/* libgomp reads its wait policy once, when it loads, and by default a thread that runs out of work
 * spins for 300 000 pause instructions (milliseconds on recent x86) before it sleeps. Between the
 * thousands of parallel regions of a step, that spinning takes the cores from the threads with
 * work, ours and other processes': on a busy 2-core machine a 2-thread bert-small step took
 * 6.1-8.2 s spinning against 1.9-2.4 s passive (2.2-2.5 s on one thread). So unless the user
 * chose a policy, the command starts itself again with OMP_WAIT_POLICY=passive. */
static void wait_passively(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);
    unsetenv("OMP_WAIT_POLICY"); /* no re-exec here: run on with the default, which says so */
}

int main(int argc, char **argv) {
    char **full_argv = argv; /* what a re-exec repeats */
    if (argc < 2) {
        overview(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) return cmd_help(argc - 2, argv + 2);
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        if (argc > 2) {
            fprintf(stderr, "cgrad --version: unexpected argument '%s' (cgrad info --system shows the kernels and threads)\n", argv[2]);
            return 2;
        }
        printf("cgrad %s\n%s, distributed training %s\n", cg_version(), cg_build_info(), /* no timing, no probe */
               cg_dist_built() ? "through MPI" : "not built (no MPI)");
        return 0;
    }
    const command *c = find_command(argv[1]);
    if (!c) {
        const char *names[N_COMMANDS];
        for (int i = 0; i < N_COMMANDS; i++) names[i] = commands[i].name;
        const char *near = cli_closest(argv[1], names, N_COMMANDS);
        if (near) fprintf(stderr, "cgrad: unknown command '%s': did you mean '%s'? (cgrad help lists the commands)\n", argv[1], near);
        else fprintf(stderr, "cgrad: unknown command '%s' (cgrad help lists the commands)\n", argv[1]);
        return 2;
    }
    argc -= 2, argv += 2; /* the command's own arguments, with every --flag=value split in two */
    if (!cli_split_equals(c->name, c->opts, &argc, &argv)) return 2;
    if (c->fn != cmd_help && cli_wants_help(c->opts, argc, argv)) {
        command_help(stdout, c, argc, argv);
        return 0;
    }
    wait_passively(full_argv);
    return c->fn(argc, argv);
}
