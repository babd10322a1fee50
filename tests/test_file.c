/* SPDX-License-Identifier: MIT */
/* io/file.c, the bounded reader every loader opens a user's file with: regular files up to the
 * limit and no further, pipes read to the limit and refused past it, devices, directories and
 * sockets refused by name before a byte is read, /proc files (which say they are empty) read whole. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cgrad/cgrad.h>
#include "check.h"
#include "io/file_internal.h"

static char dir[64];

static const char *in_dir(const char *name) {
    static char p[4][128];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static void spit(const char *name, const char *data, size_t n) {
    FILE *f = fopen(in_dir(name), "wb");
    if (f) fwrite(data, 1, n, f), fclose(f);
}

static bool has(const char *s, const char *part) { return strstr(s, part) != NULL; }

/* Regular files: at the limit read whole, one byte over refused from the size alone. */
static void test_regular(void) {
    char buf[100];
    memset(buf, 'a', sizeof buf);
    spit("hundred.txt", buf, 100);
    size_t len = 0;
    char *s = cgi_read_bounded(in_dir("hundred.txt"), 100, "test", &len);
    CHECK(s && len == 100 && s[100] == 0 && s[99] == 'a', "100 bytes at a 100-byte limit: %s", s ? "short" : cg_last_error());
    free(s);
    s = cgi_read_bounded(in_dir("hundred.txt"), 99, "test", &len);
    CHECK(!s && has(cg_last_error(), "[test]") && has(cg_last_error(), "hundred.txt") && has(cg_last_error(), "100 bytes") &&
              has(cg_last_error(), "99 bytes limit"),
          "100 bytes at a 99-byte limit: %s", s ? "accepted" : cg_last_error());
    free(s);
    spit("empty.txt", "", 0);
    s = cgi_read_bounded(in_dir("empty.txt"), 10, "test", &len);
    CHECK(s && len == 0 && s[0] == 0, "an empty file: %s", s ? "" : cg_last_error());
    free(s);
    s = cgi_read_bounded(in_dir("missing.txt"), 10, "test", &len);
    CHECK(!s && has(cg_last_error(), "missing.txt") && has(cg_last_error(), "cannot open"), "missing: %s", cg_last_error());
    /* a sparse file of 1 TiB + 1 byte is refused from its size, at once */
    int fd = open(in_dir("sparse.bin"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0 && ftruncate(fd, (1ll << 40) + 1) == 0, "cannot make a sparse file: %s", strerror(errno));
    if (fd >= 0) close(fd);
    FILE *f = cgi_fopen_bounded(in_dir("sparse.bin"), CGI_LIMIT_WEIGHTS, "checkpoint", NULL);
    CHECK(!f && has(cg_last_error(), "sparse.bin") && has(cg_last_error(), "1 TiB limit"), "sparse: %s", cg_last_error());
    if (f) fclose(f);
    unlink(in_dir("sparse.bin"));
    /* /proc files say they hold 0 bytes: read to their end all the same */
    s = cgi_read_bounded("/proc/self/status", 1 << 20, "test", &len);
    CHECK(s && len > 0 && has(s, "Pid:"), "/proc/self/status: %s", s ? "no Pid:" : cg_last_error());
    free(s);
}

/* Devices, directories and sockets: refused, naming what they are. */
static void test_refused(void) {
    static const struct { const char *path, *kind; } bad[] = {
        {"/dev/zero", "character device"}, {"/dev/urandom", "character device"}, {"/dev/null", "character device"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *s = cgi_read_bounded(bad[i].path, 1 << 20, "test", NULL);
        CHECK(!s && has(cg_last_error(), bad[i].path) && has(cg_last_error(), bad[i].kind), "%s: %s", bad[i].path,
              s ? "accepted" : cg_last_error());
        free(s);
    }
    char *s = cgi_read_bounded(dir, 1 << 20, "test", NULL);
    CHECK(!s && has(cg_last_error(), "is a directory"), "a directory: %s", cg_last_error());
    free(s);
    int sock = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", in_dir("sock"));
    if (sock >= 0 && bind(sock, (struct sockaddr *)&addr, sizeof addr) == 0) {
        s = cgi_read_bounded(in_dir("sock"), 1 << 20, "test", NULL);
        /* open(2) itself refuses a socket (ENXIO); either way it is named and not read */
        CHECK(!s && has(cg_last_error(), "sock") && (has(cg_last_error(), "socket") || has(cg_last_error(), "cannot open")),
              "a socket: %s", cg_last_error());
        free(s);
    }
    if (sock >= 0) close(sock);
    /* a pipe where the reader cannot bound one (a stream for fopen) */
    mkfifo(in_dir("fifo0"), 0600);
    FILE *f = cgi_fopen_bounded(in_dir("fifo0"), 100, "test", NULL);
    CHECK(!f && has(cg_last_error(), "is a pipe"), "a pipe for a stream: %s", cg_last_error());
    if (f) fclose(f);
}

/* A pipe a child process writes n bytes into, as the shell's <(command) gives one: its read end's
 * /dev/fd path into path, the child's pid returned, the read end in *rfd (to close after). */
static pid_t feed(size_t n, char *path, size_t pn, int *rfd) {
    int p[2];
    if (pipe(p)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGPIPE, SIG_DFL);
        close(p[0]);
        int fd = p[1];
        char block[4096];
        memset(block, 'p', sizeof block);
        for (size_t done = 0; fd >= 0 && done < n;) {
            size_t k = n - done < sizeof block ? n - done : sizeof block;
            ssize_t w = write(fd, block, k);
            if (w <= 0) break;
            done += (size_t)w;
        }
        _exit(0);
    }
    close(p[1]);
    *rfd = p[0];
    snprintf(path, pn, "/dev/fd/%d", p[0]);
    return pid;
}

/* Pipes: read to the limit, refused past it (the writer is not waited for forever). */
static void test_pipes(void) {
    const size_t limit = 100000;
    for (int over = 0; over < 2; over++) {
        const size_t n = limit + (size_t)over * 5000000; /* 5 MB past: the read stops at limit + 1 */
        char path[64];
        int rfd = -1;
        pid_t pid = feed(n, path, sizeof path, &rfd);
        CHECK(pid > 0, "pipe or fork failed");
        size_t len = 0;
        char *s = pid > 0 ? cgi_read_bounded(path, limit, "test", &len) : NULL;
        if (over)
            CHECK(!s && has(cg_last_error(), path) && has(cg_last_error(), "more than"), "pipe past the limit: %s",
                  s ? "accepted" : cg_last_error());
        else CHECK(s && len == limit, "pipe at the limit: %zu bytes, %s", len, s ? "" : cg_last_error());
        free(s);
        close(rfd);
        if (pid > 0) kill(pid, SIGKILL), waitpid(pid, NULL, 0);
    }
    mkfifo(in_dir("fifo"), 0600);
    /* nobody writing: read as empty, at once */
    size_t len = 1;
    char *s = cgi_read_bounded(in_dir("fifo"), limit, "test", &len);
    CHECK(s && len == 0, "a pipe without a writer: %s", s ? "" : cg_last_error());
    free(s);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/cgrad_test_file.XXXXXX");
    if (!mkdtemp(dir)) return 1;
    signal(SIGPIPE, SIG_IGN);
    test_regular();
    test_refused();
    test_pipes();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    TEST_END();
}
