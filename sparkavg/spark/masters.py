"""Training masters: frozen dataclasses of what a user chooses, validated on
the driver before any Spark job.  A master says HOW an epoch is distributed;
:class:`~sparkavg.spark.trainer.SparkTrainer` runs either.  The rules that
run while an epoch runs are policies (:mod:`sparkavg.spark.policies`) chosen
by the master's ``preset``: ``"sparkavg"`` (what measured best) or ``"dl4j"``
(DL4J's own behaviour).  Configurations of earlier releases are upgraded on
load (:mod:`sparkavg.spark.upgrade`).
"""
from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal, Optional, Tuple, Union

from ..configurable import Configurable, from_config, register, registered
from ..references import Names
from ..sharing.thresholds import AdaptiveThreshold, FixedThreshold, TargetSparsityThreshold, ThresholdRule
from ..transport import Topology
from ..data.transforms import check_encoding, transform_reference

__all__ = ["Repartition", "Device", "Placement", "Topology", "DataOptions", "Master", "AUTO", "PRESETS",
           "ParameterAveraging", "GradientSharing", "FixedThreshold", "AdaptiveThreshold", "DEFAULT_THRESHOLD",
           "TargetSparsityThreshold", "master_from_config"]

#: ``averaging_frequency="auto"``: chosen every epoch from measured costs and a convergence bound.
AUTO = "auto"
#: The behaviours a master can have: what measured best here, or DL4J's own.
PRESETS = ("sparkavg", "dl4j")


class Repartition(str, enum.Enum):
    """How minibatches are dealt to workers each epoch (every minibatch trains
    exactly once per epoch under each)."""

    AUTO = "auto"  #: ``local`` for Spark blocks, ``balanced`` for shared files
    LOCAL = "local"  #: one shard per worker cut once per fit where the blocks live; each shuffled in place per epoch
    BALANCED = "balanced"  #: all minibatches shuffled, then dealt round-robin: data crosses hosts every epoch
    NEVER = "never"  #: keep the data's order (no shuffle), still dealt so that every minibatch trains


class Placement(str, enum.Enum):
    """Where a fit's minibatches live between rounds."""

    AUTO = "auto"  #: files under ``shared_dir`` when given; else a temp folder for local[N], Spark blocks on clusters
    SPARK = "spark"  #: persisted Spark blocks (needs no shared filesystem)
    FILES = "files"  #: .minibatch files under ``shared_dir``


class Device(str, enum.Enum):
    """Where an executor trains, evaluates and predicts."""

    AUTO = "auto"  #: the task's Spark-assigned GPU when it has one and CuPy works, else the CPU (reason logged)
    GPU = "gpu"  #: the task's GPU; an error when Spark assigned none or CuPy cannot use it
    CPU = "cpu"  #: always the CPU


def check(cond: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``cond``."""
    if not cond:
        raise ValueError(message)


def check_int(name: str, value, minimum: int = 1, maximum: Optional[int] = None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    ok = ok and (maximum is None or value <= maximum)
    check(ok, f"Expect {name} {f'>= {minimum}' if maximum is None else f'in [{minimum}, {maximum}]'} (an int), "
              f"got {value!r}")


def as_enum(cls, name: str, value):
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"Expect {name} in {{{allowed}}}, got {value!r}") from None


@register("data")
@dataclass(frozen=True)
class DataOptions(Configurable):
    """Where a fit's minibatches live and how executors read them (both masters).

    Parameters
    ----------
    shared_dir : str or None, default None
        A location EVERY host reads and writes (a mounted path or an
        ``fsspec`` URL: ``hdfs://``, ``s3://`` ...) for the fit's minibatch files.
    placement : Placement, default AUTO
        ``spark`` forces Spark blocks (a cluster with a shared filesystem that
        reads local blocks faster); ``files`` requires ``shared_dir``.
    repartition : Repartition, default AUTO
        How each epoch deals minibatches to workers (:class:`Repartition`).
    transform : str or None, default None
        ``transform(x, y, rng) -> (x, y)`` applied to every training
        minibatch on the executors (augmentation), ``rng`` seeded per worker,
        epoch and minibatch.  An importable ``"package.module:function"``
        name (a module-level function is kept as its name; nothing is
        pickled); mark it ``@sparkavg.transform`` so that a saved master
        naming it loads (:mod:`sparkavg.references`).  See
        :mod:`sparkavg.data.transforms`.
    storage : {"auto", "memory", "stream"}, default "auto"
        Keep the prepared minibatches for all epochs, or read every epoch from
        the source DataFrame again (data larger than memory); ``auto``
        streams when they would not fit (:mod:`sparkavg.spark.streaming`).
    feature_dtype : str or None, default "auto"
        The dtype features keep in the prepared minibatches: ``"auto"``
        (integers in the narrowest type that holds them, float16 as float16,
        else float32), one of ``"uint8"``, ``"int8"``, ``"uint16"``,
        ``"int16"``, ``"float16"``, ``"float32"``, or None (float32).
    scale : float or None, default None
        Multiplies the features on the executors (``1/255`` for uint8 pixels).
    normalize : (float, float) or None, default None
        ``(mean, std)``: after ``scale``, ``(x - mean) / std``.  ``scale`` and
        ``normalize`` are the model's input encoding: applied in training,
        ``evaluate``/``predict`` and a fitted ``NetworkModel``'s ``transform``.
    """

    shared_dir: Optional[str] = None
    placement: Placement = Placement.AUTO
    repartition: Repartition = Repartition.AUTO
    transform: Annotated[Optional[str], Names("transform")] = None
    storage: Literal["auto", "memory", "stream"] = "auto"
    feature_dtype: Optional[str] = "auto"
    scale: Optional[float] = None
    normalize: Optional[Tuple[float, float]] = None

    def __post_init__(self):
        object.__setattr__(self, "transform", transform_reference(self.transform))
        check(self.shared_dir is None or (isinstance(self.shared_dir, str) and self.shared_dir.strip() != ""),
              f"Expect shared_dir to be a path or URL every host reaches (a non-empty str) or None, "
              f"got {self.shared_dir!r}")
        object.__setattr__(self, "placement", as_enum(Placement, "placement", self.placement))
        check(self.placement is not Placement.FILES or self.shared_dir is not None,
              "Expect shared_dir (a location every host reaches) with placement='files', got None")
        object.__setattr__(self, "repartition", as_enum(Repartition, "repartition", self.repartition))
        check(self.storage in ("auto", "memory", "stream"),
              f"Expect storage in ('auto', 'memory', 'stream'), got {self.storage!r}")
        check_encoding(self.feature_dtype, self.scale, self.normalize)
        if self.normalize is not None:
            object.__setattr__(self, "normalize", tuple(float(v) for v in self.normalize))

    def config_arguments(self) -> dict:
        arguments = super().config_arguments()
        for name, default in (("transform", None), ("scale", None), ("normalize", None), ("feature_dtype", "auto"),
                              ("storage", "auto")):
            if arguments[name] == default:  # configs (and checkpoints) from before these fields stay equal
                del arguments[name]
        return arguments


@dataclass(frozen=True)
class Master(Configurable):
    """What every master shares (a subclass names its runner's module in
    :mod:`sparkavg.spark.runners`).

    Parameters
    ----------
    batch_size_per_worker : int, default 16
        Examples per minibatch (DL4J's default); a partition's last may be smaller.
    workers : int or None, default None
        Workers per round; ``None`` means Spark's default parallelism.
    data : DataOptions, default DataOptions()
        Where minibatches live between rounds.
    device : Device, default AUTO
        Where executors train, evaluate and predict.
    seed : int, default 12345
        Seed of the per-epoch minibatch deal (epoch ``e`` uses ``seed + e``,
        so a resumed fit deals exactly as an uninterrupted one), >= 0.
    preset : {"sparkavg", "dl4j"}, default "sparkavg"
        The run-time policies: what measured best here, or DL4J's own
        behaviour (see each master's ``dl4j``), for comparisons with DL4J.
    """

    runner_module: ClassVar[Optional[str]] = None

    batch_size_per_worker: int = 16
    workers: Optional[int] = None
    data: DataOptions = DataOptions()
    device: Device = Device.AUTO
    seed: int = 12345
    preset: Literal["sparkavg", "dl4j"] = "sparkavg"

    def __post_init__(self):
        check_int("batch_size_per_worker", self.batch_size_per_worker)
        if self.workers is not None:
            check_int("workers", self.workers)
        check(isinstance(self.data, DataOptions), f"Expect data to be DataOptions(...), got {self.data!r}")
        object.__setattr__(self, "device", as_enum(Device, "device", self.device))
        check_int("seed", self.seed, minimum=0, maximum=2**31 - 1)
        check(self.preset in PRESETS, f"Expect preset in {PRESETS}, got {self.preset!r}")

    def config_arguments(self) -> dict:
        arguments = super().config_arguments()
        if arguments["preset"] == "sparkavg":  # configs (and checkpoints) from before presets stay equal
            del arguments["preset"]
        return arguments

    def validate_for(self, workers: int) -> None:
        """Checks that need the resolved worker count (driver, before any job)."""
        check_int("workers", workers)


@register("master")
@dataclass(frozen=True)
class ParameterAveraging(Master):
    """Synchronous parameter averaging (the default master).

    Per round the driver ships the flat parameters (and updater state),
    every worker fits ``averaging_frequency`` minibatches of its own shard,
    and the driver takes the mean of the results weighted by the examples
    each worker trained.  Every example trains exactly once per epoch.

    What the ``"sparkavg"`` preset does besides (each recorded as a decision
    in ``trainer.stats`` with its reason; :mod:`sparkavg.spark.policies`):
    block momentum (BMUF) in epochs averaging every 32 minibatches or more
    with an updater without momentum of its own; the averaged second moment
    of Adam-like updaters corrected for the workers' smaller minibatches;
    workers' shares of an epoch cut by their measured speeds.

    Parameters
    ----------
    averaging_frequency : int or "auto", default "auto"
        Minibatches each worker fits between averagings.  ``"auto"`` chooses
        it every epoch from the measured cost of a round against a
        minibatch's, bounded by how often local SGD must average to converge
        (decision ``averaging_frequency``; every epoch's summary in
        ``trainer.history`` carries it).  An int pins it.
    save_updater : bool, default True
        Average the updater state (Adam's moments ...) too; False ships only
        the parameters (less traffic for a large model).
    """

    runner_module: ClassVar[Optional[str]] = "averaging"

    averaging_frequency: Union[int, Literal["auto"]] = AUTO
    save_updater: bool = True

    def __post_init__(self):
        super().__post_init__()
        f = self.averaging_frequency
        check(f == AUTO or (isinstance(f, int) and not isinstance(f, bool) and f >= 1),
              f"Expect averaging_frequency >= 1 (an int) or {AUTO!r}, got {f!r}")
        check(isinstance(self.save_updater, bool), f"Expect save_updater to be a bool, got {self.save_updater!r}")

    @classmethod
    def dl4j(cls, averaging_frequency: Union[int, Literal["auto"]] = 5, **kwargs) -> "ParameterAveraging":
        """DL4J's ``ParameterAveragingTrainingMaster``: averaging every
        ``averaging_frequency`` (DL4J's 5) minibatches, the unweighted mean of
        the workers' results, plainly averaged updater state, no block
        momentum, equal shares."""
        return cls(averaging_frequency=averaging_frequency, preset="dl4j", **kwargs)

    @property
    def auto_frequency(self) -> bool:
        """Whether the frequency is chosen from measurements."""
        return self.averaging_frequency == AUTO


#: DL4J's adaptive rule from its documented 1e-3.
DEFAULT_THRESHOLD = AdaptiveThreshold(initial=1e-3)


@register("master")
@dataclass(frozen=True)
class GradientSharing(Master):
    """Gradient sharing (Strom 2015), opt-in.  One barrier stage per epoch; each iteration every worker adds its
    updater step to a residual, threshold-encodes it in DL4J's formats, sends it over authenticated reliable UDP
    and applies every rank's message (or their sum), in the same order on every replica.

    What the ``"sparkavg"`` preset does besides (recorded as decisions;
    :mod:`sparkavg.spark.policies`): each worker's gradient is taken at its
    own view (the shared parameters plus its residual); a Nesterov velocity
    is cleared where a message sent the entry; updates of SGD-like updaters
    are divided by the worker count (Adam-like ones only from the second
    epoch).  DL4J's residual clipping (every 5 iterations to 5 τ) always runs.

    Parameters
    ----------
    threshold : ThresholdRule or float, default AdaptiveThreshold(initial=1e-3)
        The threshold rule (:mod:`sparkavg.sharing.thresholds`); a float
        means ``FixedThreshold(value)``.
    topology : Topology or None, default None (decided by the worker count: ``policies.topology``)
        ``PLAIN`` all-to-all; ``TREE`` sums each iteration's messages on the way: one message
        applied per rank and iteration (an int ``staleness``).  A saved ``"mesh"`` loads as ``TREE``.
    port : int, default 0
        0 = an ephemeral UDP port per worker; else worker ``i`` binds
        ``port + i`` (open ``port`` .. ``port + workers - 1`` between hosts).
    network_mask : str or None
        CIDR mask choosing the interface peers use, e.g. ``"10.1.1.0/24"``;
        else env ``SPARKAVG_IP``; else the executor's Spark host address.
    staleness : int or None, default 0
        Before each minibatch a worker waits until it holds every peer's
        messages of all but its last ``staleness`` iterations.  0: each
        gradient sees every update before it, as one process would, and a
        run does not depend on arrival times.  None: fully asynchronous
        (DL4J), faster on slow links, less accurate.
    """

    runner_module: ClassVar[Optional[str]] = "sharing"

    threshold: ThresholdRule = DEFAULT_THRESHOLD
    topology: Optional[Topology] = None
    port: int = 0
    network_mask: Optional[str] = None
    staleness: Optional[int] = 0

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.threshold, (int, float)) and not isinstance(self.threshold, bool):
            object.__setattr__(self, "threshold", FixedThreshold(float(self.threshold)))
        check(isinstance(self.threshold, ThresholdRule),
              f"Expect threshold to be a ThresholdRule ({', '.join(sorted(registered('threshold')))}) "
              f"or a float, got {self.threshold!r}")
        object.__setattr__(self, "topology", self.topology and as_enum(Topology, "topology", self.topology))
        check_int("port", self.port, minimum=0, maximum=65535)
        if self.network_mask is not None:
            try:
                ipaddress.ip_network(str(self.network_mask), strict=False)
            except ValueError as exc:
                raise ValueError(f"Expect network_mask in CIDR form like '10.1.1.0/24', "
                                 f"got {self.network_mask!r}: {exc}") from None
        if self.staleness is not None:
            check_int("staleness", self.staleness, minimum=0)
        check(self.topology is not Topology.TREE or self.staleness is not None, "Expect an int staleness (>= 0) "
              "with topology TREE, got None: a tree's ranks share τ, adapted from totals every rank applied")
        if self.workers is not None:
            self.validate_for(self.workers)

    @classmethod
    def dl4j(cls, staleness: Optional[int] = None, **kwargs) -> "GradientSharing":
        """DL4J's ``SharedTrainingMaster``: asynchronous (``staleness=None``),
        every worker's whole update encoded, gradients at the shared
        parameters, no momentum masking."""
        return cls(staleness=staleness, preset="dl4j", **kwargs)

    def validate_for(self, workers: int) -> None:
        super().validate_for(workers)
        if self.port:
            check(self.port + workers - 1 <= 65535,
                  f"Expect port + workers - 1 <= 65535 (worker i binds port + i), got port {self.port} "
                  f"with {workers} workers")


def master_from_config(config: dict) -> Master:
    """Rebuild a master from :meth:`Master.to_config` output, a configuration
    of an earlier release included (:func:`sparkavg.spark.upgrade.upgrade_master`)."""
    from .upgrade import upgrade_master

    return from_config(upgrade_master(config), kind="master", expect=Master)
