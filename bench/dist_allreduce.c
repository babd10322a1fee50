/* SPDX-License-Identifier: MIT */
/* All-reduce microbenchmark on whatever link mpirun gives it (run it the way cgrad train runs):
 *   mpirun -n 2 ./build/dist_allreduce [MAX_MB]      the table below
 *   mpirun -n 2 ./build/dist_allreduce link          only "ALPHA_US BETA_GBIT" (bench/dist_hosts_bench.sh)
 * First the link itself: latency alpha (ranks 0 and 1 exchanging 8 bytes at once) and bandwidth
 * beta (the same with 16 MB, so full duplex). Then, for float32 buffers of
 * 4 KB .. MAX_MB (16), the median time of:
 *   blocking   MPI_Allreduce (Open MPI's tuned collectives)
 *   nonblock   MPI_Iallreduce waited by MPI_Test (libnbc, what cgrad used)
 *   ring       cgrad's reduce-scatter + all-gather over MPI_Isend/MPI_Irecv (dist.c)
 * against the model bytes x 2(N-1)/N / beta + alpha x log2 N. */
#include <math.h>
#include <stdbool.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

enum { REPS_MAX = 41 };

/* Sends n floats to peer while receiving as many, waited by polling MPI_Testall as cgrad does. */
static void exchange(float *out, float *in, int n, int peer) {
    MPI_Request req[2];
    int flag = 0;
    MPI_Irecv(in, n, MPI_FLOAT, peer, 1, MPI_COMM_WORLD, &req[0]);
    MPI_Isend(out, n, MPI_FLOAT, peer, 1, MPI_COMM_WORLD, &req[1]);
    while (!flag) MPI_Testall(2, req, &flag, MPI_STATUSES_IGNORE);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const bool link_only = argc > 1 && !strcmp(argv[1], "link");
    const double max_mb = argc > 1 && !link_only ? atof(argv[1]) : 16;
    const size_t max_n = (size_t)(max_mb * 1048576 / 4);
    float *buf = malloc(max_n * sizeof *buf), *tmp = malloc(max_n * sizeof *tmp);
    for (size_t i = 0; i < max_n; i++) buf[i] = 1.0f;
    double t[REPS_MAX];
    /* latency: ranks 0 and 1 exchange 8 bytes at once, as each step of an all-reduce does */
    for (int r = 0; r < REPS_MAX; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        for (int k = 0; k < 10 && rank < 2; k++) exchange(buf, tmp, 2, 1 - rank);
        t[r] = (MPI_Wtime() - t0) / 10;
    }
    const double alpha = median(t, REPS_MAX);
    /* bandwidth: ranks 0 and 1 exchange 16 MB at once */
    const int bw_n = (int)(max_n < 4194304 ? max_n : 4194304);
    for (int r = 0; r < 7; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        if (rank < 2) exchange(buf, tmp, bw_n, 1 - rank);
        t[r] = MPI_Wtime() - t0;
    }
    const double beta = (double)bw_n * 4 / median(t, 7);
    if (link_only) {
        if (rank == 0) printf("%.1f %.3f\n", alpha * 1e6, beta * 8 / 1e9);
        free(buf);
        free(tmp);
        MPI_Finalize();
        return 0;
    }
    if (rank == 0) {
        printf("%d ranks; link: latency %.1f us, bandwidth %.2f Gbit/s (full duplex, %d MB each way)\n\n", size,
               alpha * 1e6, beta * 8 / 1e9, bw_n * 4 / 1048576);
        printf("| bytes | model ms | MPI_Allreduce ms | MPI_Iallreduce ms | cgrad ring ms | ring / model |\n");
        printf("|---:|---:|---:|---:|---:|---:|\n");
    }
    cg_dist *d = cg_dist_init(600);
    for (size_t n = 1024; n <= max_n; n *= 4) {
        const double bytes = (double)n * 4;
        const double model = bytes * 2 * (size - 1) / size / beta + alpha * log2((double)size);
        double res[3];
        /* batches of back-to-back calls, so the barrier's skew between ranks averages out */
        const int reps = n >= 4194304 ? 3 : 7, per = n >= 1048576 ? 1 : 20;
        for (int mode = 0; mode < 3; mode++) {
            for (int r = 0; r < reps; r++) {
                MPI_Barrier(MPI_COMM_WORLD);
                const double t0 = MPI_Wtime();
                for (int k = 0; k < per; k++) {
                    if (mode == 0) MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                    else if (mode == 1) {
                        MPI_Request req;
                        int flag = 0;
                        MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
                        while (!flag) MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
                    } else if (cg_dist_sum_reals(d, buf, (int64_t)n)) {
                        fprintf(stderr, "%s\n", cg_last_error());
                        MPI_Abort(MPI_COMM_WORLD, 1);
                    }
                }
                t[r] = (MPI_Wtime() - t0) / per;
                for (size_t i = 0; i < n; i++) buf[i] = 1.0f;
            }
            res[mode] = median(t, reps);
        }
        if (rank == 0)
            printf("| %.0f | %.3f | %.3f | %.3f | %.3f | %.2f |\n", bytes, model * 1e3, res[0] * 1e3, res[1] * 1e3,
                   res[2] * 1e3, res[2] / model);
    }
    cg_dist_free(d);
    free(buf);
    free(tmp);
    MPI_Finalize();
    return 0;
}
