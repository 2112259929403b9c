#!/usr/bin/env python3
"""det_cost.py — what deterministic mode costs against normal mode (issue 12: <= 1.5x).

Per model, worker count and round, back to back (the order flips each round):
dtrain in normal mode and in deterministic mode (dist.deterministic = true,
the default dist.micro_batch), the same settings as bench/straggler.py
(batch 64, SGD momentum 0.9, constant rate, one epoch; the CNN on
--limit images). Prints each side's median samples/s, normal / det as a
ratio of the medians and as the median of every round's own ratio
("paired": the number to quote on a shared machine), the same for the
workers' training CPU per sample (summary.json per_worker cpu_seconds: the
work itself, which a loaded machine distorts less), and checks that every
deterministic run of a model ends with the same params_sha256 whatever the
worker count. --base OLD/dtrain adds the deterministic runs of another
binary (paired speed-up new / old, and its hash must be the same; with
--base-bits any, e.g. when the old binary's deterministic products ran on
other kernels, each binary's runs must agree among themselves only). --env
KEY=VALUE (repeatable) sets an environment variable for the deterministic
runs only (e.g. DTRAIN_DET_SLOTS=1 DTRAIN_DET_WPACK=0: the per-micro-shard
path of before 2026-11-27). Standard library only.

    python3 bench/det_cost.py --build build/release --reps 5
"""
import argparse, json, os, statistics, subprocess, tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--build", default="build/release")
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--models", default="mlp,cnn")
ap.add_argument("--workers", default="2,1")
ap.add_argument("--epochs", default="mlp:1,cnn:1")
ap.add_argument("--limit", default="mlp:0,cnn:10000", help="data.limit_train per model (0: all)")
ap.add_argument("--base", default="", help="another dtrain binary: its deterministic runs too")
ap.add_argument("--base-bits", choices=["same", "any"], default="same",
                help="same: --base must give the new binary's params_sha256; any: its own, constant")
ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the deterministic runs")
ap.add_argument("--set", action="append", default=[], help="section.key=value for every run")
a = ap.parse_args()

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
dtrain = os.path.join(a.build, "dtrain")
env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
det_env = dict(env, **dict(kv.split("=", 1) for kv in a.env))
common = ["--set", "optim.name=sgd", "--set", "optim.lr=0.05", "--set", "optim.momentum=0.9",
          "--set", "optim.weight_decay=0", "--set", "schedule.kind=constant",
          "--set", "schedule.warmup_steps=0", "--set", "train.batch=64",
          "--set", "train.eval_every=1000"]
for kv in a.set:
    common += ["--set", kv]
epochs = dict(kv.split(":") for kv in a.epochs.split(","))
limits = dict(kv.split(":") for kv in a.limit.split(","))


def run(binary, model, workers, det):
    args = [binary, "train", os.path.join(root, "examples", f"fashion_{model}.ini"), *common,
            "--set", f"train.epochs={epochs[model]}", "--workers", str(workers)]
    if int(limits[model]):
        args += ["--set", f"data.limit_train={limits[model]}"]
    if det:
        args += ["--set", "dist.deterministic=true"]
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(args + ["--out", out], env=det_env if det else env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
    # training CPU of every worker per sample (summary per_worker cpu_seconds):
    # what the work costs, less sensitive to a loaded machine than the wall clock
    cpu = sum(w.get("cpu_seconds", 0) for w in s.get("per_worker", [])) / max(s["train_samples"], 1)
    return s["samples_per_second"], s["params_sha256"], cpu * 1e6


load = os.getloadavg()[0]
print(f"# det_cost: {dtrain}{' vs ' + a.base if a.base else ''}, load average {load:.1f}, "
      f"{a.reps} rounds, det env {a.env or 'default'}", flush=True)
models = a.models.split(",")
workers = [int(w) for w in a.workers.split(",")]
sides = ["normal", "det"] + (["base"] if a.base else [])
res, shas = {}, {}
for r in range(a.reps):
    for model in models:
        for w in workers:
            order = sides if r % 2 == 0 else sides[::-1]
            for side in order:
                binary = a.base if side == "base" else dtrain
                sps, sha, cpu = run(binary, model, w, side != "normal")
                res.setdefault((model, w, side), []).append(sps)
                res.setdefault((model, w, side, "cpu"), []).append(cpu)
                if side != "normal":
                    key = model + " (base)" if side == "base" and a.base_bits == "any" else model
                    shas.setdefault(key, set()).add(sha)
            line = "  ".join(f"{s} {res[(model, w, s)][-1]:8.0f}" for s in sides)
            print(f"  {model} {w}w round {r + 1}: {line}", flush=True)
med = statistics.median
ok = True
for model in models:
    for w in workers:
        n, d = res[(model, w, "normal")], res[(model, w, "det")]
        paired = med([x / y for x, y in zip(n, d)])
        line = (f"{model} {w}w: normal {med(n):.0f}, det {med(d):.0f} samples/s: det costs "
                f"{med(n) / med(d):.2f}x (paired {paired:.2f}x; target <= 1.5x with 2 workers)")
        if a.base:
            b = res[(model, w, "base")]
            line += (f"; base det {med(b):.0f}: new/base {med(d) / med(b):.2f}x "
                     f"(paired {med([y / x for x, y in zip(b, d)]):.2f}x)")
        nc, dc = res[(model, w, "normal", "cpu")], res[(model, w, "det", "cpu")]
        if min(nc) > 0 and min(dc) > 0:  # 1 worker: no per_worker record
            line += (f"; CPU per sample normal {med(nc):.2f} us, det {med(dc):.2f} us: "
                     f"{med(dc) / med(nc):.2f}x (paired {med([y / x for x, y in zip(nc, dc)]):.2f}x)")
            if a.base:
                line += f", base det {med(res[(model, w, 'base', 'cpu')]):.2f} us"
        print(line)
for key in sorted(shas):
    same = len(shas[key]) == 1
    ok &= same
    print(f"{key}: deterministic params_sha256 {'equal across every run' if same else 'DIFFER: ' + str(sorted(shas[key]))}"
          f" ({sorted(shas[key])[0][:16]}...)")
raise SystemExit(0 if ok else 1)
