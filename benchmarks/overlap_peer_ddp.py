#!/usr/bin/env python3
"""PyTorch DDP's side of benchmarks/overlap.sh: synchronous data-parallel training of the same
MLP as bench_overlap_rank (784-<hidden>-10, Dense+ReLU, Dense logits; Adam, rate 1e-3) over the
gloo backend, which allreduces gradient buckets (bucket_cap_mb) while backprop runs.

Each rank trains on 16 resident synthetic batches (features uniform in [0, 1), random labels
of 10 classes, seeded per rank), cycled; one intra-op thread per process. The first --warmup
steps are not timed; rank 0 times the next --steps (from the end of the last warm-up step to
the end of the last step) and prints
  RESULT overlap=1 framework=ddp hidden=<h> batch=<b> workers=<n> bucket_mib=<m> threads=1
         steps=<s> samples_per_s=<all ranks' examples per second> step_ms=<ms per step>

Two ways to start it:
  overlap_peer_ddp.py --workers 2 ...            picks a free port on 127.0.0.1 and spawns the
                                                 ranks with torch.multiprocessing
  overlap_peer_ddp.py --rank R --workers 2 --master ADDR:PORT ...
                                                 this process is rank R (one per host; rank 0
                                                 listens on ADDR:PORT)
"""
import argparse
import os
import socket
import time


def run_rank(rank, a, master):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    addr, port = master.rsplit(":", 1)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=a.workers)
    widths = [784] + [int(w) for w in a.hidden.split(",")] + [10]
    torch.manual_seed(7)  # the same initial model on every rank (DDP broadcasts rank 0's anyway)
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    net = DDP(torch.nn.Sequential(*layers), bucket_cap_mb=a.bucket_mib)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1000 + rank)
    xs = [torch.rand(a.batch, widths[0], generator=g) for _ in range(16)]
    ys = [torch.randint(0, 10, (a.batch,), generator=g) for _ in range(16)]

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(xs[i % 16]), ys[i % 16])
        loss.backward()  # DDP's hooks allreduce the buckets as they fill; waits for them at the end
        opt.step()

    for i in range(a.warmup):
        step(i)
    t0 = time.perf_counter()
    for i in range(a.warmup, a.warmup + a.steps):
        step(i)
    s = time.perf_counter() - t0
    if rank == 0:
        print(f"RESULT overlap=1 framework=ddp hidden={a.hidden} batch={a.batch} workers={a.workers} "
              f"bucket_mib={a.bucket_mib:g} threads={a.threads} steps={a.steps} "
              f"samples_per_s={a.steps * a.batch * a.workers / s:.1f} step_ms={1e3 * s / a.steps:.2f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def spawned(rank, a, master):
    run_rank(rank, a, master)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", default="2048,2048")
    ap.add_argument("--batch", type=int, default=64, help="examples per rank and step")
    ap.add_argument("--steps", type=int, default=30, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="steps before the timed ones")
    ap.add_argument("--bucket_mib", type=float, default=25, help="DDP's bucket_cap_mb")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rank", type=int, default=-1, help="run only this rank (with --master)")
    ap.add_argument("--master", default="", help="ADDR:PORT of rank 0 (with --rank)")
    a = ap.parse_args()
    if a.rank >= 0:
        if not a.master:
            ap.error("--rank needs --master ADDR:PORT")
        run_rank(a.rank, a, a.master)
        return
    # One host: a free port on the loopback (closed again before rank 0 binds it: a benchmark's
    # pick, not a test's), the ranks spawned here.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.multiprocessing as mp
    mp.spawn(spawned, args=(a, f"127.0.0.1:{port}"), nprocs=a.workers, join=True)


if __name__ == "__main__":
    main()
