"""Weight schedules: a reward component's weight as a function of training progress.

A schedule is ``f(t, T)`` with ``t`` the 1-based number of the training step being taken
(``RewardContext.step + 1``) and ``T`` the planned number of steps (``RewardContext.total_steps``);
the component's weight is multiplied by it. Outside training (``T = 0``) every schedule is 1: a
scheduled reward evaluates with its written weights.

* ``constant``: 1.
* ``sigmoid_decay`` (``center``, ``width``): ``1 / (1 + exp((t − center·T) / width))``. TIRESRAG-R1's
  annealed weight a_t is ``center: 0.9, width: 10`` (about 1 for most of training, 0.5 at t = 0.9T,
  then falling; spec §2.6).
* ``linear`` (``start``, ``end``): from ``start`` at t = 1 to ``end`` at t = T.

In YAML: ``{name: f1, weight: 0.6, schedule: {name: sigmoid_decay, center: 0.9, width: 10}}``. An
optional ``label`` names the multiplier in outputs: ``label: a_t`` makes ``ragrl reward`` print
``"a_t": ...`` on every line and the trainer log ``schedule/a_t`` every step. Components that share a
label must share the schedule (one number per label).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ragrl.errors import RagrlError
from ragrl.registry import Registry

SCHEDULES: Registry[Callable[..., float]] = Registry("weight schedule")
register_schedule = SCHEDULES.register


@register_schedule("constant")
def constant(t: float, total: int) -> float:
    return 1.0


@register_schedule("sigmoid_decay")
def sigmoid_decay(t: float, total: int, center: float = 0.9, width: float = 10.0) -> float:
    z = (t - center * total) / width
    return 1.0 / (1.0 + math.exp(z)) if z < 700 else 0.0


@register_schedule("linear")
def linear(t: float, total: int, start: float = 1.0, end: float = 0.0) -> float:
    if total <= 1:
        return start
    return start + (end - start) * (min(max(t, 1), total) - 1) / (total - 1)


@dataclass(frozen=True)
class Schedule:
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    label: str | None = None
    """The multiplier's name in outputs (``a_t``); None: not reported on its own."""

    def __call__(self, step: int, total_steps: int) -> float:
        """The multiplier at ``step`` (0-based count of completed steps) of ``total_steps``."""
        if total_steps <= 0:
            return 1.0
        return float(SCHEDULES.get(self.name)(step + 1, total_steps, **self.params))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **dict(self.params), **({"label": self.label} if self.label else {})}


def build_schedule(spec: Any) -> Schedule:
    """A ``Schedule`` from ``{name, **params}``; unknown names and parameters are errors."""
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise RagrlError(f"a schedule is a mapping with a 'name', got {spec!r}")
    params = {k: v for k, v in spec.items() if k not in ("name", "label")}
    label = spec.get("label")
    if label is not None and (not isinstance(label, str) or not label):
        raise RagrlError(f"schedule {spec['name']!r}: label must be a non-empty string, got {label!r}")
    fn = SCHEDULES.get(str(spec["name"]))
    accepted = [p for p in inspect.signature(fn).parameters if p not in ("t", "total")]
    for key in params:
        if key not in accepted:
            raise RagrlError(f"schedule {spec['name']!r}: unknown parameter {key!r}; it takes {accepted}")
    return Schedule(str(spec["name"]), params, label)
