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
            "  gradcheck   check every op's gradient against finite differences (table; exit 1 on a failure)\n"
            "  step        one forward/backward (and AdamW steps) of a zoo model on a batch file, outputs dumped\n"
            "  help        this text\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help")) {
        usage(stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "gradcheck")) return cmd_gradcheck(argc - 2, argv + 2);
    if (!strcmp(argv[1], "step")) return cmd_step(argc - 2, argv + 2);
    fprintf(stderr, "cgrad: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
