"""The vocabulary of training statistics: every phase, counter and series name.

Recorders accept only these names (the member or its exact string value) so
that a typo fails loudly instead of silently counting as overhead. Members
are ``str``: they compare and hash equal to their values, print as their
values, and pickle as plain ``str`` (an executor needs no enum class to
read them back, and payloads hold plain JSON types only).

Datagram counters
-----------------
Gradient sharing reports what its UDP transport did with *received*
datagrams. The counters nest; each is the transport's own count
(:meth:`sparkavg.transport.endpoint.Endpoint.stats`):

``datagrams_rejected``
    Every received datagram that was dropped, for any reason: the sum of
    the transport's ``rejected_<reason>`` counters. It is the only total.
``datagrams_invalid``
    The part of ``datagrams_rejected`` that failed authentication or
    validation (truncated, oversized, bad MAC, malformed, wrong job, unknown
    peer, misrouted): a sign of corruption or an attack.
``datagrams_forged``
    The part of ``datagrams_invalid`` whose HMAC tag did not verify.
``datagrams_replayed``
    The part of ``datagrams_rejected`` that repeated an already delivered
    message: mostly harmless late retransmissions and duplicates.

The rest, ``datagrams_rejected - datagrams_invalid - datagrams_replayed``,
was flow control (out of the receive window, or buffers full; the sender
retransmits). So ``forged <= invalid`` and ``invalid + replayed <= rejected``.
"""
from __future__ import annotations

import difflib
from enum import Enum
from typing import Any

__all__ = [
    "Phase",
    "CounterName",
    "SeriesName",
    "DecisionName",
    "DRIVER_PHASES",
    "WORKER_PHASES",
    "COMPUTE_PHASES",
    "SPAN_PHASES",
    "NON_TRAINING_PHASES",
    "SHARING_PHASES",
    "phase_kind",
]


class _StatName(str, Enum):
    """A ``str`` enum member that prints, formats and pickles as its plain value."""

    def __str__(self) -> str:
        return self._value_

    def __format__(self, spec: str) -> str:
        return format(self._value_, spec)

    def __reduce_ex__(self, protocol: int):
        # A plain str crosses process boundaries: payloads stay plain data.
        return str, (self._value_,)

    @classmethod
    def check(cls, name: Any) -> str:
        """The plain string value of ``name``, a member of this enum or its exact value.

        Raises
        ------
        ValueError
            Naming ``name``, the allowed values, and the closest one.
        """
        value = _VALUES[cls].get(name) if isinstance(name, str) else None
        if value is None:
            allowed = sorted(m.value for m in cls)
            close = difflib.get_close_matches(str(name), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"Expect a {cls.__name__} name, one of {', '.join(allowed)}; "
                             f"got {name!r}{hint}")
        return value


class Phase(_StatName):
    """Timed phases.

    Driver: ``plan`` (assign data to rounds and workers), ``broadcast``
    (create and ship a broadcast), ``aggregate`` (treeAggregate / collect),
    ``average`` (divide and set parameters), ``export`` (minibatch export),
    ``checkpoint``, ``round`` and ``epoch`` (spans that enclose the others),
    ``evaluate``. Worker: ``fetch`` (broadcast fetch / parameter load),
    ``model_init``, ``fit`` (one per minibatch; the only compute phase),
    ``data_load``, ``encode``, ``send``, ``apply`` (gradient sharing),
    ``wait`` and ``idle``.
    """

    PLAN = "plan"
    BROADCAST = "broadcast"
    AGGREGATE = "aggregate"
    AVERAGE = "average"
    EXPORT = "export"
    CHECKPOINT = "checkpoint"
    ROUND = "round"
    EPOCH = "epoch"
    EVALUATE = "evaluate"
    FETCH = "fetch"
    MODEL_INIT = "model_init"
    FIT = "fit"
    DATA_LOAD = "data_load"
    ENCODE = "encode"
    SEND = "send"
    APPLY = "apply"
    IDLE = "idle"
    WAIT = "wait"


class CounterName(_StatName):
    """Counters, summed over all workers (datagram counters: see the module docstring)."""

    #: Training examples fitted.
    EXAMPLES = "examples"
    #: Minibatches fitted (parameter averaging).
    MINIBATCHES = "minibatches"
    #: Iterations (minibatch fits) run (gradient sharing).
    ITERATIONS = "iterations"
    #: Encoded update messages sent / received.
    MESSAGES_SENT = "messages_sent"
    MESSAGES_RECEIVED = "messages_received"
    #: Update messages a rank applied to its parameters, its own included (a tree's rank: one total per iteration).
    MESSAGES_APPLIED = "messages_applied"
    #: Sparse entries (indices) sent in update messages.
    ENTRIES_SENT = "entries_sent"
    #: Every byte on the wire, retransmissions and acks included.
    BYTES_SENT = "bytes_sent"
    BYTES_RECEIVED = "bytes_received"
    #: Application bytes of update messages, each message once.
    PAYLOAD_BYTES_SENT = "payload_bytes_sent"
    #: What dense float32 updates to every peer would have been.
    DENSE_BYTES_EQUIVALENT = "dense_bytes_equivalent"
    DENSE_BYTES = "dense_bytes_equivalent"  # alias kept for older callers
    DATAGRAMS_SENT = "datagrams_sent"
    DATAGRAMS_RETRANSMITTED = "datagrams_retransmitted"
    #: Every received datagram dropped, for any reason (the total).
    DATAGRAMS_REJECTED = "datagrams_rejected"
    #: Dropped for failing authentication or validation (part of rejected).
    DATAGRAMS_INVALID = "datagrams_invalid"
    #: Dropped for a bad HMAC tag (part of invalid).
    DATAGRAMS_FORGED = "datagrams_forged"
    #: Dropped as a repeat of a delivered message (part of rejected).
    DATAGRAMS_REPLAYED = "datagrams_replayed"
    #: Thread CPU seconds a rank spent summing messages (Topology.TREE).
    MERGE_SECONDS = "merge_seconds"
    #: Spark stages started again after a failure.
    STAGE_RESTARTS = "stage_restarts"
    #: Gradient-sharing epochs shipped again whole because a rank's state was not on its executor.
    RESIDENT_STATE_MISSES = "resident_state_misses"


class SeriesName(_StatName):
    """Per-iteration (or per-epoch) series, ``(step, value)`` points per lane."""

    #: Encoding threshold tau (gradient sharing, DL4J issue 5931).
    THRESHOLD = "threshold"
    #: Fraction of entries sent per update.
    SPARSITY = "sparsity"
    #: L2 norm of the residual after encoding.
    RESIDUAL_NORM = "residual_norm"
    #: Training loss.
    SCORE = "score"
    #: Largest absolute parameter difference between replicas, per epoch (over the
    #: parameters ranks above 0 return: at most 4096, evenly spaced).
    REPLICA_MAX_ABS_DIFF = "replica_max_abs_diff"
    #: The learning rate of each epoch's last step, per epoch.
    LEARNING_RATE = "learning_rate"
    #: A fit's validation values per epoch, one lane each (``val_loss``, ``val_accuracy`` ...).
    VALIDATION = "validation"


class DecisionName(_StatName):
    """The choices the library records with their reasons (a closed set:
    ``TrainingStats.decision`` refuses any other name)."""

    #: Parameter averaging's policies (sparkavg.spark.policies).
    AVERAGING_FREQUENCY = "averaging_frequency"
    BLOCK_MOMENTUM = "block_momentum"
    MOMENT_CORRECTION = "moment_correction"
    WORKER_SHARES = "worker_shares"
    AVERAGING_PATH = "averaging_path"
    #: Gradient sharing's policies.
    UPDATE_SCALE = "update_scale"
    MOMENTUM_MASKING = "momentum_masking"
    LOCAL_VIEW = "local_view"
    THRESHOLD = "threshold"
    TOPOLOGY = "topology"
    SHARING_STATE = "sharing_state"
    UDP_ADDRESS = "udp_address"
    #: Data and devices.
    DEAL = "deal"
    DATA_STORAGE = "data_storage"
    DATA_LINEAGE = "data_lineage"
    DEVICE = "device"
    #: The trainer.
    LEARNING_RATE = "learning_rate"
    LISTENER_ERROR = "listener_error"
    #: Why a fit with early stopping ended, and its best epoch.
    EARLY_STOPPING = "early_stopping"


# str -> plain value; enum members hash and compare as their values, so one lookup serves both.
_VALUES: dict[type, dict[str, str]] = {cls: {m.value: m.value for m in cls}
                                       for cls in (Phase, CounterName, SeriesName, DecisionName)}

DRIVER_PHASES = (Phase.PLAN, Phase.BROADCAST, Phase.AGGREGATE, Phase.AVERAGE, Phase.EXPORT,
                 Phase.CHECKPOINT, Phase.ROUND, Phase.EPOCH, Phase.EVALUATE)
WORKER_PHASES = (Phase.FETCH, Phase.MODEL_INIT, Phase.FIT, Phase.DATA_LOAD, Phase.ENCODE,
                 Phase.SEND, Phase.APPLY, Phase.IDLE, Phase.WAIT)
#: Phases that are useful work; everything else, bar spans and evaluation, is overhead.
COMPUTE_PHASES = frozenset({Phase.FIT})
#: Phases that enclose other phases: counted neither as compute nor as overhead.
SPAN_PHASES = frozenset({Phase.ROUND, Phase.EPOCH})
NON_TRAINING_PHASES = frozenset({Phase.EVALUATE})
SHARING_PHASES = (Phase.ENCODE, Phase.SEND, Phase.APPLY)


def phase_kind(phase: str) -> str:
    """``"compute"``, ``"span"``, ``"not training"`` or ``"overhead"``: how a phase counts."""
    if phase in COMPUTE_PHASES:
        return "compute"
    if phase in SPAN_PHASES:
        return "span"
    if phase in NON_TRAINING_PHASES:
        return "not training"
    return "overhead"
