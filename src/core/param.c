/*
 * param.c — the one place that reads DTRAIN_* environment knobs (NCCL's
 * NCCL_PARAM habit): the table in core.h (DT_PARAM_TABLE: name, type,
 * default, range, meaning) is read once per process under pthread_once and
 * cached, so hot paths (tuning on every collective call) cost an array load.
 * A malformed or out-of-range value is reported once, with the accepted
 * range, and the default is used.
 *
 * Config-file settings live in the cli layer; these are for knobs a user
 * sets per machine or per job. Not here: parsing of values whose grammar
 * belongs to their user (an algorithm name, a HOST:PORT): STR knobs are
 * handed over as text. dt__param_reload exists for tests only.
 */
#include "core.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VAL_MAX 512 /* longer values are cut (none of the knobs needs more) */

struct knob {
  const char *name;
  bool is_int;
  int64_t def_i;
  const char *def_s;
  int64_t min, max;
  const char *meaning;
};

static const struct knob table[DT_PARAM_COUNT] = {
#define DT__PARAM_ROW(id, type, di, ds, lo, hi, meaning)                                              \
  {"DTRAIN_" #id, DT__PARAM_IS_##type, (int64_t)(di), ds, (int64_t)(lo), (int64_t)(hi), meaning},
#define DT__PARAM_IS_INT true
#define DT__PARAM_IS_STR false
    DT_PARAM_TABLE(DT__PARAM_ROW)
#undef DT__PARAM_ROW
};

struct cached {
  bool set;
  int64_t v;
  char text[VAL_MAX];
};

static struct cached cache[DT_PARAM_COUNT];
static pthread_once_t once = PTHREAD_ONCE_INIT;
/* Warnings found while loading are logged after the load, outside
 * pthread_once: dt_log reads DTRAIN_LOG_LEVEL through this table. */
static char pending[DT_PARAM_COUNT][VAL_MAX + 160];
static _Atomic int npending;

static void load(void) {
  int np = 0;
  for (int i = 0; i < DT_PARAM_COUNT; i++) {
    const struct knob *k = &table[i];
    struct cached *c = &cache[i];
    c->set = false;
    c->text[0] = '\0';
    const char *s = getenv(k->name);
    if (!s || !*s) continue;
    snprintf(c->text, sizeof c->text, "%s", s);
    if (!k->is_int) {
      c->set = true;
      continue;
    }
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno || *end || end == s) {
      snprintf(pending[np++], sizeof pending[0], "environment %s=%.*s is not an integer; using the default",
               k->name, VAL_MAX, s);
      continue;
    }
    if (v < k->min || v > k->max) {
      snprintf(pending[np++], sizeof pending[0],
               "environment %s=%lld is out of range [%" PRId64 ", %" PRId64 "]; using the default", k->name,
               v, k->min, k->max);
      continue;
    }
    c->v = v;
    c->set = true;
  }
  atomic_store(&npending, np);
}

static inline void ensure(void) {
  pthread_once(&once, load);
  if (atomic_load_explicit(&npending, memory_order_relaxed)) {
    int n = atomic_exchange(&npending, 0);
    for (int i = 0; i < n; i++) dt_log(DT_LOG_WARN, "%s", pending[i]);
  }
}

int64_t dt_param(enum dt_param_id id) {
  ensure();
  return cache[id].set ? cache[id].v : table[id].def_i;
}

int64_t dt_param_or(enum dt_param_id id, int64_t def) {
  ensure();
  return cache[id].set ? cache[id].v : def;
}

const char *dt_param_s(enum dt_param_id id) {
  ensure();
  return cache[id].set ? cache[id].text : table[id].def_s;
}

bool dt_param_isset(enum dt_param_id id) {
  ensure();
  return cache[id].set;
}

bool dt_param_info(int id, struct dt_param_info *out) {
  if (id < 0 || id >= DT_PARAM_COUNT) return false;
  ensure();
  static _Thread_local char defbuf[32];
  const struct knob *k = &table[id];
  const char *def = k->def_s;
  if (!def && k->is_int) {
    snprintf(defbuf, sizeof defbuf, "%" PRId64, k->def_i);
    def = defbuf;
  }
  *out = (struct dt_param_info){k->name, k->is_int, def ? def : "(unset)", k->min, k->max, k->meaning,
                                cache[id].set, cache[id].set ? cache[id].text : (def ? def : "(unset)")};
  return true;
}

static int find(const char *name) {
  for (int i = 0; i < DT_PARAM_COUNT; i++)
    if (!strcmp(table[i].name, name)) return i;
  static _Atomic int warned;
  if (!atomic_exchange(&warned, 1))
    dt_log(DT_LOG_WARN, "%s is not in the knob table (src/core/core.h DT_PARAM_TABLE); ignored", name);
  return -1;
}

int64_t dt_param_int(const char *name, int64_t def) {
  int i = find(name);
  return i < 0 ? def : dt_param_or((enum dt_param_id)i, def);
}

const char *dt_param_str(const char *name, const char *def) {
  int i = find(name);
  if (i < 0) return def;
  ensure();
  return cache[i].set ? cache[i].text : def;
}

void dt__param_reload(void) {
  ensure();
  load();
  ensure();
}
