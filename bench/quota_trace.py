#!/usr/bin/env python3
"""quota_trace.py — where dist.balance = dynamic loses under a CPU quota (issue 12).

One command, MLP by default, 3 epochs each: dtrain with 1 worker (the
reference), then 2 workers with rank 1 in a cgroup limited to --quota of a
core (cgroup v1 cpu.cfs_quota_us), static and dynamic, every run in cgroups
with the largest cpu.shares so other processes on the machine do not decide
who is slow. Each throttled run records a Chrome trace of its last 400 steps
(obs.trace) and prints, per rank over the last 300 steps: samples per step,
the per-sample cost (forward + backward + data over samples, steps without a
stall), the per-step fixed work (the exchange and optimizer span
"reduce+update", median over steps without a stall), the share of wall time inside
stalls (the excess of spans that took >= 5 ms and twice their usual time
on that rank — forward and backward per sample: the throttled rank's quota
ran out and everyone waits), and the cgroup's throttled periods. Then the fraction of the ideal
((1 + quota) x one worker) reached, and the best a perfect speed split could
reach with the measured per-sample cost c and fixed work F0, F1:
T = F0 + n0 c = (F1 + n1 c) / quota, n0 + n1 = batch. Needs root (cgroup v1
cpu controller); every cgroup made is removed. Standard library only.

    python3 bench/quota_trace.py --build build/release
    python3 bench/quota_trace.py --build build/release --reps 5 --ab DTRAIN_WINDOW_SPIN_US=0
    python3 bench/quota_trace.py --build build/release --ab-only --reps 4 --ab-bin OLD/dtrain
    python3 bench/quota_trace.py --build build/release --ab-only --reps 4 --epochs 1 \
        --ab-balance steal --ab-bin OLD/dtrain     # deterministic mode, hashes printed

--ab-bin pairs another binary (A, e.g. main's) against --build's (B) under
the quota, the order flipping every pair, and prints B/A's paired median.
"""
import argparse, collections, json, os, re, signal, statistics, subprocess, sys, tempfile, time

# SIGTERM (a killed bench) unwinds like an error: the finally clauses stop the
# job and remove the cgroups this run made
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

ap = argparse.ArgumentParser()
ap.add_argument("--build", default="build/release")
ap.add_argument("--model", default="mlp")
ap.add_argument("--quota", type=float, default=0.5)
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--reps", type=int, default=1)
ap.add_argument("--set", action="append", default=[], help="section.key=value for every run")
ap.add_argument("--ab", action="append", default=[], metavar="VAR=VALUE",
                help="then --reps interleaved pairs of --ab-balance under the quota, as is and with this "
                     "environment (e.g. DTRAIN_WINDOW_SPIN_US=0), and their paired ratio")
ap.add_argument("--ab-only", action="store_true", help="only the --ab / --ab-bin pairs (no reference runs)")
ap.add_argument("--ab-bin", metavar="DTRAIN",
                help="then --reps interleaved pairs under the quota, this other binary (e.g. main's) "
                     "against --build's, with --ab-balance, and their paired ratio (the order flips "
                     "every pair)")
ap.add_argument("--ab-balance", default="dynamic",
                help="dist.balance of the --ab and --ab-bin pairs (steal runs in deterministic mode "
                     "and prints params_sha256)")
a = ap.parse_args()
root_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
dtrain = os.path.join(a.build, "dtrain")
cg_root = "/sys/fs/cgroup/cpu"
if not os.path.exists(os.path.join(cg_root, "cpu.cfs_quota_us")):
    sys.exit("quota_trace.py: no cgroup v1 cpu controller at /sys/fs/cgroup/cpu")
BATCH = 64


def mkcg(name, quota_us):
    p = os.path.join(cg_root, f"dtrain_qt_{os.getpid()}_{name}")
    os.makedirs(p, exist_ok=True)
    open(os.path.join(p, "cpu.shares"), "w").write("262144")
    open(os.path.join(p, "cpu.cfs_quota_us"), "w").write(str(quota_us))
    return p


def rmcg(p):
    for pid in open(os.path.join(p, "cgroup.procs")).read().split():
        try:
            open(os.path.join(cg_root, "cgroup.procs"), "w").write(pid)
        except OSError:
            pass
    for _ in range(50):
        try:
            os.rmdir(p)
            return
        except OSError:
            time.sleep(0.1)


def cpustat(p):
    return {k: int(v) for k, v in (l.split() for l in open(os.path.join(p, "cpu.stat")))}


def run(workers, balance, throttle, extra_env=None, binary=None):
    period = int(open(os.path.join(cg_root, "cpu.cfs_period_us")).read())
    boost = mkcg("boost", -1)
    slow = mkcg("slow", int(a.quota * period) if throttle else -1)
    p = None
    try:
        with tempfile.TemporaryDirectory() as out:
            args = [binary or dtrain, "train", os.path.join(root_dir, "examples", f"fashion_{a.model}.ini"),
                    "--set", "optim.name=sgd", "--set", "optim.lr=0.05", "--set", "optim.momentum=0.9",
                    "--set", "schedule.kind=constant", "--set", f"train.batch={BATCH}",
                    "--set", "train.eval_every=1000", "--set", f"train.epochs={a.epochs}",
                    "--set", f"dist.balance={balance}", "--set", "obs.trace=true",
                    "--set", "obs.trace_steps=400", "--workers", str(workers), "--out", out]
            if balance == "steal":
                args += ["--set", "dist.deterministic=true"]
            for kv in a.set:
                args += ["--set", kv]
            log = os.path.join(out, "stdout.txt")
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", **(extra_env or {}))
            st0 = cpustat(slow)
            p = subprocess.Popen(args, env=env, stdout=open(log, "w"), stderr=subprocess.DEVNULL,
                                 preexec_fn=lambda: open(os.path.join(boost, "cgroup.procs"), "w").write(str(os.getpid())))
            moved = workers == 1
            while p.poll() is None and not moved:
                m = re.search(r"rank 1 pid (\d+)", open(log).read())
                if m:
                    open(os.path.join(slow, "cgroup.procs"), "w").write(m.group(1))
                    try:
                        moved = os.path.basename(slow) in open(f"/proc/{m.group(1)}/cgroup").read()
                    except OSError:
                        moved = True  # already gone
                    if not moved:
                        raise RuntimeError(f"rank 1 (pid {m.group(1)}) is not in {slow}")
                time.sleep(0.002)
            if p.wait():
                raise RuntimeError(f"{' '.join(args)}: exit {p.returncode}")
            if not moved:
                raise RuntimeError("rank 1's pid not printed: no throttle")
            st = cpustat(slow)
            s = json.load(open(os.path.join(out, "summary.json")))
            t = json.load(open(os.path.join(out, "trace.json")))
    finally:
        if p is not None and p.poll() is None:  # an error above: stop the job we started
            p.kill()
            p.wait()
        rmcg(slow)
        rmcg(boost)
    s["throttled"] = (st["nr_throttled"] - st0["nr_throttled"], st["nr_periods"] - st0["nr_periods"],
                      (st["throttled_time"] - st0["throttled_time"]) / 1e9)
    ev = t["traceEvents"] if isinstance(t, dict) else t
    ranks = []
    for r in range(workers):
        sp = collections.defaultdict(list)
        for e in ev:
            if e.get("ph") == "X" and e.get("pid") == r and e.get("tid") == 0:
                sp[e["name"]].append(e)
        steps = sp["step"][-300:]
        t0, t1 = steps[0]["ts"], steps[-1]["ts"] + steps[-1]["dur"]
        # what each top-level span usually takes on this rank: forward and
        # backward per sample (their size follows the share), data and
        # reduce+update per step. A span is a stall when it took at least
        # 5 ms and twice that: on the MLP every span is far below 5 ms, so
        # this is the old rule; on the CNN forward and backward take 5-20 ms
        # themselves, and only the excess over twice the usual marks the
        # quota running out (or, on the fast rank, its wait for the other)
        inwin = [e for n, L in sp.items() if n != "step" for e in L if t0 <= e["ts"] < t1]
        usual = {}
        for name in ("data", "forward", "backward", "reduce+update"):
            d = [e["dur"] / max(1, e.get("args", {}).get("n", 1)) if name in ("forward", "backward")
                 else e["dur"] for e in inwin if e["name"] == name]
            usual[name] = statistics.median(d) if d else 0.0

        def expect(e):
            u = usual.get(e["name"], 0.0)
            return u * max(1, e.get("args", {}).get("n", 1)) if e["name"] in ("forward", "backward") else u

        def stalled(e):
            return e["dur"] >= max(5000, 2 * expect(e))

        per = []  # per step: samples, compute us, fixed us, stalled us
        for stp in steps:
            inside = [e for e in inwin if stp["ts"] <= e["ts"] < stp["ts"] + stp["dur"]]
            n = sum(e.get("args", {}).get("n", 0) for e in inside if e["name"] == "forward")
            comp = sum(e["dur"] for e in inside if e["name"] in ("forward", "backward", "data"))
            # top-level spans only (allreduce spans nest in backward / reduce+update)
            top = [e for e in inside if e["name"] in ("data", "forward", "backward", "reduce+update")]
            fix = sum(e["dur"] for e in top if e["name"] == "reduce+update")
            stall = sum(e["dur"] - expect(e) for e in top if stalled(e))
            per.append((n, comp, fix, stall, any(stalled(e) for e in top)))
        calm = [x for x in per if not x[4] and x[0] > 0]
        ranks.append(dict(
            n=statistics.median(x[0] for x in per),
            c=statistics.median(x[1] / x[0] for x in calm) if calm else float("nan"),
            F=statistics.median(x[2] for x in calm) if calm else float("nan"),
            stall=sum(x[3] for x in per) / (t1 - t0),
            step=statistics.median(stp["dur"] for stp in steps)))
    s["ranks"] = ranks
    return s


def ab(kv):
    k, v = kv.split("=", 1)
    pairs = []
    for _ in range(a.reps):
        x = run(2, a.ab_balance, True)
        y = run(2, a.ab_balance, True, {k: v})
        pairs.append((x, y))
        print(f"  pair: as is {x['samples_per_second']:.0f} samples/s (throttled {x['throttled'][0]} of "
              f"{x['throttled'][1]} periods, rank 1 {100 * x['ranks'][1]['stall']:.1f}% in stalls), "
              f"{kv} {y['samples_per_second']:.0f} (throttled {y['throttled'][0]} of {y['throttled'][1]}, "
              f"{100 * y['ranks'][1]['stall']:.1f}%)", flush=True)
        print("        per step (n samples, F us): " + "; ".join(
              f"{lab} rank 0 {z['ranks'][0]['n']:.0f}, {z['ranks'][0]['F']:.0f}, rank 1 {z['ranks'][1]['n']:.0f}, "
              f"{z['ranks'][1]['F']:.0f}" for lab, z in (("as is", x), (kv, y)))
              + (f"; sha as is {x['params_sha256'][:12]}, {kv} {y['params_sha256'][:12]}"
                 if a.ab_balance == "steal" else ""), flush=True)
    # a run whose rank 1 joined the cgroup late (a loaded machine) saw few quota periods
    ok = [(x, y) for x, y in pairs if min(x["throttled"][1], y["throttled"][1]) >= 10]
    r = [x["samples_per_second"] / y["samples_per_second"] for x, y in ok]
    print(f"{a.ab_balance} as is / with {kv}: paired median {statistics.median(r) if r else float('nan'):.3f}x "
          f"samples/s over {len(ok)} pairs, as is faster in {sum(v > 1 for v in r)} "
          f"({len(pairs) - len(ok)} left out: a run with fewer than 10 quota periods)", flush=True)


def ab_bin(other):
    """--ab-bin: the other binary (A) against --build's (B), paired, the
    order flipping every pair; rank 1's samples per step, the throttled
    periods, and (steal) the params_sha256 of every run."""
    bal = a.ab_balance
    xs, ys = [], []
    for i in range(a.reps):
        order = ("A", "B") if i % 2 == 0 else ("B", "A")
        got = {}
        for side in order:
            got[side] = run(2, bal, True, binary=other if side == "A" else dtrain)
        x, y = got["A"], got["B"]
        xs.append(x)
        ys.append(y)
        print(f"  pair {i + 1} ({order[0]} first): A {x['samples_per_second']:.0f} samples/s "
              f"(rank 1 {x['ranks'][1]['n']:.0f}/step, throttled {x['throttled'][0]} of {x['throttled'][1]}), "
              f"B {y['samples_per_second']:.0f} (rank 1 {y['ranks'][1]['n']:.0f}/step, throttled "
              f"{y['throttled'][0]} of {y['throttled'][1]}), B/A {y['samples_per_second'] / x['samples_per_second']:.3f}"
              + (f"; sha A {x['params_sha256'][:12]} B {y['params_sha256'][:12]}" if bal == "steal" else ""),
              flush=True)
    ok = [(x, y) for x, y in zip(xs, ys) if min(x["throttled"][1], y["throttled"][1]) >= 10]
    r = [y["samples_per_second"] / x["samples_per_second"] for x, y in ok]
    med = statistics.median
    print(f"{a.model} {bal} under the quota: A {med(x['samples_per_second'] for x in xs):.0f}, "
          f"B {med(y['samples_per_second'] for y in ys):.0f} samples/s (medians); B/A paired median "
          f"{med(r) if r else float('nan'):.3f}x over {len(ok)} pairs, B faster in {sum(v > 1 for v in r)} "
          f"({len(xs) - len(ok)} left out: a run with fewer than 10 quota periods)", flush=True)
    return xs, ys


if a.ab_only:
    for kv in a.ab:
        ab(kv)
    if a.ab_bin:
        ab_bin(a.ab_bin)
    sys.exit(0)
ones = [run(1, "static", False) for _ in range(a.reps)]
ref = statistics.median(x["samples_per_second"] for x in ones)
ideal = (1 + a.quota) * ref
two = [run(2, "static", False) for _ in range(a.reps)]
ref2 = statistics.median(x["samples_per_second"] for x in two)
u0, u1 = two[-1]["ranks"]
c, F0, F1 = (u0["c"] + u1["c"]) / 2, u0["F"], u1["F"]
q = a.quota
print(f"{a.model}: 1 worker {ref:.0f} samples/s; ideal with rank 1 at {q:g} of a core: {ideal:.0f}; "
      f"2 workers without the quota {ref2:.0f} ({ref2 / ref:.2f}x one)")
print(f"  without the quota, per rank: c = {c:.2f} us per sample (forward, backward, data), "
      f"F = {F0:.0f} / {F1:.0f} us fixed per step (exchange and update; the update alone, 1 worker: "
      f"{ones[-1]['ranks'][0]['F']:.0f} us)")
# a perfect split (rank 1 computing at q of a core all the time, no stalls):
# T = F0 + n0 c = (F1 + n1 c) / q with n0 + n1 = batch
T = (BATCH * c + F0 + F1) / (1 + q)
print(f"  a perfect split with these c and F: step {T:.0f} us = {BATCH / (T * 1e-6) / ideal:.2f} of the ideal; "
      f"with F1 = 0: {BATCH / ((BATCH * c + F0) / (1 + q) * 1e-6) / ideal:.2f}; with F0 = F1 = F / 2 "
      f"(the per-step work shared, done once): {BATCH / ((BATCH * c + (F0 + F1) / 2) / (1 + q) * 1e-6) / ideal:.2f}")
sps_of = {}
for bal in ("static", "dynamic"):
    rs = [run(2, bal, True) for _ in range(a.reps)]
    sps = sps_of[bal] = statistics.median(x["samples_per_second"] for x in rs)
    s = rs[-1]
    stalls = [100 * x["ranks"][1]["stall"] for x in rs]
    print(f"{bal} under the quota: {sps:.0f} samples/s = {sps / ideal:.2f} of the ideal "
          f"(last run: throttled {s['throttled'][0]} of {s['throttled'][1]} periods, {s['throttled'][2]:.2f} s; "
          f"rank 1's wall in stalls per run: {', '.join(f'{v:.1f}%' for v in stalls)})")
    for r, x in enumerate(s["ranks"]):
        print(f"  rank {r}: {x['n']:.0f} samples/step, step median {x['step']:.0f} us, c = {x['c']:.2f} us "
              f"per sample (wall, calm steps), F = {x['F']:.0f} us fixed per step, "
              f"{100 * x['stall']:.1f}% of wall in stalls (excess of spans >= 5 ms and 2x usual)")
print(f"dynamic / static under the quota: {sps_of['dynamic'] / sps_of['static']:.2f}x "
      f"(targets: dynamic >= 0.9 of the ideal, >= 1.3x static)")
for kv in a.ab:
    ab(kv)
if a.ab_bin:
    ab_bin(a.ab_bin)
