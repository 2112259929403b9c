# Peer for `make bench-ps`: PyTorch 1.13's RPC parameter server on Fashion-MNIST, with the
# structure of PyTorch's own tutorial "Implementing a Parameter Server Using Distributed RPC
# Framework" (rpc_param_server_tutorial): one ParameterServer process holds the model; each
# trainer's TrainerNet runs forward through an rpc_sync to the server's model (via its RRef),
# backward runs through distributed autograd, and a DistributedOptimizer (SGD, momentum 0.9)
# steps the parameters on the server. 1 server + N trainers, one thread each, CPU.
# Usage: python3 fmnist_rpc_ps.py NTRAINERS --batch B --steps S [--lr LR]
# Prints "rpc_ps trainers N batch B samples_per_s X" (all trainers' samples / wall time of the
# trainers' step loops, after 10 warm-up steps). Change from the tutorial: a step lock (below).
import argparse, gzip, os, sys, threading, time
import numpy as np
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch.distributed.optim import DistributedOptimizer

D = "/usr/share/datasets/fashion-mnist/"
def idx(p):
    d = gzip.open(D + p).read(); nd = d[3]
    dims = [int.from_bytes(d[4+4*i:8+4*i], "big") for i in range(nd)]
    return np.frombuffer(d, np.uint8, offset=4+4*nd).reshape(dims)

class ParameterServer(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(),
                                   nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    def forward(self, x):
        return self.model(x)
    def get_param_rrefs(self):
        return [rpc.RRef(p) for p in self.model.parameters()]

param_server = None
lock = threading.Lock()
def get_parameter_server():
    global param_server
    with lock:
        if param_server is None:
            param_server = ParameterServer()
        return param_server
def call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)
def remote_method(method, rref, *args, **kwargs):
    return rpc.rpc_sync(rref.owner(), call_method, args=[method, rref] + list(args), kwargs=kwargs)

class TrainerNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.param_server_rref = rpc.remote("parameter_server", get_parameter_server)
    def get_global_param_rrefs(self):
        return remote_method(ParameterServer.get_param_rrefs, self.param_server_rref)
    def forward(self, x):
        return remote_method(ParameterServer.forward, self.param_server_rref, x)

# Two trainers running concurrently break the tutorial's code: one's optimizer step updates
# the parameters in place while the other's autograd graph still holds them ("modified by an
# inplace operation"). So each trainer step (forward, backward, step) holds a lock on the
# server, taken and released by RPC: the only change from the tutorial's structure.
step_lock = threading.Lock()
def lock_step():
    step_lock.acquire()
def unlock_step():
    step_lock.release()

def trainer(rank, a, x, y):
    net = TrainerNet()
    opt = DistributedOptimizer(torch.optim.SGD, net.get_global_param_rrefs(), lr=a.lr, momentum=0.9)
    g = torch.Generator(); g.manual_seed(rank)
    n = x.shape[0]
    t0 = None
    for s in range(a.steps + 10):
        if s == 10:
            t0 = time.perf_counter()
        ii = torch.randint(0, n, (a.batch,), generator=g)
        rpc.rpc_sync("parameter_server", lock_step)
        with dist_autograd.context() as cid:
            loss = F.cross_entropy(net(x[ii]), y[ii])
            dist_autograd.backward(cid, [loss])
            opt.step(cid)
        rpc.rpc_sync("parameter_server", unlock_step)
    return time.perf_counter() - t0

def run(rank, a):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("MASTER_PORT", "29531")
    world = a.n + 1
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=120)
    if rank == 0:
        rpc.init_rpc("parameter_server", rank=0, world_size=world, rpc_backend_options=opts)
    else:
        rpc.init_rpc(f"trainer_{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
        x = torch.tensor(idx("train-images-idx3-ubyte.gz"), dtype=torch.float32).div_(255).view(-1, 1, 28, 28)
        y = torch.tensor(idx("train-labels-idx1-ubyte.gz"), dtype=torch.long)
        dt = trainer(rank, a, x, y)
        rpc.rpc_sync("trainer_1", _report, args=(dt,))
    rpc.shutdown()
    if rank == 1:
        secs = max(_times)
        print(f"rpc_ps trainers {a.n} batch {a.batch} samples_per_s {a.n * a.steps * a.batch / secs:.0f}", flush=True)

_times = []
def _report(dt):
    _times.append(dt)

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("n", type=int)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=0.05)
    a = ap.parse_args()
    mp.spawn(run, args=(a,), nprocs=a.n + 1, join=True)
