#!/usr/bin/env python3
"""ab.py — is a change faster or slower? Two dtrain binaries, paired.

Trains the example MLP and/or CNN for one epoch with 1 and 2 workers
(32 samples per worker per step, SGD momentum 0.9, constant rate — the same
settings as bench/ddp_vs_torch.py), alternating binary A and binary B inside
every round (the order flips each round), and prints each side's median
samples/s, B/A as a ratio of the medians and as the median of every round's
own ratio ("paired"), and the 1 -> 2 worker scaling of each. The machine is
shared and noisy: the paired ratio is the number to quote.

    bench/ab.py OLD/dtrain NEW/dtrain [--reps 7] [--models mlp,cnn]

Build the old side from a worktree of the commit to compare against
(git worktree add --detach /tmp/old COMMIT; cmake ...). Standard library only.
"""
import argparse, json, os, statistics, subprocess, tempfile

ap = argparse.ArgumentParser()
ap.add_argument("a")
ap.add_argument("b")
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--models", default="mlp,cnn")
args = ap.parse_args()
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
common = ["--set", "train.epochs=1", "--set", "optim.name=sgd", "--set", "optim.lr=0.05",
          "--set", "optim.momentum=0.9", "--set", "optim.weight_decay=0",
          "--set", "schedule.kind=constant", "--set", "schedule.warmup_steps=0"]
bins = {"A": args.a, "B": args.b}
res = {}

def run(binary, model, workers):
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([binary, "train", os.path.join(root, "examples", f"fashion_{model}.ini"),
                        *common, "--set", f"train.batch={32 * workers}",
                        "--workers", str(workers), "--out", out],
                       env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(os.path.join(out, "summary.json")) as f:
            return json.load(f)["samples_per_second"]

models = args.models.split(",")
for r in range(args.reps):
    for model in models:
        for w in (1, 2):
            order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
            for side in order:
                res.setdefault((model, w, side), []).append(run(bins[side], model, w))
            print(f"  {model} {w}w round {r + 1}: A {res[(model, w, 'A')][-1]:9.0f}  "
                  f"B {res[(model, w, 'B')][-1]:9.0f}", flush=True)
med = statistics.median
for model in models:
    for w in (1, 2):
        a, b = res[(model, w, "A")], res[(model, w, "B")]
        paired = med([y / x for x, y in zip(a, b)])
        print(f"{model} {w}w  A {med(a):9.0f}  B {med(b):9.0f}  B/A {med(b) / med(a):.3f}"
              f" (paired {paired:.3f})")
    sa = med(res[(model, 2, "A")]) / med(res[(model, 1, "A")])
    sb = med(res[(model, 2, "B")]) / med(res[(model, 1, "B")])
    print(f"{model} scaling 1->2 workers  A {sa:.2f}x  B {sb:.2f}x")
