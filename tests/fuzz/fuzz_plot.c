/* SPDX-License-Identifier: MIT */
/* cgrad plot's reader of metrics files (CSV with a header, or JSON lines), and the SVG it draws.
 * Oracles: a refused file leaves a message naming it; an accepted one gives a whole SVG document
 * (written through a temporary file and renamed), and no temporary file is left either way. */
#define FUZZ_MAX_ALLOC_MB "64"
#include "fuzz.h"

#include <dirent.h>

#include "cli/commands.h"
#include "cli/session.h"

static char out_dir[64], svg[96];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    cg_set_threads(1);
    snprintf(out_dir, sizeof out_dir, "/tmp/cgrad-fuzz-plot.XXXXXX");
    FUZZ_CHECK(mkdtemp(out_dir), "mkdtemp failed");
    snprintf(svg, sizeof svg, "%s/plot.svg", out_dir);
    return 0;
}

/* Entries in the output directory besides . and .. */
static int entries(void) {
    DIR *d = opendir(out_dir);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) n += de->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, data, size);
    unlink(svg);
    cg_clear_error();
    const char *paths[1] = {path};
    if (cli_plot_runs(paths, NULL, 1, svg, "fuzz", "loss") != CG_OK) {
        fuzz_expect_message(path);
        FUZZ_CHECK(entries() == 0, "a refused plot left a file behind");
        return 0;
    }
    size_t len = 0;
    FILE *f = fopen(svg, "rb");
    FUZZ_CHECK(f, "an accepted plot wrote no %s", svg);
    char tail[16] = {0};
    fseek(f, 0, SEEK_END);
    len = (size_t)ftell(f);
    FUZZ_CHECK(len > 16 && fseek(f, -7, SEEK_END) == 0 && fread(tail, 1, 7, f) == 7 && !strcmp(tail, "</svg>\n"),
               "the SVG is not whole (%zu bytes, ends '%s')", len, tail);
    fclose(f);
    FUZZ_CHECK(entries() == 1, "temporary files left beside the plot");
    return 0;
}
