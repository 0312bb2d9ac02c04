"""A :class:`~sparkavg.torch.optim.TorchOptimizer` bound to one model's
flat vectors (:class:`Binding`), and the private copy of its groups a torch
scheduler is stepped on (:class:`ScheduleTrack`)."""
from __future__ import annotations

import re
import warnings
from typing import Sequence

import numpy as np

from .layout import class_and_name

__all__ = ["Binding", "ScheduleTrack"]


def _torch():
    import torch

    return torch


class ScheduleTrack:
    """A private copy of the optimizer's groups (one 1-element stand-in each)
    and the scheduler on it, stepped to a count: the groups' values there
    (rebuilt from the start when asked for an earlier count)."""

    def __init__(self, updater, groups):
        self.updater, self.groups, self.key = updater, list(groups), updater.rates_key
        self.scheduler_class, _, self.name = class_and_name(updater.scheduler, "scheduler", "learning-rate scheduler")
        self._build()

    def _options(self, index: int) -> dict:
        if index == 0:
            return {}
        return {k: v for k, v in self.updater.param_groups[index - 1].items() if k != "params"}

    def _build(self):
        torch = _torch()
        u = self.updater
        groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], **self._options(i)} for i in self.groups]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.optimizer = u.optimizer_class(groups, lr=u.learning_rate, **u.kwargs)
            try:
                self.scheduler = self.scheduler_class(self.optimizer, **u.scheduler_kwargs)
            except Exception as exc:  # noqa: BLE001 -- the user's arguments: named
                raise ValueError(f"Expect scheduler_kwargs that {self.name} accepts: building it failed with "
                                 f"{type(exc).__name__}: {exc}") from None
        self.count = 0

    def at(self, count: int) -> list:
        """Each group's options after ``count`` scheduler steps."""
        if count < self.count:
            self._build()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()": no step is taken here
            while self.count < count:
                try:
                    self.scheduler.step()
                except Exception as exc:  # noqa: BLE001
                    raise ValueError(f"Expect {self.name} to give a rate at {self.updater.scheduler_interval} "
                                     f"{count}: its step {self.count + 1} failed with {type(exc).__name__}: "
                                     f"{exc}") from None
                self.count += 1
        return [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]


def _tensor(array):
    """A torch tensor sharing ``array``'s memory (numpy or CuPy)."""
    torch = _torch()
    if isinstance(array, np.ndarray):
        return torch.from_numpy(array)
    return torch.from_dlpack(array)


def _member(name: str, groups: Sequence[dict]) -> int:
    """The index (1-based; 0: the default group) of the first group matching ``name``."""
    for i, group in enumerate(groups, 1):
        selector = group["params"]
        if (name in selector) if isinstance(selector, list) else re.search(selector, name):
            return i
    return 0


class Binding:
    """A :class:`TorchOptimizer` over one model's flat vectors: the torch
    optimizer on parameters that are views of ``params`` (gradients views
    of ``grads``), its per-parameter state views of ``updater_state``."""

    def __init__(self, updater, flat):
        torch = _torch()
        self.key = updater.layout_key
        self.arrays = (flat.params, flat.grads, flat.updater_state)
        self.xp = flat.xp
        layout = updater.layout
        n = flat.num_params
        params, grads, state = (_tensor(a) for a in self.arrays)
        segments = [seg for seg in flat.param_segments if seg.stop > seg.start]
        member = [_member(str(seg.name), updater.param_groups) for seg in segments]
        unmatched = [i for i, g in enumerate(updater.param_groups, 1) if i not in member]
        if unmatched:
            names = ", ".join(repr(str(seg.name)) for seg in segments[:12])
            more = f" ... ({len(segments)} in all)" if len(segments) > 12 else ""
            raise ValueError(f"Expect every param_groups entry of {updater.name} to match a parameter, got "
                             f"{[updater.param_groups[i - 1]['params'] for i in unmatched]} matching none of "
                             f"{names}{more}")
        self.tensors = []
        self._ranges = [(seg.start, seg.stop, seg.shape) for seg in segments]
        for seg in segments:
            p = torch.nn.Parameter(params[seg.start:seg.stop].view(seg.shape))
            p.grad = grads[seg.start:seg.stop].view(seg.shape)
            self.tensors.append(p)
        # torch's groups: the used ones in order (the default group first), with their options
        self.sources = [g for g in range(1 + len(updater.param_groups)) if g in member]
        groups = []
        for g in self.sources:
            options = {k: v for k, v in updater.param_groups[g - 1].items() if k != "params"} if g else {}
            groups.append({"params": [p for p, m in zip(self.tensors, member) if m == g], **options})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.optimizer = updater.optimizer_class(groups, lr=updater.learning_rate, **updater.kwargs)
        # Every parameter's state: its views of the flat vector and a step, placed by torch's own
        # rules for a loaded state_dict (a capturable or fused optimizer's step on the device).
        slots = {k: i for i, k in enumerate(layout.slots)}
        views, initial, loaded = [], [], {}
        for i, (seg, p, g) in enumerate(zip(segments, self.tensors, member)):
            made = self.optimizer.state.get(p, {})  # made at construction (Adagrad's sum): a fresh start's values
            entries = {}
            for key in sorted(layout.group_keys[g], key=layout.slots.index):
                base = slots[key] * n + seg.start
                entries[key] = state[base] if key in layout.scalars else \
                    state[base:base + seg.stop - seg.start].view(seg.shape)
                value = made.get(key)
                initial.append(value.detach().clone() if torch.is_tensor(value) else value)
                views.append((i, key, entries[key]))
            if layout.step is not None:
                entries["step"] = 0 if layout.step == "int" else torch.tensor(0.0, dtype=getattr(torch, layout.step))
            loaded[i] = entries
        whole = self.optimizer.state_dict()
        whole["state"] = loaded
        self.optimizer.load_state_dict(whole)
        self.states = [self.optimizer.state[p] for p in self.tensors]
        self.views = []
        for (i, key, view), value in zip(views, initial):
            self.states[i][key] = view  # itself, whatever load_state_dict made of it
            self.views.append((self.states[i], key, view, value))
        self.lazy = [(st, layout.lazy[g]) for st, g in zip(self.states, member)]
        self.scratch = None
        self.track = None  # the scheduler's private copy, made for the rates it was made with (_rates)
        self.applied = None  # what the groups' rates were last set from
        self.empty = not self.tensors

    def serves(self, updater, flat) -> bool:
        """Whether this binding is still ``updater``'s over ``flat``'s vectors."""
        return (self.arrays[0] is flat.params and self.arrays[1] is flat.grads
                and self.arrays[2] is flat.updater_state and updater.layout_key == self.key)

    # ------------------------------------------------------------------ step
    def _rates(self, updater, iteration: int, epoch: int) -> None:
        """The groups' rates (and what a scheduler changes) for this step."""
        if updater.scheduler is not None:
            if self.track is None or self.track.key != updater.rates_key:  # a recovery's lower rate: made again
                self.track = ScheduleTrack(updater, self.sources)
            count = epoch if updater.scheduler_interval == "epoch" else iteration
            key = (self.track, count)
            if key != self.applied:
                for group, values in zip(self.optimizer.param_groups, self.track.at(count)):
                    group.update(values)
                self.applied = key
            return
        key = (updater.lr, tuple(g.get("lr") for g in updater.param_groups))
        if key != self.applied:
            for group, g in zip(self.optimizer.param_groups, self.sources):
                group["lr"] = updater.param_groups[g - 1].get("lr", updater.lr) if g else updater.lr
            self.applied = key

    def _fresh(self) -> None:
        """Iteration 0: the state as torch starts it (made at construction, or
        at the first step for the rest)."""
        torch = _torch()
        with torch.no_grad():
            for st, key, view, initial in self.views:
                if initial is not None:
                    if torch.is_tensor(initial):
                        view.copy_(initial)
                    else:
                        view.fill_(initial)
                    st[key] = view
            for st, keys in self.lazy:
                for key in keys:
                    st.pop(key, None)

    def _sync(self) -> None:
        """Every state entry back to its view of the flat vector (an entry the
        step made anew, at a fresh start, is copied in)."""
        torch = _torch()
        with torch.no_grad():
            for st, key, view, _ in self.views:
                value = st.get(key)
                if value is view:
                    continue
                if torch.is_tensor(value):
                    view.copy_(value)
                elif value is not None:
                    view.fill_(value)
                else:
                    view.zero_()
                st[key] = view

    def step(self, updater, update, iteration: int, epoch: int) -> None:
        """Add one step of the optimizer to ``update``: in place when it is
        the parameters themselves, else through a scratch copy of them."""
        if self.empty:
            return
        self._rates(updater, iteration, epoch)
        params = self.arrays[0]
        direct = update is params
        if not direct:
            if self.scratch is None:
                self.scratch = self.xp.empty_like(params)
            self.scratch[...] = params
            self._swap(self.scratch)
        try:
            if iteration == 0:
                self._fresh()
            torch = _torch()
            for st in self.states:
                step = st.get("step")
                if torch.is_tensor(step):
                    step.fill_(iteration)
                elif step is not None:
                    st["step"] = iteration
            self.optimizer.step()
            self._sync()
        finally:
            if not direct:
                self._swap(params)
        if not direct:
            self.scratch -= params
            update += self.scratch

    def _swap(self, array) -> None:
        """Point the optimizer's parameters at ``array`` (the flat parameters or the scratch copy)."""
        whole = _tensor(array)
        for p, (start, stop, shape) in zip(self.tensors, self._ranges):
            p.data = whole[start:stop].view(shape)
