"""EVO-RAG: a query-rewriting agent trained on scheduled step rewards (spec ``methods/evo-rag.md``).

The agent searches, backtracks, answers or refuses, one action a step; seven per-step rewards are
weighted by a schedule that moves from discovery to refinement, and training runs preference cycles
(sibling candidates, a multi-head reward model, DPO) in two curriculum stages. Where each part lives:

- ``protocol``: the grammar (``EvoRagProtocol``: search, backtrack, answer, refuse);
- ``rewards``: the seven step rewards (registered as ``evo_*``) and the per-step log;
- ``schedule``: the weights of the rewards over an episode and over the stages;
- ``method``: the config (``ragrl/methods/configs/evo_rag.yaml``, ``evo_rag-tiny.yaml``), the oracle,
  the diagnostics and ``build_method``. The cycles and stages are the core's (``ragrl.train``).
"""

from ragrl.methods.evo_rag.method import build_method

__all__ = ["build_method"]
