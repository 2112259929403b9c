# Peer for `make bench-compress`: PyTorch 1.13 DDP over Gloo, one process per
# rank (started in its own network namespace by bench/compress.sh), with a
# DDP communication hook: none, fp16 (default_hooks.fp16_compress_hook) or
# powersgd (powerSGD_hook, rank 2, error feedback and warm start on).
# Same MLP, data normalisation, SGD momentum 0.9 + weight decay 5e-4 and a
# per-step cosine schedule as the dtrain side. Rank 0 prints one line per
# epoch: seconds since training started (evaluation included) and the test
# accuracy. Usage: python3 fmnist_ddp_hook.py RANK WORLD ADDR PORT --hook H
#                  --epochs E --batch GLOBAL --lr LR
import argparse, gzip, os, time
import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

ap = argparse.ArgumentParser()
ap.add_argument("rank", type=int); ap.add_argument("world", type=int)
ap.add_argument("addr"); ap.add_argument("port")
ap.add_argument("--hook", default="none"); ap.add_argument("--epochs", type=int, default=4)
ap.add_argument("--batch", type=int, default=256); ap.add_argument("--lr", type=float, default=0.1)
a = ap.parse_args()
D = "/usr/share/datasets/fashion-mnist/"
def idx(p):
    d = gzip.open(D + p).read(); nd = d[3]
    dims = [int.from_bytes(d[4+4*i:8+4*i], "big") for i in range(nd)]
    return np.frombuffer(d, np.uint8, offset=4+4*nd).reshape(dims)
os.environ["MASTER_ADDR"] = a.addr; os.environ["MASTER_PORT"] = a.port
torch.set_num_threads(1); torch.manual_seed(0)
dist.init_process_group("gloo", rank=a.rank, world_size=a.world)
xtr = torch.tensor(idx("train-images-idx3-ubyte.gz"), dtype=torch.float32).view(-1, 784)
mean, std = xtr.mean(), xtr.std()
xtr = (xtr - mean) / std
ytr = torch.tensor(idx("train-labels-idx1-ubyte.gz"), dtype=torch.long)
xte = (torch.tensor(idx("t10k-images-idx3-ubyte.gz"), dtype=torch.float32).view(-1, 784) - mean) / std
yte = torch.tensor(idx("t10k-labels-idx1-ubyte.gz"), dtype=torch.long)
model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
m = nn.parallel.DistributedDataParallel(model)
if a.hook == "fp16":
    m.register_comm_hook(None, default_hooks.fp16_compress_hook)
elif a.hook == "powersgd":
    st = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                     start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)
    m.register_comm_hook(st, powerSGD_hook.powerSGD_hook)
opt = torch.optim.SGD(m.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4)
n = xtr.shape[0]; per = a.batch // a.world
steps = n // a.batch
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps * a.epochs)
dist.barrier(); t0 = time.perf_counter()
for ep in range(a.epochs):
    g = torch.Generator(); g.manual_seed(ep)
    perm = torch.randperm(n, generator=g)
    for s in range(steps):
        ii = perm[s * a.batch + a.rank * per: s * a.batch + (a.rank + 1) * per]
        loss = F.cross_entropy(m(xtr[ii]), ytr[ii]); opt.zero_grad(); loss.backward(); opt.step(); sched.step()
    if a.rank == 0:
        with torch.no_grad(): acc = (model(xte).argmax(1) == yte).float().mean().item()
        print(f"epoch {ep+1} time {time.perf_counter() - t0:.2f} test_acc {acc:.4f}", flush=True)
    dist.barrier()
dist.destroy_process_group()
