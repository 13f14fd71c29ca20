"""Methods: each module declares a protocol (prompt + tag grammar), its rewards and its config.

A method's config is a packaged YAML file (``ragrl/methods/configs/<name>.yaml``) loaded with
OmegaConf; ``load_method_config`` reads it (or any YAML path), applies ``a.b=value`` overrides and
``to_dataclass`` checks it against the method's dataclass schema (unknown keys and wrong types are
``RagrlError``s that name the key).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ragrl.data.io import read_text
from ragrl.errors import RagrlError

T = TypeVar("T")


def available_methods() -> list[str]:
    """Names of the packaged method configs."""
    root = resources.files("ragrl.methods") / "configs"
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def _read_yaml(name_or_path: str | Path) -> DictConfig:
    text: str
    where: str
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists() or "/" in str(name_or_path):
        if not p.is_file():
            raise RagrlError(f"{p}: no such config file")
        text, where = read_text(p), str(p)
    else:
        name = str(name_or_path)
        res = resources.files("ragrl.methods") / "configs" / f"{name}.yaml"
        if not res.is_file():
            raise RagrlError(
                f"unknown method {name!r} (packaged: {', '.join(available_methods()) or 'none'})"
            )
        text, where = res.read_text(encoding="utf-8"), f"{name}.yaml"
    try:
        cfg = OmegaConf.create(text)
    except Exception as e:  # yaml errors come in several types
        raise RagrlError(_yaml_error(where, e)) from None
    if not isinstance(cfg, DictConfig):
        raise RagrlError(f"{where}: expected a mapping at the top level")
    return cfg


def apply_overrides(cfg: DictConfig, overrides: Sequence[str] | Mapping[str, Any] | None) -> DictConfig:
    """Apply ``["a.b=1", "reward.1.weight=0.2"]`` (``--set`` style; list items by index) or a mapping
    of dotted keys to values. Values are parsed as OmegaConf parses YAML scalars and lists."""
    if not overrides:
        return cfg
    if isinstance(overrides, Mapping):
        items = list(overrides.items())
    else:
        bad = [o for o in overrides if "=" not in o or not o.split("=", 1)[0].strip()]
        if bad:
            raise RagrlError(f"overrides must look like key.path=value, got {', '.join(map(repr, bad))}")
        items = []
        for o in overrides:
            key, raw = o.split("=", 1)
            try:
                items.append((key.strip(), OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]))["v"]))
            except OmegaConfBaseException as e:
                raise RagrlError(f"bad override {o!r}: {e}") from None
    cfg = cfg.copy()
    for key, value in items:
        try:
            OmegaConf.update(cfg, key, value, merge=True, force_add=True)
        except (OmegaConfBaseException, TypeError, ValueError, IndexError) as e:
            raise RagrlError(f"bad override {key}={value!r}: {e}") from None
    return cfg


def load_method_config(
    name_or_path: str | Path, overrides: Sequence[str] | Mapping[str, Any] | None = None
) -> DictConfig:
    """A method's config: a packaged name (``"search_r1"``) or a YAML path, with overrides applied."""
    return apply_overrides(_read_yaml(name_or_path), overrides)


def _yaml_error(where: str, e: Exception) -> str:
    """A YAML error on one line: ``FILE:LINE: invalid YAML (<problem> at column N)``."""
    mark = getattr(e, "problem_mark", None)
    problem = " ".join(str(getattr(e, "problem", None) or str(e) or type(e).__name__).split())
    if mark is not None:
        return f"{where}:{mark.line + 1}: invalid YAML ({problem} at column {mark.column + 1})"
    return f"{where}: invalid YAML ({problem})"


def to_dataclass(schema: type[T], cfg: DictConfig | Mapping[str, Any]) -> T:
    """Validate ``cfg`` against a dataclass ``schema`` and build it (nested dataclasses included)."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), cfg)
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        reason = (str(e.msg if hasattr(e, "msg") else e).strip().splitlines() or [type(e).__name__])[0]
        raise RagrlError(f"config{' key ' + repr(key) if key else ''}: {reason}") from None
    except (TypeError, ValueError) as e:
        raise RagrlError(f"config: {e}") from None
    return obj  # type: ignore[return-value]


@dataclass
class Method:
    """A loaded method: its validated config, protocol, rollout settings and reward."""

    name: str
    config: Any
    protocol: Any
    """A ``ragrl.rollout.protocol.Protocol``."""
    rollout: Any
    """A ``ragrl.rollout.engine.RolloutConfig``."""
    reward: Any
    """A ``ragrl.rewards.CompositeReward``."""
    train: Any = None
    """A ``ragrl.methods.train_config.TrainConfig`` (the config's ``train:`` section), validated when the
    method loads."""
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


def import_all_methods() -> None:
    """Import every method module of ``ragrl.methods``: importing one registers its reward components
    (and anything else it registers), so every name is known before a config is checked."""
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        if info.name != "train_config":
            importlib.import_module(f"{__name__}.{info.name}")


def vocabulary_texts() -> list[str]:
    """The words a policy trained here must be able to write and read, for a tokenizer trained from
    scratch (``ragrl.llm.tiny.create_tiny_policy(..., extra_texts=vocabulary_texts())``): every string
    in the ``protocol`` sections of the packaged method configs (prompt templates, observation and
    corrective texts), each method protocol's built-in wording (``Protocol.fixed_texts``), and the
    phrases the synthetic world's demonstrators write (what a warm start on demonstrations teaches).
    The rest of a config (reward names, paths, labels) is not text the policy reads or writes: leaving
    it out keeps the tokenizer, and so every tiny run, unchanged when such a setting changes."""
    from ragrl.synth.demonstrators import demonstrator_texts

    texts: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, str):
            texts.append(node)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for name in available_methods():
        walk(OmegaConf.to_container(load_method_config(name)).get("protocol", {}))
        texts.extend(load_method(name).protocol.fixed_texts())
    return [*texts, *demonstrator_texts()]


def load_method(
    name_or_path: str | Path, overrides: Sequence[str] | Mapping[str, Any] | None = None
) -> Method:
    """Load a method from its packaged name or a YAML path (its ``method:`` key names the module
    ``ragrl.methods.<method>``, which provides ``build_method(cfg) -> Method``). Every error names the
    config."""
    try:
        return _load_method(name_or_path, overrides)
    except RagrlError as e:
        names = {str(name_or_path), str(Path(name_or_path)), f"{name_or_path}.yaml"}
        if any(str(e).startswith(f"{name}:") for name in names):
            raise
        raise RagrlError(f"{name_or_path}: {e}") from None


def _load_method(name_or_path: str | Path, overrides: Sequence[str] | Mapping[str, Any] | None) -> Method:
    cfg = load_method_config(name_or_path, overrides)
    import_all_methods()  # a config may use any method's registered rewards, advantages or filters
    name = cfg.get("method")
    if not isinstance(name, str) or not name.isidentifier():
        raise RagrlError(f"{name_or_path}: the config needs a 'method:' key naming a ragrl method")
    try:
        module = importlib.import_module(f"ragrl.methods.{name}")
    except ModuleNotFoundError:
        raise RagrlError(
            f"{name_or_path}: unknown method {name!r} (packaged: {', '.join(available_methods())})"
        ) from None
    build = getattr(module, "build_method", None)
    if build is None:
        raise RagrlError(f"ragrl.methods.{name} has no build_method(cfg)")
    method = build(cfg)
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
                _load_method(name_or_path, [*_as_list(overrides), *stage.overrides, "train.stages=[]"])
            except RagrlError as e:
                raise RagrlError(f"train.stages[{i}] ({stage.name}): {e}") from None
    return method


def _as_list(overrides: Sequence[str] | Mapping[str, Any] | None) -> list[str]:
    if not overrides:
        return []
    if isinstance(overrides, Mapping):
        return [f"{k}={v}" for k, v in overrides.items()]
    return list(overrides)


__all__ = [
    "Method",
    "apply_overrides",
    "available_methods",
    "import_all_methods",
    "load_method",
    "load_method_config",
    "to_dataclass",
    "vocabulary_texts",
]
