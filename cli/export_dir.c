/* SPDX-License-Identifier: MIT */
/* An export directory replaced whole: the files are written into a temporary directory beside the
 * target, synced, and swapped with the target in one rename (renameat2's RENAME_EXCHANGE), then
 * the old files are removed. A kill at any moment leaves the old export or the new one under the
 * target's name, never a mixture or a file cut short; what a killed export leaves beside it
 * (DIR.tmp.PID.N) is removed by the next export once that process is gone. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cgrad.h"
#include "cli/commands.h"

/* The names exports write (any arch, any tokenizer): with the files the new export wrote, what a
 * target may hold to be replaced; anything else is the user's and is not thrown away. */
static const char *const export_names[] = {"model.safetensors", "config.json",  "tokenizer_config.json", "vocab.json",
                                           "merges.txt",        "vocab.txt",    "cg_tokenizer.json",     "encoder.json",
                                           "vocab.bpe",         NULL};

static bool export_name(const char *name, const char *stage) {
    for (const char *const *n = export_names; *n; n++)
        if (!strcmp(name, *n)) return true;
    if (!stage) return false;
    char p[4400];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", stage, name);
    return !lstat(p, &sb) && S_ISREG(sb.st_mode); /* a file this export writes too */
}

/* The first entry of dir that is neither an export's file nor one the stage (if any) holds,
 * copied into name; false when there is none. */
static bool foreign_file(const char *dir, const char *stage, char *name, size_t n) {
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    for (struct dirent *de; !found && (de = readdir(d));)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && !export_name(de->d_name, stage))
            found = true, snprintf(name, n, "%s", de->d_name);
    closedir(d);
    return found;
}

/* The parent directory of dir and dir's last component (trailing slashes dropped), into buffers. */
static bool split(const char *dir, char *parent, size_t pn, char *base, size_t bn) {
    char d[4096];
    if (snprintf(d, sizeof d, "%s", dir) >= (int)sizeof d) return false;
    size_t n = strlen(d);
    while (n > 1 && d[n - 1] == '/') d[--n] = 0;
    const char *slash = strrchr(d, '/');
    const char *b = slash ? slash + 1 : d;
    if (!*b || !strcmp(b, ".") || !strcmp(b, "..")) return false;
    if (!slash) snprintf(parent, pn, ".");
    else if (slash == d) snprintf(parent, pn, "/");
    else snprintf(parent, pn, "%.*s", (int)(slash - d), d);
    return snprintf(base, bn, "%s", b) < (int)bn;
}

/* Removes a directory of plain files (an export or a temporary one). */
static int remove_flat_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return errno == ENOENT ? 0 : -1;
    struct dirent *de;
    char p[4400];
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", path, de->d_name);
            unlink(p);
        }
    closedir(d);
    return rmdir(path);
}

/* Removes BASE.tmp.PID.N directories of exports that died (their process is gone). */
static void remove_stale(const char *parent, const char *base) {
    DIR *d = opendir(parent);
    if (!d) return;
    const size_t bl = strlen(base);
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, base, bl) || strncmp(de->d_name + bl, ".tmp.", 5)) continue;
        char *end;
        const long pid = strtol(de->d_name + bl + 5, &end, 10);
        if (pid <= 0 || *end != '.' || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", parent, de->d_name);
        remove_flat_dir(p);
    }
    closedir(d);
}

static int fsync_path(const char *path, int flags) {
    const int fd = open(path, O_RDONLY | flags);
    if (fd < 0) return -1;
    const int r = fsync(fd), err = errno;
    close(fd);
    errno = err;
    return r;
}

bool cli_export_stage(const char *dir, char *tmp, size_t n) {
    char parent[4096], base[1024];
    if (!split(dir, parent, sizeof parent, base, sizeof base)) {
        fprintf(stderr, "cgrad export: %s: not a directory name to export to\n", dir);
        return false;
    }
    struct stat sb;
    if (!lstat(dir, &sb)) { /* replacing: only an export, so no file of the user's is lost */
        if (!S_ISDIR(sb.st_mode)) {
            fprintf(stderr, "cgrad export: %s exists and is not a directory\n", dir);
            return false;
        }
        if (access(dir, R_OK | W_OK | X_OK)) {
            fprintf(stderr, "cgrad export: cannot replace the directory %s: %s\n", dir, strerror(errno));
            return false;
        }
        char name[256];
        if (foreign_file(dir, NULL, name, sizeof name)) { /* refused before the work; checked again at the swap */
            fprintf(stderr, "cgrad export: %s holds %s, which an export does not write: export replaces the whole "
                            "directory, so give a new or empty directory, or one an earlier export wrote\n", dir, name);
            return false;
        }
    }
    remove_stale(parent, base);
    static atomic_uint counter;
    for (int tries = 0; tries < 100; tries++) {
        snprintf(tmp, n, "%s/%s.tmp.%ld.%u", parent, base, (long)getpid(), atomic_fetch_add(&counter, 1));
        if (!mkdir(tmp, 0777)) return true;
        if (errno != EEXIST) break;
    }
    fprintf(stderr, "cgrad export: cannot create the directory %s beside %s: %s\n", tmp, dir, strerror(errno));
    return false;
}

bool cli_export_commit(const char *tmp, const char *dir) {
    char parent[4096], base[1024];
    split(dir, parent, sizeof parent, base, sizeof base);
    DIR *d = opendir(tmp);
    struct dirent *de;
    int err = d ? 0 : errno;
    while (!err && (de = readdir(d))) { /* every byte on disk before the name points at it */
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", tmp, de->d_name);
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && fsync_path(p, 0) && errno != EINVAL) err = errno;
    }
    if (d) closedir(d);
    if (!err && fsync_path(tmp, O_DIRECTORY) && errno != EINVAL) err = errno;
    char name[256];
    if (!err && foreign_file(dir, tmp, name, sizeof name)) { /* a file of the user's appeared meanwhile */
        fprintf(stderr, "cgrad export: %s now holds %s, which an export does not write: left as it was\n", dir, name);
        remove_flat_dir(tmp);
        return false;
    }
    bool swapped = false;
    if (!err && rename(tmp, dir)) { /* a new name or an empty directory: one rename */
        if (errno != ENOTEMPTY && errno != EEXIST) err = errno;
        else if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE)) err = errno;
        else swapped = true; /* the old export now sits at tmp */
    }
    if (err) {
        fprintf(stderr, "cgrad export: cannot put %s in place of %s: %s\n", tmp, dir, strerror(err));
        remove_flat_dir(tmp);
        return false;
    }
    if (fsync_path(parent, O_DIRECTORY) && errno != EINVAL)
        fprintf(stderr, "cgrad export: warning: fsync of %s failed: %s\n", parent, strerror(errno));
    if (swapped && remove_flat_dir(tmp))
        fprintf(stderr, "cgrad export: warning: cannot remove the old export, now at %s: %s\n", tmp, strerror(errno));
    return true;
}

void cli_export_discard(const char *tmp) { remove_flat_dir(tmp); }
