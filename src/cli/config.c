/*
 * config.c — INI run configurations into dt_run_cfg. One table describes
 * every key (section, name, type, field, range); the libinih handler, the
 * `--set` overrides and the canonical dump all go through it, so a key
 * behaves the same wherever it is set.
 *
 * libinih reads lines through our own reader so we know the line number of
 * every key (the Debian build has no lineno handler), can reject over-long
 * lines, NUL bytes and unknown sections (even empty ones), and can tell an
 * indented continuation line from a new key. Only model.layers may continue
 * on indented lines; any other repeated key is an error. Parsing stops at
 * the first error. It never touches data files or builds models.
 */
#include "cli/config.h"

#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "comm/compress/compress.h"
#include "core/core.h"

/* Records an error message with every control byte of it (from a config
 * file, a --set argument or a path: the format text has none) written as
 * \xNN, so a message never sends raw escape sequences to a terminal. */
static int cfg_err(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cfg_err(int rc, const char *fmt, ...) {
  char raw[1024], safe[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(raw, sizeof raw, fmt, ap);
  va_end(ap);
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)raw; *p && n + 5 < sizeof safe; p++) {
    if (*p < 0x20 || *p == 0x7f) n += (size_t)snprintf(safe + n, sizeof safe - n, "\\x%02x", *p);
    else safe[n++] = (char)*p;
  }
  safe[n] = '\0';
  return dt__seterr(rc, "%s", safe);
}

enum ktype { K_SPEC, K_PATH, K_INT, K_I64, K_U64, K_FLOAT, K_BOOL, K_ENUM, K_SHAPE, K_CUTS, K_ADDR };

/* Range flags: lo/hi bounds are inclusive unless the OPEN flag is set. */
#define R_LO_OPEN 1
#define R_HI_OPEN 2

typedef struct key {
  const char *section, *name;
  int type;
  size_t off;
  double lo, hi;
  int rflags;
  const char *const *enums; /* K_ENUM: NULL-terminated names, value = index */
} key;

/* enum names: the one table each, in src/engine/run_cfg.c */
#define fmt_names dt__format_names
#define opt_names dt__optim_names
#define sched_names dt__sched_names
#define transport_names dt__transport_names
#define reduce_names dt__reduce_names
#define balance_names dt__balance_names
#define schedule_names dt__schedule_names
#define consistency_names dt__ps_consistency_names

#define OFF(f) offsetof(dt_run_cfg, f)
#define BIG 1e18

static const key keys[] = {
    {"model", "layers", K_SPEC, OFF(layers), 0, 0, 0, NULL},
    {"model", "stages", K_CUTS, OFF(stages), 0, 0, 0, NULL},
    {"model", "init", K_PATH, OFF(model_init), 0, 0, 0, NULL},
    {"data", "format", K_ENUM, OFF(format), 0, 0, 0, fmt_names},
    {"data", "train_images", K_PATH, OFF(train_images), 0, 0, 0, NULL},
    {"data", "train_labels", K_PATH, OFF(train_labels), 0, 0, 0, NULL},
    {"data", "test_images", K_PATH, OFF(test_images), 0, 0, 0, NULL},
    {"data", "test_labels", K_PATH, OFF(test_labels), 0, 0, 0, NULL},
    {"data", "normalize", K_BOOL, OFF(normalize), 0, 1, 0, NULL},
    {"data", "shuffle", K_BOOL, OFF(shuffle), 0, 1, 0, NULL},
    {"data", "limit_train", K_I64, OFF(limit_train), 0, BIG, 0, NULL},
    {"data", "limit_test", K_I64, OFF(limit_test), 0, BIG, 0, NULL},
    {"data", "label_col", K_INT, OFF(label_col), -1, 1 << 20, 0, NULL},
    {"data", "shape", K_SHAPE, OFF(shape), 0, 0, 0, NULL},
    {"optim", "name", K_ENUM, OFF(optim.kind), 0, 0, 0, opt_names},
    {"optim", "lr", K_FLOAT, OFF(optim.lr), 0, 1e6, R_LO_OPEN, NULL},
    {"optim", "momentum", K_FLOAT, OFF(optim.momentum), 0, 1, R_HI_OPEN, NULL},
    {"optim", "nesterov", K_BOOL, OFF(optim.nesterov), 0, 1, 0, NULL},
    {"optim", "weight_decay", K_FLOAT, OFF(optim.weight_decay), 0, 1e6, 0, NULL},
    {"optim", "beta1", K_FLOAT, OFF(optim.beta1), 0, 1, R_HI_OPEN, NULL},
    {"optim", "beta2", K_FLOAT, OFF(optim.beta2), 0, 1, R_HI_OPEN, NULL},
    {"optim", "eps", K_FLOAT, OFF(optim.eps), 0, 1, R_LO_OPEN, NULL},
    {"train", "epochs", K_INT, OFF(epochs), 1, 1000000, 0, NULL},
    {"train", "batch", K_INT, OFF(batch), 1, 65536, 0, NULL},
    {"train", "seed", K_U64, OFF(seed), 0, 0, 0, NULL},
    {"train", "eval_every", K_INT, OFF(eval_every), 1, 1000000, 0, NULL},
    {"train", "recompute", K_BOOL, OFF(recompute), 0, 1, 0, NULL},
    {"schedule", "kind", K_ENUM, OFF(sched.kind), 0, 0, 0, sched_names},
    {"schedule", "warmup_steps", K_I64, OFF(sched.warmup_steps), 0, BIG, 0, NULL},
    {"schedule", "step_size", K_I64, OFF(sched.step_size), 1, BIG, 0, NULL},
    {"schedule", "gamma", K_FLOAT, OFF(sched.gamma), 0, 1, R_LO_OPEN, NULL},
    {"schedule", "min_lr", K_FLOAT, OFF(sched.min_lr), 0, 1e6, 0, NULL},
    {"dist", "workers", K_INT, OFF(workers), 1, 4096, 0, NULL},
    {"dist", "transport", K_ENUM, OFF(transport), 0, 0, 0, transport_names},
    {"dist", "bucket_bytes", K_I64, OFF(bucket_bytes), 1024, 1 << 30, 0, NULL},
    {"dist", "reduce", K_ENUM, OFF(reduce), 0, 0, 0, reduce_names},
    {"dist", "scale_lr", K_BOOL, OFF(scale_lr), 0, 1, 0, NULL},
    {"dist", "base_batch", K_INT, OFF(base_batch), 1, 65536, 0, NULL},
    {"dist", "deterministic", K_BOOL, OFF(deterministic), 0, 1, 0, NULL},
    {"dist", "micro_batch", K_INT, OFF(micro_batch), 1, 65536, 0, NULL},
    {"dist", "balance", K_ENUM, OFF(balance), 0, 0, 0, balance_names},
    {"dist", "straggler_threshold", K_FLOAT, OFF(straggler_threshold), 0, 1e6, R_LO_OPEN, NULL},
    {"dist", "balance_every", K_INT, OFF(balance_every), 1, 1000000, 0, NULL},
    {"dist", "pipeline_stages", K_INT, OFF(pipeline_stages), 1, DT_CFG_MAX_STAGES, 0, NULL},
    {"dist", "schedule", K_ENUM, OFF(schedule), 0, 0, 0, schedule_names},
    {"dist", "micro_batches", K_INT, OFF(micro_batches), 1, 65536, 0, NULL},
    /* gradient compression (docs/compress.md) */
    {"dist", "compress", K_ENUM, OFF(compress), 0, 0, 0, dt__codec_names},
    {"dist", "error_feedback", K_BOOL, OFF(error_feedback), 0, 1, 0, NULL},
    {"dist", "compress_ratio", K_FLOAT, OFF(compress_ratio), 0, 1, R_LO_OPEN, NULL},
    {"dist", "qsgd_levels", K_INT, OFF(qsgd_levels), 1, 127, 0, NULL},
    {"dist", "powersgd_rank", K_INT, OFF(powersgd_rank), 1, 64, 0, NULL},
    {"dist", "powersgd_warm_rank", K_INT, OFF(powersgd_warm_rank), -1, 64, 0, NULL},
    {"dist", "powersgd_warm_steps", K_I64, OFF(powersgd_warm_steps), -1, BIG, 0, NULL},
    {"dist", "compress_warmup_epochs", K_INT, OFF(compress_warmup_epochs), 0, 1000000, 0, NULL},
    {"dist", "compress_start_step", K_I64, OFF(compress_start_step), -1, BIG, 0, NULL},
    {"dist", "compress_clip", K_FLOAT, OFF(compress_clip), 0, 1e30, 0, NULL},
    {"dist", "compress_momentum", K_FLOAT, OFF(compress_momentum), 0, 1, R_HI_OPEN, NULL},
    {"dist", "compress_force", K_BOOL, OFF(compress_force), 0, 1, 0, NULL},
    {"dist", "tcp_connections", K_INT, OFF(tcp_connections), 0, 16, 0, NULL},
    {"dist", "zero", K_INT, OFF(zero), 0, 1, 0, NULL},
    {"obs", "metrics", K_ADDR, OFF(obs_metrics), 0, 0, 0, NULL},
    {"obs", "trace", K_BOOL, OFF(obs_trace), 0, 1, 0, NULL},
    {"obs", "trace_steps", K_INT, OFF(obs_trace_steps), 1, 1000000, 0, NULL},
    {"obs", "log_format", K_ENUM, OFF(obs_log_format), 0, 0, 0, dt__log_format_names},
    /* checkpoints (docs/checkpoint.md) */
    {"ckpt", "dir", K_PATH, OFF(ckpt_dir), 0, 0, 0, NULL},
    {"ckpt", "every_steps", K_I64, OFF(ckpt_every_steps), 0, BIG, 0, NULL},
    {"ckpt", "every_seconds", K_FLOAT, OFF(ckpt_every_seconds), 0, 1e9, 0, NULL},
    {"ckpt", "epoch_end", K_BOOL, OFF(ckpt_epoch_end), 0, 1, 0, NULL},
    {"ckpt", "on_signal", K_BOOL, OFF(ckpt_on_signal), 0, 1, 0, NULL},
    {"ckpt", "keep", K_INT, OFF(ckpt_keep), 0, 1000000, 0, NULL},
    {"ckpt", "async", K_BOOL, OFF(ckpt_async), 0, 1, 0, NULL},
    /* parameter server (docs/ps.md) */
    {"ps", "servers", K_INT, OFF(ps.servers), 0, 4096, 0, NULL},
    {"ps", "colocate", K_BOOL, OFF(ps.colocate), 0, 1, 0, NULL},
    {"ps", "consistency", K_ENUM, OFF(ps.consistency), 0, 0, 0, consistency_names},
    {"ps", "staleness", K_INT, OFF(ps.staleness), 0, 1000000, 0, NULL},
    {"ps", "backup_workers", K_INT, OFF(ps.backup_workers), 0, 4095, 0, NULL},
    {"ps", "significance", K_FLOAT, OFF(ps.significance), 0, 1, R_HI_OPEN, NULL},
    {"ps", "replicas", K_INT, OFF(ps.replicas), 1, 64, 0, NULL},
    {"dist", "min_workers", K_INT, OFF(min_workers), 0, 4096, 0, NULL},
    {"dist", "max_workers", K_INT, OFF(max_workers), 0, 4096, 0, NULL},
    {"dist", "rejoin_timeout", K_FLOAT, OFF(rejoin_timeout), 0, 86400, 0, NULL},
    {"dist", "heartbeat_timeout", K_FLOAT, OFF(heartbeat_timeout), 0.05, 3600, 0, NULL},
    {"dist", "replace", K_BOOL, OFF(replace), 0, 1, 0, NULL},
    {"dist", "standby", K_INT, OFF(standby), 0, 4096, 0, NULL},
    {"dist", "standby_refresh_steps", K_INT, OFF(standby_refresh_steps), 0, 1000000, 0, NULL},
    {"model", "loss", K_ENUM, OFF(loss), 0, 0, 0, dt__loss_names},
};
#define NKEYS ((int)(sizeof keys / sizeof keys[0]))
_Static_assert(sizeof keys / sizeof keys[0] <= DT_CONFIG_MAX_KEYS, "too many keys");

static const char *const sections[] = {"model", "data", "optim", "train", "schedule", "dist",
                                       "obs", "ckpt", "ps", NULL};

/* ---- lookup ------------------------------------------------------------ */

static int find_key(const char *section, const char *name) {
  for (int i = 0; i < NKEYS; i++)
    if (!strcmp(keys[i].section, section) && !strcmp(keys[i].name, name)) return i;
  return -1;
}

static int known_section(const char *s) {
  for (int i = 0; sections[i]; i++)
    if (!strcmp(sections[i], s)) return 1;
  return 0;
}

/* "name, lr, momentum, ..." for messages about an unknown key. */
static void section_keys(const char *section, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  for (int i = 0; i < NKEYS && n < cap; i++) {
    if (strcmp(keys[i].section, section)) continue;
    n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", keys[i].name);
  }
}

/* ---- values -------------------------------------------------------------- */

static int parse_bool(const char *v, int *out) {
  static const char *const t[] = {"1", "true", "yes", "on"}, *const f[] = {"0", "false", "no", "off"};
  for (int i = 0; i < 4; i++) {
    if (!strcasecmp(v, t[i])) return *out = 1, 0;
    if (!strcasecmp(v, f[i])) return *out = 0, 0;
  }
  return -1;
}

static int parse_i64(const char *v, long long *out) {
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end || errno) return -1;
  *out = x;
  return 0;
}

static int parse_double(const char *v, double *out) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (end == v || *end || !isfinite(x) || (errno == ERANGE && fabs(x) > 1)) return -1;
  *out = x;
  return 0;
}

static const char *range_text(const key *k, char *buf, size_t cap) {
  if (k->hi >= BIG)
    snprintf(buf, cap, "%s %g", (k->rflags & R_LO_OPEN) ? ">" : ">=", k->lo);
  else
    snprintf(buf, cap, "in %c%g, %g%c", (k->rflags & R_LO_OPEN) ? '(' : '[', k->lo, k->hi,
             (k->rflags & R_HI_OPEN) ? ')' : ']');
  return buf;
}

static int in_range(const key *k, double x) {
  if ((k->rflags & R_LO_OPEN) ? !(x > k->lo) : !(x >= k->lo)) return 0;
  if ((k->rflags & R_HI_OPEN) ? !(x < k->hi) : !(x <= k->hi)) return 0;
  return 1;
}

/* Sets key k from text v. On error writes the reason (without location) to
 * why and returns -1. */
static int set_value(dt_run_cfg *r, const key *k, const char *v, char *why, size_t cap) {
  char *field = (char *)r + k->off;
  char rb[64];
  switch (k->type) {
  case K_SPEC:
  case K_PATH: {
    size_t max = k->type == K_SPEC ? DT_CFG_SPEC_MAX : DT_CFG_PATH_MAX;
    if (strlen(v) >= max) return snprintf(why, cap, "value too long (max %zu bytes)", max - 1), -1;
    if (k->type == K_SPEC && !*v) return snprintf(why, cap, "empty model spec"), -1;
    /* Keep every value writable back into an INI file unchanged. */
    if (*v == ';') return snprintf(why, cap, "value starts with ';' (a comment in INI files)"), -1;
    for (const char *q = v; *q; q++) {
      if ((unsigned char)*q < 0x20 && *q != '\t')
        return snprintf(why, cap, "control character in value"), -1;
      if ((*q == ' ' || *q == '\t') && q[1] == ';')
        return snprintf(why, cap, "' ;' in value (it starts a comment in INI files)"), -1;
    }
    memcpy(field, v, strlen(v) + 1);
    return 0;
  }
  case K_ADDR: {
    /* "" (off) or HOST:PORT: an IPv4 address or "localhost", port 0..65535 */
    if (!*v) return *field = '\0', 0;
    const char *colon = strrchr(v, ':');
    char host[64];
    unsigned a, b, c2, d;
    char extra;
    long long port;
    if (!colon || colon == v || (size_t)(colon - v) >= sizeof host || parse_i64(colon + 1, &port) ||
        port < 0 || port > 65535)
      return snprintf(why, cap, "expects HOST:PORT (e.g. 127.0.0.1:9400): '%s'", v), -1;
    memcpy(host, v, (size_t)(colon - v));
    host[colon - v] = '\0';
    if (strcmp(host, "localhost") &&
        (sscanf(host, "%u.%u.%u.%u%c", &a, &b, &c2, &d, &extra) != 4 || a > 255 || b > 255 ||
         c2 > 255 || d > 255))
      return snprintf(why, cap, "host '%s' is not an IPv4 address or localhost", host), -1;
    if (strlen(v) >= 64) return snprintf(why, cap, "value too long (max 63 bytes)"), -1;
    memcpy(field, v, strlen(v) + 1);
    return 0;
  }
  case K_BOOL: {
    int b;
    if (parse_bool(v, &b)) return snprintf(why, cap, "not a boolean (true/false): '%s'", v), -1;
    *(int *)field = b;
    return 0;
  }
  case K_ENUM: {
    for (int i = 0; k->enums[i]; i++)
      if (!strcmp(v, k->enums[i])) return *(int *)field = i, 0;
    size_t n = (size_t)snprintf(why, cap, "unknown value '%s' (one of:", v);
    for (int i = 0; k->enums[i] && n < cap; i++)
      n += (size_t)snprintf(why + n, cap - n, " %s", k->enums[i]);
    if (n < cap) snprintf(why + n, cap - n, ")");
    return -1;
  }
  case K_INT:
  case K_I64: {
    long long x;
    if (parse_i64(v, &x)) return snprintf(why, cap, "not an integer: '%s'", v), -1;
    if (!in_range(k, (double)x))
      return snprintf(why, cap, "must be %s (got %lld)", range_text(k, rb, sizeof rb), x), -1;
    if (k->type == K_INT) *(int *)field = (int)x;
    else *(int64_t *)field = x;
    return 0;
  }
  case K_U64: {
    char *end;
    errno = 0;
    if (!*v || *v == '-' || *v == '+') return snprintf(why, cap, "not an unsigned integer: '%s'", v), -1;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || errno) return snprintf(why, cap, "not an unsigned integer: '%s'", v), -1;
    *(uint64_t *)field = x;
    return 0;
  }
  case K_FLOAT: {
    double x;
    if (parse_double(v, &x)) return snprintf(why, cap, "not a number: '%s'", v), -1;
    /* Check what will be stored: 1e-50 is 0 as a float. */
    if (fabs(x) > 3.4e38) return snprintf(why, cap, "out of float range: '%s'", v), -1;
    x = (double)(float)x;
    if (!in_range(k, x))
      return snprintf(why, cap, "must be %s (got %g)", range_text(k, rb, sizeof rb), x), -1;
    *(float *)field = (float)x;
    return 0;
  }
  case K_SHAPE: {
    int s[3] = {0, 0, 0};
    if (*v) {
      const char *p = v;
      for (int i = 0; i < 3; i++) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 1 || x > 65536)
          return snprintf(why, cap, "expects C,H,W (three positive integers): '%s'", v), -1;
        s[i] = (int)x;
        p = end;
        while (*p == ' ' || *p == '\t') p++;
        if (i < 2) {
          if (*p != ',') return snprintf(why, cap, "expects C,H,W (three positive integers): '%s'", v), -1;
          p++;
        }
      }
      if (*p) return snprintf(why, cap, "expects C,H,W (three positive integers): '%s'", v), -1;
    }
    memcpy(field, s, sizeof s);
    return 0;
  }
  case K_CUTS: {
    /* "4,7": increasing layer indices where the next stage starts */
    int cuts[DT_CFG_MAX_STAGES] = {0};
    const char *p = v;
    while (*p) {
      char *end;
      errno = 0;
      long x = strtol(p, &end, 10);
      if (end == p || errno || x < 1 || x > 65536)
        return snprintf(why, cap, "expects cut points, increasing positive layer indices "
                        "separated by commas: '%s'", v), -1;
      if (cuts[0] + 1 >= DT_CFG_MAX_STAGES)
        return snprintf(why, cap, "at most %d cut points", DT_CFG_MAX_STAGES - 1), -1;
      if (cuts[0] && x <= cuts[cuts[0]])
        return snprintf(why, cap, "cut points must increase (%ld after %d)", x, cuts[cuts[0]]), -1;
      cuts[++cuts[0]] = (int)x;
      p = end;
      while (*p == ' ' || *p == '\t') p++;
      if (*p == ',') {
        p++;
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) return snprintf(why, cap, "trailing ',' in '%s'", v), -1;
      } else if (*p) {
        return snprintf(why, cap, "expects cut points separated by commas: '%s'", v), -1;
      }
    }
    memcpy(field, cuts, sizeof cuts);
    return 0;
  }
  }
  return snprintf(why, cap, "internal: bad key type"), -1;
}

/* ---- errors -------------------------------------------------------------- */

/* "<where>: section.key: msg" where <where> is file:line or "--set". */
static int key_error(const dt_config *c, int k, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int key_error(const dt_config *c, int k, const char *fmt, ...) {
  char msg[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int w = c->where[k];
  if (w > 0)
    return cfg_err(DT_EINVAL, "%s:%d: %s.%s: %s", c->file, w, keys[k].section, keys[k].name, msg);
  if (w < 0) return cfg_err(DT_EINVAL, "--set %s.%s: %s", keys[k].section, keys[k].name, msg);
  return cfg_err(DT_EINVAL, "config: %s.%s: %s", keys[k].section, keys[k].name, msg);
}

/* ---- init ---------------------------------------------------------------- */

void dt_config_init(dt_config *c) {
  memset(c, 0, sizeof *c);
  dt_run_cfg_defaults(&c->run);
  snprintf(c->file, sizeof c->file, "(defaults)");
}

/* ---- INI parsing --------------------------------------------------------- */

typedef struct pstate {
  dt_config *c;
  const char *p, *end;
  int line;          /* line number of the line last handed to libinih */
  int cont;          /* that line is indented (a continuation for libinih) */
  int keyed;         /* a key was set since the last section header: libinih
                        continues only a previous key of the same section */
  int failed;        /* an error was recorded; stop */
  int fail_line;     /* the line of that error */
  int seen[DT_CONFIG_MAX_KEYS]; /* line where each key was set in this text */
} pstate;

static int fail_at(pstate *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail_at(pstate *s, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  s->failed = 1;
  s->fail_line = s->line;
  cfg_err(DT_EINVAL, "%s:%d: %s", s->c->file, s->line, msg);
  return 0;
}

static const char *skip_ws(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\r') p++;
  return p;
}

/* fgets-style reader over the in-memory text that also checks each line. */
static char *reader(char *str, int num, void *stream) {
  pstate *s = stream;
  if (s->failed || s->p >= s->end) return NULL;
  const char *nl = memchr(s->p, '\n', (size_t)(s->end - s->p));
  size_t len = nl ? (size_t)(nl - s->p) + 1 : (size_t)(s->end - s->p);
  s->line++;
  if (num < 4 || len > (size_t)num - 3) {
    fail_at(s, "line too long (max %d characters)", num > 4 ? num - 4 : 0);
    return NULL;
  }
  if (memchr(s->p, '\0', len)) {
    fail_at(s, "NUL byte in line");
    return NULL;
  }
  memcpy(str, s->p, len);
  str[len] = '\0';
  s->p += len;
  const char *t = skip_ws(str);
  s->cont = t != str && *t && *t != '\n' && *t != ';' && *t != '#';
  /* Section headers are checked here so that an unknown empty section is
   * an error too (libinih does not report empty sections). */
  if (*t == '[') {
    s->keyed = 0;
    const char *close = strchr(t, ']');
    if (close) {
      char name[64];
      size_t n = (size_t)(close - t - 1);
      const char *a = skip_ws(t + 1);
      n = (size_t)(close - a);
      while (n && (a[n - 1] == ' ' || a[n - 1] == '\t')) n--;
      if (n >= sizeof name) n = sizeof name - 1;
      memcpy(name, a, n);
      name[n] = '\0';
      if (!known_section(name)) {
        fail_at(s, "unknown section [%s] (known: model, data, optim, train, schedule, dist)", name);
        return NULL;
      }
    }
  }
  return str;
}

static int handler(void *user, const char *section, const char *name, const char *value) {
  pstate *s = user;
  dt_config *c = s->c;
  if (s->failed) return 0;
  if (!*section) return fail_at(s, "key '%s' outside any [section]", name);
  int k = find_key(section, name);
  if (k < 0) {
    char known[256];
    section_keys(section, known, sizeof known);
    return fail_at(s, "unknown key '%s' in [%s] (known: %s)", name, section, known);
  }
  /* An indented line right after a section header (or at the top) is a
   * key of its own for libinih, not a continuation (found by the fuzzer:
   * such a 'layers = ...' line was appended to the default spec). */
  const int cont = s->cont && s->keyed;
  s->keyed = 1;
  if (cont) {
    /* libinih hands an indented line to the previous key. */
    if (keys[k].type != K_SPEC)
      return fail_at(s, "unexpected indented line (only model.layers may continue on "
                        "indented lines)");
    char *f = (char *)&c->run + keys[k].off;
    /* libinih 55 keeps inline comments on continuation lines: drop them. */
    char vbuf[DT_CFG_SPEC_MAX];
    snprintf(vbuf, sizeof vbuf, "%s", value);
    for (char *q = vbuf; *q; q++)
      if ((*q == ' ' || *q == '\t') && q[1] == ';') {
        *q = '\0';
        break;
      }
    size_t vl = strlen(vbuf);
    while (vl && (vbuf[vl - 1] == ' ' || vbuf[vl - 1] == '\t')) vbuf[--vl] = '\0';
    for (const char *q = vbuf; *q; q++)
      if ((unsigned char)*q < 0x20 && *q != '\t')
        return fail_at(s, "%s.%s: control character in value", section, name);
    if (!vl) return 1; /* only a comment */
    value = vbuf;
    size_t a = strlen(f), b = strlen(value);
    if (a + 1 + b >= DT_CFG_SPEC_MAX)
      return fail_at(s, "%s.%s: value too long (max %d bytes)", section, name, DT_CFG_SPEC_MAX - 1);
    f[a] = ' ';
    memcpy(f + a + 1, value, b + 1);
    return 1;
  }
  if (s->seen[k])
    return fail_at(s, "%s.%s: given twice (first at line %d)", section, name, s->seen[k]);
  char why[300];
  if (set_value(&c->run, &keys[k], value, why, sizeof why))
    return fail_at(s, "%s.%s: %s", section, name, why);
  s->seen[k] = s->line;
  c->where[k] = s->line;
  return 1;
}

int dt_config_parse(dt_config *c, const char *text, size_t len, const char *name) {
  pstate s;
  memset(&s, 0, sizeof s);
  s.c = c;
  s.p = text;
  s.end = text + len;
  snprintf(c->file, sizeof c->file, "%s", name ? name : "(string)");
  /* Keys set by an earlier text keep their values but not their lines. */
  for (int i = 0; i < NKEYS; i++)
    if (c->where[i] > 0) c->where[i] = 0;
  dt__clearerr();
  int rc = ini_parse_stream(reader, &s, handler, &s);
  /* libinih goes on after a malformed line; it comes first if earlier. */
  if (s.failed && !(rc > 0 && rc < s.fail_line)) return DT_EINVAL;
  if (rc > 0)
    return cfg_err(DT_EINVAL, "%s:%d: malformed line (expected 'key = value' or '[section]')",
                      c->file, rc);
  if (rc < 0) return cfg_err(DT_ENOMEM, "%s: out of memory while parsing", c->file);
  return DT_OK;
}

int dt_config_load(dt_config *c, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return cfg_err(errno == ENOENT ? DT_ENOENT : DT_EIO, "config '%s': %s", path,
                      strerror(errno));
  char *buf = malloc(DT_CONFIG_MAX_BYTES + 1);
  if (!buf) {
    fclose(f);
    return cfg_err(DT_ENOMEM, "config '%s': out of memory", path);
  }
  size_t n = fread(buf, 1, DT_CONFIG_MAX_BYTES + 1, f);
  int err = ferror(f);
  fclose(f);
  int rc;
  if (err)
    rc = cfg_err(DT_EIO, "config '%s': read error (is it a directory?)", path);
  else if (n > DT_CONFIG_MAX_BYTES)
    rc = cfg_err(DT_EINVAL, "config '%s': larger than %d bytes", path, DT_CONFIG_MAX_BYTES);
  else
    rc = dt_config_parse(c, buf, n, path);
  free(buf);
  return rc;
}

int dt_config_set(dt_config *c, const char *assignment) {
  const char *eq = strchr(assignment, '=');
  const char *dot = strchr(assignment, '.');
  if (!eq || !dot || dot > eq)
    return cfg_err(DT_EINVAL, "--set '%s': expected section.key=value", assignment);
  char section[64], name[64];
  size_t sl = (size_t)(dot - assignment), nl = (size_t)(eq - dot - 1);
  if (sl == 0 || nl == 0 || sl >= sizeof section || nl >= sizeof name)
    return cfg_err(DT_EINVAL, "--set '%s': expected section.key=value", assignment);
  memcpy(section, assignment, sl);
  section[sl] = '\0';
  memcpy(name, dot + 1, nl);
  name[nl] = '\0';
  if (!known_section(section))
    return cfg_err(DT_EINVAL, "--set %s.%s: unknown section [%s]", section, name, section);
  int k = find_key(section, name);
  if (k < 0) {
    char known[256];
    section_keys(section, known, sizeof known);
    return cfg_err(DT_EINVAL, "--set %s.%s: unknown key '%s' in [%s] (known: %s)", section,
                      name, name, section, known);
  }
  /* Same trimming as libinih applies to file values. */
  const char *v = skip_ws(eq + 1);
  char val[DT_CFG_SPEC_MAX + 1];
  size_t vl = strlen(v);
  if (vl > DT_CFG_SPEC_MAX) vl = DT_CFG_SPEC_MAX;
  memcpy(val, v, vl);
  val[vl] = '\0';
  while (vl && (val[vl - 1] == ' ' || val[vl - 1] == '\t')) val[--vl] = '\0';
  char why[300];
  if (set_value(&c->run, &keys[k], val, why, sizeof why))
    return cfg_err(DT_EINVAL, "--set %s.%s: %s", section, name, why);
  c->where[k] = -1;
  return DT_OK;
}

/* ---- cross-key validation ------------------------------------------------- */

int dt_config_validate(const dt_config *c) {
  const dt_run_cfg *r = &c->run;
  if (r->optim.nesterov && r->optim.kind == DT_OPT_SGD && !(r->optim.momentum > 0))
    return key_error(c, find_key("optim", "nesterov"), "Nesterov momentum needs optim.momentum > 0");
  if (r->sched.kind == DT_SCHED_COSINE && r->sched.min_lr > r->optim.lr)
    return key_error(c, find_key("schedule", "min_lr"), "must not exceed optim.lr (%g > %g)",
                     r->sched.min_lr, r->optim.lr);
  if (r->stages[0] && r->stages[0] != r->pipeline_stages - 1)
    return key_error(c, find_key("model", "stages"), "%d cut points for dist.pipeline_stages = %d "
                     "(expects %d)", r->stages[0], r->pipeline_stages, r->pipeline_stages - 1);
  if (r->pipeline_stages > 1 && r->workers > 1 && r->workers % r->pipeline_stages)
    return key_error(c, find_key("dist", "pipeline_stages"), "%d workers are not a multiple of "
                     "%d stages", r->workers, r->pipeline_stages);
  const struct dt_run_ps_cfg *ps = &r->ps;
  int ps_on = ps->servers > 0 || ps->colocate;
  if (ps->colocate && ps->servers > 0)
    return key_error(c, find_key("ps", "colocate"), "servers inside the workers and ps.servers = "
                     "%d separate ones: choose one", ps->servers);
  if (ps_on && (r->pipeline_stages > 1 || r->micro_batches > 1 || r->recompute))
    return key_error(c, find_key("dist", "pipeline_stages"), "not with a parameter server "
                     "(ps.servers / ps.colocate)");
  if (ps_on && r->balance != 0)
    return key_error(c, find_key("dist", "balance"), "not with a parameter server yet (it is %s)",
                     balance_names[r->balance]);
  if (ps_on && r->deterministic)
    return key_error(c, find_key("dist", "deterministic"), "not with a parameter server "
                     "(ps.consistency = bsp is deterministic already)");
  if (ps->colocate && r->workers < 2)
    return key_error(c, find_key("ps", "colocate"), "needs at least 2 workers (dist.workers = %d)",
                     r->workers);
  if (ps->backup_workers > 0 && ps->consistency != 0)
    return key_error(c, find_key("ps", "backup_workers"), "only with ps.consistency = bsp (it is "
                     "%s)", consistency_names[ps->consistency]);
  if (ps_on && ps->backup_workers >= r->workers)
    return key_error(c, find_key("ps", "backup_workers"), "must be below dist.workers (%d >= %d)",
                     ps->backup_workers, r->workers);
  if (ps->replicas > 1 && ps->colocate)
    return key_error(c, find_key("ps", "replicas"), "not with ps.colocate (a colocated server "
                     "dies with its worker): use separate servers (ps.servers)");
  if (ps->replicas > 1 && ps->replicas > ps->servers)
    return key_error(c, find_key("ps", "replicas"), "%d replicas need at least %d servers "
                     "(ps.servers = %d)", ps->replicas, ps->replicas, ps->servers);
  if (ps->staleness > 0 && ps->consistency != 1)
    return key_error(c, find_key("ps", "staleness"), "only with ps.consistency = ssp (it is %s)",
                     consistency_names[ps->consistency]);
  if (r->compress && (r->zero || r->pipeline_stages > 1 || r->micro_batches > 1 || r->recompute))
    return key_error(c, find_key("dist", "compress"), "not with %s yet (compression runs inside "
                     "the ddp strategy)", r->zero ? "dist.zero" : "the pipeline strategy "
                     "(dist.pipeline_stages, dist.micro_batches, train.recompute)");
  if (r->zero && (r->deterministic || ps_on))
    return key_error(c, find_key("dist", "zero"), "not with %s yet",
                     r->deterministic ? "dist.deterministic" : "a parameter server");
  if (r->workers > 1 && r->min_workers > r->workers)
    return key_error(c, find_key("dist", "min_workers"), "%d is more than dist.workers = %d",
                     r->min_workers, r->workers);
  /* a parameter server survives lost workers with separate servers
   * (docs/ps.md "Workers leaving and joining"), joiners included */
  if (r->min_workers && ps_on && ps->servers > 0 && !ps->colocate) ps_on = 0;
  if (r->min_workers && (r->pipeline_stages > 1 || r->micro_batches > 1 || r->zero || ps_on))
    return key_error(c, find_key("dist", "min_workers"), "elastic training is built for the ddp "
                     "strategies and separate parameter servers only, not with %s yet", ps_on
                     ? "colocated parameter servers (ps.colocate: a server dies with its worker)"
                     : r->zero
                     ? "dist.zero"
                     : "pipeline parallelism (dist.pipeline_stages, dist.micro_batches)");
  if ((r->replace || r->standby) && !r->min_workers)
    return key_error(c, find_key("dist", r->replace ? "replace" : "standby"), "spare workers "
                     "replace lost ones in elastic training only: set dist.min_workers too");
  if (r->max_workers && r->max_workers < r->min_workers)
    return key_error(c, find_key("dist", "max_workers"), "%d is less than dist.min_workers = %d",
                     r->max_workers, r->min_workers);
  static const char *const paths[] = {"train_images", "train_labels", "test_images",
                                      "test_labels"};
  for (int i = 0; i < 4; i++) {
    if (r->format == DT_FMT_CSV && (i == 1 || i == 3)) continue; /* labels are a column */
    int k = find_key("data", paths[i]);
    const char *v = (const char *)r + keys[k].off;
    if (!*v)
      return key_error(c, k, "empty path (format %s needs it)", fmt_names[r->format]);
  }
  return DT_OK;
}

/* ---- dump ---------------------------------------------------------------- */

static size_t value_text(const dt_run_cfg *r, const key *k, char *buf, size_t cap) {
  const char *field = (const char *)r + k->off;
  switch (k->type) {
  case K_SPEC:
  case K_PATH:
  case K_ADDR: return (size_t)snprintf(buf, cap, "%s", field);
  case K_BOOL: return (size_t)snprintf(buf, cap, "%s", *(const int *)field ? "true" : "false");
  case K_ENUM: return (size_t)snprintf(buf, cap, "%s", k->enums[*(const int *)field]);
  case K_INT: return (size_t)snprintf(buf, cap, "%d", *(const int *)field);
  case K_I64: return (size_t)snprintf(buf, cap, "%lld", (long long)*(const int64_t *)field);
  case K_U64:
    return (size_t)snprintf(buf, cap, "%llu", (unsigned long long)*(const uint64_t *)field);
  case K_FLOAT: {
    /* The shortest text that reads back as the same float. */
    float x = *(const float *)field;
    for (int prec = 1; prec < 9; prec++) {
      char t[64];
      snprintf(t, sizeof t, "%.*g", prec, (double)x);
      if ((float)strtod(t, NULL) == x) return (size_t)snprintf(buf, cap, "%s", t);
    }
    return (size_t)snprintf(buf, cap, "%.9g", (double)x);
  }
  case K_SHAPE: {
    const int *s = (const int *)field;
    if (!s[0]) return (size_t)snprintf(buf, cap, "%s", "");
    return (size_t)snprintf(buf, cap, "%d,%d,%d", s[0], s[1], s[2]);
  }
  case K_CUTS: {
    const int *s = (const int *)field;
    size_t n = 0;
    if (cap) buf[0] = '\0';
    for (int i = 1; i <= s[0] && n < cap; i++)
      n += (size_t)snprintf(buf + n, cap - n, "%s%d", i > 1 ? "," : "", s[i]);
    return n;
  }
  }
  return 0;
}

/* Long layer specs go on indented continuation lines, so the dump stays
 * within libinih's line limit and parses back to the same spec. Replaces
 * spaces by "\n    " in place when the buffer allows it. */
static void wrap_spec(char *v) {
  enum { WIDTH = 100 };
  char out[DT_CFG_SPEC_MAX + 8];
  size_t n = 0, col = 0, len = strlen(v);
  for (size_t i = 0; i < len; i++) {
    /* Never start a continuation line with a comment or section mark. */
    if (v[i] == ' ' && col >= WIDTH - 30 && !strchr(";#[ \t", v[i + 1]) && i &&
        v[i - 1] != ' ' && v[i - 1] != '\t') {
      if (n + 5 >= sizeof out - 1) return; /* no room: leave it on one line */
      memcpy(out + n, "\n    ", 5);
      n += 5;
      col = 4;
      continue;
    }
    if (n + 1 >= sizeof out - 1) return;
    out[n++] = v[i];
    col++;
  }
  out[n] = '\0';
  memcpy(v, out, n + 1);
}

size_t dt_config_dump(const dt_config *c, char *buf, size_t cap) {
  size_t n = 0;
  char v[DT_CFG_SPEC_MAX + 8];
  const char *cur = "";
  for (int i = 0; i < NKEYS; i++) {
    char *dst = n < cap ? buf + n : NULL;
    size_t room = n < cap ? cap - n : 0;
    if (strcmp(cur, keys[i].section)) {
      n += (size_t)snprintf(dst, room, "%s[%s]\n", i ? "\n" : "", keys[i].section);
      cur = keys[i].section;
      dst = n < cap ? buf + n : NULL;
      room = n < cap ? cap - n : 0;
    }
    value_text(&c->run, &keys[i], v, sizeof v);
    if (keys[i].type == K_SPEC) wrap_spec(v);
    n += (size_t)snprintf(dst, room, "%s = %s\n", keys[i].name, v);
  }
  if (cap && n >= cap) buf[cap - 1] = '\0';
  return n;
}

const char *dt_config_key_name(int i, char *buf, size_t cap) {
  if (i < 0 || i >= NKEYS) return NULL;
  dt_run_cfg d;
  dt_run_cfg_defaults(&d);
  char v[DT_CFG_SPEC_MAX + 8];
  value_text(&d, &keys[i], v, sizeof v);
  snprintf(buf, cap, "%s.%s = %s", keys[i].section, keys[i].name, v);
  return buf;
}
