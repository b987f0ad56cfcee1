/* delayline: a wire with a fixed one-way delay (and an optional rate) between network
 * namespaces, in user space, for kernels without the netem qdisc.
 *
 *   delayline [-l SHARE] DELAY_US BYTES_PER_S NETNS_NAME...  (BYTES_PER_S 0: no rate limit)
 *
 * For each named namespace (as created by `ip netns add`) it opens a TUN device "tun0"
 * inside it, then writes "ready\n" to stdout; the caller then gives the k-th namespace's
 * tun0 the address NET.(k+1).  An IPv4 packet read from any tun0 is written to the tun0 of
 * namespace (last octet of its destination address - 1), DELAY_US after it was read, or
 * later if the destination's link is still busy sending earlier packets at BYTES_PER_S.
 * Each destination has its own queue, so a busy link never delays another one.  Packets to
 * an unknown destination, and packets beyond QUEUE waiting for one destination, are dropped
 * (TCP sends them again).  With -l SHARE (0 to 1), each packet is also dropped with that
 * probability, as a lossy link would (a fixed-seed generator: runs are repeatable).  SIGTERM or SIGINT end the program; the TUN devices disappear with
 * it.  A sleeping wake-up comes 10-20 us late on a loaded machine, so the last SPIN_NS
 * before a packet is due are spent polling instead (CPU is used only while packets wait).
 *
 * Build: cc -O2 -o delayline delayline.c
 */
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

enum { MAX_HOSTS = 32, QUEUE = 256, PACKET = 65536 };
static const int64_t SPIN_NS = 30000;

struct packet {
    int64_t due;
    int len;
    unsigned char data[PACKET];
};

struct link {                 /* everything waiting for one destination */
    int fd;                   /* that destination's tun0 */
    int head, count;
    int64_t free_at;          /* when the link has sent what it holds */
    long dropped;
    struct packet *queue;     /* QUEUE packets, in order of release */
};

static volatile sig_atomic_t stopping;
static double loss;           /* share of packets dropped at random (-l) */
static uint64_t seed = 0x9E3779B97F4A7C15u;
static long lost;

static double uniform(void) {  /* xorshift64*: a fixed sequence, good enough for dropping */
    seed ^= seed >> 12;
    seed ^= seed << 25;
    seed ^= seed >> 27;
    return (double)((seed * 0x2545F4914F6CDD1Du) >> 11) / 9007199254740992.0;
}

static void on_stop(int sig) { (void)sig; stopping = 1; }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A TUN device "tun0" inside the named network namespace. */
static int open_tun(const char *netns) {
    char path[256];
    snprintf(path, sizeof path, "/run/netns/%s", netns);
    int ns = open(path, O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) {
        fprintf(stderr, "delayline: cannot enter network namespace %s: %s\n", netns,
                strerror(errno));
        return -1;
    }
    close(ns);
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    struct ifreq req;
    memset(&req, 0, sizeof req);
    req.ifr_flags = IFF_TUN | IFF_NO_PI;
    snprintf(req.ifr_name, sizeof req.ifr_name, "tun0");
    if (fd < 0 || ioctl(fd, TUNSETIFF, &req) != 0) {
        fprintf(stderr, "delayline: no TUN device in %s: %s\n", netns, strerror(errno));
        return -1;
    }
    return fd;
}

/* Queue one packet for its destination; false if it has none or its queue is full. */
static int enqueue(struct link *links, int hosts, const unsigned char *data, int len,
                   int64_t delay, double rate) {
    if (len < 20 || (data[0] >> 4) != 4)
        return 0;
    int to = data[19] - 1;    /* last octet of the IPv4 destination address */
    if (to < 0 || to >= hosts)
        return 0;
    struct link *l = &links[to];
    if (loss > 0 && uniform() < loss) {
        lost++;
        return 0;
    }
    if (l->count == QUEUE) {
        l->dropped++;
        return 0;
    }
    int64_t arrived = now_ns(), sent = arrived;
    if (rate > 0) {           /* serialised behind what the link already carries */
        int64_t start = l->free_at > arrived ? l->free_at : arrived;
        l->free_at = sent = start + (int64_t)(len * 1e9 / rate);
    }
    struct packet *p = &l->queue[(l->head + l->count) % QUEUE];
    memcpy(p->data, data, len);
    p->len = len;
    p->due = sent + delay;
    if (l->count > 0) {       /* never overtake the packet ahead */
        int64_t ahead = l->queue[(l->head + l->count - 1) % QUEUE].due;
        if (p->due < ahead)
            p->due = ahead;
    }
    l->count++;
    return 1;
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "-l") == 0) {
        loss = atof(argv[2]);
        argv[2] = argv[0];
        argv += 2;
        argc -= 2;
    }
    if (argc < 4 || loss < 0 || loss >= 1) {
        fprintf(stderr, "usage: %s [-l SHARE] DELAY_US BYTES_PER_S NETNS...\n", argv[0]);
        return 2;
    }
    int64_t delay = (int64_t)(atof(argv[1]) * 1000);
    double rate = atof(argv[2]);
    int hosts = argc - 3;
    if (hosts > MAX_HOSTS) {
        fprintf(stderr, "delayline: at most %d namespaces\n", MAX_HOSTS);
        return 2;
    }
    static struct link links[MAX_HOSTS];
    struct pollfd fds[MAX_HOSTS];
    int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    for (int k = 0; k < hosts; k++) {
        links[k].fd = open_tun(argv[3 + k]);
        links[k].queue = malloc(sizeof(struct packet) * QUEUE);
        if (links[k].fd < 0 || links[k].queue == NULL)
            return 1;
        fds[k].fd = links[k].fd;
        fds[k].events = POLLIN;
    }
    if (home >= 0)
        setns(home, CLONE_NEWNET);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    printf("ready\n");
    fflush(stdout);

    static unsigned char buffer[PACKET];
    while (!stopping) {
        /* release every packet that is due, and find the next one */
        int64_t now = now_ns(), next = -1;
        for (int k = 0; k < hosts; k++) {
            struct link *l = &links[k];
            while (l->count > 0 && l->queue[l->head].due <= now) {
                struct packet *p = &l->queue[l->head];
                if (write(l->fd, p->data, p->len) < 0 && errno != EAGAIN)
                    perror("delayline: write");
                l->head = (l->head + 1) % QUEUE;
                l->count--;
            }
            if (l->count > 0 && (next < 0 || l->queue[l->head].due < next))
                next = l->queue[l->head].due;
        }
        int64_t wait = next < 0 ? 100000000 : next - now;
        struct timespec ts = {0, 0};
        if (wait > SPIN_NS) {
            wait -= next < 0 ? 0 : SPIN_NS;
            ts.tv_sec = wait / 1000000000;
            ts.tv_nsec = wait % 1000000000;
        }
        if (ppoll(fds, hosts, &ts, NULL) < 0) {
            if (errno == EINTR)
                continue;
            perror("delayline: ppoll");
            return 1;
        }
        for (int k = 0; k < hosts; k++) {
            if (!(fds[k].revents & POLLIN))
                continue;
            for (;;) {
                int len = read(links[k].fd, buffer, sizeof buffer);
                if (len <= 0)
                    break;
                enqueue(links, hosts, buffer, len, delay, rate);
            }
        }
    }
    if (lost)
        fprintf(stderr, "delayline: %ld packets dropped at random (-l %g)\n", lost, loss);
    for (int k = 0; k < hosts; k++)
        if (links[k].dropped)
            fprintf(stderr, "delayline: %ld packets to %s dropped (queue full)\n",
                    links[k].dropped, argv[3 + k]);
    return 0;
}
