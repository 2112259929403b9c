#!/usr/bin/env python3
"""straggler.py — one slow worker, for real: a cgroup CPU quota (bench/straggler.sh).

Two workers on this 2-core machine, one of them limited to QUOTA of a core by a
cgroup (v1 cpu.cfs_quota_us / cpu.cfs_period_us under /sys/fs/cgroup/cpu, or
v2 cpu.max), so the ideal is (1 + QUOTA) x the speed of one unthrottled worker.
Per model and round, back to back: dtrain with 1 worker (the reference), with
2 workers static and dynamic under the throttle, and both without it;
deterministic mode static / dynamic under the throttle (params_sha256 compared
with the 1-worker deterministic run); PyTorch 1.13 DDP (Gloo, 2 processes, the
second in the same cgroup) with and without it. Prints medians, the fraction of
the ideal, dynamic / static, the no-straggler cost, and PyTorch's slowdown
against its own unthrottled run. --accuracy adds full runs (the example's epoch
budget) with dynamic under the throttle. Every cgroup made is removed.

The throttled worker is found by the launcher's "workers: rank 0 pid X, rank 1
pid Y" line (not by sorting its children's pids, which wrap around on a busy
machine: the throttle then missed) and moved into the cgroup as soon as it exists; PyTorch's rank 1 moves itself (bench/peers/
fmnist_ddp_cgroup.py). Standard library only; needs root.
"""
import argparse, collections, json, os, random, re, statistics, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("--build", default="build/release")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--models", default="mlp,cnn")
ap.add_argument("--quota", type=float, default=0.5)
ap.add_argument("--epochs", default="mlp:3,cnn:1")
ap.add_argument("--limit", default="mlp:0,cnn:20000", help="data.limit_train per model (0: all)")
ap.add_argument("--accuracy", action="store_true")
ap.add_argument("--no-torch", action="store_true")
ap.add_argument("--no-det", action="store_true")
ap.add_argument("--runs", default="",
                help="only these runs of each round, comma-separated (e.g. det_1w,det_steal_thr,"
                     "det_steal_thr_nobackup); the summary lines then print what they can")
ap.add_argument("--stop", type=float, default=0, help="also freeze 1 of 3 workers this many seconds")
ap.add_argument("--boost", action="store_true",
                help="on a loaded machine: every run in cgroups with the largest cpu.shares, so "
                     "the other processes on the machine do not decide who is slow (the throttled "
                     "worker keeps its quota)")
a = ap.parse_args()

dtrain = os.path.join(a.build, "dtrain")
env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
common = ["--set", "optim.name=sgd", "--set", "optim.lr=0.05", "--set", "optim.momentum=0.9",
          "--set", "optim.weight_decay=0", "--set", "schedule.kind=constant",
          "--set", "schedule.warmup_steps=0", "--set", "train.batch=64",
          "--set", "train.eval_every=1000"]
epochs = dict(kv.split(":") for kv in a.epochs.split(","))
limits = dict(kv.split(":") for kv in a.limit.split(","))


class Cgroup:
    """A CPU-quota cgroup of our own, removed on close."""

    def __init__(self, quota, tag="", shares=0):
        name = f"dtrain_straggler_{os.getpid()}{tag}"
        v1 = "/sys/fs/cgroup/cpu"
        v2 = "/sys/fs/cgroup/unified"
        self.path = None
        if os.path.exists(os.path.join(v1, "cpu.cfs_quota_us")):
            self.path = os.path.join(v1, name)
            os.mkdir(self.path)
            period = int(open(os.path.join(self.path, "cpu.cfs_period_us")).read())
            if quota > 0:
                with open(os.path.join(self.path, "cpu.cfs_quota_us"), "w") as f:
                    f.write(str(int(period * quota)))
            if shares:
                with open(os.path.join(self.path, "cpu.shares"), "w") as f:
                    f.write(str(shares))
        elif os.path.exists(os.path.join(v2, "cgroup.controllers")) and \
                "cpu" in open(os.path.join(v2, "cgroup.controllers")).read():
            self.path = os.path.join(v2, name)
            os.mkdir(self.path)
            if quota > 0:
                with open(os.path.join(self.path, "cpu.max"), "w") as f:
                    f.write(f"{int(100000 * quota)} 100000")
            if shares:
                with open(os.path.join(self.path, "cpu.weight"), "w") as f:
                    f.write("10000")
        else:
            raise OSError("no writable cgroup cpu controller (v1 cpu.cfs_quota_us or v2 cpu.max)")
        self.procs = os.path.join(self.path, "cgroup.procs")

    def throttled(self):
        """Periods in which the group ran out of quota so far (cpu.stat nr_throttled)."""
        try:
            for line in open(os.path.join(self.path, "cpu.stat")):
                k, v = line.split()
                if k == "nr_throttled":
                    return int(v)
        except OSError:
            pass
        return -1

    def add(self, pid):
        with open(self.procs, "w") as f:
            f.write(str(pid))

    def close(self):
        # anything left goes back to the root group, then the group goes
        root = os.path.dirname(self.path)
        for _ in range(50):
            try:
                for p in open(self.procs).read().split():
                    try:
                        with open(os.path.join(root, "cgroup.procs"), "w") as f:
                            f.write(p)
                    except OSError:
                        pass
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


def run_dtrain(model, workers, balance="static", det=False, throttle=None, rank=1, extra=(),
               full=False, stop=None, env_add=None):
    opts = common if not full else []  # full runs: the example's own settings and budget
    args = [dtrain, "train", f"examples/fashion_{model}.ini", *opts,
            "--workers", str(workers), "--set", f"dist.balance={balance}"]
    if not full:
        args += ["--set", f"train.epochs={epochs[model]}"]
        if int(limits[model]):
            args += ["--set", f"data.limit_train={limits[model]}"]
    if det:
        args += ["--set", "dist.deterministic=true"]
    args += list(extra)
    if boost:
        # the launcher joins the boosted group before it forks the workers
        args = ["sh", "-c", f'echo $$ > {boost.procs} && exec "$@"', "sh"] + args
    thr0 = throttle.throttled() if throttle else 0
    with tempfile.TemporaryDirectory() as out:
        log = os.path.join(out, "stdout.txt")
        p = subprocess.Popen(args + ["--out", out], env=dict(env, **(env_add or {})),
                             stdout=open(log, "w"), stderr=subprocess.PIPE, text=True)
        target = None
        if throttle or stop:
            # the launcher prints "workers: rank 0 pid X, rank 1 pid Y" before
            # training; not the children sorted by pid, which wrap around on a
            # busy machine (the throttle then missed, or hit the sweeper)
            t_end = time.time() + 30
            while time.time() < t_end and p.poll() is None:
                m = re.search(rf"rank {rank} pid (\d+)", open(log).read())
                if m:
                    target = int(m.group(1))
                    break
                time.sleep(0.002)
            if throttle and not target:
                raise RuntimeError(f"{' '.join(args)}: rank {rank}'s pid not printed: no throttle")
            if target and throttle:
                throttle.add(target)
                try:
                    inside = os.path.basename(throttle.path) in open(f"/proc/{target}/cgroup").read()
                except OSError:
                    inside = p.poll() is not None
                if not inside:
                    raise RuntimeError(f"rank {rank} (pid {target}) is not in {throttle.path}")
        if stop and target:
            # mid-training: once the first epoch is recorded
            secs = stop
            ev = os.path.join(out, "events.jsonl")
            while p.poll() is None and not (os.path.exists(ev) and os.path.getsize(ev) > 0):
                time.sleep(0.01)
            os.kill(target, 19)  # SIGSTOP
            t_stop = time.time()
            time.sleep(secs)
            os.kill(target, 18)  # SIGCONT
        _, err = p.communicate()
        if p.returncode:
            raise RuntimeError(f"{' '.join(args)}: exit {p.returncode}: {err}")
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
    s["stderr"] = err
    # periods in which the quota bit (a paced worker stays under it: 0 is fine)
    s["throttled_periods"] = throttle.throttled() - thr0 if throttle else None
    if stop and target:
        # the others' first step without the frozen worker (wall clock, in the log)
        m = re.search(r"first step of generation 1 done at wall clock ([0-9.]+)", err)
        s["stalled_s"] = float(m.group(1)) - t_stop if m else None
    return s


def run_torch(model, throttle=None):
    penv = dict(env, MASTER_PORT=str(random.randint(20000, 30000)))
    if throttle:
        penv["STRAGGLER_CGROUP_PROCS"] = throttle.procs
    args = ["/usr/bin/python3", "bench/peers/fmnist_ddp_cgroup.py", "2",
            "--model", model, "--epochs", "1", "--batch", "32", "--lr", "0.05"]
    if boost:
        # boosted like dtrain's runs (rank 1 then moves itself into the quota group)
        args = ["sh", "-c", f'echo $$ > {boost.procs} && exec "$@"', "sh"] + args
    out = subprocess.run(args, env=penv, check=True, capture_output=True, text=True).stdout
    m = re.search(r"samples_per_s (\d+) test_acc ([\d.]+)", out)
    return float(m.group(1))


def torch_thr(model):
    t0 = cg.throttled()
    sps = run_torch(model, throttle=cg)
    return {"samples_per_second": sps, "throttled_periods": cg.throttled() - t0}


def med(v):
    return statistics.median(v) if v else float("nan")


# a background job ignores SIGINT: end on SIGTERM through the finally below too
import signal
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
cg = Cgroup(a.quota, shares=262144 if a.boost else 0)
boost = Cgroup(0, "_boost", 262144) if a.boost else None
try:
    print(f"# straggler bench: 2 workers, one limited to {a.quota:.0%} of a core by cgroup "
          f"({cg.path}{', all runs boosted' if boost else ''}); ideal = {1 + a.quota:.2f} x one unthrottled worker; {a.reps} rounds, "
          f"load average {' '.join(open('/proc/loadavg').read().split()[:3])}", flush=True)
    for model in (a.models.split(",") if a.reps > 0 else []):
        R = {}
        shas = {}
        runs = [
            ("1w", lambda: run_dtrain(model, 1)),
            ("static_thr", lambda: run_dtrain(model, 2, "static", throttle=cg)),
            ("dynamic_thr", lambda: run_dtrain(model, 2, "dynamic", throttle=cg)),
            ("static", lambda: run_dtrain(model, 2, "static")),
            ("dynamic", lambda: run_dtrain(model, 2, "dynamic")),
        ]
        if not a.no_det:
            runs += [
                ("det_1w", lambda: run_dtrain(model, 1, det=True)),
                ("det_static", lambda: run_dtrain(model, 2, "static", det=True)),
                ("det_static_thr", lambda: run_dtrain(model, 2, "static", det=True, throttle=cg)),
                ("det_dynamic_thr", lambda: run_dtrain(model, 2, "dynamic", det=True, throttle=cg)),
                ("det_steal_thr", lambda: run_dtrain(model, 2, "steal", det=True, throttle=cg)),
                # the same without backup copies (DTRAIN_STEAL_BACKUP=0): what they change
                ("det_steal_thr_nobackup", lambda: run_dtrain(model, 2, "steal", det=True, throttle=cg,
                                                              env_add={"DTRAIN_STEAL_BACKUP": "0"})),
                ("det_steal", lambda: run_dtrain(model, 2, "steal", det=True)),
            ]
        if not a.no_torch:
            runs += [("torch", lambda: {"samples_per_second": run_torch(model)}),
                     ("torch_thr", lambda: torch_thr(model))]
        want = set(a.runs.split(",")) if a.runs else None
        runs = [(k, f) for k, f in runs if want is None or k in want]
        backups = {}
        for rep in range(a.reps):
            for key, f in runs:
                s = f()
                R.setdefault(key, []).append(s["samples_per_second"])
                if "params_sha256" in s:
                    shas.setdefault(key, set()).add(s["params_sha256"])
                if s.get("throttled_periods") is not None and "per_worker" in s:
                    pw = s["per_worker"]
                    print(f"#   {key}: share {' '.join(str(round(w.get('share', 0), 3)) for w in pw)}, "
                          f"wait s {' '.join(str(round(w.get('wait_seconds', 0), 2)) for w in pw)}, "
                          f"train s {s.get('train_seconds', 0):.2f}, quota bit in "
                          f"{s['throttled_periods']} periods", flush=True)
                if "backups" in s:
                    backups.setdefault(key, []).append((s["backups"], s["backups_won"]))
            print(f"# {model} round {rep + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in R.items()),
                  flush=True)
        for k, v in backups.items():
            print(f"# {model} {k}: backup copies ran / counted per run: "
                  + " ".join(f"{int(x)}/{int(y)}" for x, y in v))
        m = collections.defaultdict(lambda: float("nan"), {k: med(v) for k, v in R.items()})
        ideal = (1 + a.quota) * m["1w"]
        print(f"{model}: 1 worker {m['1w']:.0f} samples/s; ideal with the throttle {ideal:.0f}")
        for k in ("static_thr", "dynamic_thr"):
            print(f"{model}: {k:16s} {m[k]:8.0f} samples/s = {m[k] / ideal:.3f} of ideal")
        print(f"{model}: dynamic / static under the throttle: {m['dynamic_thr'] / m['static_thr']:.3f}")
        print(f"{model}: no straggler: static {m['static']:.0f}, dynamic {m['dynamic']:.0f}: "
              f"dynamic costs {1 - m['dynamic'] / m['static']:+.3f}")
        if not a.no_det:
            print(f"{model}: deterministic: 1 worker {m['det_1w']:.0f}, 2 static {m['det_static']:.0f} "
                  f"(vs normal 2 static: {m['static'] / m['det_static']:.2f}x slower); throttled: "
                  f"static {m['det_static_thr']:.0f} = {m['det_static_thr'] / ideal:.3f} of ideal, "
                  f"dynamic {m['det_dynamic_thr']:.0f} = {m['det_dynamic_thr'] / ideal:.3f} of ideal, "
                  f"steal {m['det_steal_thr']:.0f} = {m['det_steal_thr'] / ideal:.3f} of ideal "
                  f"(det ideal {(1 + a.quota) * m['det_1w']:.0f}: steal "
                  f"{m['det_steal_thr'] / ((1 + a.quota) * m['det_1w']):.3f} of it)")
            print(f"{model}: deterministic, no straggler: static {m['det_static']:.0f}, steal "
                  f"{m['det_steal']:.0f}: steal costs {1 - m['det_steal'] / m['det_static']:+.3f}")
            det_ideal = (1 + a.quota) * m["det_1w"]
            print(f"{model}: steal under the throttle: with backups {m['det_steal_thr']:.0f} = "
                  f"{m['det_steal_thr'] / det_ideal:.3f} of the det ideal, without "
                  f"{m['det_steal_thr_nobackup']:.0f} = {m['det_steal_thr_nobackup'] / det_ideal:.3f}")
            keys = [k for k in shas if k.startswith("det_")]
            hs = set().union(*(shas[k] for k in keys)) if keys else set()
            print(f"{model}: deterministic params_sha256 equal across {', '.join(keys)}: "
                  f"{len(hs) == 1} ({sorted(hs)[0][:16] if hs else '-'}...)")
        if not a.no_torch:
            print(f"{model}: PyTorch DDP 2 procs: {m['torch']:.0f} unthrottled, {m['torch_thr']:.0f} "
                  f"throttled: slowdown {m['torch'] / m['torch_thr']:.2f}x; dtrain static "
                  f"{m['static'] / m['static_thr']:.2f}x, dynamic {m['dynamic'] / m['dynamic_thr']:.2f}x")
        sys.stdout.flush()
    if a.stop:
        # 3 workers, one frozen for STOP seconds mid-run, taken over through
        # elastic training (dist.min_workers = 2, heartbeat 0.5 s): the time
        # the others made no progress (SIGSTOP to their first step without it)
        model = a.models.split(",")[0]
        el = ["--set", "train.epochs=4", "--set", "dist.min_workers=2",
              "--set", "dist.heartbeat_timeout=0.5"]
        for bal, det in (("dynamic", False), ("steal", True)):
            base = run_dtrain(model, 3, bal, det=det, extra=el)
            hit = run_dtrain(model, 3, bal, det=det, extra=el, stop=a.stop, rank=2)
            st = hit.get("stalled_s")
            print(f"{model}: 3 workers, rank 2 SIGSTOPped {a.stop:.0f} s after epoch 1 ({bal}"
                  f"{', deterministic' if det else ''}): no progress for "
                  f"{st if st is None else round(st, 2)} s; train {base['train_seconds']:.2f} s "
                  f"undisturbed, {hit['train_seconds']:.2f} s frozen ({hit['workers']} workers at "
                  f"the end); accuracy {base['test_accuracy']:.4f} vs {hit['test_accuracy']:.4f}"
                  + (f"; params_sha256 equal: {base['params_sha256'] == hit['params_sha256']}"
                     if det else ""), flush=True)
    if a.accuracy:
        for model in a.models.split(","):
            s = run_dtrain(model, 2, "dynamic", throttle=cg, full=True)
            print(f"{model}: accuracy, dynamic under the throttle, {s['epochs']} epochs: "
                  f"{s['test_accuracy']:.4f} ({s['samples_per_second']:.0f} samples/s; "
                  f"rank 1 share {s['per_worker'][1].get('share', 0):.3f})", flush=True)
finally:
    cg.close()
    if boost:
        boost.close()
