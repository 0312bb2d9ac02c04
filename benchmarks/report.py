"""What every benchmark does with its result: print it as JSON, and write
it to ``--out`` when given (the files in benchmarks/results/); and what
several share: a comma-separated choice of sections, timing variants in
alternating blocks, an earlier commit's library to run beside this tree's."""
from __future__ import annotations

import io
import itertools
import json
import os
import shutil
import subprocess
import tarfile
import time
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def library_at(ref: str, into: str) -> str:
    """This repository's ``sparkavg/`` at ``ref`` under ``into``, with this tree's compiled ``sparkavg_ext``."""
    data = subprocess.run(["git", "-C", ROOT, "archive", ref, "sparkavg"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into)
    shutil.copytree(os.path.join(ROOT, "sparkavg_ext"), os.path.join(into, "sparkavg_ext"))
    return into


def commit(ref: str = "HEAD") -> str:
    """The short hash of ``ref`` in this repository."""
    return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", ref], check=True, capture_output=True,
                          text=True).stdout.strip()


def emit(result: dict, out: Optional[str]) -> dict:
    """Print ``result`` as indented JSON; also write it to ``out`` if set."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        with open(out, "w") as fh:
            fh.write(text + "\n")
    return result


def subset(parser, text: str, known, what: str) -> list:
    """The comma-separated names of ``text`` (empty ones skipped), each one of
    ``known``; otherwise ``parser``'s usage error names the others."""
    names = [name for name in text.split(",") if name]
    unknown = sorted(set(names) - set(known))
    if unknown:
        parser.error(f"Expect {what} among {tuple(known)}, got {unknown}")
    return names


def alternating_blocks(variants: dict, blocks: int, block: int, warmup: int, settle: int = 1, sync=None) -> dict:
    """Time ``variants`` (name: function of no arguments) in one process:
    ``warmup`` untimed calls of each, then ``blocks`` rounds in which each
    variant in turn makes ``settle`` untimed calls (after the switch) and
    ``block`` timed ones, so that a drift of the machine hits them all alike.
    Returns ``{name: [seconds of each timed call]}``; with ``sync`` (a
    device's synchronize: a call only queues work there) each block is timed
    whole between two ``sync()`` calls, ``[seconds per call of each block]``."""
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in variants}
    for _ in range(blocks):
        for name, fn in variants.items():
            for _ in range(settle):
                fn()
            if sync is not None:
                sync()
                t = time.perf_counter()
                for _ in range(block):
                    fn()
                sync()
                times[name].append((time.perf_counter() - t) / block)
                continue
            for _ in range(block):
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    return times


def indexed(step):
    """``step(i)`` as a function of no arguments, ``i`` counting its calls from 0 (a batch index)."""
    calls = itertools.count()
    return lambda: step(next(calls))


def torch_epoch(torch, module, opt, loss, xs, ys, xts, yt, batch: int, seed: int, epoch: int) -> tuple:
    """One epoch of a plain torch loop (the one-process baselines): ``(seconds, test accuracy)``.
    Minibatches of ``batch`` in a seeded order per epoch; ``loss(outputs, targets)``."""
    import numpy as np

    order = torch.from_numpy(np.random.default_rng([seed, epoch]).permutation(len(xs)))
    module.train()
    t = time.perf_counter()
    for start in range(0, len(xs), batch):
        idx = order[start:start + batch]
        opt.zero_grad()
        loss(module(xs[idx]), ys[idx]).backward()
        opt.step()
    seconds = time.perf_counter() - t
    module.eval()
    with torch.no_grad():
        pred = torch.cat([module(xts[i:i + 1000]).argmax(1) for i in range(0, len(xts), 1000)])
    return seconds, float((pred.numpy() == yt).mean())


def torch_step(torch, module, opt, tensors):
    """``step(i)``: one plain torch training step (cross-entropy) on
    ``tensors[i % len(tensors)]``, a list of ``(x, y)`` tensors; the loss."""

    def step(i):
        xb, yb = tensors[i % len(tensors)]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(module(xb), yb)
        loss.backward()
        opt.step()
        return loss.item()

    return step
