# Peer for bench/straggler.py: bench/peers/fmnist_ddp.py unchanged, except that rank 1
# first moves itself into the cgroup whose cgroup.procs file STRAGGLER_CGROUP_PROCS names
# (a CPU-quota straggler: its own threads follow it there).
# Usage: python3 fmnist_ddp_cgroup.py NPROCS --model mlp|cnn --epochs N --batch B
import argparse, os, sys
import torch.multiprocessing as mp
sys.path.insert(0, os.path.dirname(__file__))
import fmnist_ddp


def run(rank, a):
    path = os.environ.get("STRAGGLER_CGROUP_PROCS")
    if path and rank == 1:
        with open(path, "w") as f:
            f.write(str(os.getpid()))
    fmnist_ddp.run(rank, a)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(); ap.add_argument("n", type=int); ap.add_argument("--model", default="mlp")
    ap.add_argument("--epochs", type=int, default=1); ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    a = ap.parse_args(); mp.spawn(run, args=(a,), nprocs=a.n)
