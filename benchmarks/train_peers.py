#!/usr/bin/env python3
"""The peers' side of benchmarks/train_peers.sh: samples/s of one training step (forward,
softmax cross-entropy, backward, Adam) of an MLP on resident batches, in PyTorch or
TensorFlow, measured like bench_train_peers_dtf (16 seeded batches cycled, one warm-up
second, then --seconds timed)."""
import argparse
import os
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", choices=["torch", "tf"], required=True)
    ap.add_argument("--hidden", default="256,128")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    widths = [784] + [int(w) for w in a.hidden.split(",")] + [10]

    if a.framework == "torch":
        import torch
        torch.set_num_threads(a.threads)
        torch.set_num_interop_threads(1)
        torch.manual_seed(7)
        layers = []
        for i in range(len(widths) - 1):
            layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
            if i + 2 < len(widths):
                layers.append(torch.nn.ReLU())
        net = torch.nn.Sequential(*layers)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        loss_fn = torch.nn.CrossEntropyLoss()
        xs = [torch.rand(a.batch, widths[0]) for _ in range(16)]
        ys = [torch.randint(0, 10, (a.batch,)) for _ in range(16)]

        def step(i):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(xs[i % 16]), ys[i % 16])
            loss.backward()
            opt.step()
    else:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(a.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.random.set_seed(7)
        layers = [tf.keras.Input(shape=(widths[0],))]
        for i in range(1, len(widths)):
            layers.append(tf.keras.layers.Dense(widths[i], activation="relu" if i + 1 < len(widths) else None))
        net = tf.keras.Sequential(layers)
        opt = tf.keras.optimizers.Adam(learning_rate=1e-3)
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        xs = [tf.random.uniform((a.batch, widths[0])) for _ in range(16)]
        ys = [tf.random.uniform((a.batch,), 0, 10, dtype=tf.int32) for _ in range(16)]

        @tf.function
        def train_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, net(x, training=True))
            grads = tape.gradient(loss, net.trainable_variables)
            opt.apply_gradients(zip(grads, net.trainable_variables))
            return loss

        def step(i):
            train_step(xs[i % 16], ys[i % 16])

    def run_for(seconds, start):
        t0 = time.perf_counter()
        i = start
        while time.perf_counter() - t0 < seconds:
            step(i)
            i += 1
        return i - start, time.perf_counter() - t0

    n, _ = run_for(1.0, 0)
    n, s = run_for(a.seconds, n)
    print(f"framework={a.framework} model={a.hidden} batch={a.batch} threads={a.threads} "
          f"samples_per_s={n * a.batch / s:.1f}", flush=True)


if __name__ == "__main__":
    main()
