/* SPDX-License-Identifier: MIT */
/* Checkpoints: the safetensors image streamed through deflate (gzip wrapper) into a temp file that
 * replaces the old checkpoint only once it is complete and on disk. Reading streams the file
 * through inflate, which checks the gzip CRC-32 and length trailer before we parse anything. */
#include "io/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "graph/internal.h"
#include "io/file_internal.h"
#include "io/safetensors_internal.h"

/* Float weights have no repeated strings for LZ77 to find; only their byte statistics (sign and
 * exponent bytes) compress. Huffman-only coding measured 2.7x faster than level 1 (66 vs 24 MB/s
 * of CPU) and slightly smaller (92.6% vs 93.0% of the raw size) on normal(0, 0.02) float32. */
#define CKPT_LEVEL Z_BEST_SPEED
#define CKPT_STRATEGY Z_HUFFMAN_ONLY
#define CKPT_CHUNK (1 << 18)

static cg_status ck_fail(const char *path, cg_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static cg_status ck_fail(const char *path, cg_status s, const char *fmt, ...) {
    char head[1024];
    snprintf(head, sizeof head, "[checkpoint] %s: ", path);
    va_list ap;
    va_start(ap, fmt);
    cgi_fail_headed(s, head, fmt, ap);
    va_end(ap);
    return s;
}

/* ---- saving ---- */

typedef struct {
    z_stream z;
    int fd;
    const char *path; /* the final path, for messages */
    unsigned char out[CKPT_CHUNK];
} gz_sink;

static cg_status write_all(gz_sink *g, const unsigned char *p, size_t n) {
    while (n) {
        ssize_t r = write(g->fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return ck_fail(g->path, CG_ERR_IO, "write to temp file failed: %s", strerror(errno));
        p += r;
        n -= (size_t)r;
    }
    return CG_OK;
}

/* Runs deflate over the input until it is consumed (flush = Z_FINISH: until the stream ends). */
static cg_status deflate_some(gz_sink *g, int flush) {
    for (;;) {
        g->z.next_out = g->out;
        g->z.avail_out = CKPT_CHUNK;
        int r = deflate(&g->z, flush);
        if (r == Z_STREAM_ERROR) return ck_fail(g->path, CG_ERR_STATE, "deflate failed");
        cg_status s = write_all(g, g->out, CKPT_CHUNK - g->z.avail_out);
        if (s != CG_OK) return s;
        if (flush == Z_FINISH ? r == Z_STREAM_END : g->z.avail_in == 0 && g->z.avail_out != 0) return CG_OK;
    }
}

static cg_status to_gzip(void *ctx, const void *p, size_t n) {
    gz_sink *g = ctx;
    const unsigned char *q = p;
    while (n) { /* avail_in is 32-bit */
        uInt step = n > (1u << 30) ? 1u << 30 : (uInt)n;
        g->z.next_in = (Bytef *)q;
        g->z.avail_in = step;
        cg_status s = deflate_some(g, Z_NO_FLUSH);
        if (s != CG_OK) return s;
        q += step;
        n -= step;
    }
    return CG_OK;
}

/* Splits path into its directory ("." if none) and base name; false if path ends in '/'. */
static bool split_path(const char *path, char **dir, const char **base) {
    const char *slash = strrchr(path, '/');
    *base = slash ? slash + 1 : path;
    if (!**base) return false;
    size_t n = slash ? (slash == path ? 1 : (size_t)(slash - path)) : 1;
    *dir = malloc(n + 1);
    if (!*dir) return false;
    memcpy(*dir, slash ? path : ".", n);
    (*dir)[n] = 0;
    return true;
}

static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY);
    if (fd < 0) return -1;
    int r = fsync(fd);
    int err = errno;
    close(fd);
    errno = err;
    return r;
}

/* Parses "<base>.tmp.<pid>.<n>"; returns the pid or -1. */
static long temp_owner(const char *name, const char *base) {
    size_t bl = strlen(base);
    if (strncmp(name, base, bl) != 0 || strncmp(name + bl, ".tmp.", 5) != 0) return -1;
    const char *p = name + bl + 5;
    char *end;
    errno = 0;
    long pid = strtol(p, &end, 10);
    if (errno || end == p || *end != '.' || pid <= 0) return -1;
    p = end + 1;
    strtoul(p, &end, 10);
    return end != p && *end == 0 ? pid : -1;
}

/* Removes temp files of processes that no longer exist (they died mid-save). A pid reused by a
 * live process only keeps its file, which is the safe direction. */
static void remove_stale_temps(const char *dir, const char *base) {
    DIR *d = opendir(dir);
    if (!d) return;
    long self = (long)getpid();
    struct dirent *de;
    while ((de = readdir(d))) {
        long pid = temp_owner(de->d_name, base);
        if (pid < 0 || pid == self || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        size_t n = strlen(dir) + strlen(de->d_name) + 2;
        char *full = malloc(n);
        if (!full) break;
        snprintf(full, n, "%s/%s", dir, de->d_name);
        unlink(full);
        free(full);
    }
    closedir(d);
}

cg_status cg_checkpoint_save(cg_st_writer *w, const char *path) {
    static atomic_uint counter;
    if (!w || !path) return cgi_fail(CG_ERR_ARG, "[checkpoint] save: NULL argument");
    cg_status s = cg_st_set_metadata(w, "format", CG_CHECKPOINT_FORMAT);
    if (s == CG_OK) s = cg_st_set_metadata(w, "version", CG_CHECKPOINT_VERSION);
    if (s != CG_OK) return s;
    char *dir = NULL;
    const char *base;
    if (!split_path(path, &dir, &base)) {
        free(dir);
        return ck_fail(path, CG_ERR_ARG, "not a file path");
    }
    size_t tn = strlen(path) + 64;
    char *tmp = malloc(tn);
    gz_sink *g = calloc(1, sizeof *g);
    if (!tmp || !g) {
        free(dir);
        free(tmp);
        free(g);
        return ck_fail(path, CG_ERR_NOMEM, "out of memory");
    }
    g->path = path;
    g->fd = -1;
    for (int tries = 0; tries < 100 && g->fd < 0; tries++) {
        snprintf(tmp, tn, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&counter, 1));
        g->fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0666);
        if (g->fd < 0 && errno != EEXIST) break;
    }
    if (g->fd < 0) {
        s = ck_fail(path, CG_ERR_IO, "cannot create temp file %s: %s", tmp, strerror(errno));
        free(dir);
        free(tmp);
        free(g);
        return s;
    }
    bool zinit = deflateInit2(&g->z, CKPT_LEVEL, Z_DEFLATED, 15 + 16, 8, CKPT_STRATEGY) == Z_OK;
    s = zinit ? cgi_st_emit(w, to_gzip, g, NULL) : ck_fail(path, CG_ERR_NOMEM, "deflateInit2 failed");
    if (s == CG_OK) s = deflate_some(g, Z_FINISH);
    if (zinit) deflateEnd(&g->z);
    if (s == CG_OK && fsync(g->fd) != 0) s = ck_fail(path, CG_ERR_IO, "fsync of %s failed: %s", tmp, strerror(errno));
    if (close(g->fd) != 0 && s == CG_OK) s = ck_fail(path, CG_ERR_IO, "close of %s failed: %s", tmp, strerror(errno));
    /* Test hook (tests/mpi_fault.sh): with CGRAD_TEST_STOP_BEFORE_RENAME set, the writer stops itself
     * (SIGSTOP) once the temporary file is whole and not yet renamed, so that a test kills it during
     * a save deterministically, without timing. */
    if (s == CG_OK && getenv("CGRAD_TEST_STOP_BEFORE_RENAME")) raise(SIGSTOP);
    if (s == CG_OK && rename(tmp, path) != 0)
        s = ck_fail(path, CG_ERR_IO, "cannot rename %s into place: %s", tmp, strerror(errno));
    if (s != CG_OK) {
        unlink(tmp);
    } else {
        /* The rename is durable only once the directory entry is on disk. */
        if (fsync_dir(dir) != 0 && errno != EINVAL)
            s = ck_fail(path, CG_ERR_IO, "fsync of directory %s failed: %s", dir, strerror(errno));
        remove_stale_temps(dir, base);
    }
    free(dir);
    free(tmp);
    free(g);
    return s;
}

/* ---- opening ---- */

cg_st *cg_checkpoint_open(const char *path) {
    if (!path) {
        cgi_fail(CG_ERR_ARG, "[checkpoint] open: NULL path");
        return NULL;
    }
    FILE *fp = cgi_fopen_bounded(path, CGI_LIMIT_WEIGHTS, "checkpoint", NULL); /* a regular file: no device */
    if (!fp) return NULL;
    unsigned char *in = malloc(CKPT_CHUNK), *out = NULL;
    size_t cap = 0;
    z_stream z = {0};
    bool zinit = false;
    cg_status s = CG_OK;
    if (!in) {
        s = ck_fail(path, CG_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* Size the output from the gzip trailer (length mod 2^32), bounded by deflate's best ratio so
     * a lying trailer cannot make us reserve gigabytes. */
    struct stat st;
    if (fstat(fileno(fp), &st) == 0 && S_ISDIR(st.st_mode)) {
        s = ck_fail(path, CG_ERR_IO, "is a directory");
        goto fail;
    }
    size_t fsize = fstat(fileno(fp), &st) == 0 && S_ISREG(st.st_mode) ? (size_t)st.st_size : 0;
    cap = 1 << 20;
    if (fsize >= 18 && fseek(fp, -4, SEEK_END) == 0) {
        unsigned char t[4];
        if (fread(t, 1, 4, fp) == 4) {
            size_t hint = (size_t)t[0] | (size_t)t[1] << 8 | (size_t)t[2] << 16 | (size_t)t[3] << 24;
            /* slack: an exactly full buffer would be doubled before inflate reads the trailer */
            if (hint + 1024 > cap && hint / 1032 <= fsize) cap = hint + 1024;
        }
    }
    rewind(fp);
    size_t nread = fread(in, 1, 2, fp);
    if (nread < 2 || in[0] != 0x1f || in[1] != 0x8b) {
        if (nread < 2) s = ck_fail(path, CG_ERR_FORMAT, "not a gzip file (%zu bytes)", nread);
        else s = ck_fail(path, CG_ERR_FORMAT, "not a gzip file (starts with bytes %02x %02x, expected 1f 8b)", in[0], in[1]);
        goto fail;
    }
    if (!(out = malloc(cap + 1))) {
        s = ck_fail(path, CG_ERR_NOMEM, "cannot allocate %zu bytes", cap);
        goto fail;
    }
    if (inflateInit2(&z, 15 + 16) != Z_OK) {
        s = ck_fail(path, CG_ERR_NOMEM, "inflateInit2 failed");
        goto fail;
    }
    zinit = true;
    z.next_in = in;
    z.avail_in = (uInt)nread;
    z.next_out = out;
    z.avail_out = (uInt)(cap > UINT32_MAX ? UINT32_MAX : cap);
    bool eof = false;
    size_t done = 0; /* bytes of out before z.next_out's current chunk */
    for (;;) {
        if (z.avail_in == 0 && !eof) {
            nread = fread(in, 1, CKPT_CHUNK, fp);
            if (nread == 0) {
                if (ferror(fp)) {
                    s = ck_fail(path, CG_ERR_IO, "read failed: %s", strerror(errno));
                    goto fail;
                }
                eof = true;
            }
            z.next_in = in;
            z.avail_in = (uInt)nread;
        }
        if (z.avail_out == 0) {
            done = (size_t)(z.next_out - out);
            if (done == cap) {
                size_t ncap = cap * 2;
                if (ncap > CGI_LIMIT_INFLATED) {
                    s = ck_fail(path, CG_ERR_RANGE, "inflates to more than %s (docs/limits.md)", cgi_bytes_str(CGI_LIMIT_INFLATED));
                    goto fail;
                }
                unsigned char *o = realloc(out, ncap + 1);
                if (!o) {
                    s = ck_fail(path, CG_ERR_NOMEM, "cannot allocate %zu bytes", ncap);
                    goto fail;
                }
                out = o;
                cap = ncap;
            }
            z.next_out = out + done;
            z.avail_out = (uInt)(cap - done > UINT32_MAX ? UINT32_MAX : cap - done);
        }
        int r = inflate(&z, Z_NO_FLUSH);
        if (r == Z_STREAM_END) break;
        if (r == Z_OK) continue;
        if (r == Z_BUF_ERROR && !(eof && z.avail_in == 0)) continue;
        if (r == Z_BUF_ERROR) s = ck_fail(path, CG_ERR_FORMAT, "truncated gzip stream (file ends after %llu bytes)",
                                          (unsigned long long)z.total_in);
        else if (r == Z_MEM_ERROR) s = ck_fail(path, CG_ERR_NOMEM, "out of memory while inflating");
        else if (z.msg && strcmp(z.msg, "incorrect data check") == 0)
            s = ck_fail(path, CG_ERR_FORMAT, "gzip CRC mismatch: the file is corrupt");
        else if (z.msg && strcmp(z.msg, "incorrect length check") == 0)
            s = ck_fail(path, CG_ERR_FORMAT, "gzip length mismatch: the file is corrupt");
        else s = ck_fail(path, CG_ERR_FORMAT, "corrupt gzip data (%s)", z.msg ? z.msg : "inflate error");
        goto fail;
    }
    if (z.avail_in > 0 || fread(in, 1, 1, fp) == 1) {
        s = ck_fail(path, CG_ERR_FORMAT, "trailing bytes after the gzip stream");
        goto fail;
    }
    size_t len = (size_t)(z.next_out - out);
    inflateEnd(&z);
    fclose(fp);
    free(in);
    cg_st *f = cgi_st_adopt(out, len, path);
    if (!f) {
        char inner[1024], prefix[512];
        snprintf(prefix, sizeof prefix, "[safetensors] %s: ", path); /* the path is in our own prefix */
        const char *msg = cg_last_error();
        snprintf(inner, sizeof inner, "%s", strncmp(msg, prefix, strlen(prefix)) ? msg : msg + strlen(prefix));
        cgi_fail(CG_ERR_FORMAT, "[checkpoint] %s: corrupt safetensors image inside the gzip: %s", path, inner);
        return NULL;
    }
    const char *fmt = cg_st_metadata(f, "format"), *ver = cg_st_metadata(f, "version");
    if (!fmt || strcmp(fmt, CG_CHECKPOINT_FORMAT) != 0)
        s = ck_fail(path, CG_ERR_FORMAT, "__metadata__ format is %s%s%s, expected '%s'", fmt ? "'" : "",
                    fmt ? fmt : "missing", fmt ? "'" : "", CG_CHECKPOINT_FORMAT);
    else if (!ver || strcmp(ver, CG_CHECKPOINT_VERSION) != 0)
        s = ck_fail(path, CG_ERR_FORMAT, "__metadata__ version is %s%s%s, this build reads version '%s'",
                    ver ? "'" : "", ver ? ver : "missing", ver ? "'" : "", CG_CHECKPOINT_VERSION);
    if (s == CG_OK) s = cgi_st_check_disjoint(f); /* aliased tensors: one parameter's update would change another */
    if (s != CG_OK) {
        cg_st_close(f);
        return NULL;
    }
    return f;
fail:
    if (zinit) inflateEnd(&z);
    fclose(fp);
    free(in);
    free(out);
    return NULL;
}
