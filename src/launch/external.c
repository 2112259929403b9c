/*
 * external.c — a job whose ranks an external launcher started (mpirun,
 * srun; dt_job_from_env): this process is one rank. It meets the others
 * through a TCP store that rank 0 serves at DTRAIN_RDZV, or through a file
 * store in a private directory named after the launcher's job id (rank 0
 * removes it once everyone has joined). Without DTRAIN_JOB_TOKEN the tcp
 * links of such a job use a fresh secret rank 0 leaves in that (mode 0700)
 * directory. Then the worker function runs here, once.
 *
 * It forks nothing and handles no signals: the external launcher owns the
 * processes.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/core.h"
#include "launch/job_int.h"

/* Removes a store directory and its files (file store: one level). */
static void remove_store_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *de;
    char path[PATH_MAX];
    while ((de = readdir(d)))
      if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        unlink(path);
      }
    closedir(d);
  }
  rmdir(dir);
}

static int make_private_dir(const dt_job *j) {
  struct stat sb;
  if (mkdir(j->dir, 0700) < 0 && errno != EEXIST)
    return dt__seterr(DT_EIO, "rank %d: rendezvous directory %s: %s", j->rank0, j->dir,
                      strerror(errno));
  if (lstat(j->dir, &sb) < 0 || !S_ISDIR(sb.st_mode) || sb.st_uid != getuid())
    return dt__seterr(DT_EIO, "rank %d: rendezvous directory %s is not a directory of this user",
                      j->rank0, j->dir);
  return DT_OK;
}

/* Joins the communicator of all ranks; *out on success. */
static int join(dt_job *j, dt_comm **out) {
  const struct dt__env_world *ew = &j->ew;
  dt_store_server *srv = NULL;
  dt_store *st = NULL;
  dt_comm *c = NULL;
  struct dt_comm_config cc;
  char tok[40] = {0};
  int rc = DT_OK;
  *out = NULL;
  if (j->dir[0]) DT_CHECK(make_private_dir(j));
  dt__job_comm_config(j, ew->rank, &cc);
  if (j->rdzv_port) {
    if (ew->rank == 0) rc = dt_store_server_start(&srv, j->rdzv_ip, j->rdzv_port, j->token);
    if (rc == DT_OK) rc = dt_store_connect(&st, j->rdzv_host, j->rdzv_port, j->token,
                                           j->cfg.deadline_s);
  } else {
    rc = dt_store_open_file(&st, j->dir);
    size_t tl = 0;
    if (rc == DT_OK && !*j->token && strcmp(j->transport, "mpi")) {
      if (ew->rank == 0) {
        dt__make_token(tok, sizeof tok);
        rc = dt_store_set(st, "train/token", tok, strlen(tok), j->cfg.deadline_s);
      } else {
        rc = dt_store_get(st, "train/token", tok, sizeof tok - 1, &tl, j->cfg.deadline_s);
        tok[tl < sizeof tok ? tl : sizeof tok - 1] = '\0';
      }
      if (rc == DT_OK) cc.token = tok;
    }
  }
  /* dt_comm_create ends with a barrier: once it returns, everyone has
   * joined and nobody reads the store again */
  if (rc == DT_OK) rc = dt_comm_create(&c, st, &cc);
  if (rc < 0) {
    rc = dt__preerr(rc, "rank %d (%s %s=%d): joining the job", ew->rank, ew->source,
                    ew->rank_var, ew->rank);
    dt_comm_destroy(c);
    c = NULL;
  }
  dt_store_destroy(st);
  dt_store_server_stop(srv);
  if (j->dir[0] && ew->rank == 0) remove_store_dir(j->dir);
  *out = c;
  return rc;
}

int dt__job_run_external(dt_job *j, dt_job_worker_fn fn, void *arg) {
  dt_comm *c = NULL;
  if (j->world > 1) DT_CHECK(join(j, &c));
  j->st[0].pid = (int)getpid();
  struct dt_job_worker w = {j->ew.rank, j->world, 0, 1, 0, 1, c, NULL, 0, NULL, 0, NULL};
  int status = fn(&w, arg);
  if (status != 0 && c) dt_comm_abort(c, DT_EABORTED, dt_errmsg());
  dt_comm_destroy(c);
  j->st[0].exited = 1;
  j->st[0].code = status == 0 ? 0 : (status & 255) ? (status & 255) : 1;
  if (status == 0) return DT_OK;
  j->failed = 0;
  return dt__seterr(DT_EABORTED, "rank %d (%s %s=%d): worker returned status %d", j->ew.rank,
                    j->ew.source, j->ew.rank_var, j->ew.rank, j->st[0].code);
}
