#!/usr/bin/env python3
"""benchmarks/sparse_peer_tf.py — TensorFlow peer for dtf's sparse-embedding benchmark.

Trains one embedding table of ROWS x DIM float32, sharded over 3 parameter servers with
tf.distribute.experimental.ParameterServerStrategy and FixedShardsPartitioner(3), the way a
TensorFlow user would. The whole cluster (ps tasks and workers) runs in this one process as
in-process tf.distribute.Server instances on 127.0.0.1; this process is the coordinator
(chief) and drives the workers through ClusterCoordinator.schedule.

Each step: a batch of --batch ids drawn from a Zipf(1.1) distribution over [0, ROWS)
(values above ROWS rejected, then minus 1), rows gathered with tf.nn.embedding_lookup,
loss = 1e-3 * sum of squares of the gathered rows, and a plain SGD step applied as a sparse
(IndexedSlices) scatter_sub on each ps shard. The id batches are made up front (a pool of
--pool batches, cycled) so that drawing them is not timed.

Reports the time to create and initialise the table (--init picks how; see --help),
steps/s, the mean number of distinct rows per step, and distinct rows gathered+updated per
second, as one line:

  peer=tf-ps rows=... dim=... ps=3 workers=... batch=4096 init_s=... steps_per_s=...
  unique_rows_per_step=... rows_per_s=...

Run by benchmarks/sparse_peer_tf.sh, which installs tensorflow-cpu into a venv.
"""
import argparse
import collections
import os
import socket
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (bind to port 0, read it back, release)."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def in_process_cluster(num_ps, num_workers):
    """Start num_ps ps and num_workers worker servers inside this process (as in TF's
    ParameterServerStrategy tutorial) and return a resolver for the coordinator."""
    ports = free_ports(num_ps + num_workers)
    spec = tf.train.ClusterSpec({
        "worker": ["127.0.0.1:%d" % p for p in ports[num_ps:]],
        "ps": ["127.0.0.1:%d" % p for p in ports[:num_ps]],
    })
    worker_config = tf.compat.v1.ConfigProto()
    if (os.cpu_count() or 1) < num_workers + 1:
        worker_config.inter_op_parallelism_threads = num_workers + 1
    servers = []
    for i in range(num_workers):
        servers.append(tf.distribute.Server(spec, job_name="worker", task_index=i,
                                            config=worker_config, protocol="grpc", start=True))
    for i in range(num_ps):
        servers.append(tf.distribute.Server(spec, job_name="ps", task_index=i,
                                            protocol="grpc", start=True))
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc")
    return resolver, servers


def zipf_batches(rows, batch, count, exponent, seed):
    """count batches of `batch` ids in [0, rows), Zipf(exponent), rejecting draws > rows."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ids = np.empty(0, dtype=np.int64)
        while ids.size < batch:
            d = rng.zipf(exponent, size=2 * batch)
            d = d[d <= rows]
            ids = np.concatenate([ids, d[: batch - ids.size]])
        out.append(ids - 1)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--dim", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--ps", type=int, default=3, help="parameter servers = shards")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=int, default=20, help="steps run (and joined) before timing")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent")
    ap.add_argument("--pool", type=int, default=256, help="distinct id batches, cycled")
    ap.add_argument("--inflight", type=int, default=0,
                    help="steps scheduled but not finished at most (default 8 per worker)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--init", choices=["shard", "full", "chief"], default="shard",
                    help="shard: the initialiser takes partition_shape, each ps draws its own "
                         "shard (default); full: an initialiser without partition support, so "
                         "TF draws the whole table for each shard and slices it; chief: the "
                         "initial value is a numpy array made on the coordinator and sent")
    a = ap.parse_args()
    inflight = a.inflight or 8 * a.workers

    t = time.perf_counter()
    batches = zipf_batches(a.rows, a.batch, a.pool, a.zipf, a.seed)
    uniques = [int(np.unique(b).size) for b in batches]
    log(f"# drew {a.pool} Zipf({a.zipf}) batches of {a.batch} ids in {time.perf_counter() - t:.2f} s; "
        f"mean distinct ids per batch {np.mean(uniques):.1f}")

    resolver, _servers = in_process_cluster(a.ps, a.workers)
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver,
        variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(a.ps))
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    log(f"# cluster up: {a.ps} ps, {a.workers} workers, in process; tensorflow {tf.__version__}")

    # Table creation and initialisation. The initialiser takes the partition's shape, so
    # each shard is drawn on its own ps (nothing of table size passes through the chief).
    def init_table(partition_shape=None, partition_offset=None, shape=None, dtype=tf.float32):
        offset = partition_offset[0] if partition_offset is not None else 0
        return tf.random.stateless_uniform(
            partition_shape if partition_shape is not None else shape,
            seed=[a.seed, offset], minval=-0.05, maxval=0.05, dtype=dtype)

    def init_full():  # no partition_shape: TF calls it once per shard and slices the result
        return tf.random.stateless_uniform((a.rows, a.dim), seed=[a.seed, 0], minval=-0.05,
                                           maxval=0.05, dtype=tf.float32)

    if a.init == "chief":  # drawn before the clock starts; only its transfer is timed
        value = np.random.default_rng(a.seed).uniform(-0.05, 0.05, (a.rows, a.dim)).astype(np.float32)
    t = time.perf_counter()
    with strategy.scope():
        if a.init == "chief":
            table = tf.Variable(value, name="embedding")
            del value
        else:
            table = tf.Variable(init_table if a.init == "shard" else init_full,
                                shape=(a.rows, a.dim), dtype=tf.float32, name="embedding")
    # Reading one row of each shard back makes sure every shard is initialised.
    check = [float(tf.reduce_sum(v[0]).numpy()) for v in table.variables]
    init_s = time.perf_counter() - t
    shard_rows = [int(v.shape[0]) for v in table.variables]
    log(f"# table {a.rows} x {a.dim} in {len(shard_rows)} shards {shard_rows} "
        f"on {[v.device for v in table.variables]}; created and initialised in {init_s:.2f} s "
        f"(row-0 sums {['%.3f' % c for c in check]})")

    lr = tf.constant(a.lr, tf.float32)

    @tf.function(input_signature=[tf.TensorSpec([a.batch], tf.int64)])
    def step(ids):
        shards = table.variables
        with tf.GradientTape() as tape:
            tape.watch(shards)
            rows = tf.nn.embedding_lookup(table, ids)
            loss = 1e-3 * tf.reduce_sum(tf.square(rows))
        grads = tape.gradient(loss, shards)
        for v, g in zip(shards, grads):
            # g is a tf.IndexedSlices: one row per looked-up id that falls into this shard.
            v.scatter_sub(tf.IndexedSlices(lr * g.values, g.indices, g.dense_shape))
        return loss

    id_tensors = [tf.constant(b) for b in batches]

    def run(n_or_deadline, timed):
        """Schedule steps keeping at most `inflight` unfinished; return (steps, distinct rows)."""
        pending = collections.deque()
        steps = rows = 0
        i = 0
        while (time.perf_counter() < n_or_deadline) if timed else (steps < n_or_deadline):
            k = i % len(id_tensors)
            pending.append(coordinator.schedule(step, args=(id_tensors[k],)))
            steps += 1
            rows += uniques[k]
            i += 1
            if len(pending) > inflight:
                pending.popleft().fetch()
        coordinator.join()
        return steps, rows

    t = time.perf_counter()
    run(a.warmup, False)
    log(f"# warmup: {a.warmup} steps (tracing included) in {time.perf_counter() - t:.2f} s")

    t = time.perf_counter()
    steps, rows = run(t + a.seconds, True)
    elapsed = time.perf_counter() - t
    loss = float(coordinator.fetch(coordinator.schedule(step, args=(id_tensors[0],))))
    log(f"# timed: {steps} steps in {elapsed:.2f} s; loss on batch 0 now {loss:.6f}")

    print(f"peer=tf-ps rows={a.rows} dim={a.dim} ps={a.ps} workers={a.workers} batch={a.batch} "
          f"zipf={a.zipf} init={a.init} init_s={init_s:.2f} steps={steps} seconds={elapsed:.2f} "
          f"steps_per_s={steps / elapsed:.1f} unique_rows_per_step={rows / steps:.1f} "
          f"rows_per_s={rows / elapsed:.0f} ids_per_s={steps * a.batch / elapsed:.0f} "
          f"tf={tf.__version__}", flush=True)
    # The in-process gRPC servers cannot be stopped cleanly; skip interpreter teardown.
    os._exit(0)


if __name__ == "__main__":
    main()
