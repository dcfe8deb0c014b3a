#!/usr/bin/env python3
"""PyTorch DDP's side of benchmarks/torch_cnn.sh: the CNN of examples/torch_cnn trained on
Fashion-MNIST by synchronous data-parallel SGD over the gloo backend, the way dtf's
ring-allreduce trains it there.

The same network (conv 3x3 1->32 pad 1, BatchNorm, ReLU, max-pool 2; conv 3x3 32->64 pad 1,
BatchNorm, ReLU, max-pool 2; flatten, dropout 0.25, linear 3136->128, ReLU, linear 128->10) and
the same training: Adam, rate 1e-3, mean cross-entropy, batch 64 per worker; worker k of n
trains every n-th training image from the k-th (dtf's shard), reshuffled each epoch, the last
batch of an epoch partial; images as float32 x/255 in [0, 1]. One intra-op thread per process.
Rank 0 evaluates the 10,000 test images (eval mode, batches of 1000) after each epoch.

The ranks are spawned here (torch.multiprocessing) and meet through a FileStore in a temporary
directory, so no port is picked by hand; gloo's own connections go over the loopback.
Rank 0 prints, like dtf's chief,
  RESULT scheme=ddp workers=<n> accuracy=<a> wall_s=<s> samples_per_s=<all ranks' examples/s>
wall_s runs from just before the process group is set up (the data already loaded, as in dtf)
to the end of the last evaluation; samples_per_s = epochs * 60000 / wall_s.

--device cuda (scripts/gpu-check.sh's part torch, beside examples/torch_cnn on the GPU): the
network, the training and test images and the labels on the GPU (every rank the same GPU,
DDP's buckets still over gloo), the device drained before the clock stops. --mode eager: one
process, no process group, plain PyTorch on the whole training set (RESULT scheme=eager).

  /usr/bin/python3 benchmarks/torch_cnn_ddp.py [--epochs 1] [--workers 2] [--threads 1]
                                               [--data /usr/share/datasets/fashion-mnist]
                                               [--device cpu|cuda] [--mode ddp|eager]
"""
import argparse
import gzip
import os
import tempfile
import time

import numpy as np


def read_idx(path):
    """An IDX file (gzip) as a numpy array: magic (0, 0, type 0x08 = ubyte, rank), then the dims."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    rank = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    return (x.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28), y.astype(np.int64)


def make_cnn(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.25), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def run_rank(rank, a, store_path):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    eager = a.mode == "eager"
    workers = 1 if eager else a.workers
    dev = torch.device(a.device)
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    x, y = load(a.data, "train")
    n_train = len(y)
    x, y = torch.from_numpy(np.ascontiguousarray(x[rank::workers])), torch.from_numpy(y[rank::workers].copy())
    x, y = x.to(dev), y.to(dev)
    if rank == 0:
        tx, ty = load(a.data, "test")
        tx, ty = torch.from_numpy(tx).to(dev), torch.from_numpy(ty).to(dev)

    t0 = time.perf_counter()
    if not eager:
        dist.init_process_group("gloo", store=dist.FileStore(store_path, workers), rank=rank, world_size=workers)
    torch.manual_seed(a.seed)  # DDP broadcasts rank 0's initial parameters and buffers anyway
    net = make_cnn(torch).to(dev)
    net = net if eager else DDP(net)
    module = net if eager else net.module
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    torch.manual_seed(a.seed * 1000 + rank + 1)  # dropout masks differ per rank
    g = torch.Generator().manual_seed(a.seed + rank)
    accuracy = float("nan")
    for epoch in range(a.epochs):
        net.train()
        order = torch.randperm(len(y), generator=g).to(dev)
        for i in range(0, len(y), a.batch):
            idx = order[i:i + a.batch]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(x[idx]), y[idx])
            loss.backward()  # DDP's hooks allreduce the gradient buckets as backprop fills them
            opt.step()
        if rank == 0:
            net.eval()
            correct = 0
            with torch.no_grad():
                for i in range(0, len(ty), 1000):
                    correct += int((module(tx[i:i + 1000]).argmax(1) == ty[i:i + 1000]).sum())
            accuracy = correct / len(ty)
            print(f"{a.mode}: epoch {epoch + 1}  test_accuracy {accuracy:.4f}  at {time.perf_counter() - t0:.1f}s",
                  flush=True)
    if not eager:
        dist.barrier()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    if rank == 0:
        samples = a.epochs * n_train
        print(f"RESULT scheme={a.mode} workers={workers} accuracy={accuracy:.4f} wall_s={wall:.1f} "
              f"samples_per_s={samples / wall:.0f}", flush=True)
    if not eager:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64, help="examples per rank and step")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="directory of the IDX .gz files")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the network and data live")
    ap.add_argument("--mode", default="ddp", choices=["ddp", "eager"], help="eager: one process, no DDP")
    a = ap.parse_args()
    if a.mode == "eager":
        run_rank(0, a, None)
        return
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory(prefix="dtf_ddp_") as d:
        mp.spawn(run_rank, args=(a, os.path.join(d, "store")), nprocs=a.workers, join=True)


if __name__ == "__main__":
    main()
