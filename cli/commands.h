/* SPDX-License-Identifier: MIT */
/* Subcommands of the cgrad tool; each returns the process exit code. */
#ifndef CGRAD_CLI_COMMANDS_H
#define CGRAD_CLI_COMMANDS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

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
/* cgrad export: a checkpoint as a Hugging Face model directory (model.safetensors, config.json, tokenizer). */
int cmd_export(int argc, char **argv);

/* Value after flag name in argv, or of "name=value" (NULL if absent). */
const char *cli_arg(int argc, char **argv, const char *name);
/* True if the bare flag is present. */
bool cli_flag(int argc, char **argv, const char *name);

/* ---- flag tables: each subcommand declares its options, one parser checks every value ---- */

/* What a flag's value must be. IN: a file that exists and is readable; OUT: a path whose
 * directory exists and is writable (and that is not a directory); BARE: no value. */
typedef enum { CLI_BARE, CLI_STR, CLI_INT, CLI_NUM, CLI_U64, CLI_IN, CLI_OUT } cli_kind;

/* One option: flag, kind, inclusive range for CLI_INT and CLI_NUM (hi DBL_MAX: unbounded; lo
 * DBL_TRUE_MIN: "greater than 0"; hi CLI_BELOW_1: "below 1"), and a line of help. */
typedef struct {
    const char *flag;
    cli_kind kind;
    double lo, hi;
    const char *help;
} cli_opt;

#define CLI_BELOW_1 0.99999999999999989 /* the double just below 1: [lo, 1) ranges */
#define CLI_MAX_OPTS 48

typedef union {
    const char *s;
    int64_t i;
    uint64_t u;
    double d;
} cli_value;

/* A parsed command line: the checked value of every option given, and the positional words. */
typedef struct {
    const char *cmd;
    const cli_opt *opts;
    int n;
    bool set[CLI_MAX_OPTS];
    cli_value v[CLI_MAX_OPTS];
    const char **words; /* positional arguments (argv reused; "--" ends the options) */
    int n_words;
} cli_args;

/* Checks one value against its option (the whole string must be the number; finite; in range;
 * files as the kind says); prints "cgrad CMD: --flag wants ..., got 'v'" and returns false if bad. */
bool cli_check_value(const char *cmd, const cli_opt *o, const char *v, cli_value *out);
/* Parses argv against the NULL-flag-terminated table opts: unknown flags, missing or bad values
 * and repeated flags print a message naming the flag and return false (a usage error: exit 2).
 * Positional words are compacted to the front of argv (a->words). */
bool cli_parse(const char *cmd, const cli_opt *opts, int argc, char **argv, cli_args *a);
/* Splits every "--flag=value" before a "--" into "--flag" "value" (argv is replaced by a new array
 * that lives as long as the process); an unknown flag, or a value given to a bare one, prints a
 * message and returns false (a usage error: exit 2). */
bool cli_split_equals(const char *cmd, const cli_opt *opts, int *argc, char ***argv);
/* Prints "cgrad CMD: unknown option W", with "did you mean F?" when a flag of opts is close to W. */
void cli_unknown_option(const char *cmd, const cli_opt *opts, const char *w);
/* The name among names[0..n) closest to word (a few edits at most), or NULL when none is close. */
const char *cli_closest(const char *word, const char *const *names, int n);
/* Makes directory path and its parents (mkdir -p); false after "cgrad CMD: FLAG 'path': ..." when
 * it cannot, or when path is not a writable directory. */
bool cli_make_dirs(const char *cmd, const char *flag, const char *path);
/* Checks the count of positional words is in [lo, hi]; otherwise prints "unexpected argument 'X'"
 * or "missing WHAT", pointing at --help, and returns false (a usage error: exit 2). */
bool cli_words(const cli_args *a, int lo, int hi, const char *what);
/* True if the option was given; otherwise prints "FLAG VALUE is required" and returns false. */
bool cli_require(const cli_args *a, const char *flag, const char *value);
/* True if argv asks for help (--help or -h where an option may stand, not as a flag's value). */
bool cli_wants_help(const cli_opt *opts, int argc, char **argv);
/* The default of train option flag for --arch arch (NULL: gpt2) into buf ("" when it has none). */
void cli_train_default(const char *arch, const char *flag, char *buf, size_t n);
/* A default data file or folder rel: $CGRAD_DATA/rel if CGRAD_DATA is set and it is there, else
 * data/rel under the working directory; NULL when neither exists, with cg_last_error() naming every
 * place looked and how to point at data (flag, or CGRAD_DATA). A static buffer (4 in turn). */
const char *cli_default_data(const char *rel, const char *flag);
/* True if the option was given. */
bool cli_has(const cli_args *a, const char *flag);
/* The checked value of an option, or dflt when it was not given. */
const char *cli_str(const cli_args *a, const char *flag, const char *dflt);
int64_t cli_int(const cli_args *a, const char *flag, int64_t dflt);
uint64_t cli_u64(const cli_args *a, const char *flag, uint64_t dflt);
double cli_num(const cli_args *a, const char *flag, double dflt);
/* True (message naming flags printed) if bytes exceed this machine's physical memory. */
bool cli_too_big(const char *cmd, const char *flags, double bytes);
/* The --precision option of every command that runs a model. */
#define CLI_PRECISION                                                                                                  \
    {"--precision", CLI_STR, 0, 0, "fp32|bf16: bf16 multiplies bfloat16 operands, accumulates in float (fp32)"}
/* Applies --precision (if given, else `dflt`) to every graph the command makes: 0, or the exit code
 * after a message naming the flag (2: not fp32 or bf16; 1: bf16 cannot run here, and why). */
int cli_set_precision(const cli_args *a, const char *dflt);
/* Prints, after prefix, the kernel bf16 products run on and why (or why bf16 cannot run). */
void cli_print_bf16_kernel(const char *prefix);
/* One line per option, "CMD<TAB>FLAG<TAB>KIND[<TAB>LO<TAB>HI]": what `cgrad flags` prints. */
void cli_print_opts(FILE *f, const char *cmd, const cli_opt *opts);

/* The flag tables of the subcommands (cgrad flags walks them; tests sweep them). */
extern const cli_opt cli_train_opts[], cli_sample_opts[], cli_translate_opts[], cli_fill_mask_opts[],
    cli_classify_opts[], cli_eval_opts[], cli_info_opts[], cli_plot_opts[], cli_step_opts[], cli_bench_opts[],
    cli_gradcheck_opts[], cli_export_opts[];

#endif
