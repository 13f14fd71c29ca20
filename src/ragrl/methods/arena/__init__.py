"""ARENA: Adaptive-Rewarded Evidence Navigation Agent (Ren et al. 2025, arXiv 2505.13258 v1; spec
``methods/arena.md``).

The RAG generator is trained with GRPO to reply to a question and its given passages in one turn: the
passages it relies on (``<relevance>``), an analysis citing them, then the answer. Where each part lives:

- ``protocol``: the prompt, the reply's grammar and how a reply is read (``ArenaProtocol``);
- ``rewards``: format, accuracy, relevance and bonus (registered as ``arena_*``), the Naive-GRPO
  baseline's ``think_answer_format``, and the citation audit;
- ``evidence``: the gold reference ids and the rule for unresolvable evidence;
- ``method``: the config (``ragrl/methods/configs/arena.yaml``, ``arena-tiny.yaml``, and the Naive-GRPO
  baseline's ``arena-naive*.yaml``), the oracle for warm starts, and ``build_method``.
"""

from ragrl.methods.arena.method import build_method

__all__ = ["build_method"]
