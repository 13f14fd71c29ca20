"""TIRESRAG-R1: think, retrieve, reflect (spec ``methods/tiresrag.md``).

A search agent on Search-R1's grammar that reflects once after its first answer, trained on an answer
reward plus judged sufficiency and thinking rewards and a reflection reward, with a consistency penalty
and a difficulty weight on the advantages. Where each part lives:

- ``protocol``: the prompt, the insertion format and the reflection pass (``TiresragProtocol``);
- ``rewards``: the answer reward R^A and the reflection reward R^R;
- ``judges``: the judged rewards R^S (sufficiency) and R^T (thinking quality);
- ``advantage``: the estimator ``tiresrag`` (the consistency penalty, the difficulty weight) and the
  step diagnostics;
- ``analysis``: the paper's failure-pattern analysis of thinking (``ragrl analyze``);
- ``method``: the config (``ragrl/methods/configs/tiresrag.yaml``, ``tiresrag-tiny.yaml``), the oracle and
  ``build_method``.
"""

from ragrl.methods.tiresrag.method import build_method

__all__ = ["build_method"]
