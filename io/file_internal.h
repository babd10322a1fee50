/* SPDX-License-Identifier: MIT */
/* Bounded reading of a user's file: every reader of a path a user names (config, run file, data,
 * checkpoint, tokenizer files, metrics to plot) opens it through these, so each has a size limit
 * and none can be handed a device or a socket that never ends. docs/limits.md lists the limits. */
#ifndef CGRAD_IO_FILE_INTERNAL_H
#define CGRAD_IO_FILE_INTERNAL_H
#include <stdint.h>
#include <stdio.h>

#include "cgrad.h"

/* The readers' byte limits (what docs/limits.md documents). */
#define CGI_LIMIT_JSON (64ull << 20)         /* config.json, run.json, tokenizer_config.json, a step's config */
#define CGI_LIMIT_TOKENIZER (512ull << 20)   /* vocab.txt, vocab.json, merges.txt, tokenizer.json */
#define CGI_LIMIT_DATA (2ull << 30)          /* a data file read whole: text, TSV, sentence pairs */
#define CGI_LIMIT_METRICS (256ull << 20)     /* a metrics CSV or JSON lines file (plot, resume) */
#define CGI_LIMIT_WEIGHTS (1ull << 40)       /* a safetensors file or a .ckpt (mapped or streamed, not copied) */
#define CGI_LIMIT_STREAM (4ull << 30)        /* a safetensors image read from a pipe */
#define CGI_LIMIT_INFLATED (64ull << 30)     /* a .ckpt's safetensors image once inflated */

/* Opens path for reading when it is a regular file of at most limit bytes, or (allow_pipe) a pipe,
 * which the caller must read with a bound. Returns the descriptor and, if size is given, the
 * file's size (0 for a pipe); -1 with "[what] path: reason" when it is a directory, a device, a
 * socket, too large, or cannot be opened. */
int cgi_open_bounded(const char *path, uint64_t limit, const char *what, bool allow_pipe, uint64_t *size);

/* cgi_open_bounded as a stdio stream (mode "rb" or "r"); NULL with the message on a refusal. */
FILE *cgi_fopen_bounded(const char *path, uint64_t limit, const char *what, uint64_t *size);

/* Reads all of fd (a regular file or a pipe) into a malloc'd, NUL-terminated buffer the caller
 * frees; more than limit bytes is refused. NULL with "[what] path: reason" on a failure. */
char *cgi_read_fd_bounded(int fd, const char *path, uint64_t limit, const char *what, size_t *len);

/* Reads the whole of path (a regular file or a pipe) of at most limit bytes; the caller frees.
 * NULL with "[what] path: reason" when refused or unreadable. */
char *cgi_read_bounded(const char *path, uint64_t limit, const char *what, size_t *len);

/* Reads path whole within limit as cg_read_text_file does (UTF-8, no NUL, not empty, a byte-order
 * mark dropped); errors are "[what] path: reason". */
cg_status cgi_read_text_bounded(const char *path, uint64_t limit, const char *what, char **text, size_t *len);

/* "1.5 GiB": a limit for a message, in a rotating static buffer. */
const char *cgi_bytes_str(uint64_t bytes);

#endif
