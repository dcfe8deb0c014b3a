#!/usr/bin/env python3
"""benchmarks/recommender_peer_tf.py — TensorFlow peer of dtf's recommender benchmark.

The model of examples/recommender/model.hpp in TensorFlow, trained with
tf.distribute.experimental.ParameterServerStrategy on the same Criteo TSV file (written by
`recommender --save_synthetic`), the same split (the last --test_fraction held out), the same
number of examples per epoch and epochs, the same batch:

  ids        the 26 categorical fields hashed (with their column) into one table of --buckets
             rows x --dim, a tf.Variable sharded over the ps by MinSizePartitioner (the dense
             variables, small, stay whole); an empty field is its column's own id
  numbers    log(1 + x) for x > 0, else 0 (criteo_dense_value)
  model      [numbers | the 26 rows | their 325 pairwise dot products] -> ReLU MLP -> 1 logit,
             binary cross-entropy (dtf's two-class softmax is the same logistic model)
  updates    SGD(--lr) on the dense variables, Adagrad(--embedding_lr) on the looked-up rows
             only (sparse updates on the ps: scatter ops on each shard)

Plain tf.Variables rather than Keras layers: Keras 3 (TensorFlow >= 2.16) does not train under
ParameterServerStrategy, and these are the variables a Keras Embedding and Dense layers hold.
The whole cluster (ps tasks and workers) runs in this process on 127.0.0.1 as in
sparse_peer_tf.py (whose in_process_cluster this reuses); this process is the coordinator and
schedules every step on the workers through ClusterCoordinator.schedule.

Prints one line:
  RESULT scheme=tf_pss workers=N ps=P examples=... epochs=E wall_s=... samples_per_s=...
         auc=... log_loss=... steps=K

Run by benchmarks/recommender.sh (which installs tensorflow-cpu into a venv).
"""
import argparse
import collections
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from sparse_peer_tf import in_process_cluster, log  # noqa: E402

COLUMNS = 26
NUMERIC = 13


def mix(x):
    """splitmix64's finaliser over uint64 numpy arrays."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def read_tsv(path, buckets):
    """labels [n], numbers [n, 13], bucket ids [n, 26] of a Criteo TSV file (plain or .gz)."""
    import gzip
    opener = gzip.open if path.endswith(".gz") else open
    labels, numbers, cats = [], [], []
    with opener(path, "rt") as f:
        for line in f:
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) != 1 + NUMERIC + COLUMNS:
                raise SystemExit(f"{path}: a line of {len(fields)} fields")
            labels.append(float(fields[0]))
            numbers.append([np.log1p(float(v)) if v and int(v) > 0 else 0.0 for v in fields[1:14]])
            # an empty field: value 2^32, outside the 32-bit hex values, so its column's own id
            cats.append([int(v, 16) if v else (1 << 32) for v in fields[14:]])
    cat = np.array(cats, dtype=np.uint64)
    col = np.arange(COLUMNS, dtype=np.uint64)[None, :]
    ids = (mix(cat ^ (col << np.uint64(40))) % np.uint64(buckets)).astype(np.int64)
    return (np.array(labels, np.float32), np.array(numbers, np.float32), ids)


def auc(scores, labels):
    """Exact ROC AUC, ties at their average rank (Mann-Whitney)."""
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s), np.float64)
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        ranks[i:j] = (i + 1 + j) / 2.0
        i = j
    pos = labels[order] == 1
    npos, nneg = pos.sum(), len(s) - pos.sum()
    return float((ranks[pos].sum() - npos * (npos + 1) / 2.0) / (npos * nneg))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="Criteo TSV (recommender --save_synthetic)")
    ap.add_argument("--test_fraction", type=float, default=0.1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ps", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--hidden", default="64,32")
    ap.add_argument("--buckets", type=int, default=1 << 20, help="rows of the hashed table")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--embedding_lr", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--inflight", type=int, default=0, help="unfinished steps at most (default 8 per worker)")
    a = ap.parse_args()
    inflight = a.inflight or 8 * a.workers

    t = time.perf_counter()
    y, x, ids = read_tsv(a.data, a.buckets)
    n = len(y)
    split = n - int(n * a.test_fraction)
    log(f"# read {n} lines in {time.perf_counter() - t:.1f} s; {split} to train, {n - split} held out")

    resolver, _servers = in_process_cluster(a.ps, a.workers)
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver,
        variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=256 << 10, max_shards=a.ps))
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    log(f"# cluster up: {a.ps} ps, {a.workers} workers, in process; tensorflow {tf.__version__}")

    D = a.dim
    widths = [NUMERIC + COLUMNS * D + COLUMNS * (COLUMNS - 1) // 2] + [int(h) for h in a.hidden.split(",")] + [1]
    rng = np.random.default_rng(a.seed)
    with strategy.scope():
        table = tf.Variable(tf.random.stateless_uniform((a.buckets, D), seed=[a.seed, 0], minval=-0.05, maxval=0.05),
                            name="categorical")
        accum = tf.Variable(tf.fill((a.buckets, D), 0.1), name="categorical_adagrad")
        dense = []
        for i, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):
            w = rng.normal(0, np.sqrt(2.0 / fan_in), (fan_in, fan_out)).astype(np.float32)
            dense += [tf.Variable(w, name=f"dense_{i}/kernel"), tf.Variable(tf.zeros([fan_out]), name=f"dense_{i}/bias")]
    log(f"# table {a.buckets} x {D} in shards on {[v.device for v in table.variables]}")
    iu = np.triu_indices(COLUMNS, 1)
    pair_index = tf.constant(iu[0] * COLUMNS + iu[1], tf.int32)

    def logits_of(num, cat, rows_of):
        e = rows_of(cat)  # [b, 26, D]
        b = tf.shape(e)[0]
        dots = tf.gather(tf.reshape(tf.matmul(e, e, transpose_b=True), [b, COLUMNS * COLUMNS]), pair_index, axis=1)
        h = tf.concat([num, tf.reshape(e, [b, COLUMNS * D]), dots], axis=1)
        for i in range(0, len(dense), 2):
            h = tf.matmul(h, dense[i]) + dense[i + 1]
            if i + 2 < len(dense):
                h = tf.nn.relu(h)
        return tf.squeeze(h, 1)

    lr, elr = tf.constant(a.lr), tf.constant(a.embedding_lr)

    @tf.function
    def step(num, cat, label):
        unique, where = tf.unique(tf.reshape(cat, [-1]))
        with tf.GradientTape() as tape:
            rows = tf.nn.embedding_lookup(table, unique)  # the distinct rows, gathered from the ps once
            tape.watch(rows)
            z = logits_of(num, tf.reshape(where, tf.shape(cat)), lambda c: tf.gather(rows, c))
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=z))
        grads = tape.gradient(loss, [rows] + dense)
        for v, g in zip(dense, grads[1:]):
            v.assign_sub(lr * g)
        # Adagrad on the distinct rows: accumulate g^2, then step by lr * g / sqrt(accumulator)
        g = tf.convert_to_tensor(grads[0])  # [distinct rows, D], the uses summed
        accum.scatter_add(tf.IndexedSlices(g * g, unique))
        acc_rows = tf.nn.embedding_lookup(accum, unique)
        table.scatter_sub(tf.IndexedSlices(elr * g / tf.sqrt(acc_rows), unique))
        return loss

    # The batches of each epoch, shuffled, made before the clock starts.
    order_rng = np.random.default_rng(a.seed)
    epochs = []
    for _ in range(a.epochs):
        perm = order_rng.permutation(split)
        epochs.append([(tf.constant(x[perm[i:i + a.batch]]), tf.constant(ids[perm[i:i + a.batch]]),
                        tf.constant(y[perm[i:i + a.batch]])) for i in range(0, split, a.batch)])
    steps = sum(len(e) for e in epochs)

    t = time.perf_counter()
    pending = collections.deque()
    for batches in epochs:
        for b in batches:
            pending.append(coordinator.schedule(step, args=b))
            if len(pending) > inflight:
                pending.popleft().fetch()
    coordinator.join()
    wall = time.perf_counter() - t

    # Evaluation on the coordinator: the trained variables read back, the held-out logits.
    full = tf.concat([v.read_value() for v in table.variables], axis=0) if hasattr(table, "variables") else table
    z = []
    for i in range(split, n, 4096):
        z.append(logits_of(tf.constant(x[i:i + 4096]), tf.constant(ids[i:i + 4096]),
                           lambda c: tf.nn.embedding_lookup(full, c)).numpy())
    z = np.concatenate(z).astype(np.float64)
    p = np.clip(1.0 / (1.0 + np.exp(-z)), 1e-7, 1 - 1e-7)
    yt = y[split:]
    ll = float(-np.mean(yt * np.log(p) + (1 - yt) * np.log(1 - p)))
    print(f"RESULT scheme=tf_pss workers={a.workers} ps={a.ps} examples={split} epochs={a.epochs} "
          f"wall_s={wall:.1f} samples_per_s={a.epochs * split / wall:.0f} auc={auc(z, yt):.4f} "
          f"log_loss={ll:.4f} steps={steps} tf={tf.__version__}", flush=True)
    # The in-process gRPC servers cannot be stopped cleanly; skip interpreter teardown.
    os._exit(0)


if __name__ == "__main__":
    main()
