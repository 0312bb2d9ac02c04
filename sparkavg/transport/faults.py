"""Fault injection on outgoing datagrams: loss, duplication, reordering.

Test-only: the transport's tests pass it to an endpoint
(``ReliableEndpoint(..., limits={"faults": ...})``), the Spark executors
build it from the test hook ``sparkavg.test.udp_loss`` (the example's
``--simulate-udp-loss P``); no configuration carries it.  Applied
inside the endpoint to every datagram it sends (DATA and ACK alike), so the
real retransmission and duplicate-suppression paths are exercised over real
sockets.
"""
from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass

__all__ = ["FaultInjection", "FaultInjector"]

#: Held-back datagrams beyond this many are sent at once instead (keeps memory bounded).
MAX_HELD_DATAGRAMS = 4096


@dataclass(frozen=True)
class FaultInjection:
    """What to do to outgoing datagrams, each decision drawn independently.

    Parameters
    ----------
    loss : float, default 0.0
        Probability that a datagram is silently dropped, in ``[0, 1)``.
    duplicate : float, default 0.0
        Probability that a (not dropped) datagram is sent twice, in ``[0, 1)``.
    reorder : float, default 0.0
        Probability that each copy is held back and sent later (after
        datagrams sent meanwhile), in ``[0, 1)``.
    reorder_delay : float, default 0.02
        A held-back copy is sent after a uniform delay in ``(0, reorder_delay]``
        seconds; must be in ``(0, 10]``.
    seed : int or None, default None
        Seed of the decisions; each endpoint mixes in its rank, so processes
        sharing one seed still draw different streams. ``None``: fresh entropy.
    """

    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    reorder_delay: float = 0.02
    seed: int | None = None

    def __post_init__(self):
        for name in ("loss", "duplicate", "reorder"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"Expect {name} in [0, 1), got {value}")
        if not 0.0 < self.reorder_delay <= 10.0:
            raise ValueError(f"Expect reorder_delay in (0, 10] seconds, got {self.reorder_delay}")

    @property
    def active(self) -> bool:
        """Whether any fault is injected at all."""
        return bool(self.loss or self.duplicate or self.reorder)


class FaultInjector:
    """Applies a :class:`FaultInjection` to a stream of outgoing datagrams.

    Not thread-safe: the endpoint calls it under its lock.

    Parameters
    ----------
    faults : FaultInjection
    stream : int
        Mixed into the seed (the endpoint's rank).
    """

    def __init__(self, faults: FaultInjection, stream: int):
        self.faults = faults
        seed = None if faults.seed is None else f"{faults.seed}:{stream}"
        self._rng = random.Random(seed)
        self._held: list = []
        self._tie = itertools.count()
        self.dropped = 0
        self.duplicated = 0
        self.reordered = 0

    def outgoing(self, datagram: bytes, address, now: float) -> list:
        """Decide the fate of one datagram; return the ``(datagram, address)`` to send now."""
        f, rng = self.faults, self._rng
        if f.loss and rng.random() < f.loss:
            self.dropped += 1
            return []
        copies = 1
        if f.duplicate and rng.random() < f.duplicate:
            self.duplicated += 1
            copies = 2
        out = []
        for _ in range(copies):
            if f.reorder and len(self._held) < MAX_HELD_DATAGRAMS and rng.random() < f.reorder:
                self.reordered += 1
                release = now + rng.uniform(0.0, f.reorder_delay) + 1e-4
                heapq.heappush(self._held, (release, next(self._tie), datagram, address))
            else:
                out.append((datagram, address))
        return out

    def due(self, now: float) -> list:
        """Pop the held-back datagrams whose release time has come."""
        out = []
        while self._held and self._held[0][0] <= now:
            _, _, datagram, address = heapq.heappop(self._held)
            out.append((datagram, address))
        return out

    def next_release(self) -> float | None:
        """Monotonic time of the next held-back datagram, or ``None``."""
        return self._held[0][0] if self._held else None

    @property
    def held(self) -> int:
        """Datagrams currently held back."""
        return len(self._held)
