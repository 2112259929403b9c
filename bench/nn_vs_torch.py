#!/usr/bin/env python3
"""nn_vs_torch.py — single-process training speed, dtrain vs PyTorch 1.13.

Runs, for each model (MLP 784-256-128-10 and the 2-conv CNN), REPS rounds of
one dtrain epoch and one PyTorch epoch back to back (alternating, so machine
noise hits both alike), then prints the median samples/s of each, the ratio,
and the achieved GFLOP/s of each against OpenBLAS's measured sgemm rate.
Both sides: one thread, batch 64, SGD momentum 0.9, lr 0.05, no schedule.
Only training time is counted (no data loading, no evaluation), as in the
peer script. Standard library only.
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--build", default="build/release")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--models", default="mlp,cnn")
a = ap.parse_args()

env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
dtrain = os.path.join(a.build, "dtrain")
peak_out = subprocess.run([os.path.join(a.build, "sgemm_peak")], env=env, check=True,
                          capture_output=True, text=True).stdout
m = re.search(r"^sgemm_gflops ([\d.]+) (\S+)", peak_out, re.M)
peak, core = float(m.group(1)), m.group(2)
m = re.search(r"^dt_sgemm_gflops ([\d.]+) (\S+)", peak_out, re.M)
dpeak, impl = float(m.group(1)), m.group(2)
print(f"sgemm 1 thread (1024^3, median of 9): OpenBLAS ({core} kernels) {peak:.1f} GFLOP/s, "
      f"dtrain dt_sgemm ({impl}) {dpeak:.1f} GFLOP/s")

common = ["--set", "train.epochs=1", "--set", "train.batch=64", "--set", "optim.name=sgd",
          "--set", "optim.lr=0.05", "--set", "optim.momentum=0.9", "--set", "optim.weight_decay=0",
          "--set", "schedule.kind=constant", "--set", "schedule.warmup_steps=0"]

def run_dtrain(model):
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([dtrain, "train", f"examples/fashion_{model}.ini", *common, "--out", out],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
    return s["samples_per_second"], s.get("flops_per_sample"), s["test_accuracy"]

def run_torch(model):
    out = subprocess.run(["/usr/bin/python3", "bench/peers/fmnist.py", "--model", model, "--epochs", "1",
                          "--batch", "64", "--threads", "1", "--lr", "0.05"],
                         env=env, check=True, capture_output=True, text=True).stdout
    m = re.search(r"samples_per_s (\d+) test_acc ([\d.]+)", out)
    return float(m.group(1)), float(m.group(2))

rows = []
for model in a.models.split(","):
    d, t, fl = [], [], None
    for r in range(a.reps):
        sps, fl, acc_d = run_dtrain(model)
        d.append(sps)
        tps, acc_t = run_torch(model)
        t.append(tps)
        print(f"  {model} round {r+1}: dtrain {sps:9.0f} samples/s (acc {acc_d:.4f})   "
              f"pytorch {tps:9.0f} samples/s (acc {acc_t:.4f})", flush=True)
    md, mt = statistics.median(d), statistics.median(t)
    rows.append((model, md, mt, fl))

print()
print(f"{'model':6} {'dtrain samples/s':>17} {'pytorch samples/s':>18} {'ratio':>6} "
      f"{'dtrain GFLOP/s':>15} {'pytorch GFLOP/s':>16} {'OpenBLAS sgemm':>15} {'dt_sgemm':>9}")
for model, md, mt, fl in rows:
    gd = md * fl * 1e-9 if fl else float("nan")
    gt = mt * fl * 1e-9 if fl else float("nan")
    print(f"{model:6} {md:17.0f} {mt:18.0f} {md/mt:5.2f}x {gd:10.1f} ({gd/peak*100:3.0f}%) "
          f"{gt:10.1f} ({gt/peak*100:3.0f}%) {peak:15.1f} {dpeak:9.1f}")
print(f"(medians of {a.reps} alternating rounds; GFLOP/s counts the model's fwd+bwd FLOPs per sample;")
print(" the percentages are of the OpenBLAS sgemm rate, the practical ceiling the issue names)")
