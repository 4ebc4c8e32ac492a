"""A host's per-core speed, the parts a rank's time is made of (medians of 3): a Python loop,
torch's CPU dispatch, CUDA launches, gloo all_reduce latency between 2 local processes.
Usage: python ci/host_speed.py from the checkout (docs/performance.md; the bench records
the Python loop of harness/report/host_speed.py)."""
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from harness.report.host_speed import LOOP_STEPS, median_s, python_loop_s


def gloo_rank(rank, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29533"))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    x = torch.ones(256)
    for _ in range(200):
        dist.all_reduce(x)
    dist.barrier()
    t = time.perf_counter()
    for _ in range(3000):
        dist.all_reduce(x)
    if rank == 0:
        q.put((time.perf_counter() - t) / 3000)
    dist.destroy_process_group()


def dispatch():
    a = torch.ones(16)
    for _ in range(100_000):
        torch.add(a, a)


if __name__ == "__main__":
    print(f"python loop {LOOP_STEPS:,}: {python_loop_s():.3f} s")
    print(f"torch.add x100k (CPU): {median_s(dispatch):.3f} s")
    if torch.cuda.is_available():
        c = torch.ones(16, device="cuda")
        def launches():
            for _ in range(50_000):
                c.add_(1)
            torch.cuda.synchronize()
        launches()
        print(f"cuda add_ x50k: {median_s(launches):.3f} s")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=gloo_rank, args=(r, q)) for r in range(2)]
    for p in procs:
        p.start()
    print(f"gloo all_reduce 1 KB, 2 ranks: {q.get(timeout=120) * 1e6:.0f} us")
    for p in procs:
        p.join(60)
