/* SPDX-License-Identifier: MIT */
/* Output files written whole or not at all: the text goes to a temporary file beside the target,
 * which is renamed over it once every byte is written and flushed. A failed write (a full disk,
 * a file-size limit) is an error naming the path and the reason, and the temporary file is
 * removed, so a reader never sees half a plot or half a run file. */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cgrad.h"
#include "cli/commands.h"

void cli_ignore_sigxfsz(void) {
    /* past `ulimit -f` the kernel's default is to end the process before any cleanup can run;
     * ignored, the write fails with EFBIG and the error path removes its temporary file */
    signal(SIGXFSZ, SIG_IGN);
}

bool cli_out_open(cli_out *o, const char *path) {
    static atomic_uint counter;
    o->path = path;
    o->f = NULL;
    if (snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&counter, 1)) >=
        (int)sizeof o->tmp) {
        cg_set_error(CG_ERR_ARG, "[write] %s: path too long", path);
        return false;
    }
    o->f = fopen(o->tmp, "wx");
    if (!o->f) cg_set_error(CG_ERR_IO, "[write] %s: cannot create %s: %s", path, o->tmp, strerror(errno));
    return o->f != NULL;
}

cg_status cli_out_close(cli_out *o) {
    if (!o->f) return cg_set_error(CG_ERR_IO, "[write] %s: not open", o->path);
    /* fflush retries what a failed buffered write left, so errno says why it fails */
    errno = 0;
    int err = fflush(o->f) || ferror(o->f) ? (errno ? errno : EIO) : 0;
    if (!err && fsync(fileno(o->f)) && errno != EINVAL) err = errno;
    if (fclose(o->f) && !err) err = errno ? errno : EIO;
    o->f = NULL;
    if (!err && rename(o->tmp, o->path)) err = errno;
    if (!err) return CG_OK;
    unlink(o->tmp);
    return cg_set_error(CG_ERR_IO, "[write] %s: %s", o->path, strerror(err));
}

void cli_out_abort(cli_out *o) {
    if (o->f) fclose(o->f);
    o->f = NULL;
    unlink(o->tmp);
}
