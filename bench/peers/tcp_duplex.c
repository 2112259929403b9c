/*
 * tcp_duplex.c — the ceiling of any 2-rank allreduce over loopback TCP on
 * this machine: two processes exchange BYTES in both directions at once
 * (what a 2-rank ring's every step and a direct exchange do), over K
 * connections, non-blocking with poll; no reduction, no framing. Prints
 * the per-direction rate. A 2-rank allreduce must receive BYTES per rank
 * (ring: two halves), so its busbw (= algbw for 2 ranks) cannot beat this
 * rate, and is lower by the reduction and whatever else it does.
 * Build: cc -O2 -o tcp_duplex bench/peers/tcp_duplex.c
 * Usage: tcp_duplex BYTES ITERS K [SNDBUF]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void opts(int fd, int buf) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (buf > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  }
}

/* Sends and receives `bytes` split into k contiguous parts, one per fd. */
static void exchange(int *fd, int k, char *sb, char *rb, size_t bytes) {
  size_t per = (bytes + k - 1) / k, soff[16], roff[16], end[16];
  for (int i = 0; i < k; i++) {
    soff[i] = roff[i] = i * per < bytes ? i * per : bytes;
    end[i] = (i + 1) * per < bytes ? (i + 1) * per : bytes;
  }
  for (;;) {
    struct pollfd p[16];
    int busy = 0;
    for (int i = 0; i < k; i++) {
      p[i].fd = fd[i];
      p[i].events = (soff[i] < end[i] ? POLLOUT : 0) | (roff[i] < end[i] ? POLLIN : 0);
      busy |= p[i].events;
    }
    if (!busy) return;
    poll(p, k, -1);
    for (int i = 0; i < k; i++) {
      if (p[i].revents & POLLOUT) {
        ssize_t w = send(fd[i], sb + soff[i], end[i] - soff[i], MSG_DONTWAIT);
        if (w > 0) soff[i] += w;
      }
      if (p[i].revents & POLLIN) {
        ssize_t r = recv(fd[i], rb + roff[i], end[i] - roff[i], MSG_DONTWAIT);
        if (r > 0) roff[i] += r;
        if (r == 0) exit(3);
      }
    }
  }
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s BYTES ITERS K [SNDBUF]\n", argv[0]);
    return 2;
  }
  size_t bytes = strtoull(argv[1], 0, 0);
  int iters = atoi(argv[2]), k = atoi(argv[3]), buf = argc > 4 ? atoi(argv[4]) : 0;
  if (k < 1 || k > 16) return 2;
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  if (bind(lfd, (void *)&sa, sizeof sa) || listen(lfd, 16) || getsockname(lfd, (void *)&sa, &sl)) return 1;
  pid_t child = fork();
  int fd[16];
  for (int i = 0; i < k; i++) {
    if (child == 0) {
      fd[i] = socket(AF_INET, SOCK_STREAM, 0);
      opts(fd[i], buf);
      if (connect(fd[i], (void *)&sa, sizeof sa)) return 1;
    } else {
      fd[i] = accept(lfd, NULL, NULL);
      opts(fd[i], buf);
    }
  }
  char *sb = malloc(bytes), *rb = malloc(bytes);
  memset(sb, 1, bytes);
  memset(rb, 0, bytes);
  exchange(fd, k, sb, rb, bytes); /* warm-up */
  double t0 = now();
  for (int it = 0; it < iters; it++) exchange(fd, k, sb, rb, bytes);
  double dt = (now() - t0) / iters;
  if (child) {
    waitpid(child, NULL, 0);
    printf("%zu bytes each way, %d connection(s): %.2f ms per exchange, %.3f GB/s per direction\n", bytes, k,
           dt * 1e3, bytes / dt / 1e9);
  }
  return 0;
}
