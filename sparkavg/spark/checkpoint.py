"""Per-epoch checkpoints that belong to a run.

A checkpoint folder ``epoch-NNNNN/`` holds the network (``Network.save``:
npz + JSON, never pickle), the master's runner state when it has one
(``runner.npz``: plain arrays, e.g. a block velocity; read without pickle)
and ``trainer.json``: the run it belongs to
(``run_id``), the epochs done and the epochs the run aims at, the master's
configuration, a fingerprint of the network's architecture and the
history.  Folders are written atomically (tmp folder + rename).

Resuming (:func:`find_resumable`) takes the newest *complete* checkpoint
that loads whole -- network, runner state -- and fits the trainer's model
(a newer one that does not is skipped with a warning naming the file), so
that the trainer restores all of it or nothing; it refuses -- with a
:class:`CheckpointError` that says which run it found -- a checkpoint of
another architecture or master configuration, or a run that already has
the epochs asked for.  A fresh fit refuses a folder that holds another
run's checkpoints (:func:`check_fresh`).
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from ..jsonfile import read_json
from ..npzfile import load_npz
from ..references import named_code
from .upgrade import upgrade_master

__all__ = ["Checkpoint", "CheckpointError", "save_checkpoint", "list_checkpoints", "find_resumable",
           "check_fresh", "remove_other_runs", "architecture_fingerprint"]

logger = logging.getLogger(__name__)

_EPOCH_DIR = re.compile(r"^epoch-(\d{5})$")
_FORMAT = "sparkavg.checkpoint/2"
_RUNNER_FILE = "runner.npz"


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed as asked (another run, architecture or configuration)."""


def architecture_fingerprint(network) -> str:
    """The model's fingerprint (:meth:`sparkavg.nn.Model.fingerprint`): what
    fixes the layout of its state vectors."""
    return network.fingerprint()


@dataclass
class Checkpoint:
    """One complete checkpoint folder (the network is loaded by :meth:`load_network`)."""

    directory: str
    run_id: str
    epochs_done: int
    target_epochs: Optional[int]
    master: dict
    architecture: str
    written_at: str = ""
    extra: dict = field(default_factory=dict)

    def load_network(self, trusted=None):
        """The checkpoint's model; code it names is called only if marked or
        ``trusted`` (:mod:`sparkavg.references`)."""
        from ..nn import load_model

        return load_model(os.path.join(self.directory, "network.npz"), trusted=trusted)

    def load_runner_state(self) -> dict:
        """The runner state saved with this checkpoint (name -> ndarray; empty when none was saved),
        read in bounded memory (:func:`sparkavg.npzfile.load_npz`): a runner carries a few vectors
        the size of the parameters, so at most twice the network file plus 1 MiB."""
        path = os.path.join(self.directory, _RUNNER_FILE)
        if not os.path.exists(path):
            return {}
        limit = 2 * os.path.getsize(os.path.join(self.directory, "network.npz")) + (1 << 20)
        return load_npz(path, max_bytes=limit, error=CheckpointError)

    def describe(self) -> str:
        target = f" of {self.target_epochs}" if self.target_epochs else ""
        return f"run {self.run_id} after epoch {self.epochs_done}{target} ({self.directory}, written {self.written_at})"


def save_checkpoint(directory: str, network, *, run_id: str, epochs_done: int, target_epochs: Optional[int],
                    master: dict, extra: Optional[dict] = None, runner_state: Optional[dict] = None) -> str:
    """Write ``directory/epoch-NNNNN/`` atomically; returns its path.

    ``runner_state`` (name -> array or plain number/string, see
    :meth:`~sparkavg.spark.runners.base.EpochRunner.state_dict`) goes to
    ``runner.npz`` when not empty."""
    final = os.path.join(directory, f"epoch-{epochs_done:05d}")
    tmp = final + ".tmp"
    meta = {"format": _FORMAT, "run_id": run_id, "epochs_done": epochs_done, "target_epochs": target_epochs,
            "master": master, "architecture": architecture_fingerprint(network),
            "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "extra": extra or {}}
    step = directory
    try:
        os.makedirs(directory, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        step = tmp
        os.makedirs(tmp)
        step = os.path.join(tmp, "network.npz")
        network.save(step)
        if runner_state:
            step = os.path.join(tmp, _RUNNER_FILE)
            np.savez(step, **{k: np.asarray(v) for k, v in runner_state.items()})
        step = os.path.join(tmp, "trainer.json")
        with open(step, "w") as fh:
            json.dump(meta, fh, indent=2)
        step = final
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
    except OSError as exc:  # a full disk, a read-only or vanished folder: say which checkpoint, where
        shutil.rmtree(tmp, ignore_errors=True)  # a partial folder would only fill the disk further
        raise OSError(exc.errno, f"cannot write the checkpoint of epoch {epochs_done} (run {run_id}) to {final}: "
                                 f"{exc.strerror or exc} (writing {exc.filename or step}); the checkpoints written "
                                 "before are intact") from exc
    logger.info("checkpoint written: %s", final)
    return final


def _read(folder: str) -> Checkpoint:
    path = os.path.join(folder, "trainer.json")
    meta = read_json(path, error=CheckpointError)
    missing = [k for k in ("run_id", "epochs_done", "master", "architecture") if k not in meta]
    if missing:
        raise CheckpointError(f"{path} lacks {missing}; expected a {_FORMAT} record")
    done, target = meta["epochs_done"], meta.get("target_epochs")
    for name, ok, want in [
        ("epochs_done", isinstance(done, int) and not isinstance(done, bool) and done >= 0, "an int >= 0"),
        ("target_epochs", target is None or (isinstance(target, int) and not isinstance(target, bool)),
         "an int or null"),
        ("run_id", isinstance(meta["run_id"], str), "a str"),
        ("architecture", isinstance(meta["architecture"], str), "a str"),
        ("master", isinstance(meta["master"], dict), "a JSON object"),
        ("extra", isinstance(meta.get("extra", {}), dict), "a JSON object"),
        ("extra.history", isinstance(meta.get("extra", {}).get("history", []), list)
         if isinstance(meta.get("extra", {}), dict) else True, "a list"),
    ]:
        if not ok:
            value = meta["extra"]["history"] if name == "extra.history" else meta.get(name)
            raise CheckpointError(f"{path}: expected {name} as {want}, got {type(value).__name__} {value!r:.80}")
    if not os.path.exists(os.path.join(folder, "network.npz")):
        raise ValueError(f"{folder} has no network.npz")
    return Checkpoint(folder, meta["run_id"], done, target, meta["master"], meta["architecture"],
                      str(meta.get("written_at", "")), meta.get("extra", {}))


def list_checkpoints(directory: str) -> List[Checkpoint]:
    """Readable checkpoints in ``directory``, oldest first (unreadable ones logged and skipped)."""
    if not os.path.isdir(directory):
        return []
    found = []
    for name in sorted(os.listdir(directory)):
        if not _EPOCH_DIR.match(name):
            continue
        try:
            found.append(_read(os.path.join(directory, name)))
        except (OSError, ValueError) as exc:
            logger.warning("skipping incomplete checkpoint %s: %s", os.path.join(directory, name), exc)
    return found


def check_fresh(directory: str, run_id: str) -> None:
    """Refuse to start a new run in a folder holding another run's checkpoints."""
    others = [c for c in list_checkpoints(directory) if c.run_id != run_id]
    if others:
        raise CheckpointError(
            f"checkpoint_dir {directory!r} already holds {others[-1].describe()}. Resume it with "
            f"fit(..., resume_from={directory!r}), or give this run a new checkpoint_dir "
            "(or fit(..., overwrite_checkpoints=True) to replace it)")


def _differences(saved: dict, current: dict) -> list:
    keys = sorted(set(saved) | set(current))
    return [f"{k}: checkpoint {saved.get(k)!r}, now {current.get(k)!r}" for k in keys if saved.get(k) != current.get(k)]


_STATE_NAMES = {"params": "parameters", "updater": "updater state", "buffers": "buffers"}


def _check_state(path: str, saved, model) -> None:
    """Refuse (:class:`CheckpointError` naming ``path``) a saved model whose
    state vectors do not fit the trainer's ``model`` (e.g. another updater:
    the architecture's fingerprint leaves the updater out)."""
    from ..nn.model import STATE_VECTORS

    live, got = model.state, saved.state
    for name in STATE_VECTORS:
        want, have = int(getattr(live.get(name), "size", 0)), int(getattr(got.get(name), "size", 0))
        if want != have:
            hint = ""
            if name == "updater":
                hint = (f" (another updater: the checkpoint's {type(saved.updater).__name__}, the trainer's "
                        f"{type(model.updater).__name__}; build the model with the checkpoint's updater to resume)")
            raise CheckpointError(f"{path}: {_STATE_NAMES.get(name, name)} of {have} values, the trainer's model "
                                  f"has {want}{hint}")


def _named(exc: BaseException, path: str) -> str:
    text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc)
    return text if path in text else f"{path}: {text}"


def find_resumable(path: str, *, network, master: dict, epochs: int, run_id: Optional[str] = None, check=None):
    """The checkpoint to resume ``epochs`` epochs from, loaded whole and
    checked against the trainer's model before anything is restored.

    A checkpoint that cannot be loaded or checked (a damaged network or
    ``runner.npz``, state vectors of another size) is skipped with a
    warning naming the file, and the next older one is tried; when none is
    left, a :class:`CheckpointError` lists every file and why.

    Parameters
    ----------
    path : str
        A checkpoint folder, or a checkpoint_dir (its newest complete checkpoint).
    network : sparkavg.nn.Model
        The trainer's model: the checkpoint must have its architecture and
        state vectors of its sizes.  It is not changed.
    master : dict
        The trainer's master configuration: the checkpoint's must equal it.
    epochs : int
        The total epochs asked for.
    run_id : str, optional
        Resume only this run.
    check : callable, optional
        ``check(runner_state, model)`` raises ``ValueError`` when the runner
        state (name -> array, as read from ``runner.npz``) cannot be restored
        for the loaded ``model``; it must change nothing.

    Returns
    -------
    (Checkpoint, Model, dict)
        The checkpoint, its loaded model and its runner state.
    """
    if os.path.exists(os.path.join(path, "trainer.json")):
        candidates = [_read(path)]
    else:
        candidates = list_checkpoints(path)
    if run_id is not None:
        candidates = [c for c in candidates if c.run_id == run_id]
    if not candidates:
        which = f" of run {run_id}" if run_id else ""
        raise FileNotFoundError(f"Expect a checkpoint folder (epoch-NNNNN with trainer.json){which} in "
                                f"{path!r}, found none")
    arch = architecture_fingerprint(network)
    errors = []
    for ckpt in reversed(candidates):
        if ckpt.architecture != arch:
            raise CheckpointError(f"{ckpt.describe()} has another network architecture than the trainer's "
                                  f"(fingerprint {ckpt.architecture} vs {arch}); build the same network to resume it")
        diff = _differences(upgrade_master(ckpt.master), master)
        if diff:
            raise CheckpointError(f"{ckpt.describe()} was trained with another master configuration "
                                  f"({'; '.join(diff)}); resume with the same master")
        at = os.path.join(ckpt.directory, "network.npz")
        try:
            # the code the resuming model names was named by the user: a checkpoint may name that, no more
            net = ckpt.load_network(trusted=named_code(network))
            _check_state(at, net, network)
            at = os.path.join(ckpt.directory, _RUNNER_FILE)
            runner_state = ckpt.load_runner_state()
            if check is not None:
                check(runner_state, net)
        except Exception as exc:  # a damaged or unfitting checkpoint: fall back to an older one
            errors.append(_named(exc, at))
            logger.warning("cannot resume %s (%s); trying an older checkpoint", ckpt.directory, errors[-1])
            continue
        if ckpt.epochs_done >= epochs:
            raise CheckpointError(f"{ckpt.describe()} already has {ckpt.epochs_done} epoch(s) and "
                                  f"{epochs} were asked for: nothing to resume. Ask for more epochs to continue "
                                  "that run, or start a new run with a new checkpoint_dir")
        return ckpt, net, runner_state
    raise CheckpointError(f"no loadable checkpoint in {path!r}: {'; '.join(errors)}")


def remove_other_runs(directory: str, run_id: str) -> int:
    """Delete every checkpoint folder in ``directory`` that is not run
    ``run_id``'s (unreadable ones included): what ``overwrite_checkpoints``
    does before a fresh run writes, so that a later ``resume_from`` cannot
    continue the old run's later epochs.  Returns how many were removed."""
    if not os.path.isdir(directory):
        return 0
    removed = 0
    for name in sorted(os.listdir(directory)):
        if not (_EPOCH_DIR.match(name) or (name.endswith(".tmp") and _EPOCH_DIR.match(name[:-4]))):
            continue
        folder = os.path.join(directory, name)
        try:
            mine = _read(folder).run_id == run_id
        except (OSError, ValueError):
            mine = False
        if not mine:
            shutil.rmtree(folder)
            removed += 1
    if removed:
        logger.warning("overwrite_checkpoints: removed %d checkpoint folder(s) of another run from %s", removed,
                       directory)
    return removed
