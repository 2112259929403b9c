/*
 * core.h — the base layer every other layer may include: error recording and
 * the DT_CHECK macros, logging, tunable parameters read from the environment,
 * aligned allocation, clocks, the counter-based RNG (Philox4x32-10) and
 * crc32c. Nothing here knows about tensors, models or networks.
 */
#ifndef DT_CORE_H
#define DT_CORE_H

#include "dtrain/core.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- errors ------------------------------------------------------------ */

/* Records a one-line message for dt_errmsg() and returns rc, so callers can
 * write `return dt__seterr(DT_EINVAL, "%s:%d: ...", file, line);`. */
int dt__seterr(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current thread message with more context ("loading x: <old>"). */
int dt__preerr(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dt__clearerr(void);

#define DT_CHECK(call)                                                         \
  do {                                                                         \
    int dt__rc_ = (call);                                                      \
    if (dt__rc_ < 0) return dt__rc_;                                           \
  } while (0)

#define DT_CHECK_GOTO(call, rc, label)                                         \
  do {                                                                         \
    (rc) = (call);                                                             \
    if ((rc) < 0) goto label;                                                  \
  } while (0)

/* ---- logging ----------------------------------------------------------- */

enum dt_log_level { DT_LOG_ERROR = 0, DT_LOG_WARN, DT_LOG_INFO, DT_LOG_DEBUG };

/* Log to stderr if level <= the DTRAIN_LOG_LEVEL parameter (default INFO;
 * accepts error|warn|info|debug or 0..3). Thread-safe: one write per line. */
void dt_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The rank every later line names (-1: none), and JSON lines on (1) or the
 * text prefix "TIME HOST rank R dtrain LEVEL: " (0, the default). */
void dt_log_set_rank(int rank);
void dt_log_set_json(int on);
#define DT_LOG_ERR(...) dt_log(DT_LOG_ERROR, __VA_ARGS__)
#define DT_LOG_WARN(...) dt_log(DT_LOG_WARN, __VA_ARGS__)
#define DT_LOG_INFO(...) dt_log(DT_LOG_INFO, __VA_ARGS__)
#define DT_LOG_DEBUG(...) dt_log(DT_LOG_DEBUG, __VA_ARGS__)

/* ---- parameters (NCCL style: every knob from the environment) ---------- */

/* Every DTRAIN_* environment knob, in one table (param.c reads them; nobody
 * else calls getenv on a DTRAIN_ name). Columns: id, type (INT or STR),
 * default (INT), default (STR, or for an INT a description shown instead of
 * the number, e.g. "auto"), min, max (INT only), meaning. `dtrain env`
 * prints the table with current values; docs/config.md lists the same
 * names (tests/core/test_param_docs.sh keeps them in step). */
#define DT_PARAM_TABLE(X)                                                                                   \
  X(ALGO, STR, 0, NULL, 0, 0, "force one collective algorithm: auto ring rhd tree hier direct (default: chosen by size and topology)") \
  X(AUTH_PENDING_MAX, INT, 256, NULL, 1, 1 << 20, "connections a store or tcp listener keeps waiting to authenticate; beyond it the oldest that have had a second are closed, checked on every pass of the listener's loop") \
  X(AUTH_TIMEOUT_MS, INT, 5000, NULL, 1, 3600000, "a connection that has not authenticated within this is closed, ms (store and tcp listeners)") \
  X(BIND_ADDR, STR, 0, NULL, 0, 0, "IPv4 address this node's workers listen on in a multi-node job (default: this machine's address towards the rendezvous)") \
  X(CHUNK_BYTES, INT, 2 << 20, NULL, 0, INT64_MAX, "chunk size of pipelined ring algorithms, bytes (at least 4096 is used)") \
  X(DATA_MAX_BYTES, INT, (int64_t)1 << 30, NULL, 1, INT64_MAX, "largest dataset file or array a reader accepts, bytes") \
  X(CZ_FUSE, INT, 1, NULL, 0, 1, "compressed gradients of all buckets of a step in one collective after the last bucket (topk, sign, qsgd: one allgather; powersgd: its two allreduces): 1 on, 0 per bucket") \
  X(CZ_SIGN_BLOCKS, INT, 1, NULL, 0, 3, "dist.compress = sign: where its scale blocks lie: 0 every 256 values from a bucket's start (blocks may straddle rows and layers), 1 inside one row of a weight matrix (or a layer's other parameters), cut into near-equal pieces of at most 256 values, 2 one whole row, 3 one whole weight matrix; must be the same on every rank") \
  X(CZ_SIGN_TWO, INT, 1, NULL, 0, 1, "dist.compress = sign with DTRAIN_CZ_SIGN_BLOCKS > 0: two scales per block, the mean of its values >= 0 and the mean |x| of the others (1), or one, the mean |x| (0); must be the same on every rank") \
  X(CZ_SIGN_MOM, INT, 0, NULL, 0, 1, "dist.compress = sign with SGD momentum (no dampening, no Nesterov) and dist.compress_momentum = 0: 1 keeps the optimizer's momentum before the codec on each worker, the optimizer's buffer then being the sum of the decoded velocities plus its weight decay as in dense SGD (signum; 3/4 epoch of dense steps first); 0 (default) the momentum after the codec with 2 dense epochs: 1 measured 0.83 points below dense on the CNN (mean of 3 seeds; dist.compress_momentum 0.96) and 0.56 on the MLP (docs/compress.md); must be the same on every rank") \
  X(CZ_SIGN_DENSE, INT, 20000, NULL, 0, 2147483647, "dist.compress = sign with DTRAIN_CZ_SIGN_BLOCKS > 0: every weight matrix, and every stretch of parameters between weight matrices (biases, other layers), of at most this many values is sent dense (f32) inside the sign frame, the rest as signs (the CNN: all but fc1, 2.2x the bytes of all-sign, 7.6x fewer than dense; within 0.12 points of dense over 3 seeds, docs/compress.md); 0 none; must be the same on every rank") \
  X(DDP_OVERLAP, INT, -1, "auto", -1, 1, "reduce gradient buckets on a communication thread while backward runs: 1 on, 0 off, -1 auto") \
  X(SHUPD, INT, -1, "auto", -1, 2, "dist.balance = dynamic on one host: the optimizer step split over the workers by speed, each stepping its slice inside the gradient reduction, with the optimizer state once per host; 2: every worker keeps its parameter copy and copies the slices the others stepped, 1: one parameter copy per host, 0: off (every worker updates all parameters), -1 auto: 2 with AdamW, 0 with SGD (docs/ddp.md)") \
  X(DYNAMIC_PACE, INT, 0, NULL, 0, 1, "dist.balance = dynamic: a worker whose cgroup allows it less than one core paces itself at 0.9 of its quota (a token bucket, one sleep at a step's start), so the kernel does not stop it for the rest of a quota period (1), or runs until the kernel does (0)") \
  X(DYNAMIC_QUOTA_PCT, INT, 80, NULL, 0, 100, "dist.balance = dynamic: a worker under a CPU quota has its measured speed (CPU seconds / quota when that exceeds its busy time) counted at this percent when the batch is cut, so its CPU stays under the quota; 100: no margin; 0: a margin from how much its speed varies between re-plans (docs/ddp.md)") \
  X(DYNAMIC_MARGIN_MAX, INT, 95, NULL, 0, 100, "dist.balance = dynamic: the margin of a worker under a CPU quota starts at DTRAIN_DYNAMIC_QUOTA_PCT and rises towards this percent while its cgroup is rarely throttled (cpu.stat), falling back when the kernel throttles it (at or below DTRAIN_DYNAMIC_QUOTA_PCT: the margin stays fixed; docs/ddp.md)") \
  X(DYNAMIC_QUOTA_SLICE, INT, 1, NULL, 0, 1, "dist.balance = dynamic on one host: a worker under a CPU quota below one core sums no slice of the shared window's reduction (and, with the shared update, steps none), the workers without a quota sum its part (1), or every worker sums a slice by its speed (0; docs/ddp.md)") \
  X(GEMM, STR, 0, NULL, 0, 0, "matrix-multiply kernels: blas, avx2 or avx512 (default: avx512 where the CPU has it, else avx2 where it has AVX2 and FMA)") \
  X(GRACE_SECONDS, INT, 8, NULL, 0, 86400, "seconds the launcher waits for the other workers after one fails before it stops them") \
  X(HIER_MIN_BYTES, INT, 64 << 10, NULL, 0, INT64_MAX, "allreduce from this size up is hierarchical when ranks span several hosts, bytes") \
  X(HOST_ID, STR, 0, NULL, 0, 0, "this rank's host identity; ranks with the same id use shared memory (default: hostname and boot id)") \
  X(JOB_TOKEN, STR, 0, NULL, 0, 0, "per-job secret every connection proves with HMAC-SHA256 (at least 16 characters across nodes; never printed)") \
  X(LOG_LEVEL, STR, 0, "info", 0, 0, "log level on stderr: error warn info debug (or 0..3)") \
  X(NNODES, STR, 0, NULL, 0, 0, "dtrain launch --nnodes: nodes in the job") \
  X(NN_CHUNK_BYTES, INT, 128 << 10, NULL, 0, INT64_MAX, "working-set size of one chunk of the fused layer execution plan, bytes") \
  X(NODE_RANK, STR, 0, NULL, 0, 0, "dtrain launch --node-rank: this node, 0..nnodes-1") \
  X(NPROC_PER_NODE, STR, 0, NULL, 0, 0, "dtrain launch --nproc-per-node: workers on this node") \
  X(PIPE_RECOMPUTE_ROWS, INT, 64, NULL, 0, 1 << 20, "pipeline with train.recompute: each stage makes its linear layers' weight gradients in one product per group of micro-batches of about this many rows, keeping their inputs and output gradients until then (below 2 micro-batches' rows: per micro-batch, nothing kept)") \
  X(PIPE_WGRAD, INT, 1, NULL, 0, 1, "pipeline: each stage makes its linear layers' weight gradients in one product per step over every micro-batch (1; with train.recompute per group of DTRAIN_PIPE_RECOMPUTE_ROWS rows) or per micro-batch (0); not in deterministic mode") \
  X(PIPE_DDP, INT, 1, NULL, 0, 1, "pipeline with replicas (hybrid): each stage's gradient reduced over its replicas in ddp's buckets, each as soon as the stage's last products have made it (1), or in one allreduce after the step (0); not in deterministic mode") \
  X(PIPE_WARMUP, INT, 1, NULL, 0, 1 << 16, "pipeline 1f1b: extra warm-up forwards on every stage but the last (stage s runs P-1-s+this before its first backward and holds up to P-s+this micro-batches' activations), so a stage computes while its first gradients make the round trip") \
  X(PIPE_WPACK, INT, 1, NULL, 0, 1, "pipeline: each stage packs its linear layers' weights for the forward product once per step (1) instead of once per micro-batch (0); not in deterministic mode") \
  X(PIPE_TAIL, INT, 0, NULL, 0, 1, "pipeline: every stage but the last runs a helper thread for work it need not wait for at once, while the next stage leaves its core idle: half of the step's last deferred weight-gradient products (the layers split in two sets of about equal work) and the input-gradient packing of the weights during the step's first forwards (1); or none (0, the default: quiet, 2 stages of the deep MLP ran 0.89x as fast with it, 2026-11-28); the same bits either way") \
  X(PIPE_OFFLOAD, INT, 1, NULL, 0, 1, "pipeline with 2 stages and deferred weight gradients: the last stage makes stage 0's first linear layer's weight gradient from the rows stage 0 sends it after each backward, and sends the product back before stage 0's optimizer step (1, the default: 2 stages of the deep MLP 1.02-1.04x as fast, quiet, 2026-11-28), balancing the stages below layer granularity; or stage 0 makes it (0); the same bits either way; not in deterministic mode, with recomputation or with DTRAIN_PIPE_TAIL") \
  X(WPACK_DINP, INT, 1, NULL, 0, 1, "pipeline stages and deterministic mode, where the forward weights are packed once per step: linear layers' weights also packed once per step for the input-gradient product dout * W (1; one more copy of those weights, none for a first layer that needs no input gradient) instead of read in place by every micro-batch's product (0); the same bits in deterministic mode") \
  X(CONV_WINOGRAD, INT, 1, NULL, 0, 1, "normal mode on AVX2: 3x3 stride-1 convolutions with at least 4 input and output channels by Winograd's F(2x2,3x3) transform, forward and both gradients (1; 2.25x fewer multiplications, other roundings), or on the implicit-GEMM route (0); deterministic mode never takes it") \
  X(PS_DIRECT, INT, 1, NULL, 0, 1, "ps: colocated asp with shared-memory windows: each worker applies its own pushes to the keys' master copies in shared memory under a per-key lock, with no server thread (1), or hands them to the owning worker's server thread (0); must be the same on every rank") \
  X(PS_EVEN_FIRST, INT, 1, NULL, 0, 1, "ps bsp: a first layer of at least (S-1)/S of the parameters is cut into S equal shares, one a server, the later layers on the last server (1), or every share balanced by bytes (0); part of the key map") \
  X(PS_LAZY, INT, 0, NULL, 0, 1, "ps: colocated asp workers take each push's reply at the next step's begin instead of waiting for it at the step's end (1), or wait (0)") \
  X(PS_PIECE, INT, -1, NULL, -1, 1 << 30, "ps: dense keys longer than this many floats are cut into near-equal pieces, pushed, stepped and sent back one after another, and a first linear layer's weight gradient is made in such pieces (0: one key per layer and server; -1: 32768 for asp and ssp, on a first linear layer only, whose gradient backward makes in pieces, and 0 for bsp; a value > 0 cuts every dense layer); part of the key map") \
  X(PS_WINDOW, INT, 1, NULL, 0, 1, "ps: when every rank of the job is on one host over shared memory, each worker's parameters and gradients live in a shared-memory window, so servers read pushes in place and write replies straight into the worker's parameters (1), or every payload goes through the transport (0); must be the same on every rank") \
  X(PS_REJOIN, INT, -1, NULL, -1, 4095, "ps: with dtrain launch --join, this process is a new server in the lost server slot given (replicas: it takes a copy of every range that runs on fewer than ps.replicas copies and becomes its backup, docs/ps.md); -1: a joining worker") \
  X(PS_FUSED, INT, 1, NULL, 0, 1, "ps bsp: a key's two pushes (2 workers) summed in rank order and stepped by SGD (plain or with momentum, no Nesterov or dampening) in one pass, the same bits (1), or a pass for the sum and one for the optimizer (0)") \
  X(PS_QUOTA_SLEEP, INT, 1, NULL, 0, 1, "ps: a worker whose cgroup allows it less than one core (read every 100 ms) sleeps 20 us between polls while it waits for parameters (separate servers, and colocated bsp) instead of spinning and yielding, since polling is charged to the quota (1); 0: it polls as without a quota") \
  X(RDZV, STR, 0, NULL, 0, 0, "HOST:PORT of the rendezvous store (dtrain launch --rdzv; under mpirun/srun rank 0 serves it there)") \
  X(RDZV_BACKEND, STR, 0, "builtin", 0, 0, "dtrain launch --rdzv-backend: builtin (node 0 serves the store) or etcd (DTRAIN_RDZV names an etcd server)") \
  X(RDZV_DIR, STR, 0, "/tmp", 0, 0, "directory where ranks started by mpirun/srun without DTRAIN_RDZV meet through files") \
  X(RING_MIN_BYTES, INT, 1 << 20, NULL, 0, INT64_MAX, "allreduce/broadcast from this size up use the ring (more than 2 ranks), bytes") \
  X(RING_MIN_OVERSUB_BYTES, INT, 32 << 20, NULL, 0, INT64_MAX, "the same threshold when ranks outnumber cores, bytes") \
  X(SHM_ASYM_FENCE, INT, 1, NULL, 0, 1, "shm: a rank about to sleep calls membarrier() so senders skip a full fence per message (0: a fence per message)") \
  X(SHM_BIND, INT, 1, NULL, 0, 1, "shm: pin each rank's communication thread to a core when ranks do not outnumber cores") \
  X(SHM_CMA_BYTES, INT, 1 << 20, NULL, 0, INT64_MAX, "shm: messages from this size up are copied once with process_vm_readv (0: never)") \
  X(SHM_LIMIT_BYTES, INT, 0, NULL, 0, INT64_MAX, "launcher: count /dev/shm as having at most this many bytes free in the memory check before workers start (0: the real free space; for tests)") \
  X(SHM_LIVE_MS, INT, 2, NULL, 1, 60000, "shm: how often a waiting rank checks that its peers are alive, ms") \
  X(SHM_PREFAULT, INT, 1, NULL, 0, 1, "shm: map a ring's pages when its peer is first sent to or received from, so the first messages do not page-fault") \
  X(SHM_RING_BYTES, INT, -1, "auto", 0, INT64_MAX, "shm: bytes per peer ring, rounded up to a power of two, 4 KiB .. 1 GiB (auto: 1 MiB, halved down to 64 KiB while ranks x ring exceed 16 MiB)") \
  X(SHM_SPIN_US, INT, -1, "auto", 0, INT64_MAX / 1000, "shm: poll this long before sleeping on the futex, us (auto: 2000, or 200 when ranks outnumber cores)") \
  X(SHM_STOPPED_S, INT, 5, NULL, 0, 86400, "shm: a peer stopped (SIGSTOP, state T) this long while we wait for it fails the call naming it, s (0: only the deadline)") \
  X(SHM_YIELD_US, INT, -1, "auto", 0, INT64_MAX / 1000, "shm: poll without yielding the core this long first, us (auto: 20, or 0 when ranks outnumber cores)") \
  X(DET_WPACK, INT, 1, NULL, 0, 1, "deterministic mode: linear layers' forward weights packed once per step instead of once per micro-shard (the same products, the same bits)") \
  X(DET_SLOTS, INT, 4, NULL, 1, 64, "deterministic mode: micro-shard gradients a worker keeps as floats before turning them into fixed point in one pass (1: after every micro-shard, as before 2026-11-27); the same sums and bits for any value") \
  X(DET_AVX2, INT, 1, NULL, 0, 1, "deterministic mode: on a CPU without AVX-512, turn micro-shard gradients into fixed point with AVX2 (0: the scalar loop; the same bits either way)") \
  X(DET_FUSE, INT, 1, NULL, 0, 1, "deterministic mode: linear layers' weight gradients made per micro-shard straight in fixed point from their stashed inputs and output gradients, never written as floats (0: backward writes them to the gradient slots, as before 2026-11-27 04:00); the same bits") \
  X(DET_FWIN, INT, 1, NULL, 0, 1, "deterministic mode, workers sharing a window: each rank turns only its own slice of the reduced int64 sums back into floats, written into every rank's window where the model's gradients then live (0: every rank converts the whole sums, as before 2026-11-27 07:00); the same bits; must be the same on every rank") \
  X(STEAL_TAIL, INT, 1, NULL, 0, 1, "dist.balance = steal: a worker under a CPU quota leaves the last micro-shards of a step to the others when they would finish them before it finished one (1), so they do not wait for it at the reduction; 0: it takes them while any is left") \
  X(STEAL_BACKUP, INT, 3, NULL, 0, 1000, "dist.balance = steal: an idle worker re-runs a micro-shard another worker has held this many times its own mean micro-shard time (and at least 0.2 ms); the first copy to finish counts (0: no backups)") \
  X(TCP_BUFFER, INT, 0, NULL, 0, INT32_MAX, "tcp: SO_SNDBUF/SO_RCVBUF bytes (0: kernel autotuning)") \
  X(TCP_KEEPIDLE, INT, 2, NULL, 1, 32767, "tcp: seconds of idleness before keepalive probes start") \
  X(TCP_NCONN, INT, 1, NULL, 1, 16, "tcp: connections per peer when the config (dist.tcp_connections) does not say; messages from DTRAIN_TCP_STRIPE_MIN up are striped over them") \
  X(TCP_SPIN_US, INT, 0, NULL, 0, INT64_MAX / 1000, "tcp: poll this long before sleeping in epoll_wait, us") \
  X(TCP_STRIPE_MIN, INT, 256 << 10, NULL, 0, INT64_MAX, "tcp: messages from this size up are cut into one part per connection, bytes (at least 128 KiB is used)") \
  X(TCP_USER_TIMEOUT_MS, INT, 0, NULL, 0, INT32_MAX, "tcp: TCP_USER_TIMEOUT for unacknowledged data, ms (0: off)") \
  X(TEST_SLOW_RANK, INT, -1, "none", -1, 1 << 20, "tests only: the rank DTRAIN_TEST_SLOW_US slows down (-1: none)") \
  X(TEST_SLOW_US, INT, 0, NULL, 0, 1000000, "tests only: microseconds rank DTRAIN_TEST_SLOW_RANK sleeps per sample of each step, a fake straggler") \
  X(TEST_KILL, STR, 0, NULL, 0, 0, "tests of elastic training: ID:STEP:PHASE makes worker ID kill itself at global step STEP during forward, backward, allreduce, eval or ckpt, before its last collective send of the step (lastsend) or after the step's reduction (reduced)") \
  X(TEST_TCP_SHED, INT, 0, NULL, 0, 1000, "tests only: a tcp listener closes this many of the first connections it accepts in mid-handshake, as one shedding strangers does") \
  X(TEST_VISITS, STR, 0, NULL, 0, 0, "tests of elastic training: directory where each worker appends the positions it trained on per epoch (visits.PID)") \
  X(TEST_PS_DIE, STR, 0, NULL, 0, 0, "tests of ps: CLOCK[:final] makes a separate server SIGKILL itself right after it answered one worker's reads of every key it holds at clock CLOCK or later (step reads, or FINAL reads with :final)") \
  X(TIMEOUT, INT, 60, NULL, 1, 86400 * 7, "deadline of every blocking step (connect, collective), seconds") \
  X(TRANSPORT, STR, 0, NULL, 0, 0, "overrides dist.transport: auto shm tcp mpi") \
  X(TREE_MAX_BYTES, INT, 32 << 10, NULL, 0, INT64_MAX, "allreduce up to this size uses the binomial tree, bytes") \
  X(UNEXPECTED_MAX_MB, INT, 4096, NULL, 1, (int64_t)1 << 30, "bound on early (not yet received) message bytes buffered per peer, MiB; a peer exceeding it is lost") \
  X(WINDOW, INT, 1, NULL, 0, 1, "reduce gradients through a shared-memory window when all ranks share a host") \
  X(WINDOW_SPIN_US, INT, 1000, NULL, 0, INT64_MAX / 1000, "window: poll this long before sleeping, us") \
  X(WINDOW_YIELD, INT, -1, "auto", 0, 1, "window: yield the core while polling (auto: 1 when ranks x 2 threads outnumber cores)")

enum dt_param_id {
#define DT__PARAM_ENUM(id, type, di, ds, lo, hi, meaning) DT_PARAM_##id,
  DT_PARAM_TABLE(DT__PARAM_ENUM)
#undef DT__PARAM_ENUM
  DT_PARAM_COUNT
};

/* The value of an INT knob: the environment's if set and valid, else the
 * table's default. Read once per process (pthread_once) and cached; a set
 * but malformed or out-of-range value logs one warning naming the variable
 * and the accepted range, and the default is used. Cheap: call freely. */
int64_t dt_param(enum dt_param_id id);
/* For knobs whose default depends on the caller (table default -1 =
 * "auto"): the environment's value if set and valid, else def. */
int64_t dt_param_or(enum dt_param_id id, int64_t def);
/* A STR knob: the environment's value if set and non-empty, else the
 * table's default (may be NULL). The pointer stays valid until
 * dt__param_reload. */
const char *dt_param_s(enum dt_param_id id);
/* True if the environment sets the knob (to a valid value). */
bool dt_param_isset(enum dt_param_id id);

/* Description of one knob, for `dtrain env` and the docs check. */
struct dt_param_info {
  const char *name;    /* "DTRAIN_..." */
  bool is_int;
  const char *def;     /* default as text ("(unset)" if none) */
  int64_t min, max;    /* INT only */
  const char *meaning;
  bool set;            /* the environment sets it (validly) */
  const char *value;   /* current value as text (the default's text if unset) */
};
/* Fills *out for knob id; returns false when id is out of range. */
bool dt_param_info(int id, struct dt_param_info *out);

/* By-name access kept for callers not yet moved to ids: looks `name` up in
 * the table and returns its environment value if set, else def (a name not
 * in the table logs a warning once and returns def; add it to the table). */
int64_t dt_param_int(const char *name, int64_t def);
const char *dt_param_str(const char *name, const char *def);

/* TEST ONLY: re-reads every knob from the environment (tests that setenv
 * per case call it after setenv/unsetenv). Not thread-safe against
 * concurrent readers: call it while no other thread uses the library. */
void dt__param_reload(void);

/* ---- memory ------------------------------------------------------------ */

/* 64-byte aligned allocation (cache line / AVX-512). Free with dt_free. */
void *dt_alloc(size_t bytes);
void *dt_calloc(size_t bytes);
void dt_free(void *p);

/* ---- clocks ------------------------------------------------------------ */

double dt_now(void);       /* monotonic seconds */
int64_t dt_now_ns(void);   /* monotonic nanoseconds */

/* The CPU quota of this process's cgroup in cores (cgroup v1
 * cpu.cfs_quota_us / cpu.cfs_period_us or v2 cpu.max; the tighter of both
 * on a hybrid mount), 0 when there is none or it cannot be read. Read
 * fresh on every call (cpu_quota.c). */
double dt_cpu_quota(void);
/* Seconds this process's cgroup has been throttled for its CPU quota so
 * far (cpu.stat: v1 throttled_time, v2 throttled_usec), -1 when it cannot
 * be read. Read fresh on every call (cpu_quota.c). */
double dt_cpu_throttled(void);

/* ---- counter-based RNG -------------------------------------------------- */

/* Philox4x32-10 (Salmon et al., SC'11): a pure function of (key, counter).
 * dtrain keys randomness by (seed, purpose) and counts by (step, global sample
 * index, element), never by rank, so results do not depend on the number of
 * workers. */
typedef struct dt_philox_ctr { uint32_t v[4]; } dt_philox_ctr;
void dt_philox4x32(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]);

/* Convenience: 4 random u32 for (seed, stream, a, b). `stream` separates
 * purposes (init, shuffle, dropout, ...). */
void dt_rng4(uint64_t seed, uint32_t stream, uint64_t a, uint64_t b, uint32_t out[4]);
/* Uniform float in [0,1) from 24 random bits. */
static inline float dt_u32_to_unit(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

enum dt_rng_stream {
  DT_RNG_INIT = 1,    /* parameter initialisation: a = layer index, b = element block */
  DT_RNG_SHUFFLE = 2, /* data order: a = epoch */
  DT_RNG_DROPOUT = 3, /* dropout: a = step, b = (global sample index, layer, element block) */
  DT_RNG_AUGMENT = 4,
  DT_RNG_USER = 16
};

/* Fills `n` uniform floats in [lo, hi) as a pure function of (seed, stream, a)
 * and the element index. */
void dt_rng_uniform(float *out, size_t n, float lo, float hi, uint64_t seed,
                    uint32_t stream, uint64_t a);
/* Fisher-Yates permutation of 0..n-1 as a pure function of (seed, stream, a). */
void dt_rng_permutation(int64_t *perm, int64_t n, uint64_t seed, uint32_t stream, uint64_t a);

/* ---- little-endian fields of wire and file formats --------------------- */

static inline void dt_put_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void dt_put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t dt_get_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t dt_get_le64(const uint8_t *p) {
  return (uint64_t)dt_get_le32(p) | (uint64_t)dt_get_le32(p + 4) << 32;
}

/* ---- checksums --------------------------------------------------------- */

uint32_t dt_crc32c(uint32_t crc, const void *buf, size_t len);
/* SHA-256 of buf, the 32 raw bytes (OpenSSL libcrypto). */
void dt_sha256(const void *buf, size_t len, uint8_t out[32]);
/* The same over pieces: begin (NULL when out of memory; update and end
 * accept NULL and then give 32 zero bytes), update in order, end writes
 * the digest and frees the context. */
typedef struct dt_sha256_ctx dt_sha256_ctx;
dt_sha256_ctx *dt_sha256_begin(void);
void dt_sha256_update(dt_sha256_ctx *c, const void *buf, size_t len);
void dt_sha256_end(dt_sha256_ctx *c, uint8_t out[32]);
/* SHA-256 of buf as 64 lowercase hex digits plus NUL. */
void dt_sha256_hex(const void *buf, size_t len, char out[65]);
/* n bytes as 2n lowercase hex digits plus NUL (out holds 2n + 1 chars). */
void dt_hex(const uint8_t *bytes, size_t n, char *out);

/* Enum name tables (NULL-terminated, index = value): the value of name s, or
 * -1; the name of value v, or "?" when out of range (never NULL). */
int dt__enum_parse(const char *const *names, const char *s);
const char *dt__enum_name(const char *const *names, int v);

#endif /* DT_CORE_H */
