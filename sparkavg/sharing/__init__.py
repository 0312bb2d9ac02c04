"""The gradient-sharing algorithm, apart from Spark and the network.

- Rules (frozen, configurable): :class:`FixedThreshold`,
  :class:`AdaptiveThreshold`, :class:`TargetSparsityThreshold` (kind
  ``"threshold"``); :func:`check_tau` is the one threshold check;
  :func:`clip_when_due`, DL4J's residual clipping, always on.
- State: :class:`SharingState` (residual, τ, encoder state, statistics;
  ``to_plain`` / ``from_plain`` to carry it between epochs); :class:`InOrder`
  (peers' messages applied in (iteration, rank) order).
- Steps: :func:`encode_update`, :func:`apply_message`,
  :func:`apply_received`, :func:`message_bytes` and the whole iteration
  :func:`sharing_step`; :func:`local_view` (the worker's own view, the
  shared parameters plus its residual, where its gradient is taken).
- A tree's ranks (``Topology.TREE``, messages summed on the way):
  :func:`tree_step` (publish, apply nothing), :func:`apply_totals` (one
  total per iteration), :func:`adapt_group_tau` (one τ for the group),
  :func:`merge_payloads` (a relay's sum).

A worker's loop (``shared``: the replica's parameters, a copy of the
network's; the network's own vector holds the view)::

    state = SharingState(AdaptiveThreshold(), n)
    shared = net.params.copy()
    for x, y in minibatches:
        local_view(state, shared, net.params)
        net.compute_update(x, y, update)
        sharing_step(state, update, shared, group.publish,
                     lambda: [p for _, p in group.poll(0)], phase=recorder.phase)
    net.params[...] = shared

(the Spark executors' loop; ``phase`` is an optional timing hook).
"""
from .order import InOrder
from .state import SharingState
from .step import (
    adapt_group_tau,
    apply_message,
    apply_received,
    apply_totals,
    merge_payloads,
    tree_step,
    encode_update,
    local_view,
    message_bytes,
    sent_entries,
    sharing_step,
)
from .thresholds import (
    TAU_MAX,
    TAU_MIN,
    AdaptiveThreshold,
    FixedThreshold,
    TargetSparsityThreshold,
    ThresholdRule,
    check_tau,
    clip_when_due,
)

__all__ = [
    "InOrder",
    "SharingState",
    "encode_update",
    "apply_message",
    "apply_received",
    "message_bytes",
    "sharing_step",
    "sent_entries",
    "local_view",
    "tree_step",
    "apply_totals",
    "adapt_group_tau",
    "merge_payloads",
    "ThresholdRule",
    "FixedThreshold",
    "AdaptiveThreshold",
    "TargetSparsityThreshold",
    "clip_when_due",
    "check_tau",
    "TAU_MIN",
    "TAU_MAX",
]
