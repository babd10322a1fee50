/* The cgrad command: one binary, one subcommand per job. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cgrad.h"
#include "cli/commands.h"

static int cmd_gradcheck(int argc, char **argv) {
    const char *filter = NULL;
    double tol = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--op") && i + 1 < argc) filter = argv[++i];
        else if (!strcmp(argv[i], "--tol") && i + 1 < argc) tol = atof(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) cg_set_threads(atoi(argv[++i]));
        else {
            fprintf(stderr, "usage: cgrad gradcheck [--op NAME] [--tol REL] [--threads N]\n");
            return 2;
        }
    }
    int failed = cg_gradcheck_ops(stdout, tol, filter);
    printf("%s: %d failed\n", failed ? "FAIL" : "PASS", failed);
    return failed ? 1 : 0;
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
            "  help        this text\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help")) {
        usage(stdout);
        return argc < 2 ? 2 : 0;
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
    fprintf(stderr, "cgrad: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
