#!/usr/bin/env python3
"""ps_steps.py — a load-tolerant comparison of ps modes and knobs: alternating
traced one-epoch runs (2 workers, global batch 64, the speed part's
settings), each reduced to its 10th-percentile step time (the steps no
other process preempted; on a loaded machine the means and samples/s
scatter 3-10x, the p10 step much less), medians over rounds, ratio to ddp.

  python3 bench/ps_steps.py BUILD MODEL REPS MODE...
  e.g. python3 bench/ps_steps.py build/release mlp 6 ddp bsp asp asp,PS_PIECE=0

A MODE is ddp, bsp or asp (ps colocated) or srv (bsp with 1 separate server,
the RPC comparison's dtrain side), then ,KNOB=VALUE for DTRAIN_KNOB
(X_... passes X_... as it is). Prints each run's samples/s, p10 step and
params_sha256 prefix (bsp must equal ddp's), and the CPU time of the whole
job (every process: getrusage of the children) per trained sample.
"""
import json, os, resource, subprocess, sys, tempfile, statistics
build = sys.argv[1]; model = sys.argv[2]; reps = int(sys.argv[3]); modes = sys.argv[4:]
env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
common = ["--set", "optim.name=sgd", "--set", "optim.lr=0.05", "--set", "optim.momentum=0.9",
          "--set", "optim.weight_decay=0", "--set", "schedule.kind=constant", "--set", "train.batch=64"]
M = {"ddp": ["--workers", "2"], "bsp": ["--workers", "2", "--set", "ps.colocate=true"],
     "asp": ["--workers", "2", "--set", "ps.colocate=true", "--set", "ps.consistency=asp"],
     # the RPC comparison's dtrain side: 1 separate bsp server, 2 workers
     "srv": ["--workers", "2", "--servers", "1"]}
res = {}; cpus = {}
for r in range(reps):
    line = f"round {r+1} load {os.getloadavg()[0]:.1f}:"
    for m in modes:
        base, *kv = m.split(",")
        xenv = dict(env, **{("" if x.startswith("X_") else "DTRAIN_") + x.split("=")[0]: x.split("=")[1] for x in kv})
        args = [os.path.join(build, "dtrain"), "train", f"examples/fashion_{model}.ini", *common,
                "--set", "train.epochs=1", *M[base]]
        if model == "cnn": args += ["--set", "data.limit_train=12000"]
        args += ["--set", "obs.trace=true"]
        with tempfile.TemporaryDirectory() as out:
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(args + ["--out", out], env=xenv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            s = json.load(open(os.path.join(out, "summary.json")))
            t = json.load(open(os.path.join(out, "trace.json")))
        ev = t["traceEvents"] if isinstance(t, dict) else t
        st = [e["dur"] for e in ev if e.get("ph") == "X" and e["name"] == "step"]
        st.sort(); med = st[len(st)//10]
        res.setdefault(m, []).append(med)
        # CPU of the whole job (every process) per trained sample: load-independent
        cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1e6 / (len(st) * 64)
        cpus.setdefault(m, []).append(cpu)
        line += f"  {m} {s['samples_per_second']:.0f}/s p10 step {med:.0f}us cpu {cpu:.1f}us/sample ({s['params_sha256'][:8]})"
    print(line, flush=True)
b = statistics.median(res["ddp"]) if "ddp" in res else None
cb = statistics.median(cpus["ddp"]) if "ddp" in cpus else None
for m in modes:
    med = statistics.median(res[m]); c = statistics.median(cpus[m])
    print(f"median step {m:12s} {med:8.0f} us" + (f"  {b/med:.2f}x ddp" if b else "") +
          f"   cpu {c:6.1f} us/sample" + (f"  {c/cb:.2f}x ddp's" if cb else ""))
print(f"load {os.getloadavg()}")
