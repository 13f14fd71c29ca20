"""Rollouts: the ``Trajectory`` record, tag protocols, the batched multi-turn engine, scripted backends."""

from ragrl.rollout.engine import RolloutConfig, RolloutEngine, read_trajectories, write_trajectories
from ragrl.rollout.protocol import Protocol, TagSpan, find_spans, first_span, last_span, last_span_of
from ragrl.rollout.scripted import DemonstratorBackend, ScriptedBackend
from ragrl.rollout.trajectory import ACTION_KINDS, Action, Segment, Trajectory

__all__ = [
    "ACTION_KINDS",
    "Action",
    "DemonstratorBackend",
    "Protocol",
    "RolloutConfig",
    "RolloutEngine",
    "ScriptedBackend",
    "Segment",
    "TagSpan",
    "Trajectory",
    "find_spans",
    "first_span",
    "last_span",
    "last_span_of",
    "read_trajectories",
    "write_trajectories",
]
