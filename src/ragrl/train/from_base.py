"""What a method needs to start from the pretrained reader base (``ragrl.train.reader``): its token limits
scaled for the base's BPE, the demo's warm-start and GRPO recipe, the prompt the base reads, and the
demonstrator whose replies read the way the base learned to (quote the evidence, then answer). The
benchmarks' ``--base`` and the reader's other grammars (``ReaderRecipe.also``) use them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

BPE_SCALE = 2.0
"""How much longer the reader base's BPE sequences may run than a word-level policy's (measured: 40%
more tokens per text on average; 18% of the demo's oracle episodes were cut at the word-level limits,
none at twice the turn's (96 new tokens), the demo's ``BASE_SETTINGS``)."""

RECIPE_KEYS = ("train.sft.batch_size", "train.sft.lr", "rollout.temperature", "train.optim.lr")

BASE_PASSAGES_SETTINGS = (
    "protocol.user='{references}\nQuestion: {question}'",
    "protocol.reference_template='{title} [{index}]: {text}'",
    "rollout.max_new_tokens=160",
    "rollout.max_total_tokens=160",
)
"""The base's prompt for a method that shows the given passages: the passages, each after its title and
number, then the question on one line. A method's own instruction (ARENA's runs to ~280 BPE tokens) is
text a tiny policy does not read, and it pushed ARENA's prompts (527-644 tokens) past the 512 positions
the base was trained on. The title comes first so that a reply that names an entity can copy what
follows it, the passage's number and text, as the base copies a search result after its title. The
quoting replies (``base_demonstrator``) run to 144 BPE tokens (mean 89; worlds 0 and 1016): 160."""


def base_recipe() -> list[str]:
    """The demo's warm start and GRPO settings on the base (``train.demo.base_settings``), the same for
    every arm (the last setting of each key wins, as in the overrides): the measured probe with each
    method's own instruction prompt, its non-quoting oracle and T = 0.5, lr 2e-4 lost the base's reading
    (Search-R1 arm, seed 0: answerable EM 0.178 after a 50-step warm start, 0.078 after 30 GRPO steps)."""
    from ragrl.train.demo import base_settings

    return list({s.split("=")[0]: s for s in base_settings() if s.split("=")[0] in RECIPE_KEYS}.values())


def base_prompt() -> str:
    """The one-line prompt the reader base was trained on (a tiny policy does not read instructions)."""
    from ragrl.train.demo import base_settings

    return next(s for s in base_settings() if s.startswith("protocol.user="))


def base_overrides(config: str, overrides: Sequence[str] = ()) -> list[str]:
    """What a method config needs to start from the reader base: its token limits scaled by
    ``BPE_SCALE``, the demo's recipe (``base_recipe``), and the base's prompt where the method's prompt
    is a template of the question alone (``base_prompt``) or of the question and the given passages
    (``BASE_PASSAGES_SETTINGS``, with the longer reply a quoting one needs); a prompt with other fields
    (R²AG's ``{evidence}``) is kept."""
    import string

    from ragrl.methods import load_method

    method = load_method(config, list(overrides))
    limits = [
        f"rollout.{key}={int(getattr(method.rollout, key) * BPE_SCALE)}"
        for key in ("max_total_tokens", "max_new_tokens", "max_obs_tokens")
        if getattr(method.rollout, key, None)
    ]
    user = getattr(method.protocol, "user_template", None) or getattr(method.config.protocol, "user", None)
    fields = {f for _, f, _, _ in string.Formatter().parse(user)} - {None} if isinstance(user, str) else set()
    prompt = {
        frozenset({"question"}): [base_prompt()],
        frozenset({"question", "references"}): list(BASE_PASSAGES_SETTINGS),
    }.get(frozenset(fields), [])
    return [*limits, *base_recipe(), *prompt]


def base_demonstrator(method: Any) -> Any:  # noqa: ANN401
    """The warm start's demonstrator from the base: the quoting oracle the base learned to read with, in
    the method's grammar where its oracle can wrap another demonstrator (over given passages, the
    method's oracle quotes what ``QuotingOracle.read_given`` reads); else the method's own oracle (or
    the quoting oracle for a method without one)."""
    from ragrl.synth.demonstrators import QuotingOracle

    if method.oracle is None:
        return QuotingOracle()
    return method.oracle.wrap(QuotingOracle()) if hasattr(method.oracle, "wrap") else method.oracle
