#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

const char *cli_arg(int argc, char **argv, const char *name) {
    for (int i = 0; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return NULL;
}

bool cli_flag(int argc, char **argv, const char *name) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], name)) return true;
    return false;
}

bool cli_known(int argc, char **argv, const char *const *known, const char *cmd) {
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "--", 2)) continue;
        bool ok = false;
        for (int k = 0; known[k]; k++) ok |= !strcmp(argv[i], known[k]);
        if (!ok) {
            fprintf(stderr, "cgrad %s: unknown option %s\n", cmd, argv[i]);
            return false;
        }
    }
    return true;
}
