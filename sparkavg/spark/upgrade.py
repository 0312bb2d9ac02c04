"""Master configurations written by earlier releases, brought up to date.

Checkpoints, saved estimators and Pipelines hold a master's
``to_config()``.  Fields that later became the library's behaviour (a
measured win, no longer a switch) are dropped on load; a file that set one
away from its old default loads with a warning naming it.  A file whose
fields together say DL4J's behaviour (plain unweighted averaging without
the moment correction or worker shares; sharing's summed updates without
masking or the local view) loads as the ``"dl4j"`` preset.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

__all__ = ["upgrade_master", "RETIRED", "DECIDED", "REPLACED"]

logger = logging.getLogger(__name__)

_BLOCK_MOMENTUM = {"type": "BlockMomentum", "momentum": None, "block_lr": 1.0, "nesterov": True, "min_frequency": 32,
                   "with_momentum_updaters": False}
_MASTER = {"collect_stats": True}
#: The transport's sizes and timers as GradientSharing carried them (now sparkavg.transport.limits' constants).
_ENDPOINT = dict(type="EndpointConfig", max_datagram_bytes=60000, max_message_bytes=8 << 20, retransmit_timeout=1.0,
                 adaptive_retransmit=True, min_retransmit_timeout=0.05, stall_timeout=60.0, send_window_bytes=4 << 20,
                 send_window_messages=256, recv_window_messages=1024, max_reassembly_bytes=8 << 20,
                 max_inbox_bytes=64 << 20, socket_buffer_bytes=4 << 20, faults=None)
#: Retired fields by config type, with the defaults they had.
RETIRED = {
    "ParameterAveraging": {**_MASTER, "target_overhead": 0.03, "max_averaging_frequency": 400, "aggregation_depth": 2,
                           "weighting": "examples", "worker_shares": "auto", "max_plain_momentum_frequency": 32,
                           "moment_correction": True, "block_momentum": _BLOCK_MOMENTUM},
    "GradientSharing": {**_MASTER, "residual_post_processor": {"type": "ResidualClipping", "frequency": 5, "k": 5.0},
                        "transport": _ENDPOINT, "simulate_loss": 0.0, "max_stage_attempts": 3, "update_scale": "auto",
                        "momentum_masking": True, "local_view": True},
    "DataOptions": {"prefetch": "auto", "storage_level": "MEMORY_AND_DISK"},
    "AdaptiveThreshold": {"decay": 0.5 ** (1.0 / 20.0)},
    "TargetSparsityThreshold": {"decay": 0.5 ** (1.0 / 20.0)},
}
#: Fields that became decisions, with the value earlier releases wrote as their default: a file carrying it
#: loads with the field unset, decided as this release decides it (gradient sharing's topology: PLAIN up to
#: a few workers, then TREE, sparkavg.spark.policies.topology).
DECIDED = {"GradientSharing": {"topology": "plain"}}
#: Values this release no longer has, as what stands for them now: DL4J's MESH relay tree as the tree that
#: sums on the way (TREE; decided instead where the file is asynchronous, staleness None, which TREE is not).
REPLACED = {"GradientSharing": {"topology": {"mesh": "tree"}}}
#: The fields whose values together were DL4J's behaviour.
_DL4J = {"ParameterAveraging": {"block_momentum": None, "moment_correction": False, "worker_shares": "equal",
                                "weighting": "uniform"},
         "GradientSharing": {"update_scale": "sum", "momentum_masking": False, "local_view": False}}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return abs(float(a) - float(b)) <= 1e-12 * max(1.0, abs(float(b)))
        except (TypeError, ValueError):
            return False
    return a == b


def _upgrade(config: Any, where: str) -> Any:
    if not isinstance(config, Mapping):
        return config
    config = dict(config)
    kind = config.get("type")
    retired = RETIRED.get(kind, {})
    signature = _DL4J.get(kind)
    if signature and all(key in config and _same(config[key], value) for key, value in signature.items()):
        config.setdefault("preset", "dl4j")
        for key in signature:
            del config[key]
    for key, old in DECIDED.get(kind, {}).items():
        if config.get(key) == old:
            config[key] = None
    for key, values in REPLACED.get(kind, {}).items():
        if config.get(key) in values:
            new = values[config[key]] if config.get("staleness", 0) is not None else None
            logger.warning("%s: %s=%r is gone from this release; loaded as %r", where, key, config[key], new)
            config[key] = new
    for key, default in retired.items():
        if key not in config:
            continue
        value = config.pop(key)
        if isinstance(value, Mapping) and isinstance(default, Mapping):  # a retired part: name what it changed
            value = {k: v for k, v in value.items() if not _same(v, default.get(k))} or default
        if default is not None and not _same(value, default):
            logger.warning("%s: the saved configuration sets %s=%r, a setting this release retired (the library "
                           "now decides it: sparkavg.spark.policies, or a constant); loaded without it", where, key,
                           value)
    for key, value in list(config.items()):
        if isinstance(value, Mapping) and "type" in value:
            config[key] = _upgrade(value, f"{where}.{key}")
    return config


def upgrade_master(config: Any) -> Any:
    """``config`` (a master's ``to_config()`` of any release) as this
    release's configuration; anything that is not a mapping is returned as it is."""
    return _upgrade(config, str(config.get("type", "master")) if isinstance(config, Mapping) else "master")
