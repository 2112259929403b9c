/*
 * obs_diag.h — what the launcher (or `dtrain report`) reads out of the
 * rank pages: the hang diagnosis and the flight-recorder tables (diag.c),
 * the Prometheus exposition of every rank's metrics (expo.c) and the
 * metrics endpoint serving it (http_mhd.c).
 */
#ifndef DT_OBS_DIAG_H
#define DT_OBS_DIAG_H

#include <stdio.h>

#include "obs/obs_file.h"

/* Reads the pages of ranks r0..r0+n-1 in obs_dir and writes one line into
 * msg naming the rank that is behind and the operation the others wait in
 * (file comment of diag.c). dump: if not NULL, every rank's recorder as a
 * table. Returns 1 when some rank is inside an operation (msg names it), 0
 * when none is (msg says so), or a negative DT_E*. now_ns: dt_now_ns(). */
int dt_obs_diagnose(const char *obs_dir, int r0, int n, int64_t now_ns, char *msg, size_t cap,
                    FILE *dump);
/* The same over pages already read: pg[i] is rank ranks[i]'s page when
 * ok[i] (else that rank left none). states (may be NULL): for a page
 * fetched from another host, its process's state there (a /proc letter,
 * '?' unknown); 0 for a page of this host (looked up in /proc). */
int dt_obs_diagnose_pages(const struct dt_obs_page *pg, const int *ok, const int *ranks,
                          const char *states, int n, int64_t now_ns, char *msg, size_t cap,
                          FILE *dump);
/* One page's recorder as a table, its last `last` entries. */
void dt_obs_fr_dump(const struct dt_obs_page *pg, FILE *f, int64_t now_ns, int last);
/* The state letter of /proc/pid/stat ('R', 'S', 'T', ...); 'X' if gone. */
int dt__obs_proc_state(int pid);

/* ---- exposition (expo.c) ----------------------------------------------------------- */

/* Appends the Prometheus text exposition (format 0.0.4) of n pages to a
 * growing buffer (*buf of *cap bytes, *len used; realloc'd): one HELP and
 * TYPE line per name, every series labelled job, rank, host, histograms
 * cumulative with +Inf = _count, plus dtrain_resident_memory_bytes read
 * from /proc for each live pid. DT_ENOMEM. */
int dt_obs_expose(const struct dt_obs_page *pages, int n, char **buf, size_t *len, size_t *cap);

/* ---- the metrics endpoint (http_mhd.c) ---------------------------------------------------- */

typedef struct dt_obs_server dt_obs_server;
/* Serves GET /metrics on addr ("HOST:PORT", an IPv4 address or "localhost";
 * port 0: any free one) with the pages of the n ranks in ranks[] (NULL:
 * ranks 0..n-1) in obs_dir, read at every scrape; the list is copied.
 * DT_EINVAL for a bad address (naming it), DT_EIO when the port cannot be
 * bound. */
int dt_obs_server_start(dt_obs_server **out, const char *addr, const char *obs_dir,
                        const int *ranks, int n);
int dt_obs_server_port(const dt_obs_server *s);
/* Adds another host's server ("IPv4:PORT"): every scrape of s then fetches
 * its GET /pages (1 s timeouts; a peer that does not answer is left out of
 * that scrape) and shows those ranks too (a rank already shown: once; no
 * resident memory, that is read from /proc here). DT_EINVAL for a bad
 * address or more than 64 peers. */
int dt_obs_server_add_peer(dt_obs_server *s, const char *addr);
/* GET /pages of the server at addr ("IPv4:PORT"): its ranks' pages into
 * out[0..max) and, if states is not NULL, the state of each one's process
 * as that host sees it (a /proc state letter, '?' unknown) into states[i]
 * (1 s timeouts). Returns how many, or < 0. */
int dt_obs_fetch_pages(const char *addr, struct dt_obs_page *out, char *states, int max);
void dt_obs_server_stop(dt_obs_server *s);

/* ---- the run report (report.c) ---------------------------------------------------------- */

/* Writes out_path (atomically: out_path.tmp, then rename) as one
 * self-contained HTML page of the run in run_dir. DT_ENOENT when run_dir
 * holds neither events.jsonl nor summary.json nor failure.json; DT_EIO
 * naming the file that cannot be written. */
int dt_obs_report(const char *run_dir, const char *out_path);

#endif /* DT_OBS_DIAG_H */
