"""The method registry: what a method is once loaded (``Method``), how a paper's package registers the
function that builds it from its config (``register_method``), and how a config becomes a method
(``load_method``: the YAML read once, ``build_method``: validated and built).

A config's ``method:`` key names a registered builder. The papers' own methods are registered by
``ragrl.methods`` (importing it registers them all, with their reward components); a new method
registers itself the same way::

    from ragrl.config import Method, register_method

    @register_method("my_method")
    def build_method(cfg) -> Method: ...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ragrl.config.files import apply_overrides, available_methods, load_method_config
from ragrl.errors import RagrlError
from ragrl.registry import Registry

METHODS: Registry[Callable[[DictConfig], Any]] = Registry("method")
"""``name -> build_method(cfg) -> Method``: the names a config's ``method:`` key may take."""


def register_method(name: str) -> Callable[[Callable[[DictConfig], Any]], Callable[[DictConfig], Any]]:
    """Register ``build_method(cfg) -> Method`` under ``name`` (a config's ``method:`` key)."""
    return METHODS.register(name)


@dataclass
class Method:
    """A loaded method: its validated config, protocol, rollout settings and reward."""

    name: str
    config: Any
    protocol: Any
    """A ``ragrl.rollout.protocol.Protocol``."""
    rollout: Any
    """A ``ragrl.rollout.config.RolloutConfig``."""
    reward: Any
    """A ``ragrl.rewards.CompositeReward``."""
    train: Any = None
    """A ``ragrl.config.train.TrainConfig`` (the config's ``train:`` section), validated when the method
    loads."""
    diagnostics: Any = None
    """Optional ``fn(trajectory, example) -> {name: float}``: method-specific per-trajectory measurements
    (for example ARENA's citation audit). Evaluation reports their means (and keeps them per row); the
    GRPO trainer logs their means every step."""

    step_diagnostics: Any = None
    """Optional ``fn(trajectories, examples, results, config) -> {name: float}``: measurements over one
    training step's episodes together (the groups are ``trajectory.metadata["group"]``, ``results`` the
    ``RewardResult`` of each, ``config`` the ``TrainConfig`` in force): what only a whole group shows,
    such as TIRESRAG's saturated-group shares and its advantage weights. The GRPO trainer logs them
    every step; over several processes a name ending in ``_min`` or ``_max`` is reduced by min or max,
    any other by the mean."""

    step_log: Any = None
    """Optional ``fn(trajectory) -> [dict per step]``: what each step did (its action, query, passages,
    the method's verdicts), read after the reward scored the episode; ``ragrl reward`` adds it to every
    per-step line (EVO-RAG's per-step log)."""

    oracle: Any = None
    """Optional demonstrator (``next_turn(example, history) -> str``) that writes ideal replies in this
    method's protocol, for SFT warm starts (``ragrl sft --demos oracle``); None: the synthetic world's
    search oracle (``ragrl.synth.demonstrators.OracleDemonstrator``)."""

    prepare: Any = None
    """Optional ``fn(examples, where) -> examples`` applied to every question set the method is trained
    or evaluated on (ARENA attaches the gold reference ids and applies its rule for unresolvable
    evidence, reporting what it drops); ``where`` names the source for messages."""

    scripted: Any = None
    """Optional ``{name: fn(tokenizer) -> backend}``: the method's own scripted policies, played through
    its rollout in place of a model (``ragrl eval --demonstrator NAME``; R²AG's steering oracle and
    single-step retrieval). None: the synthetic world's search demonstrators."""

    few_shot: Any = None
    """Optional ``fn(method, tokenizer, pool, retriever, k) -> (protocol, shot trajectories)``: a method
    whose worked examples are not whole answered episodes builds its few-shot protocol itself
    (``ragrl eval --few-shot``; R²AG shows steering steps). None: the oracle's answered episodes."""

    eval_rollout: Any = None
    """Optional rollout settings for evaluation, when they differ from training's beyond greediness and
    one sample (R²AG trains one expansion of a tree state and evaluates whole trees); None: ``rollout``."""

    task_source: Any = None
    """Optional ``fn(examples, seed) -> source``: where the GRPO trainer takes its questions when they
    grow from what the policy does (R²AG's RR-Forest rounds) rather than from a fixed shuffled list.
    The source has ``take(k) -> list[Example]`` (the next ``k``, the same on every process),
    ``grow(episodes, owners) -> list[dict]`` (the JSON records of the items these episodes add),
    ``add(records)`` (every process's records, in process order), ``done`` (nothing left to train on),
    ``metrics() -> {name: float}`` (logged each step) and ``state_dict`` / ``load_state_dict`` (saved
    with every checkpoint, so a resumed run continues exactly)."""

    source: Any = None
    """The config the method was built from (an OmegaConf ``DictConfig``, overrides applied, before the
    schema filled in its defaults): ``with_overrides`` derives other runs from it without reading the
    file again."""

    where: str = ""
    """The config's packaged name or path, for messages."""

    def with_overrides(self, overrides: Sequence[str] | Mapping[str, Any] | None) -> Method:
        """This method with more overrides (a training stage's, a run folder's ``train.out``), built from
        the config it was loaded from: the file is read once per run."""
        if self.source is None:
            raise RagrlError(
                f"method {self.name!r} was built without its config (use load_method or build_method): "
                "there is nothing to apply overrides to"
            )
        try:
            cfg = apply_overrides(self.source, overrides)
        except RagrlError as e:
            raise RagrlError(_named(self.where, str(e))) from None
        return build_method(cfg, self.where)

    def resolved_yaml(self) -> str:
        """The full config (every default filled in) as YAML, for the run folder."""
        return OmegaConf.to_yaml(OmegaConf.structured(self.config))

    def make_rollout(self, backend: Any, retriever: Any, config: Any = None) -> Any:
        """This method's rollout (``rollout.kind`` in the registry ``ragrl.rollout.registry``) over a
        generation backend and a retriever; ``config`` replaces the method's rollout settings (evaluation
        runs greedy, one sample per question). The trainers and evaluation build rollouts only here."""
        from ragrl.rollout.registry import build_rollout

        config = self.rollout if config is None else config
        return build_rollout(config.kind, backend, retriever, self.protocol, config)

    def prepare_examples(self, examples: Any, where: str) -> list[Any]:
        """``examples`` as this method trains and evaluates on them: over-long questions cut or refused
        (``rollout.max_question_chars`` / ``long_questions``, a cut reported), then ``prepare``."""
        from ragrl.console import console
        from ragrl.rollout.limits import limit_questions

        examples, report = limit_questions(list(examples), self.rollout, where)
        if report.cut:
            console.print(f"warning: {report.summary(where, self.rollout.max_question_chars)}")
        return list(examples) if self.prepare is None else list(self.prepare(list(examples), where))

    def diagnose_step(self, trajectories: Any, examples: Any, results: Any, config: Any) -> dict[str, float]:
        """The method's diagnostics of one training step's episodes (empty when it declares none)."""
        if self.step_diagnostics is None:
            return {}
        out = self.step_diagnostics(trajectories, examples, results, config)
        return {k: float(v) for k, v in out.items()}

    def diagnose(self, trajectory: Any, example: Any) -> dict[str, float]:
        """The method's diagnostics of one trajectory (empty when it declares none)."""
        if self.diagnostics is None:
            return {}
        return {k: float(v) for k, v in self.diagnostics(trajectory, example).items()}


def load_method(
    name_or_path: str | Path, overrides: Sequence[str] | Mapping[str, Any] | None = None
) -> Method:
    """Load a method from its packaged name or a YAML path: the file is read once, the overrides
    applied, then ``build_method``. Every error names the config."""
    where = str(name_or_path)
    try:
        cfg = load_method_config(name_or_path, overrides)
    except RagrlError as e:
        raise RagrlError(_named(where, str(e))) from None
    return build_method(cfg, where)


def build_method(cfg: DictConfig, where: str) -> Method:
    """The method a config describes (its ``method:`` key names the registered builder), its ``train:``
    section validated, and every training stage's config checked before any stage runs. Errors name
    ``where``."""
    try:
        return _build(cfg, where)
    except RagrlError as e:
        raise RagrlError(_named(where, str(e))) from None


def _named(where: str, message: str) -> str:
    names = {where, str(Path(where)), f"{where}.yaml"}
    return message if any(message.startswith(f"{name}:") for name in names) else f"{where}: {message}"


def _build(cfg: DictConfig, where: str) -> Method:
    name = cfg.get("method")
    if not isinstance(name, str) or not name.isidentifier():
        raise RagrlError(f"{where}: the config needs a 'method:' key naming a ragrl method")
    if name not in METHODS:
        known = ", ".join(METHODS.names()) or "none: import ragrl.methods to register the packaged ones"
        raise RagrlError(
            f"{where}: unknown method {name!r} (registered: {known}; packaged configs: "
            f"{', '.join(available_methods())})"
        )
    method = METHODS[name](cfg)
    method.source, method.where = cfg, where
    if method.train is not None:
        method.train.validate()  # every name and value, before anything is loaded
        on = method.train.grpo.group_filter_on
        if on != "total" and on not in method.reward.keys:
            raise RagrlError(
                f"train.grpo.group_filter_on: {on!r} is neither 'total' nor a reward component of this "
                f"method ({', '.join(method.reward.keys)})"
            )
        for i, stage in enumerate(method.train.stages):  # each stage's config, before any stage runs
            try:
                _build(apply_overrides(cfg, [*stage.overrides, "train.stages=[]"]), where)
            except RagrlError as e:
                raise RagrlError(f"train.stages[{i}] ({stage.name}): {e}") from None
    return method
