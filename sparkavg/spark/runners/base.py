"""One epoch skeleton for every master.

:meth:`EpochRunner.run_epoch` is the same for both masters: plan the
epoch (the minibatch source's deal to rounds x workers, :mod:`..sources`),
then per round ship the network state, launch the round's tasks through
the deal, destroy what was shipped, raise an executor's permanent error as
itself, merge the results into the network and record the round.  A master says only how
its epoch distributes work:

- :meth:`~EpochRunner.minibatches_per_round` -- how many minibatches each
  worker fits between merges;
- :meth:`~EpochRunner.shipped` -- what travels to the executors besides the state;
- :meth:`~EpochRunner.launch` -- which tasks run and how their results come back;
- :meth:`~EpochRunner.merge` -- how results become the network's new state;
- :meth:`~EpochRunner.state_dict` / :meth:`~EpochRunner.load_state_dict` -- what the
  runner carries between epochs (checkpointed next to the network);
- :meth:`~EpochRunner.check_model` -- what the master cannot train, refused
  on the driver before any job.
"""
from __future__ import annotations

import abc
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from ...backend import to_cpu
from ...listeners.base import EventDispatcher, sample_points
from ..cancel import CancelRequest
from ..sources import EpochDeal, MinibatchSource
from ..errors import is_permanent, raise_failures
from ..executor.device import summarize_devices
from ..executor.hooks import stage_attempts
from ..masters import Repartition
from ..session import check_result_path
from ...stats import Phase
from ...data.transforms import transform_plan
from ...transport import PeerLostError, PeerStalledError
from ...transport.limits import STALL_TIMEOUT

__all__ = ["EpochRunner", "Merged", "Progress", "network_state", "runs"]

logger = logging.getLogger(__name__)


def network_state(network, with_updater: bool) -> dict:
    """What ships to executors: ``iteration``, ``epoch`` (the counters a
    learning-rate schedule follows) and the model's named state
    vectors (``params``, ``updater`` -- None without ``with_updater`` --,
    ``buffers``) as plain host float32 numpy arrays (may share memory with
    a CPU model's live vectors: copy before changing them)."""
    live = network.state
    host = {name: np.ascontiguousarray(to_cpu(live[name]), dtype=np.float32) for name in ("params", "buffers")}
    host["updater"] = np.ascontiguousarray(to_cpu(live["updater"]), dtype=np.float32) if with_updater else None
    return {"iteration": int(network.iteration), "epoch": int(network.epoch), **host}


@dataclass
class Merged:
    """What a merged round contributes to the epoch's summary."""

    loss_sum: float
    examples: int
    payloads: list
    extra: dict = field(default_factory=dict)
    #: The merge recorded its rounds itself (rounds inside one stage).
    recorded: bool = False


class Progress:
    """Periodic progress lines on the driver (at most one per ``every`` s);
    none when ``quiet`` (a progress bar shows it instead)."""

    def __init__(self, label: str, total: int, every: float = 5.0, quiet: bool = False):
        self.label, self.total, self.every, self.quiet = label, max(1, total), every, quiet
        self.start = self._last = time.monotonic()

    def update(self, done: int, **fields) -> None:
        now = time.monotonic()
        if self.quiet or (done < self.total and now - self._last < self.every):
            return
        self._last = now
        extra = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
        logger.info("%s: %d/%d (%.0f%%) %.1fs %s", self.label, done, self.total, 100.0 * done / self.total,
                    now - self.start, extra)


#: Master class -> its runner class (:func:`runs`).
_RUNNERS: dict = {}


def runs(master_class: type):
    """Class decorator: the decorated :class:`EpochRunner` runs ``master_class``
    (and its subclasses without a runner of their own)."""

    def deco(cls):
        _RUNNERS[master_class] = cls
        return cls

    return deco


class EpochRunner(abc.ABC):
    """Runs epochs of one master through one seam (see the module docstring)."""

    #: What a round is called in errors and progress lines.
    round_name = "round"
    #: Whether this master's epoch can train on streamed rounds (:mod:`~sparkavg.spark.streaming`).
    streams = False
    #: Whether the running epoch's rounds run inside one barrier stage (its deal's ``counts``).
    in_stage = False
    #: The trainer's listeners (:class:`~sparkavg.listeners.base.EventDispatcher`); set by the trainer.
    events = EventDispatcher()

    def __init__(self, seam, master):
        self.seam = seam
        self.master = master
        self._session_checked = False
        self._device_stats, self._device_keys = None, set()  # device decisions recorded (record_devices)
        self._deal = None  # (stats, local, reason) last recorded (deals_locally)
        #: Set by ``SparkTrainer.cancel()`` and the driver's cancel calls (:mod:`~sparkavg.spark.cancel`);
        #: checked before every round.
        self.cancel_request = CancelRequest()

    # ------------------------------------------------------------ the hooks
    @abc.abstractmethod
    def minibatches_per_round(self, prepared: MinibatchSource, workers: int, network, epoch: int, stats) -> int:
        """Minibatches each worker fits between two merges."""

    @abc.abstractmethod
    def result_bytes(self, network) -> int:
        """Bytes one worker returns per round (checked against the session)."""

    def check_model(self, network) -> None:
        """Raise ``ValueError`` naming what this master cannot train in
        ``network``; called on the driver before a fit runs any job.
        Default: every model of the contract."""

    def shipped(self, network, epoch: int):
        """The value shipped to executors for one round (default: the network state)."""
        return network_state(network, with_updater=True)

    @abc.abstractmethod
    def launch(self, plan: EpochDeal, r: int, config_json: str, shipped, epoch: int, stats):
        """Run round ``r``'s tasks; return their (combined or listed) results."""

    @abc.abstractmethod
    def merge(self, network, results, epoch: int, r: int, stats) -> Merged:
        """Fold the round's results into ``network``."""

    def epoch_done(self, summary: dict, stats) -> None:
        """Called once the epoch's rounds are merged (default: nothing)."""

    def plan_weights(self, prepared: MinibatchSource, workers: int, local: bool, epoch: int, stats, per_round=None):
        """Each worker's share of the epoch's minibatches, or None for equal
        shares (the default; see :func:`~sparkavg.data.deal.deal_epoch`);
        ``per_round``: the epoch's minibatches per worker per round."""
        return None

    def state_dict(self) -> dict:
        """What the runner carries from epoch to epoch besides the network
        (e.g. a block velocity), for checkpoints: names to numpy arrays or
        plain numbers/strings, saved as ``.npz`` (never pickle).  Default: none."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output (arrays as read from ``.npz``)."""
        if state:
            raise ValueError(f"Expect no runner state for {type(self).__name__}, got keys {sorted(state)}")

    def check_state_dict(self, state: dict, network) -> None:
        """Raise ``ValueError`` when :meth:`load_state_dict` would refuse
        ``state`` or it does not fit ``network``; changes nothing (a resume
        checks everything before it restores anything).  Default: a fresh
        runner of the same master loads it."""
        type(self)(self.seam, self.master).load_state_dict(state)

    def record_devices(self, results, epoch: int, stats) -> None:
        """Record where the round's workers trained and why (decision
        ``device``, logged): once per fit, again only when it changes.

        ``results`` is a round's result or list of results; each carries
        ``devices``, the workers' ``DeviceChoice.to_plain()`` entries."""
        listed = results if isinstance(results, (list, tuple)) else [results]
        entries = [e for r in listed for e in (getattr(r, "devices", None) or ())]
        if not entries:
            return
        if stats is not self._device_stats:
            self._device_stats, self._device_keys = stats, set()
        value, reason = summarize_devices(entries)
        key = (value, frozenset((e["kind"], e["reason"]) for e in entries))  # not the addresses: they vary
        if key in self._device_keys:
            return
        self._device_keys.add(key)
        stats.decision("device", value, reason, epoch=epoch)
        logger.info("epoch %d: workers train on %s: %s", epoch + 1, value, reason)

    def deals_locally(self, prepared: MinibatchSource, workers: int, epoch: int, stats) -> bool:
        """Whether this epoch deals each worker's shard in place (the
        source's :meth:`~.sources.MinibatchSource.deal_choice`); the choice is recorded
        (decision ``deal``, logged) once per fit, again only when it changes."""
        local, reason = prepared.deal_choice(self.master.data, workers)
        if self._deal is None or self._deal[0] is not stats or self._deal[1:] != (local, reason):
            self._deal = (stats, local, reason)
            stats.decision("deal", "local" if local else "balanced", reason, epoch=epoch)
            logger.info("epoch %d: minibatches dealt %s: %s", epoch + 1, "locally" if local else "balanced",
                        reason)
        return local

    def _emit_round(self, epoch: int, r: int, rounds: int, merged: Merged, loss_sum: float, examples: int,
                    t_round: float) -> None:
        """The ``round_end`` and ``sharing_progress`` events (payloads: :mod:`sparkavg.listeners.base`)."""
        events = self.events
        if events.wants("round_end"):
            seconds = time.perf_counter() - t_round
            events.emit("round_end", {
                "epoch": epoch + 1, "round": r + 1, "rounds": rounds, "loss": loss_sum / max(examples, 1),
                "round_loss": merged.loss_sum / max(merged.examples, 1), "examples": examples,
                "round_examples": merged.examples, "seconds": seconds,
                "examples_per_second": merged.examples / max(seconds, 1e-9)})
        if events.wants("sharing_progress"):
            series = {}
            for payload in merged.payloads:
                for name in ("threshold", "sparsity", "residual_norm"):
                    points = (payload or {}).get("series", {}).get(name)
                    if points:
                        series.setdefault(name, {})[str(payload.get("lane"))] = sample_points(points)
            if series:
                events.emit("sharing_progress", {"epoch": epoch + 1, "round": r + 1, "series": series})

    def run_barrier(self, plan: EpochDeal, r: int, make_task, what: str, stats, hooks, swap=None):
        """``plan.barrier(r, make_task(meeting), what)`` -- the ranks meet where the seam says
        (``seam.meeting``, open for every attempt; a failed attempt's waiting ranks are answered at once, so
        none holds the task slot the next attempt needs) --, run again from the same start when it failed
        with an error retrying can fix (counter ``stage_restarts``; Spark never retries a barrier stage), up
        to :func:`~..executor.hooks.stage_attempts`; ``swap(error)`` may answer with another ``make_task``
        to run instead (None: not its error)."""
        attempts, attempt = stage_attempts(hooks), 1
        server = self.seam.meeting(plan.workers, self.stall_timeout(hooks))
        with server as meeting:
            task = make_task(meeting)
            while True:
                try:
                    return plan.barrier(r, task, what)
                except Exception as exc:
                    getattr(server, "abandon", lambda _: None)(exc)
                    swapped = swap(exc) if swap is not None else None
                    if swapped is not None:
                        task = swapped(meeting)
                        continue
                    if is_permanent(exc):
                        raise
                    self.name_lost_ranks(exc, attempt >= attempts, plan, hooks)
                    if attempt >= attempts:
                        raise
                    stats.count("stage_restarts", 1)
                    logger.warning("%s, attempt %d of %d failed (%s); restarting the epoch", what, attempt, attempts,
                                   str(exc).splitlines()[0][:300])
                    attempt += 1

    @staticmethod
    def stall_timeout(hooks) -> float:
        """Seconds a rank waits for a silent peer (the tests' hook may shorten it)."""
        return float((hooks.numbers if hooks else {}).get("stall_timeout", STALL_TIMEOUT))

    def name_lost_ranks(self, exc, last: bool, plan, hooks) -> None:
        """Add to ``exc`` the ranks lost in a failed epoch and their hosts (Spark's); raise it at once when
        Spark cannot run the epoch's barrier stage again: fewer task slots than ranks without the hosts
        whose every rank a surviving rank found silent (a host or link lost: Spark learns of it only at its
        heartbeat timeout, and then waits for barrier slots for minutes) for a stall timeout."""
        tasks, workers = self.seam.barrier_tasks(plan.failed_jobs()), plan.workers
        silent = (set(exc.ranks) if isinstance(exc, PeerStalledError) else  # Spark knows of the others
                  {exc.rank} if isinstance(exc, PeerLostError) and exc.reason == "stalled" else set())
        lost = silent or {r for r, (_, _, failed) in tasks.items() if failed}
        gone = {h for h, _, _ in tasks.values() if all(r in silent for r, t in tasks.items() if t[0] == h)}
        named = ", ".join(f"worker rank {r} on host {tasks[r][0]} (executor {tasks[r][1]})" for r in sorted(lost)
                          if r in tasks)
        if named:
            exc.args = (f"{named} lost: {exc.args[0] if exc.args else exc}",) + exc.args[1:]
        deadline = time.monotonic() + self.stall_timeout(hooks)
        while not last and (slots := self.seam.barrier_slots(gone)) is not None and slots < workers:
            if time.monotonic() > deadline:
                exc.args = (f"{exc.args[0]}; not run again: Spark has {slots} task slot(s) for the epoch's {workers} "
                            f"ranks{' without host(s) ' + ', '.join(sorted(gone)) if gone else ''}: resume from the "
                            f"last checkpoint when the cluster has them",) + exc.args[1:]
                raise exc
            time.sleep(1.0)

    # ----------------------------------------------------------- skeleton
    def run_epoch(self, network, prepared: MinibatchSource, epoch: int, workers: int, stats) -> dict:
        """Train one epoch in place on ``network``; returns a summary dict."""
        if not self._session_checked:
            check_result_path(self.seam.conf("spark.task.maxDirectResultSize", "1m"), self.result_bytes(network))
            self._session_checked = True
        m = self.master
        per_round = self.minibatches_per_round(prepared, workers, network, epoch, stats)
        seed = None if m.data.repartition is Repartition.NEVER else m.seed + epoch
        with stats.timed(Phase.PLAN, epoch=epoch):
            local = self.deals_locally(prepared, workers, epoch, stats)
            weights = self.plan_weights(prepared, workers, local, epoch, stats, per_round)
            plan = prepared.plan(workers, per_round, seed, local=local, weights=weights, in_stage=self.in_stage)
        rounds = len(plan.rounds)
        progress = Progress(f"epoch {epoch + 1} {self.round_name}s", rounds, quiet=self.events.shows_progress)
        config_json = network.to_json()
        loss_sum, examples, extra = 0.0, 0, {}
        try:
            for r in range(rounds):
                self.cancel_request.check(
                    f"{self.round_name} {r + 1} of epoch {epoch + 1}",
                    f"the state after {self.round_name} {r} of epoch {epoch + 1}" if r else
                    f"the state after epoch {epoch}" if epoch else "the state it had before the fit")
                t_round = time.perf_counter()
                with stats.timed(Phase.BROADCAST, epoch=epoch, round=r):
                    value = self.shipped(network, epoch)
                    transform = transform_plan(m.data, m.seed, epoch, network.iteration, workers)
                    if transform is not None:  # the executors' minibatch transform (data/transforms.py)
                        value["transform"] = transform
                    shipped = self.seam.ship(value)
                try:
                    launched = time.perf_counter()
                    results = self.launch(plan, r, config_json, shipped, epoch, stats)
                    returned = time.perf_counter()
                finally:
                    shipped.destroy()
                raise_failures(results, f"{self.round_name} {r + 1} of epoch {epoch + 1}")
                if results is None or (isinstance(results, list) and not results):
                    raise RuntimeError(f"{self.round_name} {r + 1} of epoch {epoch + 1} returned no result: "
                                       "every shard was empty")
                self.record_devices(results, epoch, stats)
                with stats.timed(Phase.AVERAGE, epoch=epoch, round=r):
                    merged = self.merge(network, results, epoch, r, stats)
                for payload in merged.payloads:
                    stats.add_worker_payload(payload, epoch=epoch, round=r, launched=launched, returned=returned)
                loss_sum += merged.loss_sum
                examples += merged.examples
                extra.update(merged.extra)
                if not merged.recorded:
                    stats.record(Phase.ROUND, t_round, time.perf_counter(), epoch=epoch, round=r)
                    self._emit_round(epoch, r, rounds, merged, loss_sum, examples, t_round)
                progress.update(r + 1, loss=loss_sum / max(examples, 1), examples=examples)
        finally:
            plan.drop()
        summary = {"loss": loss_sum / max(examples, 1), "examples": examples, "rounds": rounds, **extra}
        self.epoch_done(summary, stats)
        return summary

