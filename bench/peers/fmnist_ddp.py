# Peer for `make bench`: PyTorch DDP (Gloo, CPU, one thread per process) on Fashion-MNIST,
# copied from the shared reference; only change: MASTER_PORT from the environment (default 29518).
# Usage: python3 fmnist_ddp.py NPROCS --model mlp|cnn --epochs N --batch B (per-process batch)
import os, sys, time, argparse, torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist, torch.multiprocessing as mp
sys.path.insert(0, os.path.dirname(__file__))
def build(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64*7*7, 128), nn.ReLU(), nn.Linear(128, 10))
def run(rank, a):
    import numpy as np, gzip
    D = "/usr/share/datasets/fashion-mnist/"
    def idx(p):
        d = gzip.open(D + p).read(); nd = d[3]
        dims = [int.from_bytes(d[4+4*i:8+4*i], "big") for i in range(nd)]
        return np.frombuffer(d, np.uint8, offset=4+4*nd).reshape(dims)
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ.setdefault("MASTER_PORT", "29518")
    torch.set_num_threads(1); torch.manual_seed(0)
    dist.init_process_group("gloo", rank=rank, world_size=a.n)
    xtr = torch.tensor(idx("train-images-idx3-ubyte.gz"), dtype=torch.float32).div_(255).view(-1,1,28,28)
    ytr = torch.tensor(idx("train-labels-idx1-ubyte.gz"), dtype=torch.long)
    xte = torch.tensor(idx("t10k-images-idx3-ubyte.gz"), dtype=torch.float32).div_(255).view(-1,1,28,28)
    yte = torch.tensor(idx("t10k-labels-idx1-ubyte.gz"), dtype=torch.long)
    m = nn.parallel.DistributedDataParallel(build(a.model))
    opt = torch.optim.SGD(m.parameters(), lr=a.lr, momentum=0.9)
    n = xtr.shape[0]; shard = n // a.n
    for ep in range(a.epochs):
        g = torch.Generator(); g.manual_seed(ep)
        perm = torch.randperm(n, generator=g)[rank*shard:(rank+1)*shard]
        dist.barrier(); t0 = time.perf_counter()
        for i in range(0, shard - a.batch + 1, a.batch):
            ii = perm[i:i+a.batch]
            loss = F.cross_entropy(m(xtr[ii]), ytr[ii]); opt.zero_grad(); loss.backward(); opt.step()
        dist.barrier(); dt = time.perf_counter() - t0
        if rank == 0:
            with torch.no_grad(): acc = (m.module(xte).argmax(1) == yte).float().mean().item()
            print(f"epoch {ep+1} model {a.model} procs {a.n} batch/proc {a.batch} train_s {dt:.2f} samples_per_s {n/dt:.0f} test_acc {acc:.4f}", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    ap = argparse.ArgumentParser(); ap.add_argument("n", type=int); ap.add_argument("--model", default="mlp")
    ap.add_argument("--epochs", type=int, default=1); ap.add_argument("--batch", type=int, default=32); ap.add_argument("--lr", type=float, default=0.05)
    a = ap.parse_args(); mp.spawn(run, args=(a,), nprocs=a.n)
