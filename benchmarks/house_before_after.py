#!/usr/bin/env python
"""The house refactor measured against the commit before it, in one run.

Checks out ``--before`` and ``--after`` into temporary worktrees (the Cython
kernels are copied from this checkout's build: ``sparkavg_ext/`` did not
change between them, which the script checks), then runs, alternating the two
so that load drifts hit both alike:

- the parity cells (``bench_parity.py`` with ``--parity``'s arguments): one
  process and each master per cell, accuracy and speed;
- LeNet on all 60k for 3 epochs with parameter averaging at the defaults
  against one 2-thread process (``bench_averaging.py --sections lenet``),
  when ``--lenet60k``.

Writes one JSON with both commits' results side by side::

    python benchmarks/house_before_after.py --before 3d71c4b --after HEAD \\
        --parity "--models lenet,mlp,sgd --data 12k --masters defaults,sharing --seeds 123" \\
        --lenet60k --out benchmarks/results/house_before_after.json
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
log = logging.getLogger("house_before_after")


def _git(*args, cwd=REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def checkout(commit: str, root: Path) -> Path:
    """A worktree of ``commit`` under ``root`` with this checkout's compiled kernels."""
    sha = _git("rev-parse", "--short", commit)
    path = root / sha
    _git("worktree", "add", "--detach", str(path), sha)
    for so in (REPO / "sparkavg_ext").glob("*.so"):
        shutil.copy2(so, path / "sparkavg_ext" / so.name)
    return path


def run(tree: Path, script: str, args: list, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, str(tree / "benchmarks" / script), *args, "--out", str(out)]
    log.info("%s: %s", tree.name, " ".join(cmd))
    subprocess.run(cmd, cwd=tree, env=env, check=True)
    return json.loads(out.read_text())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True)
    p.add_argument("--after", default="HEAD")
    p.add_argument("--parity", default="--models lenet,mlp,sgd --data 12k --masters defaults,sharing --seeds 123")
    p.add_argument("--lenet60k", action="store_true")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    changed = _git("diff", "--stat", args.before, args.after, "--", "sparkavg_ext", "setup.py")
    if changed:
        p.error(f"the kernels changed between {args.before} and {args.after}; build each tree instead:\n{changed}")
    data = ["--data-dir", args.data_dir] if args.data_dir else []
    result = {"benchmark": "house before/after", "argv": sys.argv[1:] if argv is None else list(argv),
              "cpu_count": os.cpu_count(), "commits": {}}
    root = Path(tempfile.mkdtemp(prefix="house-"))
    trees = {}
    try:
        for label, commit in (("before", args.before), ("after", args.after)):
            trees[label] = checkout(commit, root)
            result["commits"][label] = _git("rev-parse", "--short", commit)
        for label in ("before", "after"):
            parity = run(trees[label], "bench_parity.py", shlex.split(args.parity) + data, root / f"parity_{label}.json")
            result[f"parity_{label}"] = parity["cells"]
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        if args.lenet60k:
            for label in ("before", "after"):
                lenet = run(trees[label], "bench_averaging.py",
                            ["--sections", "lenet", "--lenet-extra-batch", "0"] + data, root / f"lenet_{label}.json")
                result[f"lenet60k_{label}"] = lenet["lenet"]
                Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for b, a in zip(result.get("parity_before", []), result.get("parity_after", [])):
        rows.append(f"| {b['model']} | {b['data']} | {b['master']} | {b['accuracy']:.4f} | {a['accuracy']:.4f} | "
                    f"{b['local_seconds'] / b['seconds']:.2f}x | {a['local_seconds'] / a['seconds']:.2f}x |")
    if rows:
        log.info("\n| model | data | master | acc before | acc after | speed before | speed after |\n"
                 "|---|---|---|---|---|---|---|\n%s", "\n".join(rows))
    return result


if __name__ == "__main__":
    main()
