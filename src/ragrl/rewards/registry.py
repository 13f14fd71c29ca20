"""The reward registry and weighted composition.

A reward component is a pure function ``fn(trajectory, example, ctx, **params) -> float`` registered
under a name. A method's reward is a list of named, weighted components, written in its YAML as::

    reward:
      - {name: em, weight: 1.0, variant: squad}
      - {name: search_r1_format, weight: 0.2}

``build_reward(spec)`` turns that list into a ``CompositeReward``; calling it returns a
``RewardResult`` with the weighted total and every component's raw value, which the trainer logs
per step. Methods register their own components with ``@register_reward("name")`` in their own module;
nothing in the core changes when a method adds one.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.registry import Registry
from ragrl.rollout.trajectory import Trajectory


@dataclass
class RewardContext:
    """What a reward may know beyond the trajectory and the example."""

    step: int = 0
    """Training step (0 outside training)."""
    total_steps: int = 0
    """Planned number of training steps (0 if unknown), for time-varying schedules."""
    extra: dict[str, Any] = field(default_factory=dict)


RewardFn = Callable[..., float]

REWARDS: Registry[RewardFn] = Registry("reward")
register_reward = REWARDS.register
"""Register ``fn(trajectory, example, ctx, **params) -> float`` under ``name``."""


def get_reward(name: str) -> RewardFn:
    return REWARDS.get(name)


def reward_names() -> list[str]:
    """The registered components: the shared ones (``ragrl.rewards.answer``, registered when
    ``ragrl.rewards`` is imported) and those of every method module imported so far
    (``ragrl.methods.load_method`` imports them all)."""
    return REWARDS.names()


@dataclass(frozen=True)
class RewardComponent:
    name: str
    fn: RewardFn
    weight: float = 1.0
    params: Mapping[str, Any] = field(default_factory=dict)
    key: str = ""
    """The name the component is reported under (``name`` unless two components share a name)."""


@dataclass
class RewardResult:
    total: float
    components: dict[str, float]
    """Raw (unweighted) value of every component, by reporting key."""


class CompositeReward:
    """A weighted sum of named components; each component's raw value is kept for logging."""

    def __init__(self, components: Sequence[RewardComponent]) -> None:
        if not components:
            raise RagrlError("a reward needs at least one component")
        self.components = list(components)

    def __call__(
        self, trajectory: Trajectory, example: Example, ctx: RewardContext | None = None
    ) -> RewardResult:
        ctx = ctx or RewardContext()
        values: dict[str, float] = {}
        total = 0.0
        for c in self.components:
            value = float(c.fn(trajectory, example, ctx, **c.params))
            if not math.isfinite(value):
                raise RagrlError(f"reward component {c.key!r} returned {value} for example {example.id!r}")
            values[c.key] = value
            total += c.weight * value
        return RewardResult(total, values)

    def score(
        self,
        trajectories: Iterable[Trajectory],
        examples: Iterable[Example],
        ctx: RewardContext | None = None,
    ) -> list[RewardResult]:
        return [self(t, e, ctx) for t, e in zip(trajectories, examples, strict=True)]

    @property
    def keys(self) -> list[str]:
        return [c.key for c in self.components]

    def describe(self) -> list[dict[str, Any]]:
        return [{"name": c.name, "key": c.key, "weight": c.weight, **dict(c.params)} for c in self.components]


def build_reward(spec: Iterable[Mapping[str, Any]]) -> CompositeReward:
    """Build a ``CompositeReward`` from ``[{name, weight?, key?, **params}, ...]``.

    Unknown names and parameters the component does not take are errors naming the entry.
    """
    components: list[RewardComponent] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(spec):
        entry = dict(entry)
        if "name" not in entry:
            raise RagrlError(f"reward[{i}]: missing 'name'")
        name = str(entry.pop("name"))
        weight = float(entry.pop("weight", 1.0))
        key = str(entry.pop("key", name))
        fn = get_reward(name)
        accepted = inspect.signature(fn).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
        for param in entry:
            if not takes_any and (param not in accepted or param in ("trajectory", "example", "ctx")):
                valid = [p for p in accepted if p not in ("trajectory", "example", "ctx")]
                raise RagrlError(f"reward[{i}] ({name}): unknown parameter {param!r}; it takes {valid}")
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:
            raise RagrlError(f"reward[{i}]: two components are reported as {key!r}; give one a 'key'")
        components.append(RewardComponent(name, fn, weight, entry, key))
    return CompositeReward(components)
