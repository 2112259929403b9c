#!/usr/bin/env python3
"""pipeline_vs_torch.py — PyTorch 1.13's GPipe (torch.distributed.pipeline.sync.Pipe)
on the deep MLP of examples/fashion_deep_mlp.ini, 2 stages on CPU, the same
micro-batch count, batch and optimizer as dtrain's run; prints one line
"torch_pipe samples_per_second X" after STEPS timed steps (synthetic data of
Fashion-MNIST's shape: the speed does not depend on the values).
Usage: pipeline_vs_torch.py M STEPS [BATCH [CHECKPOINT]]

CHECKPOINT is Pipe's activation checkpointing: "never" (the default here:
dtrain's run keeps its activations too, so both do the same arithmetic) or
Pipe's own default "except_last" (every micro-batch but the last is
recomputed in backward: one more forward for 7 of 8 micro-batches)."""
import os
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.distributed.rpc as rpc
from torch.distributed.pipeline.sync import Pipe

m = int(sys.argv[1])
steps = int(sys.argv[2])
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 256
ckpt = sys.argv[4] if len(sys.argv) > 4 else "never"
torch.manual_seed(0)
# Fair peer: Pipe on CPU runs both partitions in this one process, so it gets
# the machine's cores as intra-op threads (2 here), as many as dtrain's two
# single-threaded stage processes use together.
torch.set_num_threads(int(os.environ.get("TORCH_THREADS", os.cpu_count() or 1)))
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
tmp = tempfile.NamedTemporaryFile(delete=False)
rpc.init_rpc("worker", rank=0, world_size=1,
             rpc_backend_options=rpc.TensorPipeRpcBackendOptions(init_method="file://" + tmp.name))
W = 2048
s0 = nn.Sequential(nn.Flatten(), nn.Linear(784, W), nn.ReLU(), nn.Linear(W, W), nn.ReLU(),
                   nn.Dropout(0.2), nn.Linear(W, W), nn.ReLU())
s1 = nn.Sequential(nn.Linear(W, W), nn.ReLU(), nn.Dropout(0.2), nn.Linear(W, W), nn.ReLU(),
                   nn.Linear(W, 10))
model = Pipe(nn.Sequential(s0, s1), chunks=m, checkpoint=ckpt)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
x = torch.randn(batch, 1, 28, 28)
y = torch.randint(0, 10, (batch,))
lossf = nn.CrossEntropyLoss()


def step():
    opt.zero_grad()
    out = model(x).local_value()
    loss = lossf(out, y)
    loss.backward()
    opt.step()


for _ in range(3):
    step()
t0 = time.perf_counter()
for _ in range(steps):
    step()
dt = time.perf_counter() - t0
print(f"torch_pipe samples_per_second {steps * batch / dt:.1f} threads {torch.get_num_threads()} "
      f"checkpoint {ckpt}")
rpc.shutdown()
os.unlink(tmp.name)
