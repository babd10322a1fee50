/* Subcommands of the cgrad tool; each returns the process exit code. */
#ifndef CGRAD_CLI_COMMANDS_H
#define CGRAD_CLI_COMMANDS_H

#include <stdbool.h>

/* cgrad step: one forward/backward (and optional AdamW steps) on a batch file, outputs dumped. */
int cmd_step(int argc, char **argv);

/* Value after flag name in argv (NULL if absent). */
const char *cli_arg(int argc, char **argv, const char *name);
/* True if the bare flag is present. */
bool cli_flag(int argc, char **argv, const char *name);
/* Fails (message to stderr, false) if argv holds a flag not in the NULL-terminated known list. */
bool cli_known(int argc, char **argv, const char *const *known, const char *cmd);

#endif
