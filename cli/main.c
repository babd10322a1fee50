/* The cgrad command: one binary, one subcommand per job. */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cgrad.h"
#include "cli/commands.h"

const cli_opt cli_gradcheck_opts[] = {{"--op", CLI_STR, 0, 0, "only ops whose name contains this"},
                                      {"--tol", CLI_NUM, 0, DBL_MAX, "relative tolerance (0: each op's own)"},
                                      {"--threads", CLI_INT, 1, 1024, "threads (CGRAD_THREADS or all cores)"},
                                      {NULL, CLI_BARE, 0, 0, NULL}};

static int cmd_gradcheck(int argc, char **argv) {
    cli_args a;
    if (!cli_parse("gradcheck", cli_gradcheck_opts, argc, argv, &a) || a.n_words) {
        fprintf(stderr, "usage: cgrad gradcheck [--op NAME] [--tol REL] [--threads N]\n");
        return 2;
    }
    if (cli_has(&a, "--threads")) cg_set_threads((int)cli_int(&a, "--threads", 0));
    int failed = cg_gradcheck_ops(stdout, cli_num(&a, "--tol", 0), cli_str(&a, "--op", NULL));
    printf("%s: %d failed\n", failed ? "FAIL" : "PASS", failed);
    return failed ? 1 : 0;
}

/* The option tables of every subcommand, for `cgrad flags`. */
static const struct {
    const char *cmd;
    const cli_opt *opts;
} tables[] = {{"train", cli_train_opts},         {"sample", cli_sample_opts}, {"translate", cli_translate_opts},
              {"fill-mask", cli_fill_mask_opts}, {"classify", cli_classify_opts}, {"eval", cli_eval_opts},
              {"info", cli_info_opts},           {"plot", cli_plot_opts},     {"gradcheck", cli_gradcheck_opts},
              {"step", cli_step_opts},           {"bench", cli_bench_opts}};

static int cmd_flags(int argc, char **argv) {
    (void)argv;
    if (argc) {
        fprintf(stderr, "usage: cgrad flags\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) cli_print_opts(stdout, tables[i].cmd, tables[i].opts);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: cgrad COMMAND [ARGS]\n"
            "  train       train a model (no arguments: a character-level GPT on data/moby-dick.txt)\n"
            "  sample      generate text from a GPT checkpoint\n"
            "  translate   decode with an encoder-decoder checkpoint (greedy or --beam N)\n"
            "  fill-mask   a BERT checkpoint's top tokens for [MASK]\n"
            "  classify    label and probabilities from a classifier checkpoint\n"
            "  eval        loss, perplexity, bits per character (accuracy, exact match) over a file\n"
            "  info        what a checkpoint holds\n"
            "  plot        draw a metrics CSV as an SVG loss chart\n"
            "  gradcheck   check every op's gradient against finite differences (table; exit 1 on a failure)\n"
            "  step        one forward/backward (and AdamW steps) of a zoo model on a batch file, outputs dumped\n"
            "  bench       time training steps (and --gen generation) of the benchmark configs, JSON lines\n"
            "  flags       every command's options: command, flag, kind and range, one a line\n"
            "  help        this text\n"
            "  --version   cgrad's and BLIS's versions, BLIS's kernel set and why, threads, OpenMP wait policy\n");
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
    wait_passively(argv);
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help")) {
        usage(stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("%s\n", cg_runtime_info());
        return 0;
    }
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {{"train", cmd_train},       {"sample", cmd_sample}, {"translate", cmd_translate},
                {"fill-mask", cmd_fill_mask}, {"classify", cmd_classify}, {"eval", cmd_eval},
                {"info", cmd_info},         {"plot", cmd_plot}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name)) return cmds[i].fn(argc - 2, argv + 2);
    if (!strcmp(argv[1], "gradcheck")) return cmd_gradcheck(argc - 2, argv + 2);
    if (!strcmp(argv[1], "step")) return cmd_step(argc - 2, argv + 2);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc - 2, argv + 2);
    if (!strcmp(argv[1], "flags")) return cmd_flags(argc - 2, argv + 2);
    fprintf(stderr, "cgrad: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
