"""What one gradient-sharing worker carries from step to step (after torch's
``PowerSGDState``): the rules it was given, its residual, τ and encoder
state, and counts of what it sent and received.

The state crosses epochs (and processes) as plain values --
:meth:`SharingState.to_plain` gives a dict of Python numbers and strings
plus the residual as a numpy array, :meth:`SharingState.from_plain`
rebuilds the state from it -- so no pickle is needed.
"""
from __future__ import annotations

import numbers
from collections import deque

import numpy as np

from .. import backend, ops
from .thresholds import CLIP_EVERY, CLIP_K, ThresholdRule, check_tau

__all__ = ["SharingState"]

_PLAIN_KEYS = ("residual", "tau", "iteration", "encoding_format", "last_sparsity", "messages_sent", "entries_sent",
               "messages_received")
_FORMATS = (ops.BITMAP, ops.SPARSE)


class SharingState:
    """The state of one worker's gradient sharing.

    Parameters
    ----------
    rule : ThresholdRule
        How τ starts and adapts (:class:`FixedThreshold`,
        :class:`AdaptiveThreshold`, :class:`TargetSparsityThreshold`).
    num_params : int
        Length N of the flat parameter vector (>= 1).
    xp : module, default numpy
        Array module of the parameters (``numpy`` or ``cupy``); the residual
        lives there too.

    Attributes
    ----------
    rule
        *Set by user.*
    clip : (int, float) or None
        *Internal.*  ``(every, k)`` of DL4J's residual clipping
        (:func:`~.thresholds.clip_when_due`), always
        ``(CLIP_EVERY, CLIP_K)`` in the library; a test may change it, or
        turn it off with None.
    residual : float32 array of shape (N,)
        *Internal.*  What has been added but not yet sent.
    tau : float
        *Internal.*  τ of the next step (rounded to float32 by the encoder).
    iteration : int
        *Internal.*  Steps taken; clipping runs when it is a multiple of
        ``clip[0]``.
    encoding : sparkavg.ops.EncodingState
        *Internal.*  Which format the encoder tries next (its own message
        counts restart with every state built by :meth:`from_plain`).
    group_sparsity : collections.deque of float
        *Internal.*  A tree's ranks: the sparsity of each total applied and
        not yet used to adapt the group's τ (``sharing.adapt_group_tau``);
        not carried by :meth:`to_plain` (an epoch starts with none).
    messages_sent, entries_sent, messages_received : int
        *Statistics.*  Messages published, ±τ entries in them, and peer
        messages applied.
    last_sparsity : float
        *Statistics.*  Fraction of the N entries the last step sent.
    """

    __slots__ = (
        # set by user
        "rule",
        # internal
        "clip",
        "residual",
        "tau",
        "iteration",
        "encoding",
        "group_sparsity",
        # statistics
        "messages_sent",
        "entries_sent",
        "messages_received",
        "last_sparsity",
    )

    def __init__(self, rule: ThresholdRule, num_params: int, xp=np):
        if not isinstance(rule, ThresholdRule):
            raise TypeError(f"Expect rule to be a ThresholdRule (FixedThreshold, AdaptiveThreshold, "
                            f"TargetSparsityThreshold), got {type(rule).__name__} {rule!r}")
        if isinstance(num_params, bool) or not isinstance(num_params, numbers.Integral) or num_params < 1:
            raise ValueError(f"Expect num_params >= 1 (an int), got {num_params!r}")
        self.rule = rule
        self.clip = (CLIP_EVERY, CLIP_K)
        self.residual = xp.zeros(int(num_params), dtype=xp.float32)
        self.tau = rule.initial_tau()
        self.iteration = 0
        self.encoding = ops.EncodingState()
        self.group_sparsity = deque()
        self.last_sparsity = 0.0
        self.reset_statistics()

    @property
    def num_params(self) -> int:
        """N, the length of the residual."""
        return int(self.residual.size)

    def reset_statistics(self) -> None:
        """Zero ``messages_sent``, ``entries_sent`` and ``messages_received``
        (e.g. at the start of an epoch, to report per-epoch counts)."""
        self.messages_sent = 0
        self.entries_sent = 0
        self.messages_received = 0

    def statistics(self) -> dict:
        """The statistics as a dict of Python numbers."""
        return {"messages_sent": self.messages_sent, "entries_sent": self.entries_sent,
                "messages_received": self.messages_received, "last_sparsity": self.last_sparsity}

    def to_plain(self) -> dict:
        """Everything but the rules, as plain values.

        Returns
        -------
        dict
            ``residual`` (a float32 numpy copy, shape (N,); a device -> host
            copy for CuPy), ``tau`` (float), ``iteration`` (int),
            ``encoding_format`` ("bitmap" or "sparse"), ``last_sparsity``
            (float), ``messages_sent``, ``entries_sent``,
            ``messages_received`` (int).
        """
        return {
            "residual": np.array(backend.to_cpu(self.residual), dtype=np.float32, copy=True),
            "tau": float(self.tau),
            "iteration": int(self.iteration),
            "encoding_format": str(self.encoding.format),
            "last_sparsity": float(self.last_sparsity),
            "messages_sent": int(self.messages_sent),
            "entries_sent": int(self.entries_sent),
            "messages_received": int(self.messages_received),
        }

    @classmethod
    def from_plain(cls, rule: ThresholdRule, plain: dict, xp=np) -> "SharingState":
        """Rebuild a state from :meth:`to_plain` output; it continues exactly
        as the state that was saved would have.

        Parameters
        ----------
        rule
            As for the constructor (the plain dict does not carry it).
        plain : dict
            :meth:`to_plain` output; the residual is copied.
        xp : module, default numpy
            Array module for the residual.

        Raises
        ------
        ValueError
            A missing key, a residual that is not a non-empty 1-D array, a
            τ the encoder would reject, or an unknown encoding format.
        """
        if not isinstance(plain, dict):
            raise TypeError(f"Expect plain to be a dict from SharingState.to_plain(), got {type(plain).__name__}")
        missing = [k for k in _PLAIN_KEYS if k not in plain]
        if missing:
            raise ValueError(f"Expect SharingState plain keys {list(_PLAIN_KEYS)}, got {sorted(plain)} "
                             f"(missing {missing})")
        residual = np.asarray(backend.to_cpu(plain["residual"]), dtype=np.float32)
        if residual.ndim != 1 or residual.size < 1:
            raise ValueError(f"Expect a non-empty 1-D residual, got shape {residual.shape}")
        if plain["encoding_format"] not in _FORMATS:
            raise ValueError(f"Expect encoding_format in {_FORMATS}, got {plain['encoding_format']!r}")
        state = cls(rule, residual.size, xp=xp)
        state.residual[...] = xp.asarray(residual)  # a copy: the plain dict keeps its array
        state.tau = check_tau(plain["tau"], "tau")
        state.iteration = int(plain["iteration"])
        state.encoding.format = plain["encoding_format"]
        state.last_sparsity = float(plain["last_sparsity"])
        state.messages_sent = int(plain["messages_sent"])
        state.entries_sent = int(plain["entries_sent"])
        state.messages_received = int(plain["messages_received"])
        return state

    def __repr__(self) -> str:
        return (f"SharingState(rule={self.rule!r}, clip={self.clip!r}, num_params={self.num_params}, "
                f"tau={self.tau!r}, iteration={self.iteration}, format={self.encoding.format!r}, "
                f"messages_sent={self.messages_sent}, entries_sent={self.entries_sent}, "
                f"messages_received={self.messages_received}, last_sparsity={self.last_sparsity!r})")
