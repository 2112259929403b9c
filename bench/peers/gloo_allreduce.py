# gloo_allreduce.py — peer baseline for `make bench-comm`: torch.distributed
# allreduce over Gloo (TCP loopback), float32 sum, timed like `dtrain bench
# allreduce` (same columns; busbw = algbw * 2(n-1)/n, time = slowest rank).
# It only measures; it is not a correctness test.
# Usage: /usr/bin/python3 gloo_allreduce.py NPROCS [MIN_BYTES [MAX_BYTES [PORT]]]
import os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def iters_for(nbytes):
    return 200 if nbytes < (256 << 10) else (20 if nbytes < (16 << 20) else 5)

def run(rank, n, minb, maxb, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    if rank == 0:
        print(f"# peer=gloo ranks={n}")
        print(f"{'bytes':>12} {'count':>12} {'time_us':>12} {'algbw_GBps':>12} {'busbw_GBps':>12}", flush=True)
    c = max(1, minb // 4)
    while c * 4 <= maxb:
        t = torch.ones(c)
        iters = iters_for(c * 4)
        dist.all_reduce(t); dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters): dist.all_reduce(t)
        el = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(el, op=dist.ReduceOp.MAX)
        dt = el.item(); alg = c * 4 / dt / 1e9
        if rank == 0:
            print(f"{c*4:12d} {c:12d} {dt*1e6:12.2f} {alg:12.3f} {alg*2*(n-1)/n:12.3f}", flush=True)
        c *= 4
    dist.destroy_process_group()

if __name__ == "__main__":
    n = int(sys.argv[1])
    minb = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    maxb = int(sys.argv[3]) if len(sys.argv) > 3 else (64 << 20)
    port = int(sys.argv[4]) if len(sys.argv) > 4 else 29517
    mp.spawn(run, args=(n, minb, maxb, port), nprocs=n)
