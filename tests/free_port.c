/*
 * free_port.c — `dt_free_port [IPV4]`: prints a TCP port on IPV4 (default
 * 127.0.0.1) that the kernel has just handed out and that stays reserved
 * for a minute, for shell tests that must name a port before the process
 * that listens on it starts (`dtrain launch --rdzv 127.0.0.1:PORT` on two
 * nodes). tests/cli/lib.sh wraps it as free_port.
 *
 * Asking the kernel (bind to port 0) instead of picking a number avoids
 * ports in use; to keep another test from being handed the same port
 * before dtrain binds it, the port is left in TIME_WAIT: a connection to
 * it is accepted and closed from the listening side first. For about 60 s
 * the kernel then hands that port to no bind(0) and no connect(), while a
 * listener with SO_REUSEADDR (dtrain's store server does so) can bind it
 * at once. This is the ephemeral-port-reserve trick (Yelp).
 *
 * It does not hold the port for anyone: a program that binds the number
 * explicitly with SO_REUSEADDR can still take it. Exit status 1 with a
 * message on stderr if any step fails. Built by CMake beside the tests
 * (not a ctest entry itself).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int die(const char *what) {
  fprintf(stderr, "dt_free_port: %s: %s\n", what, strerror(errno));
  return 1;
}

int main(int argc, char **argv) {
  const char *ip = argc > 1 ? argv[1] : "127.0.0.1";
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  if (argc > 2 || inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
    fprintf(stderr, "usage: dt_free_port [IPV4]\n");
    return 2;
  }
  int one = 1;
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lfd < 0) return die("socket");
  /* SO_REUSEADDR on the socket that ends in TIME_WAIT is what lets a later
   * SO_REUSEADDR listener bind the port (Linux wants it on both). */
  if (setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0) return die("SO_REUSEADDR");
  if (bind(lfd, (struct sockaddr *)&a, sizeof a) < 0) return die("bind");
  if (listen(lfd, 1) < 0) return die("listen");
  if (getsockname(lfd, (struct sockaddr *)&a, &len) < 0) return die("getsockname");
  int cfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (cfd < 0) return die("socket");
  if (connect(cfd, (struct sockaddr *)&a, sizeof a) < 0) return die("connect");
  int afd = accept(lfd, NULL, NULL);
  if (afd < 0) return die("accept");
  /* The accepted socket (local port = the port) closes first, so it is the
   * one that waits in TIME_WAIT. */
  close(afd);
  close(cfd);
  close(lfd);
  printf("%d\n", ntohs(a.sin_port));
  return 0;
}
