/*
 * flood.h — what the two connection-flood tests share (test_store_flood,
 * test_tcp_flood): a stranger process that opens up to n idle, non-blocking
 * TCP connections to a loopback port (one every 2 ms, raising its own
 * descriptor limit to fit) and holds them, and the process's CPU time
 * (user + system) to check a server did not spin on them. Header-only,
 * static functions, one test executable each; it never sends a byte.
 */
#ifndef DT_TESTS_FLOOD_H
#define DT_TESTS_FLOOD_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

/* Opens up to n connections to 127.0.0.1:port into fds; the count opened. */
__attribute__((unused)) static int flood_open(int port, int n, int *fds) {
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < (rlim_t)n + 64) {
    rl.rlim_cur = rl.rlim_max < (rlim_t)n + 64 ? rl.rlim_max : (rlim_t)n + 64;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  int opened = 0;
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < n; i++) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS) {
      close(fd);
      continue;
    }
    fds[opened++] = fd;
    usleep(2000);
  }
  return opened;
}

/* This process's CPU seconds so far, user + system. */
__attribute__((unused)) static double flood_cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

#endif /* DT_TESTS_FLOOD_H */
