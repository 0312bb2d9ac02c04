"""Training-master configurations: frozen dataclasses with documented
defaults and validation (after torch.distributed.fsdp.api).

A master says HOW training is distributed; :class:`~sparkavg.spark.trainer.SparkTrainer`
is the one interface that runs either.
"""
from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Optional, Union

from ..transport.group import Topology

__all__ = [
    "Weighting",
    "DataApproach",
    "Repartition",
    "Topology",
    "ParameterAveraging",
    "GradientSharing",
    "FixedThreshold",
    "AdaptiveThreshold",
    "TargetSparsityThreshold",
    "ResidualClipping",
    "master_from_dict",
]


class Weighting(str, enum.Enum):
    """How worker results are averaged."""

    EXAMPLES = "examples"  #: weight each worker by the examples it trained (default)
    UNIFORM = "uniform"  #: every non-empty worker counts once (DL4J's behaviour)


class DataApproach(str, enum.Enum):
    """How minibatches are held between rounds."""

    EXPORT = "export"  #: written once as .npz files; each round's RDD holds only its paths
    DIRECT = "direct"  #: a persisted minibatch RDD; each round runs on its own partitions


class Repartition(str, enum.Enum):
    """How minibatches are assigned to workers each epoch."""

    BALANCED = "balanced"  #: shuffled, then dealt round-robin: shards differ by at most one minibatch
    NEVER = "never"  #: keep export order (no shuffle), still dealt so that every minibatch trains


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _positive_int(name: str, value, minimum: int = 1) -> None:
    _check(isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
           f"Expect {name} >= {minimum} (an int), got {value!r}")


def _enum(cls, name: str, value):
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"Expect {name} in {{{allowed}}}, got {value!r}") from None


@dataclass(frozen=True)
class ParameterAveraging:
    """Synchronous parameter averaging (the default master).

    Per round the driver broadcasts the flat parameters (and updater
    state), every worker fits ``averaging_frequency`` minibatches of its
    own shard of that round, ``treeAggregate`` sums the weighted results
    and the driver divides.  Every example trains exactly once per epoch.

    Parameters
    ----------
    batch_size_per_worker : int, default 16
        Examples per minibatch (DL4J's default).  Data is re-batched to this
        size once per fit; a partition's last minibatch may be smaller.
    averaging_frequency : int, default 5
        Minibatches each worker fits between averagings.  DL4J warns that
        values far above 20 hurt convergence.
    workers : int or None, default None
        Workers per round; ``None`` means Spark's ``defaultParallelism``.
    aggregation_depth : int, default 2
        ``treeAggregate`` depth.
    save_updater : bool, default True
        Average and carry the updater state (Adam's moments ...) too.
        DL4J documents this default but ships False; we ship what it says.
    weighting : Weighting, default EXAMPLES
        ``examples`` weights each worker by the examples it trained;
        ``uniform`` is DL4J's unweighted mean.
    repartition : Repartition, default BALANCED
        Shuffle minibatches each epoch (seeded) and deal them evenly.
    storage_level : str, default "MEMORY_ONLY"
        Storage level of the persisted minibatch RDD (``direct`` approach);
        a name from ``pyspark.StorageLevel``.
    data_approach : DataApproach, default EXPORT
        ``export`` writes minibatches once to ``export_dir`` (must be a path
        every executor can read: local on one machine, a shared filesystem
        on a cluster); ``direct`` keeps a persisted minibatch RDD.
    export_dir : str or None, default None
        Where exported minibatches go; ``None`` makes a temporary folder
        (removed when the trainer is closed).
    prefetch : int, default 1
        Minibatches a worker loads ahead in a background thread (0 = off).
    collect_stats : bool, default True
        Record per-phase timings on driver and workers.
    seed : int, default 12345
        Seed of the per-epoch minibatch shuffle (epoch ``e`` uses ``seed + e``,
        so a resumed fit shuffles exactly as an uninterrupted one).
    """

    batch_size_per_worker: int = 16
    averaging_frequency: int = 5
    workers: Optional[int] = None
    aggregation_depth: int = 2
    save_updater: bool = True
    weighting: Weighting = Weighting.EXAMPLES
    repartition: Repartition = Repartition.BALANCED
    storage_level: str = "MEMORY_ONLY"
    data_approach: DataApproach = DataApproach.EXPORT
    export_dir: Optional[str] = None
    prefetch: int = 1
    collect_stats: bool = True
    seed: int = 12345

    def __post_init__(self):
        _positive_int("batch_size_per_worker", self.batch_size_per_worker)
        _positive_int("averaging_frequency", self.averaging_frequency)
        if self.workers is not None:
            _positive_int("workers", self.workers)
        _positive_int("aggregation_depth", self.aggregation_depth)
        _positive_int("prefetch", self.prefetch, minimum=0)
        _check(isinstance(self.save_updater, bool), f"Expect save_updater to be a bool, got {self.save_updater!r}")
        object.__setattr__(self, "weighting", _enum(Weighting, "weighting", self.weighting))
        object.__setattr__(self, "repartition", _enum(Repartition, "repartition", self.repartition))
        object.__setattr__(self, "data_approach", _enum(DataApproach, "data_approach", self.data_approach))
        from pyspark import StorageLevel

        _check(isinstance(getattr(StorageLevel, str(self.storage_level), None), StorageLevel),
               f"Expect storage_level to name a pyspark.StorageLevel (e.g. 'MEMORY_ONLY', "
               f"'MEMORY_AND_DISK'), got {self.storage_level!r}")
        _check(isinstance(self.seed, int), f"Expect seed to be an int, got {self.seed!r}")

    def to_dict(self) -> dict:
        return _to_dict(self)


# ------------------------------------------------------- threshold algorithms
@dataclass(frozen=True)
class FixedThreshold:
    """A constant threshold τ."""

    threshold: float = 1e-3

    def __post_init__(self):
        _check(math.isfinite(self.threshold) and self.threshold > 0,
               f"Expect threshold > 0 and finite, got {self.threshold!r}")


@dataclass(frozen=True)
class AdaptiveThreshold:
    """DL4J's default: start at ``initial``; keep τ while the last message's
    sparsity (fraction of entries sent) is inside [min_sparsity, max_sparsity],
    else multiply (too dense) or divide (too sparse) τ by ``decay``."""

    initial: float = 1e-4
    min_sparsity: float = 1e-4
    max_sparsity: float = 1e-2
    decay: float = 0.5 ** (1.0 / 20.0)

    def __post_init__(self):
        _check(math.isfinite(self.initial) and self.initial > 0, f"Expect initial > 0, got {self.initial!r}")
        _check(0 < self.min_sparsity < self.max_sparsity <= 1,
               f"Expect 0 < min_sparsity < max_sparsity <= 1, got {self.min_sparsity!r}, {self.max_sparsity!r}")
        _check(0 < self.decay < 1, f"Expect 0 < decay < 1, got {self.decay!r}")


@dataclass(frozen=True)
class TargetSparsityThreshold:
    """Steer τ so that about ``target`` of the entries are sent each step."""

    initial: float = 1e-3
    target: float = 1e-3
    decay: float = 0.5 ** (1.0 / 20.0)

    def __post_init__(self):
        _check(math.isfinite(self.initial) and self.initial > 0, f"Expect initial > 0, got {self.initial!r}")
        _check(0 < self.target < 1, f"Expect 0 < target < 1, got {self.target!r}")
        _check(0 < self.decay < 1, f"Expect 0 < decay < 1, got {self.decay!r}")


@dataclass(frozen=True)
class ResidualClipping:
    """Every ``frequency`` iterations clip the residual to [-k·τ, k·τ]
    (DL4J's default post-processor against residual explosion)."""

    frequency: int = 5
    k: float = 5.0

    def __post_init__(self):
        _positive_int("frequency", self.frequency)
        _check(self.k >= 1, f"Expect k >= 1, got {self.k!r}")


ThresholdAlgorithm = Union[FixedThreshold, AdaptiveThreshold, TargetSparsityThreshold]


@dataclass(frozen=True)
class GradientSharing:
    """Asynchronous gradient sharing (Strom 2015), opt-in.

    One barrier stage per epoch; each iteration every worker adds its
    updater step to a residual, threshold-encodes it, sends it to its peers
    over authenticated reliable UDP and applies its own and every received
    message.

    Parameters
    ----------
    threshold : FixedThreshold | AdaptiveThreshold | TargetSparsityThreshold, default FixedThreshold(1e-3)
        The threshold algorithm (a float means ``FixedThreshold(value)``).
    residual_post_processor : ResidualClipping or None, default ResidualClipping(5, 5.0)
    batch_size_per_worker : int, default 16
    workers : int or None, default None (Spark's defaultParallelism)
    port : int, default 0
        0 = an ephemeral UDP port per worker; else a base port (worker ``i``
        binds ``port + i``).
    network_mask : str or None
        CIDR mask choosing the interface whose address peers use, e.g.
        ``"10.1.1.0/24"``; else env ``SPARKAVG_IP``; else the executor host.
    topology : Topology, default PLAIN
    max_datagram_bytes : int, default 60000
    retransmit_timeout : float, default 0.2 s
    stall_timeout : float, default 60 s
        A peer silent for this long ends the stage with an error naming it.
    simulate_loss : float, default 0.0
        Fault injection: drop, duplicate and reorder this fraction of
        datagrams inside the transport (tests and demos).
    max_stage_attempts : int, default 3
        Spark never retries a failed barrier result stage, so the driver
        does: a lost worker (process killed, peer stalled) restarts the
        epoch from its starting state, up to this many attempts in all.
    collect_stats : bool, default True
    seed : int, default 12345
    """

    threshold: ThresholdAlgorithm = field(default_factory=lambda: FixedThreshold(1e-3))
    residual_post_processor: Optional[ResidualClipping] = field(default_factory=ResidualClipping)
    batch_size_per_worker: int = 16
    workers: Optional[int] = None
    port: int = 0
    network_mask: Optional[str] = None
    topology: Topology = Topology.PLAIN
    max_datagram_bytes: int = 60000
    retransmit_timeout: float = 0.2
    stall_timeout: float = 60.0
    simulate_loss: float = 0.0
    max_stage_attempts: int = 3
    collect_stats: bool = True
    seed: int = 12345

    def __post_init__(self):
        if isinstance(self.threshold, (int, float)) and not isinstance(self.threshold, bool):
            object.__setattr__(self, "threshold", FixedThreshold(float(self.threshold)))
        _check(isinstance(self.threshold, (FixedThreshold, AdaptiveThreshold, TargetSparsityThreshold)),
               f"Expect threshold to be FixedThreshold, AdaptiveThreshold, TargetSparsityThreshold "
               f"or a float, got {self.threshold!r}")
        _check(self.residual_post_processor is None or isinstance(self.residual_post_processor, ResidualClipping),
               f"Expect residual_post_processor to be ResidualClipping or None, got {self.residual_post_processor!r}")
        _positive_int("batch_size_per_worker", self.batch_size_per_worker)
        if self.workers is not None:
            _positive_int("workers", self.workers)
        _check(isinstance(self.port, int) and 0 <= self.port <= 65535, f"Expect port in [0, 65535], got {self.port!r}")
        object.__setattr__(self, "topology", _enum(Topology, "topology", self.topology))
        _check(isinstance(self.max_datagram_bytes, int) and 512 <= self.max_datagram_bytes <= 65507,
               f"Expect max_datagram_bytes in [512, 65507], got {self.max_datagram_bytes!r}")
        _check(self.retransmit_timeout > 0, f"Expect retransmit_timeout > 0 s, got {self.retransmit_timeout!r}")
        _check(self.stall_timeout > self.retransmit_timeout,
               f"Expect stall_timeout > retransmit_timeout ({self.retransmit_timeout}), got {self.stall_timeout!r}")
        _check(0.0 <= self.simulate_loss < 1.0, f"Expect simulate_loss in [0, 1), got {self.simulate_loss!r}")
        _positive_int("max_stage_attempts", self.max_stage_attempts)
        if self.network_mask is not None:
            import ipaddress

            try:
                ipaddress.ip_network(self.network_mask, strict=False)
            except ValueError as exc:
                raise ValueError(f"Expect network_mask in CIDR form like '10.1.1.0/24', got {self.network_mask!r}: {exc}") from None

    def to_dict(self) -> dict:
        return _to_dict(self)


def _to_dict(master) -> dict:
    out = {"type": type(master).__name__}
    for f in fields(master):
        value = getattr(master, f.name)
        if isinstance(value, enum.Enum):
            value = value.value
        elif hasattr(value, "__dataclass_fields__"):
            value = {"type": type(value).__name__, **asdict(value)}
        out[f.name] = value
    return out


_NESTED = {c.__name__: c for c in (FixedThreshold, AdaptiveThreshold, TargetSparsityThreshold, ResidualClipping)}
_MASTERS = {c.__name__: c for c in (ParameterAveraging, GradientSharing)}


def master_from_dict(d: dict):
    """Rebuild a master from :meth:`to_dict` output (checkpoints use this)."""
    d = dict(d)
    kind = d.pop("type", None)
    if kind not in _MASTERS:
        raise ValueError(f"Expect a master type in {sorted(_MASTERS)}, got {kind!r}")
    for key, value in list(d.items()):
        if isinstance(value, dict) and value.get("type") in _NESTED:
            v = dict(value)
            d[key] = _NESTED[v.pop("type")](**v)
    return _MASTERS[kind](**d)
