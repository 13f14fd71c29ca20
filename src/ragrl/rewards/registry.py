"""The reward registry and weighted composition.

A reward component is a function registered under a name, of one of two kinds:

* ``fn(trajectory, example, ctx, **params) -> float``: one episode at a time
  (``@register_reward("name")``);
* ``fn(trajectories, examples, ctx, **params) -> list[float]``: the whole batch in one call
  (``@register_reward("name", batched=True)``), for components that call a judge model or an
  endpoint, which should see many episodes at once (and may cache).

A method's reward is a list of named, weighted components, written in its YAML as::

    reward:
      - {name: em, weight: 1.0, variant: squad}
      - {name: search_r1_format, weight: 0.2}
      - {name: f1, weight: 0.5, schedule: {name: sigmoid_decay, center: 0.9, width: 10}}

A ``schedule`` multiplies the weight by a function of training progress (``ragrl.rewards.schedules``;
TIRESRAG-R1's annealed a_t is ``sigmoid_decay``). ``build_reward(spec)`` turns the list into a
``CompositeReward``; ``score(trajectories, examples, ctx)`` returns one ``RewardResult`` per episode
with the weighted total, every component's raw value and the weights in force, which the trainer
logs per step. Methods register their own components in their own module; nothing in the core changes
when a method adds one.
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
from ragrl.rewards.schedules import Schedule, build_schedule
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
_BATCHED: set[str] = set()


def register_reward(name: str, *, batched: bool = False) -> Callable[[RewardFn], RewardFn]:
    """Register ``fn(trajectory, example, ctx, **params) -> float`` under ``name``, or with
    ``batched=True`` ``fn(trajectories, examples, ctx, **params) -> list[float]``."""

    def decorate(fn: RewardFn) -> RewardFn:
        REWARDS.register(name)(fn)
        if batched:
            _BATCHED.add(name)
        return fn

    return decorate


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
    batched: bool = False
    """``fn`` scores a whole batch in one call (``register_reward(..., batched=True)``)."""
    schedule: Schedule | None = None
    """Multiplies ``weight`` by a function of training progress (None: constant)."""

    def weight_at(self, ctx: RewardContext) -> float:
        if self.schedule is None:
            return self.weight
        return self.weight * self.schedule(ctx.step, ctx.total_steps)

    def values(
        self, trajectories: list[Trajectory], examples: list[Example], ctx: RewardContext
    ) -> list[float]:
        """The raw value of every episode: one batched call, or one call per episode."""
        if self.batched:
            out = [float(v) for v in self.fn(trajectories, examples, ctx, **self.params)]
            if len(out) != len(trajectories):
                raise RagrlError(
                    f"reward component {self.key!r} returned {len(out)} values for "
                    f"{len(trajectories)} episodes"
                )
        else:
            pairs = zip(trajectories, examples, strict=True)
            out = [float(self.fn(t, e, ctx, **self.params)) for t, e in pairs]
        for v, e in zip(out, examples, strict=True):
            if not math.isfinite(v):
                raise RagrlError(f"reward component {self.key!r} returned {v} for example {e.id!r}")
        return out


@dataclass
class RewardResult:
    total: float
    components: dict[str, float]
    """Raw (unweighted) value of every component, by reporting key."""
    weights: dict[str, float] = field(default_factory=dict)
    """The weight of every component at this step (they differ from the config's under a schedule)."""


class CompositeReward:
    """A weighted sum of named components; each component's raw value is kept for logging."""

    def __init__(self, components: Sequence[RewardComponent]) -> None:
        if not components:
            raise RagrlError("a reward needs at least one component")
        self.components = list(components)

    def __call__(
        self, trajectory: Trajectory, example: Example, ctx: RewardContext | None = None
    ) -> RewardResult:
        return self.score([trajectory], [example], ctx)[0]

    def score(
        self,
        trajectories: Iterable[Trajectory],
        examples: Iterable[Example],
        ctx: RewardContext | None = None,
    ) -> list[RewardResult]:
        """Score a batch of episodes: every component once over the batch (a batched component in one
        call), then the weighted total per episode with the weights in force at ``ctx.step``."""
        ctx = ctx or RewardContext()
        trajectories, examples = list(trajectories), list(examples)
        if len(trajectories) != len(examples):
            raise RagrlError(
                f"{len(trajectories)} episodes but {len(examples)} examples to score them against"
            )
        weights = {c.key: c.weight_at(ctx) for c in self.components}
        columns = {c.key: c.values(trajectories, examples, ctx) for c in self.components}
        results = []
        for i in range(len(trajectories)):
            values = {key: column[i] for key, column in columns.items()}
            total = sum(weights[key] * v for key, v in values.items())
            results.append(RewardResult(total, values, dict(weights)))
        return results

    @property
    def keys(self) -> list[str]:
        return [c.key for c in self.components]

    @property
    def scheduled(self) -> bool:
        return any(c.schedule is not None for c in self.components)

    def describe(self) -> list[dict[str, Any]]:
        out = []
        for c in self.components:
            entry = {"name": c.name, "key": c.key, "weight": c.weight, **dict(c.params)}
            if c.schedule is not None:
                entry["schedule"] = c.schedule.describe()
            out.append(entry)
        return out


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
        schedule_spec = entry.pop("schedule", None)
        fn = get_reward(name)
        schedule = None
        if schedule_spec is not None:
            try:
                schedule = build_schedule(schedule_spec)
            except RagrlError as e:
                raise RagrlError(f"reward[{i}] ({name}) schedule: {e}") from None
        own = ("trajectories", "examples", "ctx") if name in _BATCHED else ("trajectory", "example", "ctx")
        accepted = inspect.signature(fn).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
        for param in entry:
            if not takes_any and (param not in accepted or param in own):
                valid = [p for p in accepted if p not in own]
                raise RagrlError(f"reward[{i}] ({name}): unknown parameter {param!r}; it takes {valid}")
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:
            raise RagrlError(f"reward[{i}]: two components are reported as {key!r}; give one a 'key'")
        components.append(RewardComponent(name, fn, weight, entry, key, name in _BATCHED, schedule))
    return CompositeReward(components)
