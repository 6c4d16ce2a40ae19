#!/usr/bin/python3
"""The parameter-server example's trainer, in Python: the same replica as ps_demo's C++
"trainer" entrypoint, against the same C++ shards, through the troupe module.

    trainer.py SHARDS_JOB SHARDS DIM STEPS BATCH LEARNING_RATE PRINT_EVERY

Finds the shards through the job's resolver (TROUPE_RESOLVER), waits until all are ready, then
trains a logistic-regression model: each step pulls the weights from every shard (a broadcast),
computes the gradient of the log-loss on this trainer's next minibatch (examples
TROUPE_TASK_INDEX, + TROUPE_NUM_TASKS, ... of a data set every process generates alike), and
pushes each shard its slice, straight to the shard that owns it. Prints "trainer I step S loss L"
every PRINT_EVERY steps, as the C++ trainer does. ps_demo --python-trainer runs it as the
trainers job.
"""

import math
import os
import sys

import troupe

DATA_SEED = 20261130  # examples/parameter_server/model.h
DATA_EXAMPLES = 4096
CALL_TIMEOUT = 10.0
READY_TIMEOUT = 60.0
MASK = (1 << 64) - 1


def splitmix64(seed):
    """The generator model.cpp uses, so that every process makes the same data set."""
    state = seed
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        yield z ^ (z >> 31)


def make_dataset(dim, count=DATA_EXAMPLES, seed=DATA_SEED):
    """model.cpp's makeDataset: features uniform in [-1, 1), labels by the true weights' sign."""
    random = splitmix64(seed)

    def symmetric():
        return (next(random) >> 40) * 2.0 ** -24 * 2.0 - 1.0

    true_weights = [symmetric() for _ in range(dim)]
    features = [[symmetric() for _ in range(dim)] for _ in range(count)]
    labels = [1.0 if sum(w * x for w, x in zip(true_weights, row)) > 0 else 0.0
              for row in features]
    return features, labels


def example_loss(z, label):
    m = -z if label > 0.5 else z
    return m + math.log1p(math.exp(-m)) if m > 0 else math.log1p(math.exp(m))


def gradient(features, labels, weights, batch):
    """The mean log-loss gradient over `batch`, and that minibatch's loss."""
    total = [0.0] * len(weights)
    loss = 0.0
    for i in batch:
        x = features[i]
        z = sum(w * v for w, v in zip(weights, x))
        loss += example_loss(z, labels[i])
        residual = 1.0 / (1.0 + math.exp(-z)) - labels[i]
        for j, v in enumerate(x):
            total[j] += residual * v
    n = len(batch)
    return [g / n for g in total], loss / n


def pull(pool, dim):
    """Every shard's slice, put together: (weights, [(endpoint, begin, end, version)])."""
    weights = [0.0] * dim
    covered = [False] * dim
    shards = []
    for r in pool.broadcast("ps.pull").wait_all(timeout=CALL_TIMEOUT):
        if not r.ok:
            raise r.error
        v = r.value
        begin, end = v["begin"], v["end"]
        if v["dim"] != dim or len(v["weights"]) != end - begin:
            raise RuntimeError(f"{r.endpoint} holds a shard of another model")
        for i, w in zip(range(begin, end), v["weights"]):
            if covered[i]:
                raise RuntimeError(f"{r.endpoint} overlaps another shard at weight {i}")
            covered[i] = True
            weights[i] = w
        shards.append((r.endpoint, begin, end, v["version"]))
    if not all(covered):
        raise RuntimeError("no ready shard owns weight %d" % covered.index(False))
    return weights, shards


def main(argv):
    if len(argv) != 7:
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    shards_job = argv[0]
    shards, dim, steps, batch_size = (int(a) for a in argv[1:5])
    learning_rate = float(argv[5])
    print_every = int(argv[6])
    task = int(os.environ.get("TROUPE_TASK_INDEX", "0"))
    tasks = int(os.environ.get("TROUPE_NUM_TASKS", "1"))

    group = troupe.open_resolver().group(shards_job, "ps")
    ready = group.wait_ready(shards, timeout=READY_TIMEOUT)
    print(f"trainer {task} of {tasks}: {len(ready)} shards ready (Python)", flush=True)
    pool = group.pool()
    refs = {}  # a direct handle per shard, for its slice of each gradient

    features, labels = make_dataset(dim)
    mine = list(range(task, len(labels), tasks))
    position = 0
    for step in range(1, steps + 1):
        weights, slices = pull(pool, dim)
        batch = [mine[(position + k) % len(mine)] for k in range(batch_size)]
        position = (position + batch_size) % len(mine)
        grad, loss = gradient(features, labels, weights, batch)
        addresses = {m["name"]: m["address"] for m in group.members()}
        for endpoint, begin, end, version in slices:
            address = addresses[endpoint]
            ref = refs.get(address)
            if ref is None:
                ref = refs[address] = troupe.connect(address, "ps")
            ref.call("ps.push", gradient=grad[begin:end], learningRate=learning_rate,
                     baseVersion=version, timeout=CALL_TIMEOUT)
        if step % print_every == 0 or step == 1 or step == steps:
            print(f"trainer {task} step {step} loss {loss:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
