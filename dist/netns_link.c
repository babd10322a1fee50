/* SPDX-License-Identifier: MIT */
/* A slow, lossy link between two network namespaces, in user space, for kernels without tc netem:
 *
 *   netns_link NS_A NS_B DEV DELAY_MS RATE_MBIT LOSS [SEED]
 *
 * makes a TUN device DEV in each namespace and carries every packet written into one to the other
 * after a one-way delay of DELAY_MS, at RATE_MBIT megabit/s (a queue of at most 8 MB each way, as
 * a router's, whose tail is dropped), and drops a share LOSS (0..1) of them at random. It runs until
 * killed; the devices vanish with it. Route the peer's address through DEV in each namespace to use
 * it (dist/netns_hosts.sh slow does). With an MTU of 64000 on DEV a 1 Gbit/s link is 2000 packets a
 * second, so the forwarder itself costs little CPU. Linux only, needs root. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

enum { MAX_PACKET = 65536, QUEUE_BYTES = 8 << 20 };

typedef struct packet {
    struct packet *next;
    double release; /* when it leaves the link */
    int len;
    unsigned char data[];
} packet;

typedef struct {
    int in, out;     /* read from in, write to out */
    packet *head, *tail;
    long queued;     /* bytes */
    double free_at;  /* when the link has sent everything queued */
    long sent, lost, dropped;
} direction;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static double uniform(void) { /* xorshift64 */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* A TUN device named dev inside namespace ns: its file descriptor, or -1 with a message. */
static int tun_in(const char *ns, const char *dev) {
    char path[300];
    snprintf(path, sizeof path, "/var/run/netns/%s", ns);
    const int nsfd = open(path, O_RDONLY);
    if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) {
        fprintf(stderr, "netns_link: cannot enter namespace %s: %s\n", ns, strerror(errno));
        return -1;
    }
    close(nsfd);
    const int fd = open("/dev/net/tun", O_RDWR);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", dev);
    if (fd < 0 || ioctl(fd, TUNSETIFF, &ifr) != 0) {
        fprintf(stderr, "netns_link: cannot make TUN device %s in %s: %s\n", dev, ns, strerror(errno));
        return -1;
    }
    fcntl(fd, F_SETFL, O_NONBLOCK);
    return fd;
}

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig, stop = 1; }

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: netns_link NS_A NS_B DEV DELAY_MS RATE_MBIT LOSS [SEED]\n");
        return 2;
    }
    const double delay = atof(argv[4]) / 1e3, rate = atof(argv[5]) * 1e6 / 8, loss = atof(argv[6]);
    if (argc > 7) rng = strtoull(argv[7], NULL, 10) * 2654435761ull + 1;
    if (!(delay >= 0) || !(rate > 0) || !(loss >= 0 && loss <= 1)) {
        fprintf(stderr, "netns_link: need DELAY_MS >= 0, RATE_MBIT > 0, 0 <= LOSS <= 1\n");
        return 2;
    }
    const int a = tun_in(argv[1], argv[3]), b = tun_in(argv[2], argv[3]);
    if (a < 0 || b < 0) return 1;
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    direction dir[2] = {{.in = a, .out = b}, {.in = b, .out = a}};
    unsigned char buf[MAX_PACKET];
    printf("netns_link: %s <-> %s via %s, %g ms, %g Mbit/s, loss %g\n", argv[1], argv[2], argv[3], delay * 1e3,
           rate * 8 / 1e6, loss);
    fflush(stdout);
    while (!stop) {
        double next = now_s() + 1;
        for (int k = 0; k < 2; k++)
            if (dir[k].head && dir[k].head->release < next) next = dir[k].head->release;
        const double wait = next - now_s();
        struct pollfd pf[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
        const double w = wait > 0 ? wait : 0;
        const struct timespec ts = {(time_t)w, (long)((w - (double)(time_t)w) * 1e9)};
        ppoll(pf, 2, &ts, NULL);
        const double t = now_s();
        for (int k = 0; k < 2; k++) {
            direction *d = &dir[k];
            for (int burst = 0; burst < 64; burst++) { /* arrivals */
                const ssize_t n = read(d->in, buf, sizeof buf);
                if (n <= 0) break;
                if (uniform() < loss) {
                    d->lost++;
                    continue;
                }
                if (d->queued + n > QUEUE_BYTES) {
                    d->dropped++;
                    continue;
                }
                packet *p = malloc(sizeof *p + (size_t)n);
                if (!p) continue;
                d->free_at = (d->free_at > t ? d->free_at : t) + (double)n / rate; /* serialised at the rate */
                p->release = d->free_at + delay, p->len = (int)n, p->next = NULL;
                memcpy(p->data, buf, (size_t)n);
                if (d->tail) d->tail->next = p;
                else d->head = p;
                d->tail = p, d->queued += n;
            }
            while (d->head && d->head->release <= t) { /* departures */
                packet *p = d->head;
                if (write(d->out, p->data, (size_t)p->len) < 0 && errno == EAGAIN) break;
                d->head = p->next;
                if (!d->head) d->tail = NULL;
                d->queued -= p->len, d->sent++;
                free(p);
            }
        }
    }
    printf("netns_link: sent %ld / %ld packets, lost %ld / %ld, queue full %ld / %ld\n", dir[0].sent, dir[1].sent,
           dir[0].lost, dir[1].lost, dir[0].dropped, dir[1].dropped);
    return 0;
}
