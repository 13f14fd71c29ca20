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
TIRESRAG-R1's annealed a_t is ``sigmoid_decay``). A component registered with ``per_step=True`` returns
one value per step of the episode; a ``step_weight: {early, late, horizon}`` then moves its weight
inside the episode (EVO-RAG's scheduler), and the result carries every step's reward ``R_t`` and the
episode's return. ``build_reward(spec)`` turns the list into a
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
_PER_STEP: set[str] = set()


def register_reward(
    name: str, *, batched: bool = False, per_step: bool = False
) -> Callable[[RewardFn], RewardFn]:
    """Register ``fn(trajectory, example, ctx, **params) -> float`` under ``name``; with
    ``batched=True`` ``fn(trajectories, examples, ctx, **params) -> list[...]`` (one value per episode);
    with ``per_step=True`` a value is a list with one number per step (policy turn) of the episode."""

    def decorate(fn: RewardFn) -> RewardFn:
        REWARDS.register(name)(fn)
        if batched:
            _BATCHED.add(name)
        if per_step:
            _PER_STEP.add(name)
        return fn

    return decorate


@dataclass(frozen=True)
class StepWeight:
    """A per-step weight that moves inside an episode: ``(1 − p)·early + p·late`` with
    ``p = min(t / horizon, 1)`` at step ``t`` (0-based); EVO-RAG's time-based scheduler (spec §2.3).
    With ``mid``, the path is piecewise: ``early → mid`` over ``p ∈ [0, ½]``, ``mid → late`` over
    ``[½, 1]`` (EVO-RAG's "one path inside every episode" reading)."""

    early: float
    late: float
    horizon: int
    mid: float | None = None

    def __call__(self, t: int) -> float:
        p = min(t / self.horizon, 1.0)
        if self.mid is None:
            return (1.0 - p) * self.early + p * self.late
        if p <= 0.5:
            return (1.0 - 2 * p) * self.early + 2 * p * self.mid
        return (2.0 - 2 * p) * self.mid + (2 * p - 1.0) * self.late

    @classmethod
    def build(cls, spec: Any) -> StepWeight:
        keys = {"early", "late", "horizon", "mid"}
        if not isinstance(spec, Mapping) or set(spec) - keys or "horizon" not in spec:
            raise RagrlError(f"step_weight is {{early, late, horizon, mid?}}, got {spec!r}")
        mid = spec.get("mid")
        out = cls(
            float(spec.get("early", 1.0)),
            float(spec.get("late", 1.0)),
            int(spec["horizon"]),
            None if mid is None else float(mid),
        )
        if out.horizon < 1:
            raise RagrlError(f"step_weight.horizon must be >= 1, got {out.horizon}")
        return out

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"early": self.early, "late": self.late, "horizon": self.horizon}
        return out if self.mid is None else {**out, "mid": self.mid}


def get_reward(name: str) -> RewardFn:
    return REWARDS.get(name)


def reward_names() -> list[str]:
    """The registered components: the shared ones (``ragrl.rewards.answer`` and ``.retrieval``,
    registered when ``ragrl.rewards`` is imported) and those of every paper's package imported so far
    (importing ``ragrl.methods`` imports them all)."""
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
    per_step: bool = False
    """``fn`` returns one value per step of the episode (``register_reward(..., per_step=True)``)."""
    step_weight: StepWeight | None = None
    """Multiplies ``weight`` by a function of the step index inside the episode (per-step only)."""

    def weight_at(self, ctx: RewardContext) -> float:
        if self.schedule is None:
            return self.weight
        return self.weight * self.schedule(ctx.step, ctx.total_steps)

    def _value(self, v: Any) -> Any:
        if not self.per_step:
            return float(v)
        if not isinstance(v, (list, tuple)) or not v:
            raise RagrlError(f"reward component {self.key!r} is per step: it must return a non-empty list")
        return [float(x) for x in v]

    def values(
        self, trajectories: list[Trajectory], examples: list[Example], ctx: RewardContext
    ) -> list[Any]:
        """The raw value of every episode: one batched call, or one call per episode."""
        if self.batched:
            out = [self._value(v) for v in self.fn(trajectories, examples, ctx, **self.params)]
            if len(out) != len(trajectories):
                raise RagrlError(
                    f"reward component {self.key!r} returned {len(out)} values for "
                    f"{len(trajectories)} episodes"
                )
        else:
            pairs = zip(trajectories, examples, strict=True)
            out = [self._value(self.fn(t, e, ctx, **self.params)) for t, e in pairs]
        for v, e in zip(out, examples, strict=True):
            if not all(math.isfinite(x) for x in (v if self.per_step else [v])):
                raise RagrlError(f"reward component {self.key!r} returned {v} for example {e.id!r}")
        return out


@dataclass
class RewardResult:
    total: float
    components: dict[str, float]
    """Raw (unweighted) value of every component, by reporting key."""
    weights: dict[str, float] = field(default_factory=dict)
    """The weight of every component at this training step (they differ from the config's under a
    schedule)."""
    steps: list[float] | None = None
    """With per-step components: the reward of every step of the episode, ``R_t = Σ_k w_k(t)·r_k(t)``
    (episode-level components count at the last step); ``total`` is their sum."""
    step_components: dict[str, list[float]] = field(default_factory=dict)
    """Per-step components' raw values, step by step (``components`` holds their sums)."""
    step_weights: dict[str, list[float]] = field(default_factory=dict)
    """Every component's weight at each step (per-step runs only)."""
    factors: dict[str, float] = field(default_factory=dict)
    """Each labelled schedule's multiplier at this training step (``{"a_t": 0.98}``)."""


class CompositeReward:
    """A weighted sum of named components; each component's raw value is kept for logging."""

    def __init__(self, components: Sequence[RewardComponent]) -> None:
        if not components:
            raise RagrlError("a reward needs at least one component")
        self.components = list(components)
        labelled: dict[str, Schedule] = {}
        for c in self.components:
            if c.schedule is None or c.schedule.label is None:
                continue
            other = labelled.setdefault(c.schedule.label, c.schedule)
            if (other.name, dict(other.params)) != (c.schedule.name, dict(c.schedule.params)):
                raise RagrlError(
                    f"reward {c.key!r}: the schedule label {c.schedule.label!r} names two different "
                    f"schedules ({other.describe()} and {c.schedule.describe()})"
                )
        clash = sorted(
            set(labelled) & {*(c.key for c in self.components), "id", "t", "total", "weights", "return"}
        )
        if clash:
            raise RagrlError(
                f"schedule label {clash[0]!r} is already a reward component's key or an output field; "
                "choose another label"
            )
        self.labelled = labelled
        """Each schedule label and its schedule."""

    def factors(self, ctx: RewardContext) -> dict[str, float]:
        """Each labelled schedule's multiplier at ``ctx``'s training step."""
        return {label: s(ctx.step, ctx.total_steps) for label, s in self.labelled.items()}

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
        factors = self.factors(ctx)
        columns = {c.key: c.values(trajectories, examples, ctx) for c in self.components}
        results = []
        for i, example in enumerate(examples):
            values = {key: column[i] for key, column in columns.items()}
            if any(c.per_step for c in self.components):
                results.append(self._per_step_result(values, weights, example))
            else:
                total = sum(weights[key] * v for key, v in values.items())
                results.append(RewardResult(total, values, dict(weights)))
            results[-1].factors = dict(factors)
        return results

    def _per_step_result(
        self, values: dict[str, Any], weights: dict[str, float], example: Example
    ) -> RewardResult:
        """``R_t = Σ_k w_k(t)·r_k(t)`` over the per-step components, episode-level ones at the last step."""
        lengths = {len(values[c.key]) for c in self.components if c.per_step}
        if len(lengths) != 1:
            raise RagrlError(f"per-step reward components disagree on the number of steps of {example.id!r}")
        n = lengths.pop()
        steps = [0.0] * n
        step_weights: dict[str, list[float]] = {}
        for c in self.components:
            if c.per_step:
                ws = [weights[c.key] * (c.step_weight(t) if c.step_weight else 1.0) for t in range(n)]
                steps = [r + w * v for r, w, v in zip(steps, ws, values[c.key], strict=True)]
            else:
                ws = [0.0] * (n - 1) + [weights[c.key]]
                steps[-1] += weights[c.key] * values[c.key]
            step_weights[c.key] = ws
        per_step = {c.key: values[c.key] for c in self.components if c.per_step}
        sums = {key: (math.fsum(v) if key in per_step else v) for key, v in values.items()}
        return RewardResult(math.fsum(steps), sums, dict(weights), steps, per_step, step_weights)

    @property
    def keys(self) -> list[str]:
        return [c.key for c in self.components]

    @property
    def per_step(self) -> bool:
        """Some component scores every step: results carry ``steps``."""
        return any(c.per_step for c in self.components)

    @property
    def scheduled(self) -> bool:
        return any(c.schedule is not None for c in self.components)

    def describe(self) -> list[dict[str, Any]]:
        out = []
        for c in self.components:
            entry = {"name": c.name, "key": c.key, "weight": c.weight, **dict(c.params)}
            if c.schedule is not None:
                entry["schedule"] = c.schedule.describe()
            if c.step_weight is not None:
                entry["step_weight"] = c.step_weight.describe()
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
        raw_weight = entry.pop("weight", 1.0)
        try:
            weight = float(raw_weight)
        except (TypeError, ValueError):
            raise RagrlError(f"reward[{i}] ({name}): weight must be a number, got {raw_weight!r}") from None
        if not math.isfinite(weight):
            raise RagrlError(f"reward[{i}] ({name}): weight must be finite, got {raw_weight!r}")
        key = str(entry.pop("key", name))
        schedule_spec = entry.pop("schedule", None)
        step_weight_spec = entry.pop("step_weight", None)
        fn = get_reward(name)
        schedule = None
        if schedule_spec is not None:
            try:
                schedule = build_schedule(schedule_spec)
            except RagrlError as e:
                raise RagrlError(f"reward[{i}] ({name}) schedule: {e}") from None
        step_weight = None
        if step_weight_spec is not None:
            if name not in _PER_STEP:
                raise RagrlError(f"reward[{i}] ({name}): step_weight needs a per-step component")
            try:
                step_weight = StepWeight.build(step_weight_spec)
            except (RagrlError, TypeError, ValueError) as e:
                raise RagrlError(f"reward[{i}] ({name}): {e}") from None
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
        components.append(
            RewardComponent(
                name, fn, weight, entry, key, name in _BATCHED, schedule, name in _PER_STEP, step_weight
            )
        )
    return CompositeReward(components)
