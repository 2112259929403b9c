/*
 * manifest.c — manifest.json, the table of contents of one checkpoint:
 * format name and version, the dtrain version that wrote it, step, epoch,
 * and every file with its owner ("rank0"; later a parameter-server shard
 * or a pipeline stage writes its own files and is its own owner), role,
 * size and SHA-256. Readers trust nothing else in the directory.
 *
 * The manifest carries its own SHA-256 in its first member,
 * "manifest_sha256": the hash of the file's bytes with those 64 hex digits
 * written as zeros. So a flipped byte anywhere in the manifest is caught
 * like one in any other file, without a second file to keep in step.
 *
 * It does not touch the disk: write.c and read.c do.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"

#define SELF_KEY "\"manifest_sha256\""

/* The 64 hex digits of the self hash inside text, or NULL. */
static char *self_digits(char *text, size_t len) {
  char *k = NULL;
  /* the key must be the first member: search only the opening bytes */
  for (size_t i = 0; i + sizeof SELF_KEY < len && i < 64; i++)
    if (!memcmp(text + i, SELF_KEY, sizeof SELF_KEY - 1)) {
      k = text + i + sizeof SELF_KEY - 1;
      break;
    }
  if (!k) return NULL;
  char *end = text + len;
  while (k < end && (*k == ':' || *k == ' ' || *k == '\t' || *k == '\n')) k++;
  if (k >= end || *k != '"' || end - k < 66 || k[65] != '"') return NULL;
  return k + 1;
}

static int add_str(cJSON *o, const char *k, const char *v) {
  return cJSON_AddStringToObject(o, k, v) ? 0 : -1;
}

int dt__manifest_build(const dt_ckpt_info *info, char **out, size_t *len) {
  cJSON *o = cJSON_CreateObject(), *files = NULL;
  int bad = !o;
  char zeros[65];
  memset(zeros, '0', 64);
  zeros[64] = '\0';
  bad = bad || add_str(o, "manifest_sha256", zeros) || add_str(o, "format", DT_CKPT_FORMAT);
  bad = bad || !cJSON_AddNumberToObject(o, "version", DT_CKPT_VERSION);
  bad = bad || add_str(o, "dtrain", info->dtrain);
  bad = bad || !cJSON_AddNumberToObject(o, "step", (double)info->step);
  bad = bad || !cJSON_AddNumberToObject(o, "epoch", info->epoch);
  bad = bad || !cJSON_AddNumberToObject(o, "created", floor(info->created));
  bad = bad || !(files = cJSON_AddArrayToObject(o, "files"));
  for (int i = 0; !bad && i < info->nfiles; i++) {
    const dt_ckpt_entry *f = &info->files[i];
    cJSON *e = cJSON_CreateObject();
    if (!e || !cJSON_AddItemToArray(files, e)) {
      cJSON_Delete(e);
      bad = 1;
      break;
    }
    bad = add_str(e, "name", f->name) || add_str(e, "owner", f->owner) ||
          add_str(e, "role", f->role) || !cJSON_AddNumberToObject(e, "bytes", (double)f->bytes) ||
          add_str(e, "sha256", f->sha256);
  }
  char *text = bad ? NULL : cJSON_Print(o);
  cJSON_Delete(o);
  if (!text) return dt__seterr(DT_ENOMEM, "manifest: out of memory");
  size_t n = strlen(text);
  char *d = self_digits(text, n);
  if (!d) {
    free(text);
    return dt__seterr(DT_EINVAL, "manifest: self hash not found in the text built");
  }
  char hex[65];
  dt_sha256_hex(text, n, hex);
  memcpy(d, hex, 64);
  *out = text;
  *len = n;
  return DT_OK;
}

static int get_str(const cJSON *o, const char *k, char *dst, size_t cap, const char *name,
                   const char *what) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap)
    return dt__seterr(DT_ECORRUPT, "%s: %s '%s' missing, not a string or longer than %zu", name,
                      what, k, cap - 1);
  memcpy(dst, v->valuestring, strlen(v->valuestring) + 1);
  return DT_OK;
}

static int get_num(const cJSON *o, const char *k, double lo, double hi, double *v,
                   const char *name, const char *what) {
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!cJSON_IsNumber(j) || !(j->valuedouble >= lo && j->valuedouble <= hi) ||
      floor(j->valuedouble) != j->valuedouble)
    return dt__seterr(DT_ECORRUPT, "%s: %s '%s' missing or not an integer in [%.0f, %.0f]", name,
                      what, k, lo, hi);
  *v = j->valuedouble;
  return DT_OK;
}

/* A file name inside the checkpoint: no path separators, not hidden. */
static int safe_name(const char *s) {
  if (!*s || *s == '.') return 0;
  for (; *s; s++)
    if (*s == '/' || *s == '\\' || (unsigned char)*s < 0x20) return 0;
  return 1;
}

static int is_hex64(const char *s) {
  if (strlen(s) != 64) return 0;
  for (; *s; s++)
    if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'))) return 0;
  return 1;
}

static int parse_obj(const cJSON *o, char *text, size_t len, const char *name,
                     dt_ckpt_info *info) {
  double v;
  /* the version first: a newer writer may have changed everything else */
  const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "version");
  if (cJSON_IsNumber(ver) && ver->valuedouble > DT_CKPT_VERSION)
    return dt__seterr(DT_ENOTSUP, "%s: checkpoint format version %.0f is newer than this dtrain "
                      "(%s) reads (version %d); use a newer dtrain", name, ver->valuedouble,
                      DT_VERSION_STRING, DT_CKPT_VERSION);
  char *d = self_digits(text, len);
  if (!d) return dt__seterr(DT_ECORRUPT, "%s: no manifest_sha256 as the first member", name);
  char want[65], got[65];
  memcpy(want, d, 64);
  want[64] = '\0';
  memset(d, '0', 64);
  dt_sha256_hex(text, len, got);
  memcpy(d, want, 64);
  if (strcmp(want, got))
    return dt__seterr(DT_ECORRUPT, "%s: SHA-256 mismatch (the manifest was changed or damaged)",
                      name);
  char fmt[64];
  DT_CHECK(get_str(o, "format", fmt, sizeof fmt, name, "member"));
  if (strcmp(fmt, DT_CKPT_FORMAT))
    return dt__seterr(DT_ECORRUPT, "%s: format '%s', expected '%s'", name, fmt, DT_CKPT_FORMAT);
  DT_CHECK(get_num(o, "version", 1, DT_CKPT_VERSION, &v, name, "member"));
  info->version = (int)v;
  DT_CHECK(get_str(o, "dtrain", info->dtrain, sizeof info->dtrain, name, "member"));
  DT_CHECK(get_num(o, "step", 0, 9e15, &v, name, "member"));
  info->step = (int64_t)v;
  DT_CHECK(get_num(o, "epoch", 0, 1e9, &v, name, "member"));
  info->epoch = (int)v;
  DT_CHECK(get_num(o, "created", 0, 9e15, &info->created, name, "member"));
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(o, "files");
  if (!cJSON_IsArray(files)) return dt__seterr(DT_ECORRUPT, "%s: 'files' is not an array", name);
  int n = cJSON_GetArraySize(files);
  if (n < 1 || n > DT_CKPT_FILES_MAX)
    return dt__seterr(DT_ECORRUPT, "%s: %d files listed (1 to %d allowed)", name, n,
                      DT_CKPT_FILES_MAX);
  int i = 0;
  for (const cJSON *e = files->child; e; e = e->next, i++) {
    dt_ckpt_entry *f = &info->files[i];
    char what[32];
    snprintf(what, sizeof what, "files[%d]", i);
    if (!cJSON_IsObject(e)) return dt__seterr(DT_ECORRUPT, "%s: %s is not an object", name, what);
    DT_CHECK(get_str(e, "name", f->name, sizeof f->name, name, what));
    DT_CHECK(get_str(e, "owner", f->owner, sizeof f->owner, name, what));
    DT_CHECK(get_str(e, "role", f->role, sizeof f->role, name, what));
    DT_CHECK(get_str(e, "sha256", f->sha256, sizeof f->sha256, name, what));
    DT_CHECK(get_num(e, "bytes", 0, 9e15, &v, name, what));
    f->bytes = (uint64_t)v;
    if (!safe_name(f->name) || !strcmp(f->name, DT_CKPT_MANIFEST))
      return dt__seterr(DT_ECORRUPT, "%s: %s name '%s' is not a plain file name", name, what,
                        f->name);
    if (!is_hex64(f->sha256))
      return dt__seterr(DT_ECORRUPT, "%s: %s sha256 is not 64 lowercase hex digits", name, what);
    for (int j = 0; j < i; j++)
      if (!strcmp(info->files[j].name, f->name))
        return dt__seterr(DT_ECORRUPT, "%s: file '%s' listed twice", name, f->name);
  }
  info->nfiles = n;
  return DT_OK;
}

int dt__manifest_parse(const char *text, size_t len, const char *name, dt_ckpt_info *info) {
  char dir[DT_CKPT_PATH_MAX];
  memcpy(dir, info->dir, sizeof dir);
  memset(info, 0, sizeof *info);
  memcpy(info->dir, dir, sizeof dir);
  if (len > (1u << 20))
    return dt__seterr(DT_ECORRUPT, "%s: %zu bytes, too large for a manifest", name, len);
  char *copy = malloc(len + 1);
  if (!copy) return dt__seterr(DT_ENOMEM, "%s: out of memory", name);
  memcpy(copy, text, len);
  copy[len] = '\0';
  cJSON *o = cJSON_ParseWithLength(copy, len);
  int rc;
  if (!o || !cJSON_IsObject(o))
    rc = dt__seterr(DT_ECORRUPT, "%s: not a JSON object (truncated or damaged)", name);
  else
    rc = parse_obj(o, copy, len, name, info);
  cJSON_Delete(o);
  free(copy);
  return rc;
}
