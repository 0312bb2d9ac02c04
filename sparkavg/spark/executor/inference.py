"""Executor side of evaluation, scoring and prediction."""
from __future__ import annotations

import copy
from typing import Iterable

import numpy as np

from ...data.validation import split_features
from ..errors import failure_aware, task_failure_guard
from .context import cached_network, load_state

__all__ = ["make_evaluator", "make_scorer", "make_predictor", "merge_evaluations", "add_scores"]


def _net(config_json: str, shipped):
    net = cached_network(config_json)
    load_state(net, shipped.value, with_updater=False)
    return net


def make_evaluator(config_json: str, shipped, evaluations: list, rebatch_fn):
    """Executor function: evaluate one partition into fresh copies of the
    given (empty) evaluations; yields one list of evaluations (or a
    :class:`TaskFailure`)."""

    def run(index, rows):
        failures: list = []
        evals = None
        with task_failure_guard(failures, partition=index):
            net = _net(config_json, shipped)
            evals = copy.deepcopy(evaluations)
            for x, y in rebatch_fn(index, rows):
                out = net.output(x)
                for ev in evals:
                    ev.eval(y, out)
        yield failures[0] if failures else evals

    return run


@failure_aware
def merge_evaluations(a, b):
    """treeAggregate combiner of evaluation lists; a failure wins."""
    for x, y in zip(a, b):
        x.merge(y)
    return a


def make_scorer(config_json: str, shipped, rebatch_fn):
    """Executor function: ``(loss_sum, examples)`` of one partition."""

    def run(index, rows):
        failures: list = []
        total, n = 0.0, 0
        with task_failure_guard(failures, partition=index):
            net = _net(config_json, shipped)
            for x, y in rebatch_fn(index, rows):
                total += float(net.score(x, y)) * len(x)
                n += len(x)
        yield failures[0] if failures else (total, n)

    return run


@failure_aware
def add_scores(a, b):
    """treeAggregate combiner of ``(loss_sum, examples)``; a failure wins."""
    return a[0] + b[0], a[1] + b[1]


def _batches(rows: Iterable, batch_size: int):
    keys, xs = [], []
    for record in rows:
        key, x = split_features(record)
        keys.append(key)
        xs.append(np.asarray(x, dtype=np.float32))
        if len(xs) == batch_size:
            yield keys, np.stack(xs)
            keys, xs = [], []
    if xs:
        yield keys, np.stack(xs)


def make_predictor(config_json: str, shipped, batch_size: int):
    """Executor function: network outputs for each row; ``(key, features)``
    rows give ``(key, output)``, bare features give ``output``."""

    def run(rows):
        net = _net(config_json, shipped)
        for keys, x in _batches(rows, batch_size):
            out = np.asarray(net.output(x))
            for key, row in zip(keys, out):
                yield row if key is None else (key, row)

    return run
