"""Per-epoch checkpoints: the network (params, updater state, iteration,
config) via ``Network.save`` (npz + JSON, never pickle) and a JSON record
of the epoch and the master's configuration."""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Optional

__all__ = ["Checkpoint", "save_checkpoint", "load_checkpoint", "latest_checkpoint"]

logger = logging.getLogger(__name__)

_EPOCH_DIR = re.compile(r"^epoch-(\d{5})$")


@dataclass
class Checkpoint:
    """What :func:`load_checkpoint` returns."""

    network: object
    epochs_done: int
    master: dict
    directory: str
    extra: dict


def save_checkpoint(directory: str, network, epochs_done: int, master: dict, extra: Optional[dict] = None) -> str:
    """Write ``directory/epoch-NNNNN/`` atomically (tmp folder + rename)."""
    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, f"epoch-{epochs_done:05d}")
    tmp = final + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    network.save(os.path.join(tmp, "network.npz"))
    with open(os.path.join(tmp, "trainer.json"), "w") as fh:
        json.dump({"epochs_done": epochs_done, "master": master, "extra": extra or {}}, fh, indent=2)
    if os.path.exists(final):
        import shutil

        shutil.rmtree(final)
    os.replace(tmp, final)
    logger.info("checkpoint written: %s", final)
    return final


def latest_checkpoint(directory: str) -> Optional[str]:
    """The newest complete ``epoch-NNNNN`` folder, or None."""
    if not os.path.isdir(directory):
        return None
    found = sorted(d for d in os.listdir(directory) if _EPOCH_DIR.match(d))
    return os.path.join(directory, found[-1]) if found else None


def load_checkpoint(path: str) -> Checkpoint:
    """Load a checkpoint folder, or the newest one inside ``path``."""
    from ..nn import Network

    folder = path if os.path.exists(os.path.join(path, "trainer.json")) else latest_checkpoint(path)
    if folder is None:
        raise FileNotFoundError(f"Expect a checkpoint folder (epoch-NNNNN with trainer.json) in {path!r}, found none")
    with open(os.path.join(folder, "trainer.json")) as fh:
        meta = json.load(fh)
    for key in ("epochs_done", "master"):
        if key not in meta:
            raise ValueError(f"Checkpoint {folder}/trainer.json lacks {key!r}; expected keys epochs_done, master")
    network = Network.load(os.path.join(folder, "network.npz"))
    return Checkpoint(network, int(meta["epochs_done"]), meta["master"], folder, meta.get("extra", {}))
