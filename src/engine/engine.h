/*
 * engine.h — the engine layer's interface for the rest of the tree: the
 * public engine API (include/dtrain/engine.h: run configurations, engines
 * over files or caller memory, callbacks, summaries) plus the file helpers
 * the command line shares. The loop is train.c over a batch source and a
 * strategy (strategy.h); what a run writes is records.c.
 *
 * It does not parse configs or arguments (that is the cli layer), does not
 * print (progress goes to caller hooks) and does not start processes.
 */
#ifndef DT_ENGINE_H
#define DT_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/engine.h"

#include "comm/comm.h"
#include "data/data.h"
#include "nn/nn.h"

/* mkdir -p; DT_EIO naming the path on failure. */
int dt_mkdirs(const char *path);

/* Writes data to path atomically: path.tmp, fsync, rename, fsync the
 * directory. */
int dt_write_file_atomic(const char *path, const void *data, size_t len);

/* The names of the run configuration's enums, index = value, NULL-terminated:
 * data.format, optim.name, schedule.kind, dist.reduce, ps.consistency (dist.transport:
 * dt__transport_names in comm/comm.h). The one table each: the config
 * parser and the records read these, through dt__enum_parse/_name. */
extern const char *const dt__format_names[];
extern const char *const dt__optim_names[];
extern const char *const dt__sched_names[];
extern const char *const dt__reduce_names[];
extern const char *const dt__balance_names[];
extern const char *const dt__schedule_names[];
extern const char *const dt__log_format_names[]; /* obs.log_format */
extern const char *const dt__ps_consistency_names[]; /* ps.consistency */
extern const char *const dt__loss_names[];           /* model.loss */

/* Parameter-server jobs (docs/ps.md): the communicator of the whole job,
 * workers first then servers, lent to the "ps" strategy (the engine's own
 * communicator holds the workers only). Before dt_engine_run. */
int dt__engine_set_job_comm(dt_engine *e, dt_comm *job);
/* Elastic parameter-server jobs: where the job's rendezvous store is and
 * the communicator config it was made with (borrowed until the run ends),
 * so servers watch for joiners and a joiner reaches them
 * (strategy_ps.c). */
int dt__engine_set_rdzv(dt_engine *e, const char *host, int port, const struct dt_comm_config *cc);
/* A server rank of such a job: serves key range `index` of the engine's
 * model until every worker is done. Errors name the server and worker. */
int dt__engine_serve(dt_engine *e, dt_comm *job, int index);
/* A new server process in a lost server's slot of a running ps job
 * (dtrain launch --join with DTRAIN_PS_REJOIN; strategy_ps.c, docs/ps.md). */
int dt__engine_rejoin_serve(dt_engine *e, const char *host, int port,
                            const struct dt_comm_config *cc, int index);
/* One line per server: its key ranges (printed at start). *out is malloc'd. */
int dt__engine_ps_describe(dt_engine *e, char **out);

/* Elastic training (docs/elastic.md): the engine re-forms over the
 * generations of el (borrowed, must outlive dt_engine_run) when a
 * collective fails; id is this worker's member id. Before dt_engine_run. */
struct dt_elastic;
int dt__engine_set_elastic(dt_engine *e, struct dt_elastic *el, int id);
/* The config fingerprint of this engine running config_text (the bytes a
 * dt_elastic publishes or compares: see dt_elastic_cfg.fp); *fp points into
 * the engine. */
void dt__engine_el_fingerprint(dt_engine *e, const char *config_text, const void **fp,
                               size_t *len);
/* dt_elastic_cfg.check_fp for a joiner (ud: the engine): DT_EMISMATCH
 * naming the first key of job_fp that differs from this engine's. */
int dt__engine_el_check_fp(void *ud, const void *job_fp, size_t len);
/* A joiner: el admitted it into generation g (dt_elastic_join); the engine
 * trains over g's communicator, set up without collectives, and takes the
 * job's state and position from g's source when it runs. Before
 * dt_engine_run, instead of dt_engine_set_comm. */
struct dt_elastic_gen;
int dt__engine_set_joined(dt_engine *e, struct dt_elastic *el, const struct dt_elastic_gen *g);
/* Elastic training with spares (dist.standby_refresh_steps > 0): the
 * standby copy of the state, a shared mapping the processes forked after
 * this call share (src/engine/standby.c). Call before forking the node's
 * workers and spares. */
int dt__engine_standby_map(dt_engine *e);
/* In a spare before it waits: parameters, gradients, buffers and optimizer
 * state written page by page, so they are the spare's own memory and the
 * state it takes when woken costs no copy-on-write faults. */
void dt__engine_standby_warm(dt_engine *e);
/* The parameters this rank holds after a run: [*off, *off + *n) of the
 * model's; all of them but on a pipeline stage (with P > 1 stages a rank
 * holds its own span only, docs/pipeline.md "Memory"). */
void dt__engine_param_span(const dt_engine *e, size_t *off, size_t *n);
#endif /* DT_ENGINE_H */
