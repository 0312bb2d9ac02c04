#!/usr/bin/env python
"""Bit identity across a refactor: LeNet on ``local[2]`` with a fixed seed,
one epoch of each master at its defaults (and DL4J's presets), reported as
the SHA-256 of the trained parameters, updater state and buffers.

    python benchmarks/bit_identity.py --out benchmarks/results/bit_identity_before.json
    python benchmarks/bit_identity.py --compare benchmarks/results/bit_identity_before.json

``--compare`` exits 1 when any digest differs from the file's.  The data are
the first ``--examples`` Fashion-MNIST training images, as RDD minibatch
chunks (the examples' classic path).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

log = logging.getLogger("bit_identity")


def digest(net) -> dict:
    state = net.state
    out = {}
    for key in ("params", "updater", "buffers"):
        a = state[key]
        out[key] = hashlib.sha256(a.tobytes()).hexdigest() if a is not None else None
    return out


def masters(workers: int, seed: int) -> dict:
    from sparkavg.spark import GradientSharing, ParameterAveraging

    found = {"averaging": ParameterAveraging(workers=workers, seed=seed),
             "averaging-F8": ParameterAveraging(workers=workers, seed=seed, averaging_frequency=8),
             "sharing": GradientSharing(workers=workers, seed=seed)}
    if hasattr(ParameterAveraging, "dl4j"):
        found["averaging-dl4j"] = ParameterAveraging.dl4j(workers=workers, seed=seed)
        # staleness=0: DL4J's asynchronous application depends on arrival times, so no digest would repeat
        found["sharing-dl4j"] = GradientSharing.dl4j(workers=workers, seed=seed, staleness=0)
    else:  # the release before the presets: DL4J's behaviour field by field
        found["averaging-dl4j"] = ParameterAveraging(
            workers=workers, seed=seed, averaging_frequency=5, block_momentum=None, weighting="uniform",
            worker_shares="equal", moment_correction=False)
        found["sharing-dl4j"] = GradientSharing(workers=workers, seed=seed, staleness=0, update_scale="sum",
                                                momentum_masking=False, local_view=False)
    return found


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=4096)
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=None, help="write the digests here (JSON)")
    p.add_argument("--compare", default=None, help="compare with the digests of this file")
    args = p.parse_args(argv)

    from mnist_example import as_minibatch_rdd, default_data_dir, spark_session
    from sparkavg.data.mnist import load_mnist
    from sparkavg.nn.zoo import lenet
    from sparkavg.spark import SparkTrainer

    x, y = load_mnist(args.data_dir or default_data_dir(), "train", limit=args.examples)
    spark = spark_session(f"local[{args.workers}]", "bit-identity")
    results = {}
    try:
        rdd = as_minibatch_rdd(spark.sparkContext, x, y, slices=args.workers).cache()
        for name, master in masters(args.workers, args.seed).items():
            net = lenet(num_classes=10, seed=args.seed)
            t0 = time.time()
            trainer = SparkTrainer(spark, net, master, progress=False)
            trainer.fit(rdd, epochs=1)
            trainer.close()
            results[name] = digest(net)
            results[name]["decisions"] = {d["name"]: str(d["value"]) for d in trainer.stats.decisions}
            log.info("%s: %s (%.1f s)", name, results[name]["params"][:16], time.time() - t0)
    finally:
        spark.stop()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    record = {"commit": commit, "examples": args.examples, "seed": args.seed, "workers": args.workers,
              "digests": results}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(record, fh, indent=1)
    print(json.dumps(record, indent=1))
    if args.compare:
        with open(args.compare) as fh:
            before = json.load(fh)["digests"]
        keys = ("params", "updater", "buffers")

        def same(name):
            return all(results[name][k] == before[name][k] for k in keys)

        bad = [name for name in before if name in results and not same(name)]
        missing = [name for name in before if name not in results]
        for name in before:
            if name in results:
                print(f"{name}: {'identical' if same(name) else 'DIFFERENT'}")
        if missing:
            print(f"not run now: {missing}")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
