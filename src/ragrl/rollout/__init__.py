"""Rollouts: the ``Trajectory`` record, tag protocols, the rollout registry (the batched multi-turn
engine, its step-wise variant), training samples and preference pairs, scripted backends."""

from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.engine import RolloutEngine
from ragrl.rollout.protocol import Protocol, TagSpan, find_spans, first_span, last_span, last_span_of
from ragrl.rollout.records import read_trajectories, write_trajectories
from ragrl.rollout.registry import ROLLOUTS, Rollout, build_rollout, register_rollout
from ragrl.rollout.sample import PreferencePair, Sample
from ragrl.rollout.scripted import DemonstratorBackend, ScriptedBackend
from ragrl.rollout.stepwise import StepwiseRollout
from ragrl.rollout.trajectory import ACTION_KINDS, Action, Segment, Trajectory

__all__ = [
    "ACTION_KINDS",
    "Action",
    "DemonstratorBackend",
    "PreferencePair",
    "Protocol",
    "ROLLOUTS",
    "Rollout",
    "RolloutConfig",
    "RolloutEngine",
    "Sample",
    "ScriptedBackend",
    "Segment",
    "StepwiseRollout",
    "TagSpan",
    "Trajectory",
    "build_rollout",
    "find_spans",
    "first_span",
    "last_span",
    "last_span_of",
    "read_trajectories",
    "register_rollout",
    "write_trajectories",
]
