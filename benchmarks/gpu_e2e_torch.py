#!/usr/bin/env python3
"""PyTorch's side of the end-to-end GPU comparison (scripts/gpu-check.sh --parts e2e): the
Fashion-MNIST MLP of dtf's examples (784-256-128-10, Adam 1e-3, softmax cross-entropy) trained
for --epochs epochs on the GPU with the whole training set resident there, reshuffled every
epoch, the last short batch kept, as dtf's non_distributed and ring_allreduce examples train it.
Modes:
  eager      PyTorch's default Adam (multi-tensor "foreach" kernels)
  fused      Adam(fused=True)
  graph      the whole step (forward, loss, backward, fused capturable Adam) captured in one CUDA
             graph and replayed; the epoch's short last batch has a graph of its own
  ddp        2 processes sharing the GPU, DistributedDataParallel over gloo, --batch per process
Prints per mode the training time (wall seconds from the first step to the last, the device
drained; data loading and warm-up left out), ms per step, samples/s and the test accuracy, and
"csv,e2e,torch_<mode>,<batch>,<seconds>,<ms_per_step>,<accuracy>" lines.

    python3 benchmarks/gpu_e2e_torch.py --data /usr/share/datasets/fashion-mnist [--epochs 2]
        [--batch 64 512] [--modes eager fused graph ddp]
"""
import argparse
import gzip
import os
import struct
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)


def load(data_dir, dev):
    def pair(prefix):
        x = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz")).reshape(-1, 784)
        y = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz")).long()
        return x.to(dev).float().div_(255.0), y.to(dev)
    return pair("train"), pair("t10k")


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 10))


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def accuracy(net, x, y):
    with torch.no_grad():
        return (net(x).argmax(1) == y).float().mean().item()


def batches(n, batch, epoch, seed, dev, rank=0, world=1):
    g = torch.Generator(device="cpu").manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=g)[rank::world].to(dev)
    return [perm[i:i + batch] for i in range(0, perm.numel(), batch)]


def train_plain(mode, train, test, batch, epochs, dev):
    torch.manual_seed(1)
    net = mlp().to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, fused=(mode == "fused"))
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = train
    steps = 0
    sync(dev)
    t0 = time.perf_counter()
    for epoch in range(epochs):
        for idx in batches(x.shape[0], batch, epoch, 42, dev):
            opt.zero_grad(set_to_none=True)
            loss_fn(net(x[idx]), y[idx]).backward()
            opt.step()
            steps += 1
    sync(dev)
    return time.perf_counter() - t0, steps, accuracy(net, *test)


def train_graph(train, test, batch, epochs, dev):
    torch.manual_seed(1)
    net = mlp().to(dev)
    start = {k: v.clone() for k, v in net.state_dict().items()}
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, fused=True, capturable=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = train
    n = x.shape[0]
    sizes = sorted({batch, n % batch} - {0}, reverse=True)
    static = {b: (torch.zeros(b, 784, device=dev), torch.zeros(b, dtype=torch.long, device=dev)) for b in sizes}
    # Warm-up on a side stream (the optimizer's state is created there), then one graph per size.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for b in sizes:
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                loss_fn(net(static[b][0]), static[b][1]).backward()
                opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graphs = {}
    for b in sizes:
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            loss_fn(net(static[b][0]), static[b][1]).backward()
            opt.step()
        graphs[b] = g
    # Back to the initial weights and a fresh optimizer state, in place (the graphs hold them).
    with torch.no_grad():
        for k, v in net.state_dict().items():
            v.copy_(start[k])
        for state in opt.state.values():
            for v in state.values():
                v.zero_()
    steps = 0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for epoch in range(epochs):
        for idx in batches(n, batch, epoch, 42, dev):
            sx, sy = static[idx.numel()]
            torch.index_select(x, 0, idx, out=sx)
            torch.index_select(y, 0, idx, out=sy)
            graphs[idx.numel()].replay()
            steps += 1
    torch.cuda.synchronize()
    return time.perf_counter() - t0, steps, accuracy(net, *test)


def ddp_rank(rank, world, port, data_dir, batch, epochs, device, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dev = torch.device(device)
    train, test = load(data_dir, dev)
    torch.manual_seed(1)
    cuda = dev.type == "cuda"
    net = torch.nn.parallel.DistributedDataParallel(mlp().to(dev), device_ids=[0] if cuda else None)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, fused=cuda)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = train
    steps = 0
    dist.barrier()
    sync(dev)
    t0 = time.perf_counter()
    for epoch in range(epochs):
        for idx in batches(x.shape[0], batch, epoch, 42, dev, rank, world):
            opt.zero_grad(set_to_none=True)
            loss_fn(net(x[idx]), y[idx]).backward()
            opt.step()
            steps += 1
    sync(dev)
    dist.barrier()
    wall = time.perf_counter() - t0
    if rank == 0:
        out.put((wall, steps, accuracy(net.module, *test)))
    dist.destroy_process_group()


def train_ddp(data_dir, batch, epochs, device):
    import socket
    with socket.socket() as s:  # a free port for the rendezvous, held until the ranks start
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=ddp_rank, args=(r, 2, port, data_dir, batch, epochs, device, out)) for r in range(2)]
    for p in procs:
        p.start()
    result = out.get(timeout=600)
    for p in procs:
        p.join()
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--modes", nargs="+", default=["eager", "fused", "graph", "ddp"])
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of eager and ddp (no GPU)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    # TF32 off: dtf's GEMMs are plain float32, so both sides do the same arithmetic.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu (dry run)"
    print(f"device: {name}; torch {torch.__version__}; {args.epochs} epochs")
    train, test = load(args.data, dev)
    samples = args.epochs * train[0].shape[0]
    if dev.type == "cuda":
        train_plain("eager", train, test, 64, 1, dev)  # CUDA context, cuBLAS and allocator warm
    for batch in args.batch:
        for mode in args.modes:
            if dev.type != "cuda" and mode in ("fused", "graph"):
                continue
            if mode == "ddp":
                if batch != 64:
                    continue  # the 2-process case: batch 64 per process
                wall, steps, acc = train_ddp(args.data, batch, args.epochs, args.device)
            elif mode == "graph":
                wall, steps, acc = train_graph(train, test, batch, args.epochs, dev)
            else:
                wall, steps, acc = train_plain(mode, train, test, batch, args.epochs, dev)
            print(f"{mode:<6} batch {batch:>4}: {wall:8.3f} s, {1e3 * wall / steps:7.3f} ms/step, "
                  f"{samples / wall:10.0f} samples/s, test accuracy {acc:.4f}")
            print(f"csv,e2e,torch_{mode},{batch},{wall:.4f},{1e3 * wall / steps:.5f},{acc:.4f}")


if __name__ == "__main__":
    main()
