"""The papers' methods, one package (or module) per paper, each registered here under the name a config's
``method:`` key uses:

- ``search_r1``: the plain search agent every paper compares against (Search-R1);
- ``arena``: ARENA, evidence navigation over given passages (``ragrl.methods.arena``);
- ``eval_rar``: Eval-RAR, a search agent that evaluates its evidence after every search;
- ``tiresrag``: TIRESRAG-R1, think, retrieve, reflect (``ragrl.methods.tiresrag``);
- ``r2ag``: R²AG, a steering model that grows a retrieval tree (``ragrl.methods.r2ag``);
- ``evo_rag``: EVO-RAG, a query-rewriting agent on scheduled step rewards (``ragrl.methods.evo_rag``).

What every method shares lives below them: the config files, the ``train:`` schema and the method registry
(``ragrl.config``), the search tag grammar (``ragrl.rollout.search_protocol``), rewards, advantages and
rollouts. A paper's package never imports another's (an import-linter contract). Their configs are
``ragrl/methods/configs/<name>.yaml`` (each one's ``method:`` names its paper). Importing this package
registers every method, its reward components, advantages and rollouts, and the configs' folder;
``load_method`` is ``ragrl.config.load_method``.
"""

from __future__ import annotations

from importlib import resources

from ragrl.config import Method, available_methods, load_method, register_method
from ragrl.config.files import register_config_folder
from ragrl.methods import arena, eval_rar, evo_rag, r2ag, search_r1, tiresrag
from ragrl.methods.vocabulary import vocabulary_texts

for _name, _paper in (
    ("search_r1", search_r1),
    ("arena", arena),
    ("eval_rar", eval_rar),
    ("tiresrag", tiresrag),
    ("r2ag", r2ag),
    ("evo_rag", evo_rag),
):
    register_method(_name)(_paper.build_method)

register_config_folder(resources.files(__name__) / "configs")

__all__ = ["Method", "available_methods", "load_method", "vocabulary_texts"]
