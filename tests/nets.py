"""Tiny networks and data for the Spark tests (fast on 2 cores)."""
from contextlib import contextmanager

import numpy as np
import pytest

from sparkavg.nn import Adam, Dense, Network, Output


def small_net(seed: int = 0, dtype: str = "float32") -> Network:
    """A 16 -> 8 relu -> 2 softmax classifier with Adam (updater state is non-trivial)."""
    return Network((1, 4, 4), [Dense(8, activation="relu"), Output(2)], updater=Adam(lr=0.01), seed=seed,
                   dtype=dtype)


def blobs(n: int, seed: int = 0):
    """Two separable Gaussian blobs of 1x4x4 'images', labels 0/1."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n)
    centers = np.where(y[:, None] == 1, 1.0, -1.0)
    x = (centers + 0.5 * rng.standard_normal((n, 16))).astype(np.float32).reshape(n, 1, 4, 4)
    return x, y


def trained_small_net():
    """``(net, x, y)``: :func:`small_net` after five full-batch steps on 90
    :func:`blobs`, whose outputs mean something."""
    x, y = blobs(90, seed=11)
    net = small_net(seed=12)
    for _ in range(5):
        net.fit_batch(x, y)
    return net, x, y


def assert_evaluation_matches_local(trainer, data, net, x, y) -> None:
    """``trainer.evaluate`` (one evaluation, and two) and ``trainer.score``
    of ``data`` are what ``net`` gives on ``(x, y)`` in this process."""
    from sparkavg.evaluation import Evaluation

    local = Evaluation(2).eval(y, net.output(x))
    assert trainer.evaluate(data) == local
    ev, ev2 = trainer.evaluate(data, evaluations=[Evaluation(2), Evaluation(2, labels=["a", "b"])])
    assert ev.confusion_matrix.tolist() == local.confusion_matrix.tolist() == ev2.confusion_matrix.tolist()
    assert trainer.score(data) == pytest.approx(float(net.score(x, y)), rel=1e-5)


def small_graph(seed: int = 0):
    """A residual Graph with BatchNorm (buffers) on the same 1x4x4 inputs:
    conv -> BatchNorm -> relu, added to a 1x1 conv of the input, dense, output."""
    from sparkavg.nn import Activation, Add, BatchNorm, Conv2D, Graph

    return Graph({"image": (1, 4, 4)},
                 [("conv", Conv2D(2, 3, padding=1), "image"),
                  ("bn", BatchNorm(), "conv"),
                  ("relu", Activation("relu"), "bn"),
                  ("skip", Conv2D(2, 1), "image"),
                  ("sum", Add(), ["relu", "skip"]),
                  ("dense", Dense(8, activation="relu"), "sum"),
                  ("output", Output(2), "dense")],
                 ["output"], updater=Adam(lr=0.01), seed=seed)


def fit_replicas(start, x, y, shards, size: int = 4) -> list:
    """What each worker of an averaging round computes: a clone of ``start``
    fitted on its shard of minibatch indices (minibatch b = examples
    [size*b, size*b + size))."""
    replicas = []
    for shard in shards:
        rep = start.clone()
        for b in shard:
            rep.fit_batch(x[size * b:size * b + size], y[size * b:size * b + size])
        replicas.append(rep)
    return replicas


def averaged_updater_state(start, replicas, corrected: bool = True):
    """The updater state one averaging round of equally weighted ``replicas``
    (each fitted from ``start``) gives: their mean, with the moment
    correction of the default preset (``corrected``; Adam's ``v`` corrected
    from the spread of their ``m``,
    :func:`~sparkavg.spark.policies.moments.correct_second_moment`, pooled
    per parameter tensor), or plainly as the ``"dl4j"`` preset averages it
    (``corrected=False``)."""
    from sparkavg.averaging.merge import block_squares, moment_blocks
    from sparkavg.spark.policies.moments import correct_second_moment

    k, n = len(replicas), start.num_params
    state = sum(r.updater_state.astype(np.float64) for r in replicas) / k
    first = start.updater.slot("first_moment", n)
    if corrected and first is not None and k > 1:
        blocks = moment_blocks(start)
        m_sq = sum(block_squares(r.updater_state[first], blocks) for r in replicas) / k
        steps = replicas[0].iteration - start.iteration
        correct_second_moment(start.updater, state, m_sq, start.updater_state.astype(np.float64), k, steps, blocks)
    return state


def straight_and_resumed(session, make_model, master, data, ckpt: str, seed: int = 14, stop_after: int = 2,
                         epochs: int = 3, setup=None):
    """The resume pattern every flavour's checkpoint test checks: a model
    trained ``epochs`` straight, and one trained ``stop_after`` epochs with
    checkpoints under ``ckpt`` then resumed to ``epochs`` from a model built
    with another seed (so everything must come from the checkpoint).
    ``setup(trainer)``, when given, is called on each of the three trainers
    before it fits (a test's policy settings on the driver's runner).

    Returns ``(straight, resumed, trainer)``, the resumed fit's trainer
    left open; the caller compares the two models."""
    from sparkavg.spark import SparkTrainer

    def trainer_for(model, **kwargs):
        trainer = SparkTrainer(session, model, master, **kwargs)
        if setup is not None:
            setup(trainer)
        return trainer

    straight = make_model(seed=seed)
    trainer_for(straight).fit(data, epochs=epochs)
    trainer_for(make_model(seed=seed), checkpoint_dir=ckpt).fit(data, epochs=stop_after)
    resumed = make_model(seed=seed + 85)
    trainer = trainer_for(resumed, checkpoint_dir=ckpt)
    trainer.fit(data, epochs=epochs, resume_from=ckpt)
    assert trainer.epochs_done == epochs and len(trainer.history) == epochs
    return straight, resumed, trainer


def tabular(n: int, seed: int = 0):
    """A table of two categorical columns (ids in [0, 6)) and three numeric
    ones; label 1 when the first category is odd XOR the numbers sum > 0."""
    rng = np.random.default_rng(seed)
    cats = rng.integers(0, 6, size=(n, 2))
    nums = rng.standard_normal((n, 3)).astype(np.float32)
    y = ((cats[:, 0] % 2 == 1) ^ (nums.sum(axis=1) > 0)).astype(np.int64)
    return cats, nums, y


def tabular_graph(seed: int = 0):
    """Two inputs: embeddings of the categorical ids ("cats", (2,) int64)
    merged with a dense layer of the numbers ("nums", (3,))."""
    from sparkavg.nn import Embedding, Flatten, Graph, Merge

    return Graph({"cats": (2,), "nums": (3,)},
                 [("embed", Embedding(6, 4), "cats"),
                  ("flat", Flatten(), "embed"),
                  ("dense", Dense(8, activation="tanh"), "nums"),
                  ("merge", Merge(), ["flat", "dense"]),
                  ("hidden", Dense(16, activation="relu"), "merge"),
                  ("output", Output(2), "hidden")],
                 ["output"], updater=Adam(lr=0.02), seed=seed)


@contextmanager
def job_properties(sc, properties: dict):
    """Set Spark local properties (the fault-injection hooks of
    :mod:`sparkavg.spark.executor.hooks`, e.g. ``sparkavg.test.udp_loss``)
    for the jobs started in the block on this thread, and unset them after."""
    try:
        for key, value in properties.items():
            sc.setLocalProperty(key, str(value))
        yield
    finally:
        for key in properties:
            sc.setLocalProperty(key, None)


def vectors(column) -> np.ndarray:
    """An Arrow column of ml Vectors (VectorUDT's struct, as ``toArrow`` gives it) as an ``(n, k)`` array."""
    rows = column.to_pylist()
    assert all(r["type"] == 1 for r in rows), "expected dense vectors"
    return np.array([r["values"] for r in rows], dtype=np.float64)
