/*
 * config.h — INI run configurations (parsed with libinih) into the typed
 * dt_run_cfg of the engine, `--set section.key=value` overrides, validation
 * and a canonical dump. Every error is DT_EINVAL with one dt_errmsg() line
 * naming where the value came from ("cfg.ini:12: optim.lr: ..." or
 * "--set optim.lr: ...") and the key; a missing or unreadable file is
 * DT_ENOENT / DT_EIO naming the file.
 *
 * It does not read data files or build models: a layer spec is only checked
 * to be non-empty here; the engine reports an impossible model.
 */
#ifndef DT_CLI_CONFIG_H
#define DT_CLI_CONFIG_H

#include <stddef.h>

#include "engine/engine.h"

#define DT_CONFIG_MAX_BYTES (1 << 20)
#define DT_CONFIG_MAX_KEYS 128

/* A config being built: the values plus where each key was last set, so
 * cross-key checks can name a line. */
typedef struct dt_config {
  dt_run_cfg run;
  char file[DT_CFG_PATH_MAX];      /* name of the last parsed text */
  int where[DT_CONFIG_MAX_KEYS];   /* per key: line in `file`, -1 = --set, 0 = default */
} dt_config;

/* Fills the defaults of docs/config.md. */
void dt_config_init(dt_config *c);

/* Parses INI text (len bytes, need not be NUL-terminated) on top of the
 * current values. `name` labels messages (the file name). Stops at the first
 * error. */
int dt_config_parse(dt_config *c, const char *text, size_t len, const char *name);

/* Reads and parses a file (at most DT_CONFIG_MAX_BYTES). */
int dt_config_load(dt_config *c, const char *path);

/* Applies one "section.key=value" override. */
int dt_config_set(dt_config *c, const char *assignment);

/* Cross-key checks, after all files and overrides. */
int dt_config_validate(const dt_config *c);

/* Writes the effective configuration as canonical INI (every key, fixed
 * order and formatting) into buf; returns the length it needs (like
 * snprintf). The same config always gives the same text. */
size_t dt_config_dump(const dt_config *c, char *buf, size_t cap);

/* Number of keys and the i-th key as "section.key" with its default value
 * as text, for --help and docs checks. Returns NULL past the end. */
const char *dt_config_key_name(int i, char *buf, size_t cap);

#endif /* DT_CLI_CONFIG_H */
