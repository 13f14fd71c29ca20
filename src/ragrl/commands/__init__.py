"""The ``ragrl`` commands, one module per command group; ``ragrl.cli`` mounts them.

Commands are the top layer: they may use every package below, and nothing imports them but
``ragrl.cli``.
"""

from importlib import resources
from typing import Annotated

import typer

PACKAGED_CONFIGS = sorted(
    p.name[: -len(".yaml")]
    for p in resources.files("ragrl").joinpath("methods", "configs").iterdir()
    if p.name.endswith(".yaml")
)
"""The configs ``ragrl.methods`` ships (``ragrl.methods.available_methods()`` once it is imported), read
from its folder through the ``ragrl`` package (``files("ragrl.methods")`` would import the methods):
importing them imports torch, which ``ragrl --help`` and the commands that need no model (data,
score, and index / search / serve on a BM25 index) need not wait for."""

METHOD_CHOICES = f"a packaged config ({', '.join(PACKAGED_CONFIGS)}) or a YAML path"
"""What a ``--method`` / ``CONFIG`` argument accepts, for help texts."""

CONFIG_EPILOG = (
    "\b\nThe *-tiny configs are the CPU recipes. Keys a run usually sets with --set KEY=VALUE:\n"
    "  train.model.path    policy checkpoint folder (ragrl model tiny, or any causal LM folder)\n"
    "  train.data.train    training questions (jsonl); train.data.eval: held-out questions\n"
    "  train.data.index    retrieval index folder (ragrl index) or a retrieval server's URL\n"
    "  train.out           run folder; train.steps, train.seed, train.optim.lr\n"
    "  rollout.n           group size; rollout.temperature, rollout.max_turns\n"
    "Every key and its default: docs/training.md; a run's resolved config: <out>/config.yaml."
)
"""The epilog of ``ragrl train / sft / dpo --help``."""

SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set", metavar="KEY=VALUE", help="Override a config value: --set train.optim.lr=1e-5 (repeatable)."
    ),
]
"""The ``--set KEY=VALUE`` option of the commands that load a method config."""
