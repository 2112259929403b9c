#!/usr/bin/env python3
"""obs.py — what observability costs and how it behaves (issue 16 numbers).

1. Overhead: the example MLP, 2 workers, one epoch, back to back with
   obs.metrics (served, scraped every 100 ms by this script) and obs.trace
   both on, and both off; the order flips each round; prints each side's
   median samples/s and the median of every round's own on/off ratio
   ("paired"). Target: on >= 0.99 x off.
2. Scrape time of a 4-worker job's /metrics: 200 GETs over one keep-alive-
   less connection each, median and p99 in ms. Target: <= 5 ms.
3. Trace size of a 1-epoch, 2-worker MLP run with the default
   obs.trace_steps. Target: < 50 MB.

    bench/obs.py BUILD/dtrain [--reps 5]

Standard library only; every process it starts is stopped by pid.
"""
import argparse, json, os, re, socket, statistics, subprocess, tempfile, threading, time, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("dtrain")
ap.add_argument("--reps", type=int, default=5)
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
    while not stop.is_set():
        u = url_holder.get("url")
        if u:
            try:
                t = time.perf_counter()
                urllib.request.urlopen(u, timeout=2).read()
                times.append(time.perf_counter() - t)
            except OSError:
                pass
        stop.wait(0.1)


def run(on):
    with tempfile.TemporaryDirectory() as out:
        extra = []
        holder, stop, times = {}, threading.Event(), []
        if on:
            port = free_port()
            extra = ["--set", f"obs.metrics=127.0.0.1:{port}", "--set", "obs.trace=true"]
            holder["url"] = f"http://127.0.0.1:{port}/metrics"
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
        size = os.path.getsize(os.path.join(out, "trace.json")) if on else 0
        return sps, size, len(times)


print(f"# 1. overhead: MLP, 2 workers, 1 epoch, {args.reps} rounds, order flipped each round")
off, on, ratios, sizes, scrapes = [], [], [], [], []
for r in range(args.reps):
    res = {}
    for side in ([False, True] if r % 2 == 0 else [True, False]):
        res[side] = run(side)
    off.append(res[False][0])
    on.append(res[True][0])
    sizes.append(res[True][1])
    scrapes.append(res[True][2])
    ratios.append(res[True][0] / res[False][0])
    print(f"round {r + 1}: off {res[False][0]:.0f}  on {res[True][0]:.0f} samples/s  "
          f"on/off {ratios[-1]:.4f}  ({res[True][2]} scrapes during the run)")
print(f"median off {statistics.median(off):.0f} samples/s, on {statistics.median(on):.0f}; "
      f"on/off of medians {statistics.median(on) / statistics.median(off):.4f}, "
      f"paired {statistics.median(ratios):.4f} (target >= 0.99)")

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
