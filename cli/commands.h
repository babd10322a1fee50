/* Subcommands of the cgrad tool; each returns the process exit code. */
#ifndef CGRAD_CLI_COMMANDS_H
#define CGRAD_CLI_COMMANDS_H

#include <stdbool.h>

/* cgrad step: one forward/backward (and optional AdamW steps) on a batch file, outputs dumped. */
int cmd_step(int argc, char **argv);
/* cgrad bench: training-step and generation timings of the zoo configs, one JSON line per config. */
int cmd_bench(int argc, char **argv);

/* cgrad train: trains a zoo model on a text or TSV file, with checkpoints, metrics and resume. */
int cmd_train(int argc, char **argv);
/* cgrad sample: text from a GPT checkpoint (KV cache; --no-cache recomputes every step). */
int cmd_sample(int argc, char **argv);
/* cgrad translate: greedy or beam decoding of an encoder-decoder checkpoint. */
int cmd_translate(int argc, char **argv);
/* cgrad fill-mask: a BERT checkpoint's top-k tokens for [MASK]. */
int cmd_fill_mask(int argc, char **argv);
/* cgrad classify: label and class probabilities from a classifier checkpoint. */
int cmd_classify(int argc, char **argv);
/* cgrad eval: loss (and perplexity, bits per character, accuracy, exact match) over a file. */
int cmd_eval(int argc, char **argv);
/* cgrad info: what a checkpoint holds. */
int cmd_info(int argc, char **argv);
/* cgrad plot: a metrics CSV as an SVG loss chart. */
int cmd_plot(int argc, char **argv);

/* Value after flag name in argv (NULL if absent). */
const char *cli_arg(int argc, char **argv, const char *name);
/* True if the bare flag is present. */
bool cli_flag(int argc, char **argv, const char *name);
/* Fails (message to stderr, false) if argv holds a flag not in the NULL-terminated known list. */
bool cli_known(int argc, char **argv, const char *const *known, const char *cmd);

#endif
