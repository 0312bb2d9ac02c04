#!/usr/bin/env python
"""Reading one minibatch file, as a worker does between two training steps.

LeNet-shaped minibatches (32 x 1 x 28 x 28 float32 features, one-hot
float32 labels: 101,760 bytes as a ``.minibatch`` file) are written to a
temporary folder, then read back in two settings:

- ``hot``: reads back to back (caches warm: the best case);
- ``after_step``: one LeNet ``fit_batch`` (1 BLAS thread) between reads,
  as inside an averaging task, so the reader starts with caches full of
  the step's data.

Readers, in alternating blocks:

- ``sparkavg``: :func:`sparkavg.data.storage.load_minibatch`;
- ``file_object_json``: the reader before this round (a Python file
  object, ``readinto`` a fresh bytearray, the JSON header parsed on every
  read), written out here as the baseline;
- ``npz``: ``np.load`` of the same arrays as an ``.npz`` (the format
  before ``.minibatch``);
- ``memcpy``: ``np.copyto`` of the file's bytes (memory-copy bound).

    python benchmarks/bench_minibatch_io.py --out benchmarks/results/minibatch_io.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from report import emit  # noqa: E402

_PREFIX = struct.Struct("<8sBI")


def file_object_json(path):
    """The previous reader: file object, fresh bytearray, JSON parsed per read."""
    with open(path, "rb") as fh:
        data = bytearray(os.fstat(fh.fileno()).st_size)
        fh.readinto(data)
    view = memoryview(data)
    _magic, _version, length = _PREFIX.unpack_from(view)
    start = _PREFIX.size + length
    header = json.loads(bytes(view[_PREFIX.size:start]))
    offset = start + (-start % 64)
    out = []
    for key in "xy":
        dtype, shape = np.dtype(header[key]["dtype"]), header[key]["shape"]
        count = int(np.prod(shape))
        out.append(np.frombuffer(view, dtype, count, offset).reshape(shape))
        offset += count * dtype.itemsize
    return out[0], out[1]


def npz_reader(path):
    with np.load(path) as f:
        return f["x"], f["y"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=200)
    p.add_argument("--blocks", type=int, default=4, help="alternating blocks per reader and setting")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    from sparkavg.nn import lenet
    from sparkavg.data.storage import SUFFIX, load_minibatch, save_minibatch

    rng = np.random.default_rng(0)
    folder = tempfile.mkdtemp(prefix="bench-minibatch-io-")
    try:
        paths, npz = [], []
        for i in range(args.files):
            x = rng.random((32, 1, 28, 28), dtype=np.float32)
            y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 32)]
            paths.append(os.path.join(folder, f"{i}{SUFFIX}"))
            save_minibatch(paths[-1], x, y)
            npz.append(os.path.join(folder, f"{i}.npz"))
            np.savez(npz[-1], x=x, y=y)
        size = os.path.getsize(paths[0])
        src, dst = np.ones(size, np.uint8), np.empty(size, np.uint8)
        readers = {"sparkavg": (load_minibatch, paths), "file_object_json": (file_object_json, paths),
                   "npz": (npz_reader, npz), "memcpy": (lambda _p: np.copyto(dst, src), paths)}
        net = lenet(seed=1)
        xs, ys = load_minibatch(paths[0])
        net.fit_batch(xs, ys)  # warm up
        times = {s: {r: [] for r in readers} for s in ("hot", "after_step")}
        for _block in range(args.blocks):
            for name, (read, files) in readers.items():
                for setting in times:
                    for f in files:
                        if setting == "after_step":
                            net.fit_batch(xs, ys)
                        t = time.perf_counter()
                        read(f)
                        times[setting][name].append(time.perf_counter() - t)
        out = {"benchmark": "minibatch_io", "file_bytes": size, "files": args.files, "blocks": args.blocks,
               "median_us": {s: {r: 1e6 * statistics.median(v) for r, v in d.items()} for s, d in times.items()},
               "p90_us": {s: {r: 1e6 * float(np.percentile(v, 90)) for r, v in d.items()} for s, d in times.items()}}
        after = out["median_us"]["after_step"]
        out["speedup_after_step_vs_previous_reader"] = after["file_object_json"] / after["sparkavg"]
        out["speedup_after_step_vs_npz"] = after["npz"] / after["sparkavg"]
        return emit(out, args.out)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
