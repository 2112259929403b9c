#!/usr/bin/env python3
"""obs.py — what observability costs and how it behaves (issue 16 numbers).

1. Overhead: the example MLP, 2 workers, one epoch, with metrics and
   tracing both on ("both": obs.metrics served and scraped every
   --interval s over one kept-alive connection, as Prometheus does, plus
   obs.trace = true) against both off, in --pairs rounds run back to back,
   each round's order flipped (off both / both off / ...), so slow changes
   of the machine's load fall on both sides alike. Two views of the cost:
     - samples/s (summary.json): the ratio of the medians, with a 90%
       bootstrap interval (rounds resampled 4000 times) and the median and
       quartiles of the rounds' own ratios;
     - CPU seconds per sample: the workers' user + system time from their
       first step to the end (summary.json per_worker cpu_seconds, every
       thread of each worker process) over the samples trained, which a
       loaded machine disturbs far less than wall time (a preempted rank
       costs its peer wall time, not CPU time, beyond the 1 ms it polls).
       It leaves out the launcher (serving the scrapes), which the
       samples/s view includes.
   With --bench-obs, a third view: what the loop records per step with
   metrics and tracing on (bench_obs, in isolation) over the CPU time of
   one worker's step measured here with both off.
   The verdict says "shown" when the interval's lower end is >= 0.99,
   "missed" when its upper end is below 0.99, and otherwise that this load
   cannot tell; also that it cannot tell when the off side alone varies by
   more than 4% (quartile range over median): the interval assumes rounds
   alike, which a load that changes by the minute breaks. --sides off,trace,metrics,both measures the two parts apart.
2. Scrape time of a 4-worker job's /metrics: 200 GETs, a new connection
   each, median / p99 / max in ms. Target: <= 5 ms.
3. Trace size of the "both" runs (1 epoch, 2 workers, default
   obs.trace_steps). Target: < 50 MB.

    bench/obs.py BUILD/dtrain [--pairs 20] [--interval 0.1] [--sides off,both]

Prints the load average before and after. Standard library only; every
process it starts is stopped by pid.
"""
import argparse, http.client, json, os, random, socket, statistics, subprocess, tempfile, threading, time, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("dtrain")
ap.add_argument("--pairs", type=int, default=20, help="rounds of every side")
ap.add_argument("--interval", type=float, default=0.1, help="seconds between scrapes")
ap.add_argument("--sides", default="off,both", help="of off, trace, metrics, both")
ap.add_argument("--epochs", type=int, default=1, help="epochs per run (longer runs: less start-up noise)")
ap.add_argument("--skip", default="", help="sections to skip: scrape, overhead")
ap.add_argument("--bench-obs", default="", help="bench_obs binary: its ns per step against the "
                "measured CPU per worker step (a third view)")
args = ap.parse_args()
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
mlp = os.path.join(root, "examples", "fashion_mlp.ini")
common = ["--set", f"train.epochs={args.epochs}", "--set", "optim.name=sgd", "--set", "optim.lr=0.05",
          "--set", "optim.momentum=0.9", "--set", "optim.weight_decay=0",
          "--set", "schedule.kind=constant", "--set", "train.batch=64"]
med = statistics.median


def load():
    return "load average " + " ".join(open("/proc/loadavg").read().split()[:3])


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def scraper(port, stop, times):
    """GETs /metrics every --interval s over one kept-alive connection (a
    new one after an error), as Prometheus's scrape loop does."""
    conn = None
    while not stop.is_set():
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            t = time.perf_counter()
            conn.request("GET", "/metrics")
            conn.getresponse().read()
            times.append(time.perf_counter() - t)
        except OSError:
            if conn:
                conn.close()
            conn = None
        stop.wait(args.interval)
    if conn:
        conn.close()


def run(metrics, trace):
    """One run: (samples/s, CPU s per sample, trace bytes, scrapes)."""
    with tempfile.TemporaryDirectory() as out:
        extra, stop, times, th = [], threading.Event(), [], None
        if metrics:
            port = free_port()
            extra += ["--set", f"obs.metrics=127.0.0.1:{port}"]
            th = threading.Thread(target=scraper, args=(port, stop, times))
            th.start()
        if trace:
            extra += ["--set", "obs.trace=true"]
        try:
            subprocess.run([args.dtrain, "train", mlp, *common, *extra, "--workers", "2", "--out", out],
                           env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            stop.set()
            if th:
                th.join()
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
        cpu = sum(w["cpu_seconds"] for w in s["per_worker"])
        samples = s["train_samples"]
        size = os.path.getsize(os.path.join(out, "trace.json")) if trace else 0
        return s["samples_per_second"], cpu / samples, size, len(times)


def boot(a, b, f, n=4000):
    """90% interval of f(b) / f(a) over rounds resampled with replacement."""
    rng, k, r = random.Random(16), len(a), []
    for _ in range(n):
        idx = [rng.randrange(k) for _ in range(k)]
        r.append(f([b[i] for i in idx]) / f([a[i] for i in idx]))
    r.sort()
    return r[int(0.05 * n)], r[int(0.95 * n) - 1]


def quartiles(x):
    q = statistics.quantiles(x, n=4) if len(x) > 1 else [x[0]] * 3
    return q[0], q[2]


def spread(x):
    """The quartile range over the median: how much one side alone varies."""
    q1, q3 = quartiles(x)
    return (q3 - q1) / med(x)


def verdict(lo, hi, off, target=0.99):
    # The interval assumes the rounds are alike; under a load that changes
    # from minute to minute they are not, and a side that alone varies by
    # more than 4% (quartile range) cannot resolve a 1% target.
    if len(off) < 8:
        return "target >= 0.99: too few rounds to tell (at least 8)"
    if spread(off) > 0.04:
        return f"target >= 0.99: this load cannot tell (off alone spreads {spread(off) * 100:.0f}%, quartile range)"
    if lo >= target:
        return "target >= 0.99: shown"
    if hi < target:
        return "target >= 0.99: missed"
    return "target >= 0.99: this load cannot tell (interval spans it)"


def overhead():
    names = [k for k in args.sides.split(",") if k]
    sides = {"off": (False, False), "trace": (False, True), "metrics": (True, False), "both": (True, True)}
    assert "off" in names and all(k in sides for k in names), "--sides: off and some of trace, metrics, both"
    print(f"# 1. overhead: MLP, 2 workers, {args.epochs} epoch(s), {args.pairs} rounds of {', '.join(names)} "
          f"(order flipped each round), scrapes every {args.interval} s; {load()}", flush=True)
    sps = {k: [] for k in names}
    cps = {k: [] for k in names}
    sizes, scrapes = [], []
    t_start = time.time()
    for r in range(args.pairs):
        order = names[r % len(names):] + names[:r % len(names)] if len(names) > 2 else list(names)
        if r % 2:
            order.reverse()
        for k in order:
            a, c, size, nscr = run(*sides[k])
            sps[k].append(a)
            cps[k].append(c)
            if k == "both":
                sizes.append(size)
                scrapes.append(nscr)
        last = names[-1]
        print(f"round {r + 1:2d}: " + "  ".join(f"{k} {sps[k][-1]:7.0f}" for k in names) +
              f" samples/s  {last}/off {sps[last][-1] / sps['off'][-1]:.4f};  CPU us/sample " +
              "  ".join(f"{k} {cps[k][-1] * 1e6:.2f}" for k in names) +
              (f"  ({scrapes[-1]} scrapes)" if scrapes else ""), flush=True)
    print(f"{len(names) * args.pairs} runs in {time.time() - t_start:.0f} s; {load()}")
    for k in names[1:]:
        lo, hi = boot(sps["off"], sps[k], med)
        pr = [b / a for a, b in zip(sps["off"], sps[k])]
        q1, q3 = quartiles(pr)
        ratio = med(sps[k]) / med(sps["off"])
        print(f"samples/s  {k:7s} median {med(sps[k]):8.0f} vs off {med(sps['off']):8.0f}: "
              f"{k}/off {ratio:.4f}, 90% interval [{lo:.4f}, {hi:.4f}]; rounds' own ratios "
              f"median {med(pr):.4f} (quartiles {q1:.4f}-{q3:.4f})" +
              (f"  -> {verdict(lo, hi, sps['off'])}" if k == "both" else ""))
        # CPU per sample: cost is on/off, so speed is off/on
        clo, chi = boot(cps[k], cps["off"], med)
        cratio = med(cps["off"]) / med(cps[k])
        print(f"CPU/sample {k:7s} median {med(cps[k]) * 1e6:8.3f} vs off {med(cps['off']) * 1e6:8.3f} us: "
              f"off/{k} {cratio:.4f}, 90% interval [{clo:.4f}, {chi:.4f}]" +
              (f"  -> {verdict(clo, chi, cps['off'])}" if k == "both" else ""))
    if args.bench_obs:
        out = subprocess.run([args.bench_obs], check=True, capture_output=True, text=True).stdout
        ns = float(out.split(":")[1].split("ns")[0])
        step_cpu = med(cps["off"]) * 32  # 32 samples per worker per step (batch 64, 2 workers)
        print(out.strip())
        print(f"recording per step {ns:.0f} ns / a worker's CPU per step {step_cpu * 1e6:.0f} us "
              f"(off) = {ns / 1e9 / step_cpu * 100:.3f}% (target <= 1%)")
    return sizes


def scrape4():
    print(f"# 2. scrape time of a 4-worker job's /metrics (200 GETs, new connection each); {load()}",
          flush=True)
    with tempfile.TemporaryDirectory() as out:
        port = free_port()
        p = subprocess.Popen([args.dtrain, "train", mlp, "--workers", "4", "--set", "train.epochs=100000",
                              "--set", "data.limit_train=4000", "--set", "data.limit_test=200",
                              "--set", f"obs.metrics=127.0.0.1:{port}", "--out", out],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            for line in p.stdout:
                if line.startswith("metrics: "):
                    break
            time.sleep(3)  # let every rank register its metrics
            ts, nbytes, series = [], 0, 0
            for i in range(200):
                t = time.perf_counter()
                body = urllib.request.urlopen(url, timeout=5).read()
                ts.append((time.perf_counter() - t) * 1e3)
                nbytes = len(body)
                series = sum(1 for l in body.decode().splitlines() if l and not l.startswith("#"))
            ranks = len({l.split('rank="')[1].split('"')[0] for l in body.decode().splitlines()
                         if 'rank="' in l})
            ts.sort()
            print(f"{nbytes} bytes, {series} samples, {ranks} ranks: median {med(ts):.3f} ms, "
                  f"p99 {ts[int(0.99 * len(ts)) - 1]:.3f} ms, max {ts[-1]:.3f} ms (target <= 5 ms: "
                  f"{'met' if med(ts) <= 5 else 'missed'} by the median)")
        finally:
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


sizes = overhead() if "overhead" not in args.skip else []
if "scrape" not in args.skip:
    scrape4()
if sizes:
    print(f"# 3. trace size, {args.epochs} epoch(s), 2 workers, default obs.trace_steps (the 'both' runs)")
    print(f"trace.json: median {med(sizes) / 1e6:.2f} MB, max {max(sizes) / 1e6:.2f} MB over "
          f"{len(sizes)} runs (target < 50 MB: {'met' if max(sizes) < 50e6 else 'missed'})")
