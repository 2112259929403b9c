/*
 * fuzz_obs_page.c — libFuzzer target for the reader of rank pages
 * (DIR/obs/rank-R: written by other processes, read by the launcher's
 * /metrics, hang diagnosis and `dtrain report`). A valid page with
 * metrics of every type and flight-recorder entries is built once; each
 * input is a list of patches (2-byte offset, 1-byte length, bytes) laid
 * over a copy, and the result goes through dt__obs_parse and, when it is
 * accepted, through the exposition and the recorder dump, which must then
 * cope with whatever the fields hold. The same bytes also go through the
 * reader of another host's GET /pages answer (dt__obs_pages_parse): as an
 * HTTP 200 answer carrying the patched page, and the input itself as an
 * answer. Any crash or sanitizer report is a bug.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obs/obs_diag.h"
#include "obs/obs_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct dt_obs_page *template_page(void) {
  static struct dt_obs_page *t;
  if (t) return t;
  dt_obs *o = NULL;
  if (dt_obs_open(&o, NULL, 1, 4, "job", "host") < 0) abort();
  dt_obs_add(dt_obs_counter(o, "a_total", "a counter"), 3);
  dt_obs_set(dt_obs_gauge(o, "b", "a gauge"), -2.5);
  dt_obs_metric *h = dt_obs_histogram(o, "c_seconds", "a histogram", NULL, 0);
  for (int i = 0; i < 5; i++) dt_obs_observe(h, 0.001 * i);
  dt_obs_fr_note(o, "bucket 1");
  for (int i = 0; i < 70; i++) dt_obs_fr_end(o, dt_obs_fr_begin(o, "allreduce", 7, (uint64_t)i, 4096, -1), 0);
  dt_obs_fr_begin(o, "send", 7, 99, 16, 2);
  t = malloc(sizeof *t);
  memcpy(t, o->pg, sizeof *t);
  dt_obs_close(o);
  return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *data0 = data;
  const size_t size0 = size;
  struct dt_obs_page *t = template_page();
  uint8_t *buf = malloc(sizeof *t);
  struct dt_obs_page *out = malloc(sizeof *out);
  memcpy(buf, t, sizeof *t);
  size_t len = sizeof *t;
  while (size >= 3) {
    size_t off = ((size_t)data[0] | (size_t)data[1] << 8) * 8 % sizeof *t, n = data[2];
    data += 3, size -= 3;
    if (n > size) n = size;
    if (off + n > sizeof *t) n = sizeof *t - off;
    memcpy(buf + off, data, n);
    data += n, size -= n;
  }
  if (dt__obs_parse(buf, len, out) == DT_OK) {
    char *x = NULL;
    size_t xl = 0, xc = 0;
    dt_obs_expose(out, 1, &x, &xl, &xc);
    free(x);
    FILE *f = fopen("/dev/null", "w");
    if (f) {
      dt_obs_fr_dump(out, f, 0, DT_OBS_FR_LEN);
      fclose(f);
    }
  }
  /* another host's /pages answer: the patched page behind a status line,
   * and the raw input as a whole answer */
  static const char head[] = "HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n";
  uint8_t *resp = malloc(sizeof head - 1 + len);
  struct dt_obs_page *two = malloc(2 * sizeof *two);
  memcpy(resp, head, sizeof head - 1);
  memcpy(resp + sizeof head - 1, buf, len);
  dt__obs_pages_parse(resp, sizeof head - 1 + len, two, 2);
  dt__obs_pages_parse(data0, size0, two, 2);
  free(resp);
  free(two);
  free(buf);
  free(out);
  return 0;
}
