"""The rollout registry: a method names its rollout, and nothing else builds one.

A rollout plays episodes and turns them into training samples (``ragrl.rollout.sample``). A method's
config names it (``rollout.kind``; ``multi_turn``, the batched linear engine, by default); the GRPO and
SFT trainers and evaluation call ``Method.make_rollout``, which looks the name up here. A method with
its own episode shape (a retrieval tree, an agent that backtracks) registers its rollout class in its
own module with ``@register_rollout("name")``; the trainers do not change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ragrl.data.schema import Example
from ragrl.registry import Registry
from ragrl.rollout.sample import Sample
from ragrl.rollout.trajectory import Trajectory

if TYPE_CHECKING:
    from ragrl.llm.backend import GenerationBackend
    from ragrl.retrieval.base import Retriever
    from ragrl.rollout.protocol import Protocol as TagProtocol


@runtime_checkable
class Rollout(Protocol):
    """What the trainers and evaluation need from a rollout. A rollout may also define
    ``sample_reward(total, steps, sample) -> float``, the reward a sample trains on given its episode's
    total and per-step rewards (default: ``ragrl.rollout.sample.return_to_go``); a tree rollout gives
    each node its own step's reward."""

    def run(
        self,
        examples: Sequence[Example],
        n: int | None = None,
        seed: int | None = None,
        *,
        first_group: int = 0,
    ) -> list[Trajectory]:
        """Play ``n`` episodes per example (groups numbered from ``first_group``), one record each."""
        ...

    def samples(self, episodes: Sequence[Trajectory]) -> list[Sample]:
        """The training samples of ``episodes`` (one per linear episode; one per step otherwise)."""
        ...


ROLLOUTS: Registry[Any] = Registry("rollout")
register_rollout = ROLLOUTS.register
"""Register a rollout class ``cls(backend, retriever, protocol, config)`` under a name."""


def build_rollout(
    kind: str,
    backend: GenerationBackend,
    retriever: Retriever | None,
    protocol: TagProtocol,
    config: Any,
) -> Rollout:
    """The rollout registered as ``kind``, built over a backend, a retriever, a protocol and a config."""
    return ROLLOUTS.get(kind)(backend, retriever, protocol, config)
