/*
 * cmd_ckpt.c — `dtrain ckpt ls DIR`, `dtrain ckpt verify DIR` and
 * `dtrain export CKPT --out model.safetensors` (docs/checkpoint.md).
 *
 * ls lists the checkpoints under DIR (a checkpoint root, a run directory
 * holding ckpt/, or one checkpoint) newest first with step, epoch, size
 * and whether each is valid; verify checks every byte of each (manifest
 * self hash, sizes, SHA-256, safetensors headers) and exits 1 if any is
 * damaged; export copies the weights (model.safetensors: parameters and
 * batch-norm statistics under nn.Sequential names, the layer spec and the
 * input normalisation in __metadata__) of the newest valid checkpoint out
 * to a file, atomically. Thin over src/ckpt; it does not train.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt.h"
#include "cli/cli.h"
#include "core/core.h"
#include "engine/engine.h"

static void ckpt_usage(FILE *f) {
  fprintf(f, "usage: dtrain ckpt ls DIR\n"
             "       dtrain ckpt verify DIR\n"
             "\n"
             "DIR is a checkpoint root (step-NNNNNNNN directories and `latest`), a run\n"
             "directory holding ckpt/, or one checkpoint. ls lists them newest first;\n"
             "verify checks every file of each against the manifest's SHA-256 and exits 1\n"
             "if any is damaged (docs/checkpoint.md).\n");
}

static void export_usage(FILE *f) {
  fprintf(f, "usage: dtrain export CKPT --out FILE.safetensors\n"
             "\n"
             "Writes the weights of CKPT (a checkpoint, or a run directory / checkpoint\n"
             "root meaning its newest valid checkpoint) to FILE: parameters and batch-norm\n"
             "statistics under PyTorch nn.Sequential state_dict names, the layer spec and\n"
             "input normalisation in __metadata__ (tools/torch_safetensors.py loads it).\n");
}

static double total_bytes(const dt_ckpt_info *i) {
  double b = 0;
  for (int k = 0; k < i->nfiles; k++) b += (double)i->files[k].bytes;
  return b;
}

/* Lists (verify = 0) or verifies (1) the checkpoints of path. */
static int walk(const char *path, int verify) {
  char root[DT_CKPT_PATH_MAX];
  if (dt__ckpt_root_of(path, root, sizeof root) < 0) {
    fprintf(stderr, "dtrain: %s\n", dt_errmsg());
    return DT_EXIT_USAGE;
  }
  struct stat st;
  char p[DT_CKPT_PATH_MAX + 40];
  snprintf(p, sizeof p, "%s/%s", path, DT_CKPT_MANIFEST);
  int one = stat(p, &st) == 0;
  char latest[64] = "";
  snprintf(p, sizeof p, "%s/%s", root, DT_CKPT_LATEST);
  uint8_t *lb;
  size_t ln;
  if (!one && dt__read_all(p, 63, &lb, &ln) == DT_OK) {
    memcpy(latest, lb, ln);
    latest[ln] = '\0';
    latest[strcspn(latest, "\n")] = '\0';
    free(lb);
  }
  char (*names)[32] = NULL;
  int n = 1;
  if (!one) {
    n = dt__ckpt_list(root, &names);
    if (n < 0) {
      fprintf(stderr, "dtrain: %s\n", dt_errmsg());
      return DT_EXIT_USAGE;
    }
    if (n == 0) {
      fprintf(stderr, "dtrain: no checkpoint under '%s'\n", root);
      free(names);
      return verify ? DT_EXIT_FAIL : DT_EXIT_OK;
    }
  }
  int bad = 0, latest_found = !latest[0];
  for (int i = 0; i < n; i++) {
    const char *dir = path;
    if (!one) {
      snprintf(p, sizeof p, "%s/%s", root, names[i]);
      dir = p;
      if (!strcmp(names[i], latest)) latest_found = 1;
    }
    dt_ckpt_info info;
    int rc = dt__ckpt_verify(dir, &info);
    const char *mark = !one && !strcmp(names[i], latest) ? "  <- latest" : "";
    if (rc == DT_OK)
      printf("%s  step %lld  epochs done %d  %.1f MB  %d files  ok%s\n", dir, (long long)info.step,
             info.epoch, total_bytes(&info) / 1e6, info.nfiles, mark);
    else {
      bad++;
      printf("%s  INVALID: %s%s\n", dir, dt_errmsg(), mark);
    }
  }
  if (!latest_found) {
    printf("%s/%s names '%s', which does not exist (dangling)\n", root, DT_CKPT_LATEST, latest);
    if (verify) bad++;
  }
  free(names);
  fflush(stdout);
  return verify && bad ? DT_EXIT_FAIL : DT_EXIT_OK;
}

int dt__cmd_ckpt(int argc, char **argv) {
  if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
    ckpt_usage(stdout);
    return DT_EXIT_OK;
  }
  if (argc != 3 || (strcmp(argv[1], "ls") && strcmp(argv[1], "verify"))) {
    ckpt_usage(stderr);
    return DT_EXIT_USAGE;
  }
  return walk(argv[2], !strcmp(argv[1], "verify"));
}

int dt__cmd_export(int argc, char **argv) {
  const char *src = NULL, *out = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      export_usage(stdout);
      return DT_EXIT_OK;
    }
    if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
    else if (!strncmp(argv[i], "--out=", 6)) out = argv[i] + 6;
    else if (argv[i][0] == '-' || src) {
      export_usage(stderr);
      return DT_EXIT_USAGE;
    } else src = argv[i];
  }
  if (!src || !out || !*out) {
    export_usage(stderr);
    return DT_EXIT_USAGE;
  }
  dt_ckpt_info info;
  if (dt__ckpt_find(src, &info) < 0) {
    fprintf(stderr, "dtrain: export: %s\n", dt_errmsg());
    return DT_EXIT_USAGE;
  }
  uint8_t *b;
  size_t n;
  int rc = dt__ckpt_load(&info, "model.safetensors", &b, &n);
  dt_st st;
  if (rc == DT_OK) {
    rc = dt__st_parse(&st, b, n, "model.safetensors");
    if (rc == DT_OK) {
      printf("exported step %lld of %s: %d tensors, layers '%s' -> %s\n", (long long)info.step,
             info.dir, st.n, dt__st_meta(&st, "dtrain.layers") ? dt__st_meta(&st, "dtrain.layers")
                                                               : "?", out);
      dt__st_free(&st);
    }
  }
  if (rc == DT_OK) rc = dt_write_file_atomic(out, b, n);
  free(b);
  if (rc < 0) {
    fprintf(stderr, "dtrain: export: %s\n", dt_errmsg());
    return DT_EXIT_FAIL;
  }
  return DT_EXIT_OK;
}
