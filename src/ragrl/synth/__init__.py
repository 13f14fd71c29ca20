"""The synthetic multi-hop world: ragrl's embedded default data (see docs/synth.md).

``generate_world(seed, size)`` builds a fictional world (countries, cities, people, companies, works)
from a seed, one templated passage per entity, and train/dev/test questions in the canonical format:
2- and 3-hop bridge questions and comparison questions, with gold decompositions, given passages and
a share of unanswerable questions whose evidence was removed from the corpus. ``demonstrators`` holds
scripted Search-R1-format policies (an oracle and a heuristic) to drive the rollout engine.
"""

from ragrl.synth.fairness import fairness_report
from ragrl.synth.generate import generate_world
from ragrl.synth.questions import UNANSWERABLE_ANSWER
from ragrl.synth.synth_world import SynthWorld
from ragrl.synth.world import SIZES, SPLITS

__all__ = ["SIZES", "SPLITS", "UNANSWERABLE_ANSWER", "SynthWorld", "fairness_report", "generate_world"]
