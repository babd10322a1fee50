/* SPDX-License-Identifier: MIT */
/* The command line's conventions, each against the documented behaviour: --flag=value as well as
 * --flag value, "did you mean" for a misspelt command or flag, --version without diagnostics (they
 * are in info --system), the exit codes (0 done, 1 the work failed, 2 a usage error, 130 after
 * Ctrl-C, which saves the run first), no terminal control codes when stdout is not a terminal, one
 * run directory for a run's files, and exports that write valid Hugging Face fields only. */
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cgrad/cgrad.h>

#include "check.h"
#include "cgrad_bin.h"
#include "cli_harness.h"

static bool exists(const char *name) {
    struct stat sb;
    return !stat(path_of(name), &sb);
}

static const char *tiny = "--data text.txt --layers 1 --heads 2 --dim 16 --context 16 --batch 2 --steps 3 "
                          "--eval-every 0 --samples 0 --threads 1";

static void test_equals_form(void) {
    char args[1024];
    snprintf(args, sizeof args, "train %s --out=eq --lr=0.01 --seed=7", tiny);
    result a = cgrad(args, NULL);
    snprintf(args, sizeof args, "train %s --out sp --lr 0.01 --seed 7", tiny);
    result b = cgrad(args, NULL);
    CHECK(a.rc == 0 && b.rc == 0, "--flag=value run rc %d (%s), --flag value rc %d (%s)", a.rc, a.err, b.rc, b.err);
    /* the same run either way: the same losses, bit for bit */
    char *ca = csv_losses("eq/metrics.csv"), *cb = csv_losses("sp/metrics.csv");
    CHECK(ca && cb && !strcmp(ca, cb), "metrics differ:\n%s\n%s", ca ? ca : "(none)", cb ? cb : "(none)");
    free(ca), free(cb);
    result_free(&a), result_free(&b);
    /* a bare flag takes no value; an unknown flag in the = form is named without its value */
    result r = cgrad("train --checkpoint-activations=1", NULL);
    CHECK(r.rc == 2 && strstr(r.err, "--checkpoint-activations takes no value"), "bare=: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    r = cgrad("sample --lenght=5", NULL);
    CHECK(r.rc == 2 && strstr(r.err, "unknown option --lenght: did you mean --length?"), "unknown=: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    /* after "--" a word is text, even in the = form; a value is a value even if it looks like a flag */
    r = cgrad("gradcheck --op=matmul --tol=0", NULL);
    CHECK(r.rc == 0 && strstr(r.out, "matmul"), "gradcheck --op=matmul: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    r = cgrad("train --steps=0x10", NULL);
    CHECK(r.rc == 2 && strstr(r.err, "--steps") && strstr(r.err, "0x10"), "--steps=0x10: rc %d '%s'", r.rc, r.err);
    result_free(&r);
}

static void test_did_you_mean(void) {
    result r = cgrad("trian", NULL);
    CHECK(r.rc == 2 && strstr(r.err, "did you mean 'train'?"), "trian: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    r = cgrad("xyzzy", NULL);
    CHECK(r.rc == 2 && strstr(r.err, "unknown command 'xyzzy'") && !strstr(r.err, "did you mean"), "xyzzy: '%s'", r.err);
    result_free(&r);
    r = cgrad("train --stpes 3", NULL); /* train has its own parser: the same suggestion */
    CHECK(r.rc == 2 && strstr(r.err, "unknown option --stpes: did you mean --steps?"), "--stpes: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    r = cgrad("eval --chekpoint x", NULL);
    CHECK(r.rc == 2 && strstr(r.err, "did you mean --checkpoint?"), "--chekpoint: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    r = cgrad("eval --zzzzzzzz x", NULL);
    CHECK(r.rc == 2 && !strstr(r.err, "did you mean"), "nothing close: '%s'", r.err);
    result_free(&r);
}

static void test_version(void) {
    result a = cgrad("--version", NULL), b = cgrad("--version", NULL);
    CHECK(a.rc == 0 && !strncmp(a.out, "cgrad ", 6) && strstr(a.out, "build: "), "--version: rc %d '%s'", a.rc, a.out);
    CHECK(!strcmp(a.out, b.out), "--version changes from call to call:\n%s\n%s", a.out, b.out);
    CHECK(!strstr(a.out, "thread") && !strstr(a.out, "measured") && !strstr(a.out, "rate"), "--version has diagnostics: %s",
          a.out);
    result_free(&a), result_free(&b);
    result r = cgrad("info --system", NULL);
    CHECK(r.rc == 0 && strstr(r.out, "kernels ") && strstr(r.out, "thread(s)") && strstr(r.out, "bf16 products"),
          "info --system: rc %d '%s'", r.rc, r.out);
    result_free(&r);
    r = cgrad("info --system extra", NULL);
    CHECK(r.rc == 2, "info --system extra: rc %d", r.rc);
    result_free(&r);
}

static void test_run_directory(void) {
    char args[1024];
    snprintf(args, sizeof args, "train %s", tiny); /* no --out, no --checkpoint: runs/ARCH */
    result r = cgrad(args, NULL);
    CHECK(r.rc == 0, "default run: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    const char *files[] = {"runs/gpt2/model.ckpt", "runs/gpt2/metrics.csv", "runs/gpt2/metrics.jsonl",
                           "runs/gpt2/loss.svg", "runs/gpt2/run.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) CHECK(exists(files[i]), "%s missing", files[i]);
    CHECK(!exists("cgrad.ckpt") && !exists("cgrad_metrics.csv") && !exists("cgrad_run.json"), "files left in the working directory");
    /* a nested --out is created; --resume alone resumes its model.ckpt */
    snprintf(args, sizeof args, "train %s --out deep/er/run", tiny);
    r = cgrad(args, NULL);
    CHECK(r.rc == 0 && exists("deep/er/run/model.ckpt"), "nested --out: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    r = cgrad("train --out deep/er/run --resume --steps 5", NULL);
    CHECK(r.rc == 0 && strstr(r.out, "final step=5"), "--out --resume: rc %d '%s' '%s'", r.rc, r.out, r.err);
    result_free(&r);
    char *csv = test_slurp(path_of("deep/er/run/metrics.csv"), NULL); /* the resumed run appends to the same file */
    CHECK(csv && strstr(csv, "\n5,"), "resumed metrics: %s", csv ? csv : "(none)");
    free(csv);
    spit("afile", "x");
    snprintf(args, sizeof args, "train %s --out afile/run", tiny);
    r = cgrad(args, NULL);
    CHECK(r.rc == 2 && strstr(r.err, "--out 'afile/run'"), "--out under a file: rc %d '%s'", r.rc, r.err);
    result_free(&r);
}

static void test_exit_codes_and_export(void) {
    /* 2: a usage error, before any work: an export directory that cannot be made */
    result r = cgrad("export runs/gpt2/model.ckpt no/such/parent/dir", NULL);
    CHECK(r.rc == 2 && strstr(r.err, "parent directory does not exist"), "export uncreatable: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    /* 1: the work failed: a damaged checkpoint */
    spit("bad.ckpt", "not a checkpoint");
    r = cgrad("export bad.ckpt outdir", NULL);
    CHECK(r.rc == 1, "export of a damaged checkpoint: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    /* 0, and the char tokenizer's export names no invalid tokenizer_class */
    r = cgrad("export runs/gpt2/model.ckpt hf", NULL);
    CHECK(r.rc == 0, "export: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    char *tc = test_slurp(path_of("hf/tokenizer_config.json"), NULL);
    cJSON *j = tc ? cJSON_Parse(tc) : NULL;
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(j, "tokenizer_class");
    CHECK(j && (!cls || (cJSON_IsString(cls) && !strchr(cls->valuestring, ' '))), "tokenizer_class: %s", tc ? tc : "(none)");
    cJSON_Delete(j);
    free(tc);
    /* 130: Ctrl-C is test_cli's (it checks the last line too) */
}

static void test_no_control_codes(void) {
    /* stdout is a file here: no carriage returns or escape sequences, even with a terminal's TERM */
    char args[1024];
    snprintf(args, sizeof args, "train %s --out plain", tiny);
    result r = cgrad(args, NULL);
    CHECK(r.rc == 0 && !strchr(r.out, '\r') && !strchr(r.out, '\033'), "control codes in piped output: %s", r.out);
    result_free(&r);
    /* under a launcher stdout may be its pseudo-terminal: the bar stays off (script(1) gives a tty;
     * the launcher's variables make the run join MPI, whose start-up allocations LeakSanitizer
     * would report, as in the MPI tests) */
    if (!system("command -v script >/dev/null 2>&1")) {
        char cmd[3 * PATH_MAX + 1024];
        snprintf(cmd, sizeof cmd,
                 "cd '%s' && ASAN_OPTIONS=detect_leaks=0 OMPI_COMM_WORLD_SIZE=1 OMPI_COMM_WORLD_RANK=0 script -qec \"'%s' train %s --out launched\" "
                 "/dev/null > launched.txt 2>&1",
                 dir, bin, tiny);
        int st = system(cmd);
        char *out = test_slurp(path_of("launched.txt"), NULL);
        CHECK(st == 0 && out && !strstr(out, "\033[K"), "launched run drew a bar: %s", out ? out : "(none)");
        free(out);
    }
}

/* Ctrl-C: the loop saves, prints the final line and exits 130; the checkpoint is at that step. */
static void test_sigint(void) {
    int out[2];
    if (pipe(out)) return;
    pid_t pid = fork();
    if (pid == 0) {
        if (chdir(dir)) _exit(99);
        dup2(out[1], 1);
        close(out[0]);
        if (!freopen("sigint.err", "w", stderr)) _exit(97);
        execl(bin, bin, "train", "--data", "text.txt", "--layers", "1", "--heads", "2", "--dim", "16", "--context", "16",
              "--batch", "2", "--steps", "1000000", "--log-every", "1", "--eval-every", "0", "--samples", "0",
              "--checkpoint", "sigint.ckpt", "--threads", "1", (char *)NULL);
        _exit(98);
    }
    close(out[1]);
    FILE *f = fdopen(out[0], "r");
    char line[1024], last[1024] = "";
    bool sent = false;
    while (f && fgets(line, sizeof line, f)) {
        if (!sent && !strncmp(line, "step 3/", 7)) kill(pid, SIGINT), sent = true;
        line[strcspn(line, "\n")] = 0;
        if (*line) snprintf(last, sizeof last, "%s", line);
    }
    if (f) fclose(f);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(sent && WIFEXITED(status) && WEXITSTATUS(status) == 130, "sigint: sent %d, status %d", sent, status);
    long long step = -1;
    int used = -1; /* a cut-short run ends by saying so, never with a "final" result line */
    sscanf(last, "interrupted at step %lld, saved sigint.ckpt (continue with: cgrad train --resume sigint.ckpt)%n", &step, &used);
    CHECK(step >= 3 && used == (int)strlen(last), "sigint last line '%s'", last);
    result r = cgrad("info --checkpoint sigint.ckpt", NULL);
    char want[64];
    snprintf(want, sizeof want, "step        %lld of 1000000", step);
    CHECK(r.rc == 0 && strstr(r.out, want), "checkpoint after Ctrl-C: want '%s' in %s", want, r.out);
    result_free(&r);
}

int main(void) {
    (void)rewrite_ckpt, (void)same_checkpoints, (void)parse_final, (void)last_line, (void)cgrad_t; /* the harness's others */
    if (!test_find_cgrad(bin, sizeof bin, "test_cli_conventions")) return 1;
    snprintf(dir, sizeof dir, "/tmp/cgrad_test_conv.XXXXXX");
    if (!mkdtemp(dir)) return 1;
    make_data();
    test_did_you_mean();
    test_version();
    test_run_directory();
    test_equals_form();
    test_exit_codes_and_export();
    test_no_control_codes();
    test_sigint();
    if (!test_failed) {
        char cmd[PATH_MAX + 16];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    }
    TEST_END();
}
