/*
 * test_ckpt_format.c — the checkpoint layer on its own: safetensors written
 * and parsed back bit for bit, malformed headers refused, a checkpoint
 * written atomically and verified, and every kind of damage detected and
 * named (a byte flipped in each file in turn, a file deleted, the manifest
 * deleted, `latest` dangling, a newer format version), with dt__ckpt_find
 * falling back to the previous valid checkpoint each time; `keep` pruning;
 * the background writer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt/ckpt.h"

static char tmpdir[256];

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_ckpt_fmt_XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

/* A snapshot like the engine's: two safetensors files and a JSON file. */
static float W[12], B3[3];
static int64_t CNT = 7;
static void fill_snap(dt_ckpt_snap *s, int64_t step) {
  for (int i = 0; i < 12; i++) W[i] = (float)i * 0.5f + (float)step;
  for (int i = 0; i < 3; i++) B3[i] = -(float)i;
  dt__snap_reset(s, step, 1);
  dt_st *st;
  assert_int_equal(dt__snap_st(s, "model.safetensors", "rank0", "model", &st), DT_OK);
  int64_t sw[2] = {3, 4}, sb[1] = {3};
  assert_int_equal(dt__st_add(st, "1.weight", DT_ST_F32, 2, sw, W), DT_OK);
  assert_int_equal(dt__st_add(st, "1.bias", DT_ST_F32, 1, sb, B3), DT_OK);
  assert_int_equal(dt__st_set_meta(st, "layers", "flatten linear(3)"), DT_OK);
  assert_int_equal(dt__snap_st(s, "state.safetensors", "rank0", "state", &st), DT_OK);
  assert_int_equal(dt__st_add(st, "optim_step", DT_ST_I64, 0, NULL, &CNT), DT_OK);
  const char *j = "{\"epoch\": 1, \"step\": 5}";
  assert_int_equal(dt__snap_text(s, "trainer.json", "rank0", "trainer", j, strlen(j)), DT_OK);
}

static void write_ckpt(const char *root, int64_t step, int keep) {
  dt_ckpt_snap s;
  memset(&s, 0, sizeof s);
  fill_snap(&s, step);
  int rc = dt__ckpt_write(root, &s, keep, NULL, 0);
  if (rc) print_error("%s\n", dt_errmsg());
  assert_int_equal(rc, DT_OK);
  dt__snap_free(&s);
}

static void sub(char *out, size_t cap, const char *name) {
  snprintf(out, cap, "%s/%s", tmpdir, name);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
  assert_int_equal(system(cmd), 0);
}

static void test_safetensors_roundtrip(void **state) {
  (void)state;
  dt_st st = {0};
  float a[6] = {1, 2, 3, 4, 5, 6};
  int64_t big = 1234567890123LL;
  int64_t sa[2] = {2, 3};
  assert_int_equal(dt__st_add(&st, "0.weight", DT_ST_F32, 2, sa, a), DT_OK);
  assert_int_equal(dt__st_add(&st, "n", DT_ST_I64, 0, NULL, &big), DT_OK);
  assert_int_equal(dt__st_set_meta(&st, "spec", "linear(3) \"quoted\"\n"), DT_OK);
  /* names the writer cannot emit unescaped, and duplicates, are refused */
  assert_int_equal(dt__st_add(&st, "bad\"name", DT_ST_F32, 2, sa, a), DT_EINVAL);
  assert_int_equal(dt__st_add(&st, "0.weight", DT_ST_F32, 2, sa, a), DT_EINVAL);
  char *h;
  size_t hl;
  assert_int_equal(dt__st_header(&st, &h, &hl), DT_OK);
  assert_int_equal(hl % 8, 0);
  size_t n = hl + 24 + 8;
  uint8_t *buf = malloc(n);
  memcpy(buf, h, hl);
  memcpy(buf + hl, a, 24);
  memcpy(buf + hl + 24, &big, 8);
  dt_st r;
  assert_int_equal(dt__st_parse(&r, buf, n, "x.safetensors"), DT_OK);
  assert_int_equal(r.n, 2);
  const dt_st_tensor *t = dt__st_find(&r, "0.weight");
  assert_non_null(t);
  assert_int_equal(t->dtype, DT_ST_F32);
  assert_int_equal(t->ndim, 2);
  assert_int_equal(t->shape[1], 3);
  assert_memory_equal(t->data, a, 24);
  t = dt__st_find(&r, "n");
  assert_int_equal(t->ndim, 0);
  assert_memory_equal(t->data, &big, 8);
  assert_string_equal(dt__st_meta(&r, "spec"), "linear(3) \"quoted\"\n");
  dt__st_free(&r);
  /* truncated by one byte, extended by one byte: both refused, named */
  assert_int_equal(dt__st_parse(&r, buf, n - 1, "x.safetensors"), DT_ECORRUPT);
  assert_non_null(strstr(dt_errmsg(), "x.safetensors"));
  uint8_t *ext = calloc(1, n + 1);
  memcpy(ext, buf, n);
  assert_int_equal(dt__st_parse(&r, ext, n + 1, "x.safetensors"), DT_ECORRUPT);
  free(ext);
  /* a header length beyond the file */
  buf[5] = 1;
  assert_int_equal(dt__st_parse(&r, buf, n, "x.safetensors"), DT_ECORRUPT);
  free(buf);
  free(h);
  dt__st_free(&st);
}

/* Hand-written headers: overlap, gap, unknown dtype, shape/offset mismatch. */
static int parse_text(const char *json, size_t data) {
  size_t hl = strlen(json), n = 8 + hl + data;
  uint8_t *b = calloc(1, n);
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
  memcpy(b + 8, json, hl);
  dt_st r;
  int rc = dt__st_parse(&r, b, n, "h.safetensors");
  if (rc == DT_OK) dt__st_free(&r);
  free(b);
  return rc;
}

static void test_safetensors_refuses(void **state) {
  (void)state;
  assert_int_equal(parse_text("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
                   DT_OK);
  assert_int_equal(parse_text("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                              "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8),
                   DT_ECORRUPT);
  assert_non_null(strstr(dt_errmsg(), "overlap"));
  assert_int_equal(parse_text("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8),
                   DT_ECORRUPT);
  assert_int_equal(parse_text("{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
                   DT_ENOTSUP);
  assert_int_equal(parse_text("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8),
                   DT_ECORRUPT);
  assert_int_equal(parse_text("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4),
                   DT_ECORRUPT);
  assert_int_equal(parse_text("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],"
                              "\"data_offsets\":[0,4]}}", 4), DT_ECORRUPT);
  assert_int_equal(parse_text("[1,2]   ", 0), DT_ECORRUPT);
  assert_int_equal(parse_text("{\"__metadata__\":{\"k\":1}}", 0), DT_ECORRUPT);
  assert_int_equal(parse_text("{} x", 0), DT_ECORRUPT);
  assert_int_equal(parse_text("{}      ", 0), DT_OK);
}

static void test_write_verify(void **state) {
  (void)state;
  char root[300], dir[400];
  sub(root, sizeof root, "wv");
  write_ckpt(root, 5, 0);
  dt_ckpt_info info;
  snprintf(dir, sizeof dir, "%s/step-00000005", root);
  assert_int_equal(dt__ckpt_verify(dir, &info), DT_OK);
  assert_int_equal(info.step, 5);
  assert_int_equal(info.epoch, 1);
  assert_int_equal(info.nfiles, 3);
  assert_string_equal(info.files[0].owner, "rank0");
  assert_string_equal(info.files[0].role, "model");
  /* latest names it; no temporary directory is left */
  char p[500];
  snprintf(p, sizeof p, "%s/latest", root);
  uint8_t *b;
  size_t n;
  assert_int_equal(dt__read_all(p, 100, &b, &n), DT_OK);
  assert_int_equal(n, strlen("step-00000005\n"));
  assert_memory_equal(b, "step-00000005\n", n);
  free(b);
  char (*names)[32];
  assert_int_equal(dt__ckpt_list(root, &names), 1);
  free(names);
  /* the tensors come back */
  assert_int_equal(dt__ckpt_load(&info, "model.safetensors", &b, &n), DT_OK);
  dt_st st;
  assert_int_equal(dt__st_parse(&st, b, n, "m"), DT_OK);
  assert_memory_equal(dt__st_find(&st, "1.weight")->data, W, sizeof W);
  assert_string_equal(dt__st_meta(&st, "layers"), "flatten linear(3)");
  dt__st_free(&st);
  free(b);
  /* found from the root and from a run directory holding ckpt/ */
  assert_int_equal(dt__ckpt_find(root, &info), DT_OK);
  assert_int_equal(info.step, 5);
}

/* Damage one file of the newest of two checkpoints: verify names it, find
 * falls back to the older one. */
static void expect_fallback(const char *root, const char *name_in_err) {
  dt_ckpt_info info;
  char dir[400];
  snprintf(dir, sizeof dir, "%s/step-00000002", root);
  int rc = dt__ckpt_verify(dir, &info);
  assert_true(rc < 0);
  if (!strstr(dt_errmsg(), name_in_err)) print_error("message: %s\n", dt_errmsg());
  assert_non_null(strstr(dt_errmsg(), name_in_err));
  assert_int_equal(dt__ckpt_find(root, &info), DT_OK);
  assert_int_equal(info.step, 1);
}

static void two(char *root, size_t cap, const char *name) {
  sub(root, cap, name);
  write_ckpt(root, 1, 0);
  write_ckpt(root, 2, 0);
}

static void test_byte_flips(void **state) {
  (void)state;
  const char *files[] = {"model.safetensors", "state.safetensors", "trainer.json",
                         "manifest.json"};
  for (int f = 0; f < 4; f++) {
    char root[300], p[500];
    two(root, sizeof root, "flip");
    snprintf(p, sizeof p, "%s/step-00000002/%s", root, files[f]);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    /* a flip at the start, the middle and the end, each on its own */
    long at[3] = {0, (long)st.st_size / 2, (long)st.st_size - 1};
    for (int k = 0; k < 3; k++) {
      FILE *fp = fopen(p, "r+b");
      fseek(fp, at[k], SEEK_SET);
      int c = fgetc(fp);
      fseek(fp, at[k], SEEK_SET);
      fputc(c ^ 0x10, fp);
      fclose(fp);
      expect_fallback(root, files[f]);
      fp = fopen(p, "r+b");
      fseek(fp, at[k], SEEK_SET);
      fputc(c, fp);
      fclose(fp);
      dt_ckpt_info info;
      assert_int_equal(dt__ckpt_find(root, &info), DT_OK);
      assert_int_equal(info.step, 2);
    }
  }
}

static void test_deleted_and_dangling(void **state) {
  (void)state;
  char root[300], p[500];
  two(root, sizeof root, "del");
  snprintf(p, sizeof p, "%s/step-00000002/state.safetensors", root);
  assert_int_equal(unlink(p), 0);
  expect_fallback(root, "state.safetensors");

  two(root, sizeof root, "delman");
  snprintf(p, sizeof p, "%s/step-00000002/manifest.json", root);
  assert_int_equal(unlink(p), 0);
  expect_fallback(root, "manifest");

  /* truncated file */
  two(root, sizeof root, "trunc");
  snprintf(p, sizeof p, "%s/step-00000002/model.safetensors", root);
  assert_int_equal(truncate(p, 40), 0);
  expect_fallback(root, "model.safetensors");

  /* latest dangling: the newest valid checkpoint is used */
  two(root, sizeof root, "dangle");
  snprintf(p, sizeof p, "%s/latest", root);
  FILE *fp = fopen(p, "w");
  fputs("step-00000099\n", fp);
  fclose(fp);
  dt_ckpt_info info;
  assert_int_equal(dt__ckpt_find(root, &info), DT_OK);
  assert_int_equal(info.step, 2);
  /* every checkpoint bad: DT_ENOENT naming what was tried */
  char d[500];
  snprintf(d, sizeof d, "%s/step-00000001/manifest.json", root);
  unlink(d);
  snprintf(d, sizeof d, "%s/step-00000002/trainer.json", root);
  unlink(d);
  assert_int_equal(dt__ckpt_find(root, &info), DT_ENOENT);
  assert_non_null(strstr(dt_errmsg(), "step-00000001"));
  assert_non_null(strstr(dt_errmsg(), "step-00000002"));
  /* an explicit checkpoint that is bad falls back to an older one */
  two(root, sizeof root, "explicit");
  snprintf(p, sizeof p, "%s/step-00000002/trainer.json", root);
  unlink(p);
  snprintf(p, sizeof p, "%s/step-00000002", root);
  assert_int_equal(dt__ckpt_find(p, &info), DT_OK);
  assert_int_equal(info.step, 1);
}

/* A manifest edited to version 2 with a correct self hash: refused as newer. */
static void test_newer_version(void **state) {
  (void)state;
  char root[300], p[500];
  sub(root, sizeof root, "newer");
  write_ckpt(root, 3, 0);
  snprintf(p, sizeof p, "%s/step-00000003/manifest.json", root);
  uint8_t *b;
  size_t n;
  assert_int_equal(dt__read_all(p, 1 << 20, &b, &n), DT_OK);
  char *v = strstr((char *)b, "\"version\":");
  assert_non_null(v);
  v += strlen("\"version\":");
  while (*v == ' ' || *v == '\t') v++;
  assert_int_equal(*v, '1');
  *v = '2';
  /* recompute the self hash as a newer writer would have */
  char *h = strstr((char *)b, "\"manifest_sha256\":");
  h = strchr(h + 18, '"') + 1;
  memset(h, '0', 64);
  char hex[65];
  dt_sha256_hex(b, n, hex);
  memcpy(h, hex, 64);
  FILE *fp = fopen(p, "wb");
  fwrite(b, 1, n, fp);
  fclose(fp);
  free(b);
  dt_ckpt_info info;
  snprintf(p, sizeof p, "%s/step-00000003", root);
  assert_int_equal(dt__ckpt_verify(p, &info), DT_ENOTSUP);
  assert_non_null(strstr(dt_errmsg(), "version 2 is newer"));
}

static void test_keep(void **state) {
  (void)state;
  char root[300];
  sub(root, sizeof root, "keep");
  for (int s = 1; s <= 5; s++) write_ckpt(root, s * 10, 2);
  char (*names)[32];
  assert_int_equal(dt__ckpt_list(root, &names), 2);
  assert_string_equal(names[0], "step-00000050");
  assert_string_equal(names[1], "step-00000040");
  free(names);
  /* a stale temporary directory of a killed writer is removed at start */
  char p[500];
  snprintf(p, sizeof p, "%s/.tmp-step-00000060-1", root);
  assert_int_equal(mkdir(p, 0777), 0);
  assert_int_equal(dt__ckpt_root_check(root), DT_OK);
  struct stat st;
  assert_int_not_equal(stat(p, &st), 0);
}

static void test_writer_thread(void **state) {
  (void)state;
  char root[300];
  sub(root, sizeof root, "thread");
  dt_ckpt_writer *w;
  assert_int_equal(dt__writer_create(&w, root, 3), DT_OK);
  for (int s = 1; s <= 4; s++) {
    dt_ckpt_snap *sn = dt__writer_acquire(w, NULL);
    fill_snap(sn, s);
    dt__writer_submit(w);
  }
  dt__writer_drain(w);
  dt_ckpt_stats st;
  dt__writer_stats(w, &st);
  assert_int_equal(st.written, 4);
  assert_int_equal(st.failed, 0);
  assert_int_equal(st.last_step, 4);
  dt__writer_destroy(w);
  dt__writer_destroy(NULL);
  dt_ckpt_info info;
  assert_int_equal(dt__ckpt_find(root, &info), DT_OK);
  assert_int_equal(info.step, 4);
  /* a root that cannot be a directory: the write fails, counted, named */
  char bad[400];
  snprintf(bad, sizeof bad, "%s/latest/x", root);
  assert_int_equal(dt__writer_create(&w, bad, 3), DT_OK);
  fill_snap(dt__writer_acquire(w, NULL), 9);
  dt__writer_submit(w);
  dt__writer_drain(w);
  dt__writer_stats(w, &st);
  assert_int_equal(st.failed, 1);
  assert_int_equal(st.failed_step, 9);
  assert_non_null(strstr(st.last_error, "latest"));
  dt__writer_destroy(w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_safetensors_roundtrip), cmocka_unit_test(test_safetensors_refuses),
      cmocka_unit_test(test_write_verify),          cmocka_unit_test(test_byte_flips),
      cmocka_unit_test(test_deleted_and_dangling),  cmocka_unit_test(test_newer_version),
      cmocka_unit_test(test_keep),                  cmocka_unit_test(test_writer_thread),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
