#!/usr/bin/env python3
"""obs.py — what observability costs and how it behaves (issue 16 numbers).

1. Overhead: the example MLP, 2 workers, one epoch, four sides run back to
   back in every round (the order rotates and flips each round): both off,
   obs.trace alone, obs.metrics alone (served and scraped every --interval
   seconds, 0.1 by default, over one kept-alive connection as Prometheus
   does), and both on; prints each side's median samples/s and the median
   of every round's own side/off ratio ("paired"), so what costs what is
   seen apart. Target: both on >= 0.99 x off.
2. Scrape time of a 4-worker job's /metrics: 200 GETs over one keep-alive-
   less connection each, median and p99 in ms. Target: <= 5 ms.
3. Trace size of a 1-epoch, 2-worker MLP run with the default
   obs.trace_steps. Target: < 50 MB.

    bench/obs.py BUILD/dtrain [--reps 5]

Standard library only; every process it starts is stopped by pid.
"""
import argparse, http.client, json, os, re, socket, statistics, subprocess, tempfile, threading, time, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("dtrain")
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--interval", type=float, default=0.1, help="seconds between scrapes")
args = ap.parse_args()
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
mlp = os.path.join(root, "examples", "fashion_mlp.ini")
common = ["--set", "train.epochs=1", "--set", "optim.name=sgd", "--set", "optim.lr=0.05",
          "--set", "optim.momentum=0.9", "--set", "optim.weight_decay=0",
          "--set", "schedule.kind=constant", "--set", "train.batch=64"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def scraper(url_holder, stop, times):
    """GETs /metrics every --interval s over one kept-alive connection (a
    new one after an error), as Prometheus's scrape loop does."""
    conn = None
    while not stop.is_set():
        port = url_holder.get("port")
        if port:
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
    with tempfile.TemporaryDirectory() as out:
        extra = []
        holder, stop, times = {}, threading.Event(), []
        if metrics:
            port = free_port()
            extra += ["--set", f"obs.metrics=127.0.0.1:{port}"]
            holder["port"] = port
        if trace:
            extra += ["--set", "obs.trace=true"]
        th = threading.Thread(target=scraper, args=(holder, stop, times))
        th.start()
        try:
            subprocess.run([args.dtrain, "train", mlp, *common, *extra, "--workers", "2", "--out", out],
                           env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            stop.set()
            th.join()
        with open(os.path.join(out, "summary.json")) as f:
            sps = json.load(f)["samples_per_second"]
        size = os.path.getsize(os.path.join(out, "trace.json")) if trace else 0
        return sps, size, len(times)


sides = {"off": (False, False), "trace": (False, True), "metrics": (True, False), "both": (True, True)}
names = list(sides)
print(f"# 1. overhead: MLP, 2 workers, 1 epoch, {args.reps} rounds, sides {', '.join(names)} "
      f"(order rotated each round), scrapes every {args.interval} s")
res = {k: [] for k in names}
sizes, scrapes = [], []
for r in range(args.reps):
    order = names[r % 4:] + names[:r % 4]
    if r % 2:
        order.reverse()
    for k in order:
        sps, size, nscr = run(*sides[k])
        res[k].append(sps)
        if k == "both":
            sizes.append(size)
            scrapes.append(nscr)
    print(f"round {r + 1}: " + "  ".join(f"{k} {res[k][-1]:.0f}" for k in names) +
          f" samples/s  both/off {res['both'][-1] / res['off'][-1]:.4f}  ({scrapes[-1]} scrapes)", flush=True)
med = statistics.median
for k in names:
    ratios = [b / a for a, b in zip(res["off"], res[k])]
    print(f"{k:8s} median {med(res[k]):9.0f} samples/s  {k}/off of medians {med(res[k]) / med(res['off']):.4f}, "
          f"paired {med(ratios):.4f}" + ("  (target >= 0.99)" if k == "both" else ""))

print("# 2. scrape time of a 4-worker job's /metrics (200 GETs)")
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
        ts.sort()
        print(f"{nbytes} bytes, {series} samples, 4 ranks: median {statistics.median(ts):.3f} ms, "
              f"p99 {ts[int(0.99 * len(ts)) - 1]:.3f} ms, max {ts[-1]:.3f} ms (target <= 5 ms)")
    finally:
        p.terminate()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

print("# 3. trace size, 1 epoch, 2 workers, default obs.trace_steps")
print(f"trace.json: median {statistics.median(sizes) / 1e6:.2f} MB over {len(sizes)} runs "
      f"(target < 50 MB)")
