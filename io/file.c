/* SPDX-License-Identifier: MIT */
/* Bounded reading of a user's file: one check of what the path is (a regular file within the
 * limit, or a pipe read with a bound), shared by every reader. A device such as /dev/zero or
 * /dev/urandom never ends, so it is refused before a byte is read. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graph/internal.h"
#include "io/file_internal.h"

const char *cgi_bytes_str(uint64_t bytes) {
    static _Thread_local char buf[4][32];
    static _Thread_local int k;
    char *b = buf[k = (k + 1) % 4];
    static const char *const unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    double v = (double)bytes;
    while (v >= 1024 && u < 4 && bytes % 1024 == 0) v /= 1024, bytes /= 1024, u++;
    snprintf(b, sizeof buf[0], "%.4g %s", v, unit[u]);
    return b;
}

/* What a file that is not a regular one is, for a refusal. */
static const char *kind_of(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISFIFO(m)) return "a pipe";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

int cgi_open_bounded(const char *path, uint64_t limit, const char *what, bool allow_pipe, uint64_t *size) {
    if (!what) what = "file";
    if (!path || !*path) {
        cgi_fail(CG_ERR_ARG, "[%s] %s: empty path", what, path ? path : "(null)");
        return -1;
    }
    /* O_NONBLOCK: opening a FIFO with no writer must not block; cleared below for reading */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        cgi_fail(CG_ERR_IO, "[%s] %s: cannot open: %s", what, path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        cgi_fail(CG_ERR_IO, "[%s] %s: cannot stat: %s", what, path, strerror(errno));
        close(fd);
        return -1;
    }
    const bool pipe_ok = allow_pipe && S_ISFIFO(st.st_mode);
    if (!S_ISREG(st.st_mode) && !pipe_ok) {
        if (S_ISDIR(st.st_mode)) cgi_fail(CG_ERR_IO, "[%s] %s: is a directory, not a file", what, path);
        else
            cgi_fail(CG_ERR_IO, "[%s] %s: is %s, not a regular file: refused (it has no size to bound the read)", what,
                     path, kind_of(st.st_mode));
        close(fd);
        return -1;
    }
    if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > limit) {
        cgi_fail(CG_ERR_RANGE, "[%s] %s: %lld bytes, over the %s limit for this kind of file (docs/limits.md)", what,
                 path, (long long)st.st_size, cgi_bytes_str(limit));
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (size) *size = S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
    return fd;
}

FILE *cgi_fopen_bounded(const char *path, uint64_t limit, const char *what, uint64_t *size) {
    int fd = cgi_open_bounded(path, limit, what, false, size);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        cgi_fail(CG_ERR_IO, "[%s] %s: cannot open: %s", what ? what : "file", path, strerror(errno));
        close(fd);
    }
    return f;
}

char *cgi_read_fd_bounded(int fd, const char *path, uint64_t limit, const char *what, size_t *len) {
    if (!what) what = "file";
    if (limit >= SIZE_MAX) limit = SIZE_MAX - 1;
    struct stat st;
    /* a regular file's size is a first guess only: /proc files say 0, and a file may grow */
    size_t cap = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size < limit ? (size_t)st.st_size + 1 : 0;
    if (cap < 4096) cap = 4096;
    if (cap > limit + 1) cap = (size_t)limit + 1;
    size_t n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) {
            cgi_fail(CG_ERR_NOMEM, "[%s] %s: out of memory after %zu bytes", what, path, n);
            return NULL;
        }
        if (n == cap) {
            if (cap > limit) { /* read limit + 1 bytes: more than the limit */
                free(buf);
                cgi_fail(CG_ERR_RANGE, "[%s] %s: more than %s, the limit for this kind of file (docs/limits.md)", what,
                         path, cgi_bytes_str(limit));
                return NULL;
            }
            size_t ncap = cap > (limit + 1) / 2 ? (size_t)limit + 1 : 2 * cap;
            char *b = realloc(buf, ncap + 1);
            if (!b) free(buf);
            buf = b;
            cap = ncap;
            continue;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int err = errno;
            free(buf);
            cgi_fail(CG_ERR_IO, "[%s] %s: read error: %s", what, path, strerror(err));
            return NULL;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

char *cgi_read_bounded(const char *path, uint64_t limit, const char *what, size_t *len) {
    int fd = cgi_open_bounded(path, limit, what, true, NULL);
    if (fd < 0) return NULL;
    char *buf = cgi_read_fd_bounded(fd, path, limit, what, len);
    close(fd);
    return buf;
}
