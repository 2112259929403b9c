#!/usr/bin/env python3
"""ps_bench.py — the parameter server's numbers (docs/ps.md), back to back.

Parts (--parts, default speed,rpc,straggler,sparse):
  speed      MLP and CNN, 2 workers, global batch 64, one epoch (the CNN on the
             first CNN_LIMIT training samples): dtrain data parallelism (ddp)
             against ps bsp and ps asp with colocated servers (each also
             with the other choice of DTRAIN_PS_PIECE: bsp in pieces, asp
             without; asp also with lazy replies, DTRAIN_PS_LAZY=1, and
             with its pushes handed to server threads, DTRAIN_PS_DIRECT=0), and
             bsp with one separate
             server; REPS rounds alternating, medians and ratios.
  rpc        the same MLP against PyTorch 1.13's RPC parameter server
             (bench/peers/fmnist_rpc_ps.py: the structure of PyTorch's
             tutorial, 1 server, 2 trainers, batch 32 each) and dtrain with 1
             separate server and 2 workers (32 each); ratio of samples/s.
  straggler  2 workers of the MLP (examples/fashion_mlp.ini as it is: cosine
             schedule, 20 epochs), in each deployment of --straggler-servers
             (default 0,1: colocated servers, then 1 separate unthrottled
             server process), worker 1 limited to
             50% of a core by a cgroup-v1 CPU quota (/sys/fs/cgroup/cpu, root
             only; skipped otherwise): time to 0.88 test accuracy with bsp
             and with ssp (s = 3) (stopped there), the epochs and seconds per
             epoch that took, and asp's final accuracy after 20 epochs.
  sparse     two ratings sets of tools/gen_ratings.py with --ratings
             (default 2M) ratings: the issue's density (users = ratings /
             100, items = ratings / 200, as 100k x 50k x 10M; --ratings
             10000000 is that set) and a dense one (users = ratings / 1000,
             items = ratings / 2000: 1000 ratings per user), both of the
             generator's default rank (2, --sparse-rank); matrix
             factorisation at that rank, embedding(users+items, rank)
             dot (the model ALS and the bound use), AdamW lr 0.03
             cosine, --sparse-epochs (8) of batch 1024, 2 workers + 1
             server, bsp: each worker's push/pull bytes per step against a
             dense push and pull of the whole model, and the test RMSE
             against the generator's floor (target: within 5%). At ~100
             ratings per user the best estimators reach 1.027x (oracle) and
             1.026x (ALS) at rank 2, 1.051x / 1.076x at rank 8
             (tools/ratings_bound.py, docs/ps.md).
  breakdown  (not in the default list) one traced epoch of the MLP per mode
             (ddp, bsp, bsp in pieces, asp, asp lazy; colocated): each span's mean per step
             and rank (forward, backward, push per key, the wait for
             parameters), to see where a ps step's time goes.
  failover   2 workers, 2 separate servers, ps.replicas = 2, bsp, the MLP
             (--failover-epochs of 3200 samples): server 0 SIGKILLed after the
             first epoch record, REPS times (--failover-reps); the time from
             the SIGKILL to the later of the two workers' first completed
             clocks after it (their log lines give the wall time), its
             median (target <= 2 s), and whether params_sha256 equals the
             run without the kill (bsp stays deterministic).
  rejoin     (not in the default list) 2 workers, 2 separate servers,
             ps.replicas = 2, bsp, the same MLP under dtrain launch: server
             0 SIGKILLed after the first epoch record, a new process started
             in its slot (DTRAIN_PS_REJOIN=0, dtrain launch --join), server 1
             SIGKILLed once the newcomer holds both copies; the time from the
             newcomer's start to its copies (it waits for an epoch's end) and
             whether params_sha256 equals the run without kills.
  workers    (not in the default list) 3 workers + 1 separate server + 1 spare, bsp,
             dist.min_workers = 2: worker 2 SIGKILLed after epoch 1; the time to the
             server's first clock without it and to the spare's admission.
  rereplicate  (not in the default list) 2 workers, 3 separate servers,
             ps.replicas = 2, bsp, the same MLP: server 0 SIGKILLed after
             the first epoch record, then, once both of its ranges have a
             new copy (each new holder's "holds its copy" line), server 1
             (range 0's new primary); the time from the first SIGKILL to
             the later copy line (the lines' own timestamps), its median,
             and whether params_sha256 after both kills equals the run
             without kills.
Training time only where dtrain reports it (summary samples_per_second);
time-to-accuracy from events.jsonl (wall time of the epoch record).
Standard library only.
"""
import argparse, datetime, json, os, random, re, statistics, subprocess, sys, tempfile, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("--build", default="build/release")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--parts", default="speed,rpc,straggler,sparse")
ap.add_argument("--ratings", type=int, default=2000000)
ap.add_argument("--sparse-epochs", type=int, default=8)
ap.add_argument("--sparse-rank", type=int, default=2, help="the ratings sets' rank (and the model's)")
ap.add_argument("--cnn-limit", type=int, default=12000)
ap.add_argument("--failover-reps", type=int, default=5)
ap.add_argument("--failover-epochs", type=int, default=6)
ap.add_argument("--straggler-servers", default="0,1",
                help="straggler part: the deployments, a comma list (0: colocated servers; "
                     "S: S separate, unthrottled server processes); default both")
a = ap.parse_args()
env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
dtrain = os.path.join(a.build, "dtrain")
common = ["--set", "optim.name=sgd", "--set", "optim.lr=0.05", "--set", "optim.momentum=0.9",
          "--set", "optim.weight_decay=0", "--set", "schedule.kind=constant",
          "--set", "train.batch=64"]

def dtrain_run(model, extra, epochs=1, limit=0):
    # an extra argument KEY=VALUE without a leading "--" is an environment variable
    xenv = dict(env, **dict(x.split("=", 1) for x in extra if x.startswith("DTRAIN_")))
    extra = [x for x in extra if not x.startswith("DTRAIN_")]
    args = [dtrain, "train", f"examples/fashion_{model}.ini", *common,
            "--set", f"train.epochs={epochs}", *extra]
    if limit:
        args += ["--set", f"data.limit_train={limit}"]
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(args + ["--out", out], env=xenv, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        with open(os.path.join(out, "summary.json")) as f:
            return json.load(f)

MODES = {
    "ddp": ["--workers", "2"],
    "ps bsp colocated": ["--workers", "2", "--set", "ps.colocate=true"],
    # the other choice of DTRAIN_PS_PIECE (default: none for bsp, 32768 floats for asp)
    "ps bsp coloc. pieces": ["--workers", "2", "--set", "ps.colocate=true", "DTRAIN_PS_PIECE=32768"],
    "ps asp colocated": ["--workers", "2", "--set", "ps.colocate=true", "--set", "ps.consistency=asp"],
    "ps asp coloc. unpieced": ["--workers", "2", "--set", "ps.colocate=true", "--set",
                               "ps.consistency=asp", "DTRAIN_PS_PIECE=0"],
    "ps asp coloc. lazy": ["--workers", "2", "--set", "ps.colocate=true", "--set", "ps.consistency=asp",
                           "DTRAIN_PS_LAZY=1"],
    # asp's pushes handed to the owner's server thread instead of applied by the pusher
    "ps asp coloc. thread": ["--workers", "2", "--set", "ps.colocate=true", "--set",
                             "ps.consistency=asp", "DTRAIN_PS_DIRECT=0"],
    "ps bsp 1 server": ["--workers", "2", "--servers", "1"],
}

def speed():
    print("== speed: 2 workers, global batch 64, 1 epoch (samples/s, training time)")
    for model in ("mlp", "cnn"):
        res = {m: [] for m in MODES}
        limit = a.cnn_limit if model == "cnn" else 0
        for r in range(a.reps):
            line = f"  {model} round {r + 1}:"
            for m, extra in MODES.items():
                s = dtrain_run(model, extra, limit=limit)
                res[m].append(s["samples_per_second"])
                line += f"  {m} {s['samples_per_second']:.0f}"
            print(line, flush=True)
        base = statistics.median(res["ddp"])
        targets = {"ps bsp colocated": 0.8, "ps bsp coloc. pieces": 0.8, "ps asp colocated": 1.0,
                   "ps asp coloc. unpieced": 1.0, "ps asp coloc. lazy": 1.0,
                   "ps asp coloc. thread": 1.0}
        # the verdict on the median of each round's own ratio (paired: this
        # VM's speed drifts between rounds by more than the modes differ)
        for m in MODES:
            med = statistics.median(res[m])
            paired = statistics.median(x / d for x, d in zip(res[m], res["ddp"]))
            t = targets.get(m)
            verdict = f"  (target >= {t}x: {'met' if paired >= t else 'missed'})" if t else ""
            print(f"  {model} median {m:22s} {med:9.0f} samples/s  {med / base:5.2f}x ddp, "
                  f"paired {paired:5.2f}x{verdict}")

def rpc():
    print("== rpc: MLP, 1 server + 2 trainers, batch 32 per trainer")
    dt, tor = [], []
    for r in range(a.reps):
        s = dtrain_run("mlp", ["--workers", "2", "--servers", "1"])
        penv = dict(env, MASTER_PORT=str(random.randint(30000, 40000)))
        out = subprocess.run(["/usr/bin/python3", "bench/peers/fmnist_rpc_ps.py", "2",
                              "--batch", "32", "--steps", "300"], env=penv, check=True,
                             capture_output=True, text=True).stdout
        t = float(re.search(r"samples_per_s (\d+)", out).group(1))
        dt.append(s["samples_per_second"]), tor.append(t)
        print(f"  round {r + 1}: dtrain ps {s['samples_per_second']:.0f}  pytorch rpc ps {t:.0f}",
              flush=True)
    d, t = statistics.median(dt), statistics.median(tor)
    print(f"  median: dtrain ps {d:.0f} samples/s, pytorch rpc ps {t:.0f} samples/s, ratio {d / t:.1f}x "
          f"(target >= 10x: {'met' if d / t >= 10 else 'missed'})")

CG = "/sys/fs/cgroup/cpu"

def throttled_run(extra, epochs, target, stop_at_target):
    """Runs the MLP (its own cosine schedule) with worker 1 in a 50% cgroup; returns (seconds
    to target or None, last accuracy). stop_at_target: SIGTERM the job once it got there."""
    name = f"dtrain_ps_bench_{os.getpid()}"
    cg = os.path.join(CG, name)
    os.makedirs(cg, exist_ok=True)
    with open(os.path.join(cg, "cpu.cfs_period_us"), "w") as f: f.write("100000")
    with open(os.path.join(cg, "cpu.cfs_quota_us"), "w") as f: f.write("50000")
    out = tempfile.mkdtemp()
    args = [dtrain, "train", "examples/fashion_mlp.ini", "--set", f"train.epochs={epochs}",
            "--set", "ckpt.epoch_end=false", *extra, "--out", out]
    p = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    def reader():
        for line in p.stdout:
            m = re.search(r"rank 1 pid (\d+)", line)
            if m:
                with open(os.path.join(cg, "cgroup.procs"), "w") as f: f.write(m.group(1))
    th = threading.Thread(target=reader)
    th.start()
    hit, acc = None, 0.0
    ev = os.path.join(out, "events.jsonl")
    while p.poll() is None:
        time.sleep(0.5)
        hit, acc, _ = scan(ev, target)
        if hit is not None and stop_at_target:
            p.terminate()
            break
    p.wait()
    th.join()
    hit, acc, ep = scan(ev, target)
    os.rmdir(cg)
    subprocess.run(["rm", "-rf", out])
    return hit, acc, ep

def scan(ev, target):
    """(time of the first epoch record at or above target or None, the last accuracy,
    the number of epoch records up to and with that first one)"""
    hit, acc, n, ep = None, 0.0, 0, None
    try:
        with open(ev) as f:
            for l in f:
                try:
                    e = json.loads(l)
                except ValueError:
                    continue
                if e.get("test_accuracy") is not None:
                    acc = e["test_accuracy"]
                    n += 1
                    if hit is None and acc >= target:
                        hit, ep = e.get("time"), n
    except OSError:
        pass
    return hit, acc, ep

def straggler():
    """Each deployment of --straggler-servers (0: colocated servers; S: S separate,
    unthrottled server processes), bsp and ssp(3) under identical conditions (the
    same config, the same quota on worker 1), then asp. Besides the time to 0.88,
    the epochs it took and the seconds per epoch until then: the ratio ssp/bsp is
    (their epochs' ratio) x (their seconds per epoch's ratio), i.e. how many clocks
    each needs times how fast the clocks go (docs/ps.md "ssp against bsp")."""
    if os.geteuid() != 0 or not os.access(CG, os.W_OK):
        print(f"== straggler: skipped: needs root and a writable cgroup-v1 cpu controller at {CG}")
        return
    for S in (int(x) for x in str(a.straggler_servers).split(",")):
        straggler_one(S)

def straggler_one(S):
    where = ["--servers", str(S)] if S else ["--set", "ps.colocate=true"]
    dep = f"{S} separate unthrottled server process{'es' if S > 1 else ''}" if S else \
        "colocated servers (each worker's server in its process: worker 1's under its quota too)"
    print(f"== straggler: MLP, 2 workers, {dep}, worker 1 at 50% of a core")
    runs = {"bsp": [], "ssp s=3": [], "asp": []}
    for r in range(a.reps):
        for m, extra in (("bsp", []), ("ssp s=3", ["--set", "ps.consistency=ssp", "--set", "ps.staleness=3"]),
                         ("asp", ["--set", "ps.consistency=asp"])):
            hit, acc, ep = throttled_run(["--workers", "2", *where, *extra], 20, 0.88,
                                         m != "asp")
            runs[m].append((hit, acc, ep))
            per = f", {ep} epochs, {hit / ep:.2f} s per epoch" if hit is not None else ""
            print(f"  round {r + 1}: {m}: time to 0.88 {hit if hit is None else round(hit, 1)} s{per}, "
                  f"final acc {acc:.4f}", flush=True)
    def med(m, f=lambda h, e: h):
        xs = [f(h, e) for h, _, e in runs[m] if h is not None]
        return statistics.median(xs) if xs else None
    b, s = med("bsp"), med("ssp s=3")
    tag = "colocated" if not S else f"{S} separate server{'s' if S > 1 else ''}"
    print(f"  [{tag}] median time to 0.88: bsp {b and round(b, 2)} s, ssp(3) {s and round(s, 2)} s" +
          (f", ratio {s / b:.2f} (target <= 0.75: {'met' if s / b <= 0.75 else 'missed'})" if b and s else ""))
    if b and s:
        print(f"  [{tag}] epochs to 0.88 (median): bsp {med('bsp', lambda h, e: e)}, ssp(3) "
              f"{med('ssp s=3', lambda h, e: e)}; seconds per epoch: bsp {med('bsp', lambda h, e: h / e):.2f}, "
              f"ssp(3) {med('ssp s=3', lambda h, e: h / e):.2f}")
    am = statistics.median(acc for _, acc, _ in runs['asp'])
    print(f"  [{tag}] asp final accuracy (median) {am:.4f} (target >= 0.885: {'met' if am >= 0.885 else 'missed'})")

def sparse():
    for per_user in (100, 1000):
        sparse_one(per_user)

def sparse_one(per_user):
    n = a.ratings
    users, items = max(1, n // per_user), max(1, n // per_user // 2)
    rk = a.sparse_rank
    print(f"== sparse: ratings {n} ({users} users x {items} items, {per_user} per user, rank {rk}), MF "
          f"embedding({users + items},{rk}) dot, 2 workers + 1 server, bsp, {a.sparse_epochs} epochs of "
          f"batch 1024")
    with tempfile.TemporaryDirectory() as d:
        meta = json.loads(subprocess.run(
            ["/usr/bin/python3", "tools/gen_ratings.py", "--users", str(users), "--items", str(items),
             "--ratings", str(n), "--rank", str(rk), "--out", d], check=True, capture_output=True, text=True).stdout)
        V = users + items
        args = [dtrain, "train", "examples/ratings_mf.ini", "--workers", "2", "--servers", "1",
                "--set", f"model.layers=embedding({V},{rk},std=0.1) dot",
                "--set", "optim.name=adamw", "--set", "optim.lr=0.03", "--set", "schedule.kind=cosine",
                "--set", f"train.epochs={a.sparse_epochs}", "--set", "train.batch=1024"]
        for k, f in (("train_images", "train_x"), ("train_labels", "train_y"),
                     ("test_images", "test_x"), ("test_labels", "test_y")):
            args += ["--set", f"data.{k}={d}/{f}.npy"]
        with tempfile.TemporaryDirectory() as out:
            subprocess.run(args + ["--out", out], env=env, check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            with open(os.path.join(out, "summary.json")) as f:
                s = json.load(f)
    per = (s["bytes_sent"] + s["bytes_received"]) / 2 / s["steps"]  # summed over the 2 workers
    dense = 2 * s["params"] * 4
    rmse = s["test_loss"] ** 0.5
    print(f"  bytes/step per worker {per:.0f} (push + pull of the batch's rows; evaluation's whole-model "
          f"pulls included), dense push + pull of the model {dense}: {per / dense:.4f} of dense")
    print(f"  rows touched per step per worker <= {2 * 512} of {V}; {s['samples_per_second']:.0f} samples/s")
    print(f"  test RMSE {rmse:.4f}, floor {meta['rmse_floor']:.4f} (linear {meta['rmse_floor_linear']:.4f}): "
          f"{rmse / meta['rmse_floor']:.3f}x the floor (target <= 1.05)")
    if per_user <= 100:
        print("  (the bound at ~100 ratings per user, tools/ratings_bound.py: rank 2 oracle 1.027x, "
              "ALS 1.026x; rank 8 1.051x / 1.076x: docs/ps.md)")

def out_sha(out):
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)["params_sha256"]

def wait_first_event(out):
    """Waits (60 s at most) for the run's first line in events.jsonl: the kill parts kill after it."""
    ev = os.path.join(out, "events.jsonl")
    t_end = time.time() + 60
    while time.time() < t_end and not (os.path.exists(ev) and os.path.getsize(ev) > 0):
        time.sleep(0.01)

def log_stamp(line):
    """The UTC time a dtrain log line carries at its start, or None."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z", line)
    return datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=datetime.timezone.utc).timestamp() if m else None

def start_then_kill(args, out, rank):
    """Starts args --out out, waits for its first event, SIGKILLs rank: (process, pids, kill time)."""
    p = subprocess.Popen(args + ["--out", out], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    pids = {}
    for line in p.stdout:
        pids = {int(k): int(v) for k, v in re.findall(r"rank (\d+) pid (\d+)", line)}
        if pids:
            break
    wait_first_event(out)
    t_kill = time.time()
    os.kill(pids[rank], 9)
    return p, pids, t_kill

def ref_sha(args):
    """params_sha256 of a run of args without kills (the kill parts' reference)."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(args + ["--out", out], env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        return out_sha(out)

def failover():
    ep = a.failover_epochs
    print(f"== failover: MLP, 2 workers + 2 servers, ps.replicas=2, bsp, {ep} epochs of 3200 samples; "
          f"server 0 SIGKILLed after epoch 1 ({a.failover_reps} runs)")
    args = [dtrain, "train", "examples/fashion_mlp.ini", "--workers", "2", "--servers", "2",
            "--set", "ps.replicas=2", "--set", f"train.epochs={ep}", "--set", "data.limit_train=3200",
            "--set", "data.limit_test=500", "--set", "ckpt.epoch_end=false"]
    ref = ref_sha(args)
    times, same = [], 0
    for r in range(a.failover_reps):
        with tempfile.TemporaryDirectory() as out:
            p, _, t_kill = start_then_kill(args, out, 2)
            _, err = p.communicate(timeout=300)
            done = [float(x) for x in re.findall(r"completed [0-9.]+ s after server 0 was lost "
                                                 r"\(at unix time ([0-9.]+)\)", err)]
            sha = out_sha(out) if p.returncode == 0 else None
            same += sha == ref
            if len(done) == 2:
                times.append(max(done) - t_kill)
                print(f"  run {r + 1}: SIGKILL -> both workers' next clock {times[-1]:.3f} s, exit "
                      f"{p.returncode}, params_sha256 {'same as' if sha == ref else 'differs from'} "
                      f"the run without the kill", flush=True)
            else:
                print(f"  run {r + 1}: exit {p.returncode}, {len(done)} workers reported a completed "
                      f"clock: {err[-400:]}", flush=True)
    if times:
        med = statistics.median(times)
        print(f"  median SIGKILL -> first completed clock {med:.3f} s (target <= 2 s: "
              f"{'met' if med <= 2 else 'missed'}); params_sha256 unchanged in {same} of "
              f"{a.failover_reps} runs")

def rereplicate():
    """Re-replication (docs/ps.md): 3 servers, 2 copies of each range; server
    0 SIGKILLed after epoch 1, then, once both new copies are in, server 1
    (range 0's new primary). Prints the time from the first SIGKILL to the
    later of the two "holds its copy" lines (their own timestamps) and
    whether bsp ends with the params_sha256 of the run without kills."""
    ep = a.failover_epochs
    print(f"== re-replication: MLP, 2 workers + 3 servers, ps.replicas=2, bsp, {ep} epochs of 3200 "
          f"samples; server 0 SIGKILLed after epoch 1, server 1 once both new copies are in "
          f"({a.failover_reps} runs)")
    args = [dtrain, "train", "examples/fashion_mlp.ini", "--workers", "2", "--servers", "3",
            "--set", "ps.replicas=2", "--set", f"train.epochs={ep}", "--set", "data.limit_train=3200",
            "--set", "data.limit_test=500", "--set", "ckpt.epoch_end=false"]
    ref = ref_sha(args)
    def stamp(line):  # the log line's own UTC time (now if it has none)
        return log_stamp(line) or time.time()
    times, same = [], 0
    for r in range(a.failover_reps):
        with tempfile.TemporaryDirectory() as out:
            p, pids, t_kill = start_then_kill(args, out, 2)
            copies, err = [], []
            for line in p.stderr:
                err.append(line)
                if "holds its copy of keys" in line:
                    copies.append(stamp(line))
                    if len(copies) == 2:
                        break
            if len(copies) == 2:
                os.kill(pids[3], 9)
            _, rest = p.communicate(timeout=300)
            sha = out_sha(out) if p.returncode == 0 else None
            same += sha == ref
            if len(copies) == 2:
                times.append(max(copies) - t_kill)
                print(f"  run {r + 1}: SIGKILL -> both new copies in {times[-1]:.3f} s, then server 1 "
                      f"killed: exit {p.returncode}, params_sha256 "
                      f"{'same as' if sha == ref else 'differs from'} the run without kills", flush=True)
            else:
                print(f"  run {r + 1}: exit {p.returncode}, {len(copies)} copies: "
                      f"{(''.join(err) + rest)[-400:]}", flush=True)
    if times:
        print(f"  median SIGKILL -> both new copies in {statistics.median(times):.3f} s; "
              f"params_sha256 unchanged after both kills in {same} of {a.failover_reps} runs")

def rejoin():
    """A restarted server rejoins (docs/ps.md): 2 workers, 2 servers, 2 copies of each range
    (no free server), bsp, under dtrain launch with a known store; server 0 SIGKILLed after
    epoch 1, a new process started in its slot (dtrain launch --join, DTRAIN_PS_REJOIN=0) once
    both workers reported the loss, then, once it holds both copies, server 1 SIGKILLed.
    Prints the time from the newcomer's start to its later "holds its copy" line (it waits
    for the workers' next epoch end) and whether bsp ends with the run without kills'
    params_sha256. At least 16 epochs (the newcomer loads the data, then waits for an epoch's
    end: it must come before the run's last)."""
    ep = max(a.failover_epochs, 16)
    print(f"== rejoin: MLP, 2 workers + 2 servers, ps.replicas=2, bsp, {ep} epochs of 3200 samples; "
          f"server 0 SIGKILLed after epoch 1, a new server 0 started, server 1 SIGKILLed once it "
          f"holds its copies ({a.failover_reps} runs)")
    tok = "0123456789abcdef0123456789abcdef"
    renv = dict(env, DTRAIN_JOB_TOKEN=tok)
    cfg = ["examples/fashion_mlp.ini", "--set", "ps.servers=2", "--set", "ps.replicas=2",
           "--set", f"train.epochs={ep}", "--set", "data.limit_train=3200",
           "--set", "data.limit_test=500", "--set", "ckpt.epoch_end=false"]
    def port():
        import socket
        with socket.socket() as so:
            so.bind(("127.0.0.1", 0))
            return so.getsockname()[1]
    def job(P):
        return [dtrain, "launch", "--rdzv", f"127.0.0.1:{P}", "--nproc-per-node", "4", "--", "train"] + cfg
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(job(port()) + ["--out", out], env=renv, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        ref = out_sha(out)
    times, same = [], 0
    for r in range(a.failover_reps):
        P = port()
        with tempfile.TemporaryDirectory() as out:
            p = subprocess.Popen(job(P) + ["--out", out], env=renv, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
            pids, log = {}, []
            for line in p.stdout:
                log.append(line)
                pids = {int(k): int(v) for k, v in re.findall(r"rank (\d+) pid (\d+)", line)}
                if pids:
                    break
            wait_first_event(out)
            os.kill(pids[2], 9)
            for line in p.stdout:
                log.append(line)
                if sum("server 0 (rank 2) lost at clock" in x for x in log) >= 2:
                    break
            t0 = time.time()
            q = subprocess.Popen([dtrain, "launch", "--join", "--rdzv", f"127.0.0.1:{P}", "--",
                                  "train"] + cfg + ["--set", "dist.workers=2"],
                                 env=dict(renv, DTRAIN_PS_REJOIN="0"), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
            copies = []
            for line in q.stderr:
                if "holds its copy of keys" in line:
                    copies.append(log_stamp(line) or time.time())
                    if len(copies) == 2:
                        break
            if len(copies) == 2:
                os.kill(pids[3], 9)
            rest, _ = p.communicate(timeout=300)
            q.communicate(timeout=60)
            sha = out_sha(out) if p.returncode == 0 else None
            if len(copies) == 2:
                same += sha == ref
                times.append(max(copies) - t0)
                print(f"  run {r + 1}: newcomer started -> both copies in {times[-1]:.3f} s, then "
                      f"server 1 killed: exit {p.returncode} (newcomer {q.returncode}), params_sha256 "
                      f"{'same as' if sha == ref else 'differs from'} the run without kills", flush=True)
            else:
                print(f"  run {r + 1}: exit {p.returncode} (newcomer {q.returncode}), {len(copies)} "
                      f"copies (the run ended first?): {(''.join(log) + rest)[-300:]}", flush=True)
    if times:
        print(f"  median newcomer start -> both copies in {statistics.median(times):.3f} s; "
              f"params_sha256 unchanged after the kills and the rejoin in {same} of "
              f"{len(times)} runs that rejoined ({a.failover_reps} runs)")

def workers():
    """Elastic workers (docs/ps.md "Workers leaving and joining"): 3 workers, 1 server, bsp,
    dist.min_workers=2 and one spare (--standby 1); worker 2 SIGKILLed after epoch 1. Prints
    the time from the SIGKILL to the server's first clock closed without it (its own log
    line's timestamp) and to the spare's admission (at the members' next epoch end)."""
    ep = a.failover_epochs
    print(f"== workers: MLP, 3 workers + 1 server + 1 spare, bsp, dist.min_workers=2, {ep} epochs "
          f"of 3200 samples; worker 2 SIGKILLed after epoch 1 ({a.failover_reps} runs)")
    args = [dtrain, "train", "examples/fashion_mlp.ini", "--workers", "3", "--servers", "1",
            "--standby", "1", "--set", "dist.min_workers=2", "--set", f"train.epochs={ep}",
            "--set", "data.limit_train=3200", "--set", "data.limit_test=500",
            "--set", "ckpt.epoch_end=false"]
    stamp = log_stamp
    clk, adm = [], []
    for r in range(a.failover_reps):
        with tempfile.TemporaryDirectory() as out:
            p, _, t_kill = start_then_kill(args, out, 2)
            _, err = p.communicate(timeout=300)
            c = [stamp(l) for l in err.splitlines() if "s after worker 2 was lost" in l]
            j = [stamp(l) for l in err.splitlines() if re.search(r"joiner \d+ is worker 2", l)]
            ok = p.returncode == 0 and c and j and c[0] and j[0]
            if ok:
                clk.append(c[0] - t_kill)
                adm.append(j[0] - t_kill)
                print(f"  run {r + 1}: SIGKILL -> first clock without it {clk[-1]:.3f} s, -> spare "
                      f"admitted {adm[-1]:.3f} s, exit 0", flush=True)
            else:
                print(f"  run {r + 1}: exit {p.returncode}: {err[-400:]}", flush=True)
    if clk:
        print(f"  median SIGKILL -> first clock without the lost worker {statistics.median(clk):.3f} s; "
              f"-> spare admitted {statistics.median(adm):.3f} s ({len(clk)} of {a.failover_reps} runs)")

def breakdown():
    """Where a step's time goes: one traced epoch of the MLP per mode (2 workers,
    global batch 64), the mean of each span per step and rank: forward,
    backward (which includes the pushes made during it), push per key (the
    local key's includes its server's aggregation, optimizer step and
    replies), and the wait for parameters at the step's end."""
    print("== breakdown: MLP, 2 workers, global batch 64, 1 epoch traced (us per step, per rank)")
    for label, extra in (("ddp", MODES["ddp"]), ("ps bsp colocated", MODES["ps bsp colocated"]),
                         ("ps bsp coloc. pieces", MODES["ps bsp coloc. pieces"]),
                         ("ps asp colocated", MODES["ps asp colocated"]),
                         ("ps asp coloc. lazy", MODES["ps asp coloc. lazy"])):
        xenv = dict(env, **dict(x.split("=", 1) for x in extra if x.startswith("DTRAIN_")))
        args = [x for x in extra if not x.startswith("DTRAIN_")]
        with tempfile.TemporaryDirectory() as out:
            subprocess.run([dtrain, "train", "examples/fashion_mlp.ini", *common, "--set",
                            "train.epochs=1", *args, "--set", "obs.trace=true", "--out", out],
                           env=xenv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with open(os.path.join(out, "trace.json")) as f:
                t = json.load(f)
            with open(os.path.join(out, "summary.json")) as f:
                sps = json.load(f)["samples_per_second"]
        ev = t["traceEvents"] if isinstance(t, dict) else t
        tot, cnt = {}, {}
        for e in ev:
            if e.get("ph") != "X":
                continue
            name = e["name"]
            if name == "push":
                name = f"push key {e.get('args', {}).get('n', '?')}"
            k = (e["pid"], name)
            tot[k] = tot.get(k, 0.0) + e["dur"]
            cnt[k] = cnt.get(k, 0) + 1
        print(f"  {label}: {sps:.0f} samples/s")
        for rank in sorted({k[0] for k in tot}):
            steps = cnt.get((rank, "step"), 1)
            parts = [(n, tot[(r, n)] / steps) for (r, n) in sorted(tot) if r == rank and
                     n in ("step", "forward", "backward", "pull", "reduce+update", "allreduce") or
                     (r == rank and n.startswith("push key"))]
            print(f"    rank {rank}: " + ", ".join(f"{n} {v:.0f}" for n, v in parts))

for part in a.parts.split(","):
    {"speed": speed, "rpc": rpc, "straggler": straggler, "sparse": sparse,
     "failover": failover, "rejoin": rejoin, "rereplicate": rereplicate, "workers": workers,
     "breakdown": breakdown}[part]()
    print(flush=True)
