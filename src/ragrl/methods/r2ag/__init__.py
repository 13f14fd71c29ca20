"""R²AG: a retrieval steering model grows a Reasoning-Augmented Retrieval Tree (spec ``methods/r2ag.md``).

R²AG improves *retrieval*. At each step the steering model reads the question and the documents found so
far (``q ⊕ d̃``) and writes (§1.2)::

    <think> … </think>
    <base-Q> a single-hop sub-question for the current hop </base-Q>        (one or more)
    <predicted-Q> a next-hop question it can already guess, or none </predicted-Q>

``<base-Q> stop retrieval </base-Q>`` ends the expansion. Every query is one retrieval (top-1 in
training, top-1 or top-2 at evaluation); the queries and their documents are the tree's vertices
(``tree``). Training rewards gold hits, not answers (Eq. 5, ``rewards``); every training
sample is one steering step from a tree state, and the RR-Forest rounds (``forest``)
carry each unfinished tree, pruned to its gold-hitting branches, into the next round.

The method's parts, one module each, in the paper's order:

* ``protocol``: the steering prompt and grammar (§1.2), the typed record of a step, the settings;
* ``tree``: the tree (Definition 2.1) and what a tree measured;
* ``rollout``: the rollout that grows trees (``rollout.kind: r2ag``) and Top-Survivor (§2);
* ``rewards``: Eq. 5 (§3.2);
* ``forest``: the RR-Forest rounds of Algorithm 1 (§3.3);
* ``steering``: the gold-decomposition oracle and single-step retrieval, played through the rollout;
* ``method``: the config (``ragrl/methods/configs/r2ag.yaml``, ``r2ag-tiny.yaml``) and ``build_method``.
"""

from ragrl.methods.r2ag.method import build_method

__all__ = ["build_method"]
