"""One gradient-sharing iteration as plain functions over a
:class:`~sparkavg.sharing.SharingState` (Strom 2015; DL4J's
SharedTrainingMaster).

Per iteration a worker adds its update to its residual, threshold-encodes
the residual at τ (what is sent leaves the residual), adapts τ from the
fraction sent, clips the residual when due, publishes the message, adds it
to its own parameters, and adds every message received from peers.  Every
replica applies the same messages, so replicas agree up to the order of
float additions.  Nothing here knows about Spark or sockets: ``publish``
and ``inbox`` are whatever moves bytes (UDP peers, or Python lists in the
tests).

Messages travel as the little-endian bytes of the int32 wire format
(:func:`message_bytes`); :func:`apply_message` takes either form.

:func:`sharing_step` is the iteration the Spark executors run; they time
its phases through its ``phase`` hook (as DDP calls a communication hook
such as ``powerSGD_hook(state, bucket)``: the algorithm is one function,
the caller only observes it).
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, ContextManager, Iterable, Optional, Union

import numpy as np

from .. import backend, ops
from .state import SharingState
from .thresholds import clip_when_due

__all__ = ["encode_update", "apply_message", "apply_received", "message_bytes", "sharing_step", "local_view",
           "PHASES", "tree_step", "apply_totals", "adapt_group_tau", "merge_payloads"]

Payload = Union[bytes, bytearray, memoryview]
Inbox = Union[Iterable[Payload], Callable[[], Iterable[Payload]]]
PhaseHook = Callable[[str], ContextManager]

#: The phases :func:`sharing_step` reports to its ``phase`` hook, in order.
PHASES = ("encode", "send", "apply")


def _untimed(name: str) -> ContextManager:
    return nullcontext()


def _encode(state: SharingState, update, adapt: bool = True):
    """Accumulate, encode, account, adapt τ (unless the group's τ is kept:
    ``adapt=False``) and clip; ``(message, entries)``."""
    residual = state.residual
    ops.accumulate(residual, update)
    message = ops.encode(residual, state.tau, state.encoding)
    entries = ops.encoded_count(message)  # 0 for None; device messages: a host sync
    if message is not None:
        state.messages_sent += 1
        state.entries_sent += entries
    # τ adapts to what this step sent, then the residual is clipped at the new τ when due.
    state.iteration += 1
    sparsity = entries / residual.size
    state.last_sparsity = sparsity
    if adapt:
        state.tau = state.rule.next_tau(state.tau, sparsity)
    if state.clip is not None:
        clip_when_due(residual, state.tau, state.iteration, *state.clip)
    return message, entries


def encode_update(state: SharingState, update) -> Optional[object]:
    """Fold ``update`` into the residual and encode what is due to be sent.

    ``residual += update``; encode the residual at ``state.tau`` (sent
    entries are subtracted from it); count the message; then set
    ``state.last_sparsity = entries / N``, ``state.tau =
    rule.next_tau(tau, sparsity)``, ``state.iteration += 1`` and clip the
    residual at the new τ when its clipping is due (``state.clip``).

    Parameters
    ----------
    state : SharingState
        Updated in place.
    update : float32 array of shape (N,)
        This step's update (the updater's step, not the raw gradient), in
        the residual's array module.

    Returns
    -------
    int32 array or None
        The message (libnd4j sparse or bitmap format, same array module as
        the residual), or None when nothing is to be sent.  To read the τ
        this message was encoded at, take ``state.tau`` before the call.

    Raises
    ------
    ValueError
        NaN or inf in the residual after adding ``update`` (the residual
        then holds the sum; nothing was encoded).
    """
    return _encode(state, update)[0]


def sent_entries(state: SharingState, update):
    """Boolean mask of the entries the next :func:`sharing_step` (or
    :func:`encode_update`) with ``update`` sends: ``|residual + update| >=
    τ``, the encoder's own test on the same float32 sums.  Call it before
    the step (``sharing_step``'s momentum masking)."""
    xp = backend.get_array_module(state.residual)
    return xp.abs(state.residual + update) >= xp.float32(state.tau)


def local_view(state: SharingState, shared, out):
    """Write this worker's own view into ``out``: the shared parameters plus
    its residual (what it has added but not yet sent), ``out = shared +
    residual`` in float32, one pass.

    A worker computes its gradient there (``out`` is its network's live
    parameter vector), so its own unsent updates are never invisible to it
    (the point each worker computes at in Qsparse-local-SGD's
    error-compensated local iterates, Basu et al. 2019).  Without it a
    worker keeps stepping from parameters its residual has already moved
    past in every entry under τ, and its updater keeps pushing them
    (``GradientSharing.local_view``).  Messages -- the worker's own and its
    peers' -- are applied to ``shared``, never to ``out``, so the replicas
    keep agreeing on ``shared`` exactly; after the last step the caller
    copies ``shared`` into the network.

    Parameters
    ----------
    state : SharingState
        This worker's state; its residual is read, not changed.
    shared : float32 array of shape (N,)
        The replica's shared parameters (numpy or CuPy).
    out : float32 array of shape (N,), same array module
        Written in place (the network's parameters); not ``shared``.

    Returns
    -------
    out
    """
    if out is shared:
        raise ValueError("Expect out to be another array than shared (the view is written over out)")
    xp = backend.get_array_module(shared)
    return xp.add(shared, state.residual, out=out)


def message_bytes(message) -> bytes:
    """The wire form of a message: its int32 words, little-endian.

    A CuPy message is copied to the host first (device -> host sync).
    """
    return np.ascontiguousarray(backend.to_cpu(message), dtype="<i4").tobytes()


def _as_message(message):
    if isinstance(message, (bytes, bytearray, memoryview)):
        size = memoryview(message).nbytes
        if size % 4:
            raise ValueError(f"Expect a message of whole int32 words (a multiple of 4 bytes), got {size} bytes")
        return np.frombuffer(message, dtype="<i4")
    return message


def apply_message(message, params) -> int:
    """Add an encoded message into ``params`` in place.

    Parameters
    ----------
    message : int32 array (numpy or CuPy) or bytes-like
        Either wire format; bytes are read as little-endian int32 words.
    params : float32 array of shape (N,), numpy or CuPy
        Written in place; unchanged when the message is malformed.

    Returns
    -------
    int
        The number of ±τ entries the message carried.

    Raises
    ------
    ValueError
        A malformed message or one for a different N.
    """
    msg = _as_message(message)
    if backend.is_gpu_array(params) and not backend.is_gpu_array(msg):
        ops.decode(backend.to_gpu(msg), params)  # host -> device copy of the message
    else:
        ops.decode(msg, params)
    return ops.encoded_count(msg)


def apply_received(state: SharingState, inbox: Iterable[Payload], params) -> int:
    """Apply every message in ``inbox`` to ``params`` and count them in
    ``state.messages_received``; returns how many were applied.

    Use it for the messages that arrive after the last step (an epoch's
    flush) too.  An empty payload (an iteration that sent nothing, published
    with ``always_publish``) is counted and applies nothing.
    """
    received = 0
    for payload in inbox:
        if len(payload):  # an empty payload: the sender's iteration sent nothing (sharing_step's always_publish)
            apply_message(payload, params)
        received += 1
    state.messages_received += received
    return received


def _encode_masked(state: SharingState, update, velocity, phase: PhaseHook, adapt: bool):
    """The ``"encode"`` phase of a step: :func:`_encode`, and the velocity
    cleared where the message sent the entry (momentum masking)."""
    with phase("encode"):
        sent = sent_entries(state, update) if velocity is not None else None
        message, entries = _encode(state, update, adapt=adapt)
        if sent is not None:
            velocity[sent] = 0.0
    return message, entries


def sharing_step(state: SharingState, update, params, publish: Callable[[bytes], None], inbox: Inbox,
                 phase: Optional[PhaseHook] = None, always_publish: bool = False, velocity=None) -> int:
    """One full sharing iteration of one worker.

    In order: :func:`encode_update` (residual, encoding, τ, clipping);
    when there is a message, ``publish(message_bytes(message))`` and add it
    to ``params``; then add every peer message of ``inbox`` to ``params``.

    Parameters
    ----------
    state : SharingState
        This worker's state, updated in place.
    update : float32 array of shape (N,)
        This step's update, same array module as ``state.residual``.
    params : float32 array of shape (N,)
        This replica's flat parameters, updated in place.
    publish : callable(bytes) -> None
        Sends this worker's message to every peer.
    inbox : iterable of bytes-like, or a callable returning one
        Peer messages to apply now.  It is read after ``publish``; pass a
        callable (``lambda: [p for _, p in group.poll(0)]``) when building
        the iterable would itself receive -- an argument list is evaluated
        before the call.
    phase : callable(str) -> context manager, optional
        Timing hook: each phase of :data:`PHASES` runs inside
        ``with phase(name):`` -- ``"encode"`` always, ``"send"`` (the wire
        bytes and ``publish``) only when there is a message (or
        ``always_publish``), ``"apply"``
        (this worker's message and the inbox, read inside it) always.
        The executors pass their recorder's ``phase``; None times nothing.
    always_publish : bool, default False
        Publish an empty payload when there is no message, so that every
        iteration publishes exactly one payload and peers can tell how many
        iterations this worker has taken (a bounded-staleness wait counts them).
    velocity : float32 array of shape (N,), optional
        The updater's velocity (a view into its state), cleared in place
        where this step's message sent the entry: momentum masking (DGC,
        Lin et al. 2018; ``GradientSharing.momentum_masking``).

    Returns
    -------
    int
        Entries this worker sent (0 when it sent nothing).

    Raises
    ------
    ValueError
        As :func:`encode_update` (nothing was published or applied), or a
        malformed peer message (as :func:`apply_message`).
    """
    phase = phase or _untimed
    message, entries = _encode_masked(state, update, velocity, phase, adapt=True)
    if message is not None or always_publish:
        with phase("send"):
            publish(b"" if message is None else message_bytes(message))
    with phase("apply"):
        if message is not None:
            ops.decode(message, params)
        apply_received(state, inbox() if callable(inbox) else inbox, params)
    return entries


# ------------------------------------------------------------------ a tree's ranks (Topology.TREE)
def merge_payloads(payloads, n: int) -> bytes:
    """A rank's merge of ``Topology.TREE``: the sum of payloads (any format, one τ)
    as wire bytes, ``b""`` when all are empty (:func:`sparkavg.ops.merge_messages`)."""
    merged = ops.merge_messages(payloads, n)
    return b"" if merged is None else message_bytes(merged)


def tree_step(state: SharingState, update, publish: Callable[[bytes], None], phase: Optional[PhaseHook] = None,
              velocity=None) -> int:
    """One iteration of a rank of a tree that sums the messages on the way
    (``Topology.TREE``).

    As :func:`sharing_step`, but: τ is the group's (kept, not adapted from
    this rank's own sparsity: :func:`adapt_group_tau`), the message is
    always published (an empty payload when nothing is sent: the tree
    merges one payload per rank and iteration), and nothing is applied --
    this rank's message comes back inside the iteration's total, which
    every rank applies (:func:`apply_totals`).

    Returns
    -------
    int
        Entries this worker sent.
    """
    phase = phase or _untimed
    message, entries = _encode_masked(state, update, velocity, phase, adapt=False)
    with phase("send"):
        publish(b"" if message is None else message_bytes(message))
    return entries


def apply_totals(state: SharingState, totals: Iterable[Payload], params, workers: int) -> int:
    """Apply a tree's totals, in iteration order, to ``params``; count them
    in ``state.messages_received`` and queue each one's sparsity (the ±τ
    entries all ranks sent, over ``workers`` x N) for :func:`adapt_group_tau`.
    Returns how many were applied."""
    applied = 0
    for payload in totals:
        entries = apply_message(payload, params) if len(payload) else 0
        state.group_sparsity.append(entries / (workers * state.num_params))
        applied += 1
    state.messages_received += applied
    return applied


def adapt_group_tau(state: SharingState) -> float:
    """The group's τ of the next step: the rule applied to the oldest queued
    total's sparsity (:func:`apply_totals`).  Every rank of a tree calls it
    before the same steps -- those after the first ``staleness + 1`` of an
    epoch, when the bounded-staleness wait has applied that total -- so the
    ranks keep one τ, which their messages need to merge.

    Raises
    ------
    RuntimeError
        No total queued: the caller did not wait for it.
    """
    if not state.group_sparsity:
        raise RuntimeError("Expect an applied total before adapting the group's τ (wait for the peers first), "
                           "got none queued")
    state.tau = state.rule.next_tau(state.tau, state.group_sparsity.popleft())
    return state.tau
