#!/usr/bin/env python3
"""PyTorch's side of bench_gpu's step section: the same MLPs (784-256-128-10, 784-2048-2048-10),
batches (64, 256, 1024), loss (softmax cross-entropy) and optimizer (Adam, lr 1e-3) on one
resident batch on the GPU; median ms per step (forward, backward, update) over --repeats runs of
--steps steps, the device synchronised around each run. Adam twice: PyTorch's default (the
multi-tensor "foreach" kernels) and fused=True (one kernel for the whole update, as dtf's).
Prints "csv,step,torch,<widths>,<batch>,<ms>" and "csv,step,torch_fused,...".

    python3 benchmarks/gpu_step_time_torch.py [--repeats 5] [--steps 50]
"""
import argparse
import statistics
import time

import torch


def mlp(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(1)
    # TF32 off: dtf's GEMMs are plain float32 (cublasSgemm), so both sides do the same arithmetic.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    print(f"{'widths':<18} {'batch':>6} {'Adam':>8} {'ms/step':>10} {'samples/s':>12}")
    for hidden in ([256, 128], [2048, 2048]):
        widths = [784, *hidden, 10]
        for batch in (64, 256, 1024):
            for fused in (False, True):
                t = time_step(widths, batch, fused, args, dev)
                name = "-".join(map(str, widths))
                kind = "fused" if fused else "foreach"
                print(f"{name:<18} {batch:>6} {kind:>8} {1e3 * t:>10.4f} {batch / t:>12.0f}")
                print(f"csv,step,{'torch_fused' if fused else 'torch'},{name},{batch},{1e3 * t:.5f}")


def time_step(widths, batch, fused, args, dev):
    torch.manual_seed(1)
    net = mlp(widths).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, fused=fused)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.rand(batch, 784, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    runs = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t0) / args.steps)
    return statistics.median(runs)

if __name__ == "__main__":
    main()
