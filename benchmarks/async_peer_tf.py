#!/usr/bin/env python3
"""benchmarks/async_peer_tf.py — TensorFlow peer for dtf's asynchronous scaling study.

Trains the study's Fashion-MNIST MLP (784-256-128-10, ReLU, batch 64, a fixed number of epochs
over the 60,000 training images) with tf.distribute.experimental.ParameterServerStrategy and
Adam(1e-3), the way a TensorFlow user would, and reports the accuracy on the 10,000 test images
and the training time as one line:

  RESULT scheme=tf_pss_adam workers=N ps=P seed=S epochs=E accuracy=0.xxxx wall_s=x.x steps=K

The whole cluster (P ps tasks and N workers) runs in this one process as in-process
tf.distribute.Server instances on 127.0.0.1 (as benchmarks/sparse_peer_tf.py does); this
process is the coordinator and drives the workers through ClusterCoordinator.schedule. Each
scheduled step takes one batch from the iterator of whichever worker is free, computes the
gradient there, and applies Adam to the variables on the ps (the update ops are placed with
the variables): TensorFlow's asynchronous parameter-server training. It is the analogue of
dtf's adam_ps (examples/distributed_setup), whose workers each pull, compute and push once per
step.

As in dtf, worker k trains on shard k of the training set (every N-th image), shuffled with
seed + k and reshuffled every pass; the total number of steps is epochs x ceil(60000 / batch)
(--max_steps caps it for quick trials), shared by the workers as they come free. TensorFlow
reports no push staleness.

Differences from dtf to keep in mind: the kernels start from Glorot-uniform (Keras' default;
dtf draws He-normal for the layers before a ReLU), and wall_s counts only the training (the
first schedule to the last join, tracing of the step function included), not the cluster's
start, the datasets' creation or the evaluation.

Run by benchmarks/async_peer_tf.sh, which installs tensorflow-cpu into a venv.
"""
import argparse
import collections
import gzip
import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# tf.distribute.Server needs concrete port numbers in its ClusterSpec (it cannot be given port 0
# and asked which one it got): free_ports binds each to port 0, reads the number back and
# releases them just before the servers start, as the sparse-embedding peer does.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sparse_peer_tf import free_ports  # noqa: E402

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def read_idx_gz(path):
    """An IDX file (gzip-compressed) as a numpy array of unsigned bytes.

    The format: two zero bytes, a type byte (0x08 = unsigned byte), the number of dimensions,
    then each dimension as a big-endian uint32, then the values in row-major order."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    values = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if values.size != math.prod(shape):
        raise ValueError(f"{path}: {values.size} values for shape {shape}")
    return values.reshape(shape)


def load_split(data_dir, prefix):
    """Images as [N, 784] uint8 (raw pixels) and labels as [N] int32."""
    images = read_idx_gz(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx_gz(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    return images.reshape(images.shape[0], -1), labels.astype(np.int32)


def scale(pixels):
    """Pixels from [0, 255] to [0, 1], as dtf's dataset::normalize() does."""
    return tf.cast(pixels, tf.float32) / 255.0


def in_process_cluster(num_ps, num_workers, threads):
    """Starts num_ps ps and num_workers worker servers in this process; returns a resolver for
    the coordinator (this process, which is not a task of the cluster) and the servers.

    TensorFlow's CPU devices share one process-wide intra-op (Eigen) pool, sized by the first
    device made in the process: the coordinator's (tf.config.threading, set in main) and the
    servers' configs all ask for `threads`, so every task's kernels share `threads` threads
    (dtf's workers run --blas_threads 1 each). Inter-op threads are given at least one per
    task plus one, as sparse_peer_tf.py does on few cores, so that no worker's step waits for a
    free thread to issue its ps reads and updates while other steps hold them all."""
    ports = free_ports(num_ps + num_workers)
    spec = tf.train.ClusterSpec({
        "worker": ["127.0.0.1:%d" % p for p in ports[num_ps:]],
        "ps": ["127.0.0.1:%d" % p for p in ports[:num_ps]],
    })
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads,
        inter_op_parallelism_threads=max(threads, num_workers + num_ps + 1))
    servers = []
    for i in range(num_workers):
        servers.append(tf.distribute.Server(spec, job_name="worker", task_index=i, config=config,
                                            protocol="grpc", start=True))
    for i in range(num_ps):
        servers.append(tf.distribute.Server(spec, job_name="ps", task_index=i, config=config,
                                            protocol="grpc", start=True))
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc")
    return resolver, servers


def make_model(seed):
    """The study's MLP; each kernel Glorot-uniform from its own seed, biases zero."""
    init = lambda i: tf.keras.initializers.GlorotUniform(seed=seed * 100 + i)  # noqa: E731
    return tf.keras.Sequential([
        tf.keras.Input(shape=(784,)),
        tf.keras.layers.Dense(256, activation="relu", kernel_initializer=init(1)),
        tf.keras.layers.Dense(128, activation="relu", kernel_initializer=init(2)),
        tf.keras.layers.Dense(10, kernel_initializer=init(3)),
    ])


def placement(v):
    """The device of a Keras variable's TensorFlow variable ("?" when it has none)."""
    return getattr(getattr(v, "value", v), "device", "?") or "?"


def numpy_accuracy(weights, images, labels):
    """Test accuracy of the MLP whose [kernel, bias] x 3 are `weights`, in numpy."""
    h = images.astype(np.float32) / 255.0  # as scale() does
    for i in range(0, len(weights), 2):
        h = h @ weights[i] + weights[i + 1]
        if i + 2 < len(weights):
            h = np.maximum(h, 0.0)
    return float(np.mean(np.argmax(h, axis=1) == labels))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max_steps", type=int, default=0,
                    help="stop after this many steps (0: epochs x ceil(60000 / batch))")
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads (TensorFlow's pool is shared by the in-process servers)")
    ap.add_argument("--inflight", type=int, default=0,
                    help="steps scheduled but not finished at most (default 4 per worker; "
                         "-1: schedule every step, then join)")
    ap.add_argument("--data", default=DATA_DIR, help="directory of the gzipped IDX files")
    a = ap.parse_args()
    inflight = a.inflight if a.inflight != 0 else 4 * a.workers

    # Thread counts take effect only before TensorFlow's context starts; set them first.
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(a.threads, a.workers + a.ps + 1))
    tf.keras.utils.set_random_seed(a.seed)

    train_x, train_y = load_split(a.data, "train")
    test_x, test_y = load_split(a.data, "t10k")
    steps_per_epoch = math.ceil(len(train_x) / a.batch)
    total_steps = a.epochs * steps_per_epoch
    if a.max_steps > 0:
        total_steps = min(total_steps, a.max_steps)

    resolver, _servers = in_process_cluster(a.ps, a.workers, a.threads)
    # No variable partitioner: each variable lives whole on one ps, placed round robin.
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    log(f"# cluster up: {a.ps} ps, {a.workers} workers, in process; tensorflow {tf.__version__}, "
        f"keras {getattr(tf.keras, '__version__', '?')}")

    # Model and optimizer under the strategy's scope, so that their variables (the kernels,
    # biases and Adam's moments and step count) are created on the ps.
    with strategy.scope():
        model = make_model(a.seed)
        optimizer = tf.keras.optimizers.Adam(learning_rate=a.lr)
        optimizer.build(model.trainable_variables)
    log("# variables: " + ", ".join(f"{v.name}{list(v.shape)} on {placement(v)}"
                                    for v in model.trainable_variables + optimizer.variables))

    # The training data are in the dataset function's graph as raw bytes (47 MB rather than
    # 188 MB of floats) and scaled per batch on the worker.
    num_workers, seed, batch = a.workers, a.seed, a.batch

    def dataset_fn():
        k = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64)
        shard_size = len(train_x) // num_workers + 1  # a buffer at least the shard's size
        return (tf.data.Dataset.from_tensor_slices((train_x, train_y))
                .shard(num_workers, k)
                .shuffle(shard_size, seed=seed + k, reshuffle_each_iteration=True)
                .batch(batch)
                .map(lambda x, y: (scale(x), y))
                .repeat()
                .prefetch(2))

    t = time.perf_counter()
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    log(f"# per-worker datasets created in {time.perf_counter() - t:.2f} s")

    @tf.function
    def train_step(it):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        x, y = next(it)
        return strategy.run(replica_step, args=(x, y))

    # Steps go out as workers come free. At most `inflight` are outstanding at a time (the
    # oldest is waited for before the next goes out), so the coordinator's queue stays short
    # and no worker waits for a join; -1 hands TensorFlow every step and joins at the end.
    t0 = time.perf_counter()
    pending = collections.deque()
    last_loss = None
    for _ in range(total_steps):
        pending.append(coordinator.schedule(train_step, args=(iterator,)))
        if 0 < inflight < len(pending):
            last_loss = pending.popleft().fetch()
    coordinator.join()
    wall = time.perf_counter() - t0
    if pending:
        last_loss = pending[-1].fetch()
    log(f"# {total_steps} steps in {wall:.1f} s ({total_steps / wall:.1f} steps/s, "
        f"{1000 * wall / total_steps:.1f} ms/step); last loss {float(last_loss):.4f}")

    # Read the trained variables back from the ps and evaluate on the coordinator.
    weights = [np.asarray(v.numpy()) for v in model.trainable_variables]
    accuracy = numpy_accuracy(weights, test_x, test_y)
    print(f"RESULT scheme=tf_pss_adam workers={a.workers} ps={a.ps} seed={a.seed} "
          f"epochs={a.epochs} accuracy={accuracy:.4f} wall_s={wall:.1f} steps={total_steps}",
          flush=True)
    sys.stderr.flush()
    # The in-process gRPC servers cannot be stopped, and the interpreter's teardown can hang
    # waiting for them (and the coordinator's threads): end the process here.
    os._exit(0)


if __name__ == "__main__":
    main()
