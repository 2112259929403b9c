"""torch_elastic.py — the PyTorch 1.13 side of bench/elastic.sh's torchrun
comparison: the same MLP as examples/fashion_mlp.ini (784-256-128-10,
SGD momentum 0.9, batch 64 global) trained with DDP over Gloo on synthetic
data of Fashion-MNIST's shape, under `torchrun --nnodes=1:3
--max-restarts=3`. Checkpoints every epoch (rank 0, torch.save; the only
way torchrun's restart keeps progress), resumes from it when restarted.
Each rank appends "STEP <global step> <wall clock> <restart count>" per
completed step to $OUT/steps.<rank> and writes its pid to $OUT/pid.<rank>."""
import os, sys, time
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

out = os.environ["OUT"]
epochs, n = int(os.environ.get("EPOCHS", "6")), int(os.environ.get("N", "6400"))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
open(f"{out}/pid.{rank}", "w").write(str(os.getpid()))
torch.manual_seed(4)
x = torch.rand(n, 784)
y = torch.randint(0, 10, (n,))
model = DDP(nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                          nn.Linear(128, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
ck = f"{out}/ckpt.pt"
start = 0
if os.path.exists(ck):
    s = torch.load(ck)
    model.module.load_state_dict(s["model"]); opt.load_state_dict(s["opt"]); start = s["epoch"]
per = 64 // world
steps = n // 64
log = open(f"{out}/steps.{rank}", "a")
for ep in range(start, epochs):
    g = torch.Generator().manual_seed(ep)
    perm = torch.randperm(n, generator=g)
    for k in range(steps):
        idx = perm[k * 64 + rank * per:k * 64 + (rank + 1) * per]
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        log.write(f"STEP {ep * steps + k + 1} {time.time():.6f} {restart}\n"); log.flush()
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "epoch": ep + 1},
                   ck + ".tmp")
        os.replace(ck + ".tmp", ck)
dist.destroy_process_group()
