#!/usr/bin/env python3
"""ddp_vs_torch.py — data-parallel training speed, dtrain vs PyTorch DDP.

For each model (MLP 784-256-128-10 and the 2-conv CNN) it runs REPS rounds,
each round back to back: dtrain with 1 worker (batch 32), dtrain with
2 workers (32 per worker, global batch 64), and PyTorch 1.13
DistributedDataParallel over Gloo with 2 processes of one thread (batch 32
per process, bench/peers/fmnist_ddp.py). It prints the medians, dtrain's
scaling from 1 to 2 workers and the ratio against PyTorch DDP.
Both sides: SGD momentum 0.9, lr 0.05, one epoch of Fashion-MNIST, training
time only (no loading, no evaluation). With DET=1 it also measures
dist.deterministic = true with 2 workers (its cost against normal mode).
Standard library only.
"""
import argparse, json, os, random, re, statistics, subprocess, tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--build", default="build/release")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--models", default="mlp,cnn")
ap.add_argument("--det", action="store_true", help="also time deterministic mode")
a = ap.parse_args()

env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
dtrain = os.path.join(a.build, "dtrain")
common = ["--set", "train.epochs=1", "--set", "optim.name=sgd", "--set", "optim.lr=0.05",
          "--set", "optim.momentum=0.9", "--set", "optim.weight_decay=0",
          "--set", "schedule.kind=constant", "--set", "schedule.warmup_steps=0"]

def run_dtrain(model, workers, det=False):
    extra = ["--set", f"train.batch={32 * workers}", "--workers", str(workers)]
    if det:
        extra += ["--set", "dist.deterministic=true"]
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([dtrain, "train", f"examples/fashion_{model}.ini", *common, *extra,
                        "--out", out], env=env, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
    return s["samples_per_second"], s["test_accuracy"]

def run_torch(model):
    penv = dict(env, MASTER_PORT=str(random.randint(20000, 30000)))
    out = subprocess.run(["/usr/bin/python3", "bench/peers/fmnist_ddp.py", "2", "--model", model,
                          "--epochs", "1", "--batch", "32", "--lr", "0.05"],
                         env=penv, check=True, capture_output=True, text=True).stdout
    m = re.search(r"samples_per_s (\d+) test_acc ([\d.]+)", out)
    return float(m.group(1)), float(m.group(2))

rows = []
for model in a.models.split(","):
    one, two, det, tor = [], [], [], []
    for r in range(a.reps):
        s1, _ = run_dtrain(model, 1)
        s2, acc2 = run_dtrain(model, 2)
        st, acct = run_torch(model)
        one.append(s1), two.append(s2), tor.append(st)
        line = (f"  {model} round {r+1}: dtrain 1 worker {s1:8.0f}  2 workers {s2:8.0f} "
                f"(acc {acc2:.4f})  pytorch ddp {st:8.0f} (acc {acct:.4f})")
        if a.det:
            sd, _ = run_dtrain(model, 2, det=True)
            det.append(sd)
            line += f"  deterministic {sd:8.0f}"
        print(line + " samples/s", flush=True)
    # paired: the median of each round's own ratio (its runs were back to
    # back, so slow spells of the shared machine cancel)
    paired = statistics.median(b / a for a, b in zip(one, two))
    paired_ddp = statistics.median(b / a for a, b in zip(tor, two))
    rows.append((model, statistics.median(one), statistics.median(two), statistics.median(tor),
                 statistics.median(det) if det else None, paired, paired_ddp))

print()
print(f"{'model':6} {'dtrain 1w':>10} {'dtrain 2w':>10} {'scaling':>8} {'paired':>7} "
      f"{'torch ddp 2p':>13} {'vs ddp':>7} {'paired':>7}"
      + (f" {'det 2w':>9} {'det cost':>9}" if a.det else ""))
for model, m1, m2, mt, md, pr, prd in rows:
    line = (f"{model:6} {m1:10.0f} {m2:10.0f} {m2/m1:7.2f}x {pr:6.2f}x {mt:13.0f} {m2/mt:6.2f}x "
            f"{prd:6.2f}x")
    if md:
        line += f" {md:9.0f} {m2/md:8.2f}x"
    print(line)
print(f"(samples/s, medians of {a.reps} rounds; 32 samples per worker/process per step;")
print(" scaling = dtrain 2 workers / 1 worker; vs ddp = dtrain 2 workers / PyTorch DDP 2 processes;")
print(" each as a ratio of the medians and, 'paired', as the median of every round's own ratio)")
