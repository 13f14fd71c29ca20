"""TIRESRAG-R1: think, retrieve, reflect (spec ``methods/tiresrag.md``). Rewards and advantages.

This module holds the protocol (think, retrieve, answer, reflect once), the rule-based rewards and the
advantage estimator. The judged rewards R^S and R^T are in ``ragrl.methods.tiresrag_judges``.

**The rollout (§1.2–1.4)** is Search-R1's loop with the method's prompt and insertion format. The
instructions go in the system message and the raw question in the user message. A search's passages
come back as ``\n\n<information>\n(1)Title text\n(2)…</information>\n\n`` (``None`` when nothing is
found; the code also drops a leading number from a KILT passage, which our corpora do not have). After
the first ``<answer>``, ``reflect: true`` continues the same episode once (``reflection_cue``, empty by
default, is inserted first): the policy may think, search again and answer again; the last answer is
final and every answer is kept for R^R. The released code gets the same effect by not stopping at
``</answer>`` during training; it stops there at evaluation (§8 Q7), which ``reflect: false``
reproduces. A reflection pass that neither searches nor answers again ends the episode with its answer
(the turn is kept as a ``reflect`` action), as the code ends a segment without a search. The code's
retrieval cap (8) is approximated by ``rollout.max_turns`` (searches and answers share the turns: 10
leaves room for 8 searches, an answer and its reflection, but a policy that never answers may search 9
times). ``prefill: "<think>"`` opens the assistant turn with ``<think>`` as the code does (the paper's
config); the policy's first segment continues it.

**Answer reward R^A (§2.1).** Token F1 of the last ``<answer>`` against the gold answers, with the
method's normalization (``tiresrag``: the authors' ``normalize_answer``, ``True``/``False`` →
``yes``/``no``, punctuation to spaces, the curly quotes kept) and the yes/no rule (two different strings,
either one ``yes``, ``no`` or ``noanswer``, score 0). An empty ``<answer> </answer>`` is the answer
``""`` (``protocol.empty_answer``), F1 0. An episode without an answer (§8 Q16): ``no_answer: text``
scores what the code's ``extract_answer_math`` reads from the response (the prefill, then the
completion, cut at an end token): the text after its last ``<answer>``, or all of it; ``zero`` (the
default) scores 0, since the code's way can reward a reply that never answers. A saved completion with
more answers than a live rollout gives (``ragrl reward``) is read to its end: the last answer is scored.

**Reflection reward R^R (§2.4)**, compared between the first and the last answer, ``mode``:

* ``paper`` (Eq. 4, the default): +1 if the first answer is wrong and the last right, −1 the other way,
  else 0 (one answer or none: 0). "Right" is cover-EM: every gold token occurs in the answer.
* ``code`` (``answer_reflection_reward.py``): "right" is ``F1 > 0.5`` or cover-EM; one answer scores 0
  if right and −1 if wrong; several score −1 if the last is wrong, or if both are right and the last
  has the lower F1, else 0. It never gives +1.

**The annealed weight a_t (§2.6)** is the core schedule ``sigmoid_decay`` (center 0.9, width 10) on the
auxiliary components' weights, so ``R_sum = R^A + a_t (0.6 R^T + 0.3 R^S + 0.3 R^R)`` (§2.7) is the
composite reward of the config.

**Advantages (§2.8, §3.1, §3.2)**, the estimator ``tiresrag``:

    A_i  = (R_i − mean_g R) / std_g R                         group z-score of R_sum
    P_i  = −λ_p · z^A_i · s_T z^T_i · s_S z^S_i   if that product is < 0, else 0
    A'_i = (A_i − P_i) · W(mean_g R^S)                        W(ρ) = 0.4 + 1.1 / (1 + exp(10 (ρ − 0.75)))

z^A, z^T, z^S are the group z-scores of the raw answer, thinking and sufficiency rewards, with the
population std and ε = 1e-8 as the code's ``compute_consistency_penalty`` (``penalty_std``,
``penalty_eps``), whatever ``std`` and ``eps`` the advantage A_i uses: the code's own A_i takes the sample
std and ε = 1e-9 (``std: sample, eps: 1.0e-9`` reproduces it). ``penalty: paper`` uses s_T = s_S = 1
(Eq. 7 with its typo A^T·A^T corrected to A^S·A^T, §8 Q2);
``penalty: code`` scales them by the components' weights in force, s_T = 0.6 a_t and s_S = 0.3 a_t, as
``compute_consistency_penalty`` does (0.018 a_t² |z^A z^T z^S| at the paper's weights). A group whose
R^S or R^T are all equal gets no penalty. ``difficulty: false`` drops W (the "w/o difficulty"
ablation). ``baseline: reinforce_pp`` is the code's Reinforce++ path (§3.6): A = r − mean_g, minus the
penalty, no W, then normalised over the update batch after the filter (``train.grpo.whiten: token``,
which the config must set).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ragrl.algos.advantages import batch_groups, difficulty_weight, grpo, grpo_mean_only, register_advantage
from ragrl.algos.filters import saturated_groups
from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods import Method, load_method_config, to_dataclass
from ragrl.methods.search_r1 import (
    SearchR1Protocol,
    SearchR1ProtocolConfig,
    search_diagnostics,
    well_formed_turn,
)
from ragrl.methods.tiresrag_judges import judge_parse_failures, response_text
from ragrl.methods.train_config import TrainConfig
from ragrl.metrics.answer import cover_em, f1
from ragrl.rewards import build_reward
from ragrl.rewards.registry import RewardContext, RewardResult, register_reward
from ragrl.rollout.engine import RolloutConfig
from ragrl.rollout.protocol import END_TOKEN_TEXT
from ragrl.rollout.scripted import Turn
from ragrl.rollout.trajectory import Action, Segment, Trajectory
from ragrl.synth.demonstrators import OracleDemonstrator, answer_turn

VARIANT = "tiresrag"
"""The method's answer normalization (``ragrl.metrics.normalize``)."""

NO_ANSWER_MODES = ("zero", "text")
REFLECTION_MODES = ("paper", "code")
PENALTY_MODES = ("paper", "code", "none")
BASELINES = ("grpo", "reinforce_pp")
STDS = ("population", "sample")


# --- the protocol (§1) --------------------------------------------------------------------------------

TIRESRAG_SYSTEM = (
    "You are a helpful assistant who answers questions. Think the question through inside <think> and "
    "</think> before any answer, and check every key entity it names (people, places, dates, awards). "
    "When you are unsure or need outside knowledge, write a query as <search> query </search>; the top "
    "results come back between <information> and </information>. Read and weigh each new piece of "
    "information; you may search as often as you need. Follow the evidence strictly. Before answering, "
    "check that your answer answers the original question exactly, and prefer the most precise span of "
    "the evidence. Give the final answer inside <answer> and </answer>, for example <answer> Beijing "
    "</answer>. After your first answer you have one chance to reflect: you may stop there, or go over "
    "your reasoning and the information again, search again if needed, and then give the answer again "
    "inside <answer> and </answer>."
)


@dataclass
class TiresragProtocolConfig(SearchR1ProtocolConfig):
    system: str | None = TIRESRAG_SYSTEM
    user: str = "{question}"
    information_prefix: str = "\n\n<information>\n"
    information_suffix: str = "</information>\n\n"
    doc_template: str = "({index}){title} {text}\n"
    doc_separator: str = ""
    no_results: str = "None"
    reflect: bool = True
    """One more pass after the first answer (training); false stops at the first answer (the code's eval)."""
    reflection_cue: str = ""
    """Environment text inserted before the reflection pass (empty: the policy just goes on)."""
    prefill: str = ""
    """Text that opens the assistant turn as part of the prompt (the code prefills ``<think>``); the
    policy's first segment continues it."""
    empty_answer: str = "answer"
    """``<answer> </answer>`` is the answer ``""`` (F1 0; a reflection from right to empty is −1), as the
    code reads it; ``invalid`` answers it with a corrective message instead."""


class TiresragProtocol(SearchR1Protocol):
    name = "tiresrag"

    def __init__(self, config: TiresragProtocolConfig | None = None) -> None:
        super().__init__(config or TiresragProtocolConfig())
        self.prefill = self.config.prefill

    def fixed_texts(self) -> list[str]:
        return [TIRESRAG_SYSTEM, REFLECTION_THOUGHT]

    def after_answer(self, trajectory: Trajectory, action: Action) -> str | None:
        """The reflection pass: once, after the first answer."""
        if not self.config.reflect or len(trajectory.answers) > 1:
            return None
        return self.config.reflection_cue


@dataclass
class TiresragConfig:
    method: str = "tiresrag"
    protocol: TiresragProtocolConfig = field(default_factory=TiresragProtocolConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: list[dict[str, Any]] = field(default_factory=list)
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def load(cls, name_or_path: str | Path = "tiresrag", overrides: Any = None) -> TiresragConfig:
        return to_dataclass(cls, load_method_config(name_or_path, overrides))


def turn_segments(trajectory: Trajectory) -> list[Segment]:
    """The policy segments that are turns, one per action: every one of a live episode; of an episode
    rebuilt from text, those that are not blank (the text between two observations is not a turn)."""
    policy = [s for s in trajectory.segments if s.kind == "policy"]
    if trajectory.metadata.get("replayed_from_text"):
        return [s for s in policy if s.text.strip()]
    return policy


def format_valid(trajectory: Trajectory, prefill: str = "", empty_answer: bool = True) -> bool:
    """The code's format check (§1.5), logged and never rewarded: every turn is ``<think>`` blocks then
    one ``<search>`` (or, for an answer, ``<answer>``) with no stray text, and the episode ends with an
    answer. A reflection declined with nothing (only the end token) is fine; one that writes a
    ``<think>`` block and stops is not (its last tag is not ``</answer>``), nor is an invalid turn. The
    first turn is read with the prefill it continues; an empty ``<answer> </answer>`` is well formed
    (``empty_answer``, the code's reading). Unlike the code's state machine, ``<think>`` is optional in a
    turn."""
    if trajectory.final_answer is None:
        return False
    texts = [s.text for s in turn_segments(trajectory)]
    actions = trajectory.actions
    if not texts or len(texts) != len(actions):
        return False
    texts[0] = prefill + texts[0]
    if actions[-1].kind == "reflect" and not END_TOKEN_TEXT.sub("", texts[-1]).strip():
        texts, actions = texts[:-1], actions[:-1]  # the reflection declined with nothing
    for text, action in zip(texts, actions, strict=True):
        final = action.kind == "answer"
        if action.kind not in ("search", "answer") or not well_formed_turn(
            text, final=final, empty_answer=empty_answer
        ):
            return False
    return bool(actions) and actions[-1].kind == "answer"


def diagnostics(
    trajectory: Trajectory, example: Example, prefill: str = "", empty_answer: bool = True
) -> dict[str, float]:
    """Search counts (Search-R1's), answers per episode, the reflection's transition (by cover-EM of the
    first and last answer), the format check and the judge's unreadable replies (§7.1 "Logging")."""
    out = search_diagnostics(trajectory, example)
    answers = trajectory.answers
    out["answers"] = float(len(answers))
    out["format_valid"] = float(format_valid(trajectory, prefill, empty_answer))
    right = [answer_right(a, example.answers) for a in (answers[0], answers[-1])] if answers else []
    reflected = len(answers) > 1
    out["reflect/none"] = float(not reflected)
    out["reflect/wrong_to_right"] = float(reflected and not right[0] and right[1])
    out["reflect/right_to_wrong"] = float(reflected and right[0] and not right[1])
    out["reflect/unchanged"] = float(reflected and right[0] == right[1])
    for component, failures in judge_parse_failures([trajectory]).items():
        out[f"{component}/parse_failures"] = float(failures)
    return out


def step_diagnostics(
    trajectories: Sequence[Trajectory],
    examples: Sequence[Example],
    results: Sequence[RewardResult],
    config: TrainConfig,
    *,
    answer: str = "tiresrag_answer",
    sufficiency: str = "tiresrag_sufficiency",
) -> dict[str, float]:
    """What the authors tracked over a step (§7.1 "Logging") that needs whole groups or the rewards:

    * ``filter/low_frac``, ``filter/high_frac``: the shares of groups whose answer F1 are all ≤ low or all
      ≥ high (with ``drop_saturated`` on: its thresholds on the component it reads, so the shares it
      drops; otherwise 0.1 and 0.9 on answer F1, the shares it would drop);
    * ``suff/correct_sufficient`` (and the three other cells): the correct × sufficient 2×2 as shares of
      the episodes; correct is cover-EM of the final answer, sufficient is R^S ≥ 0.5;
    * with ``advantage: tiresrag``: the difficulty weight W of the groups (``adv/W_mean``, ``_min``,
      ``_max``) and the consistency penalty A^P of the episodes (``adv/penalty_mean``, ``_max``, and
      ``adv/penalty_share``, the share it touches), as the update used them.
    """
    out: dict[str, float] = {}
    if not results:
        return out
    group_ids = torch.tensor([t.metadata["group"] for t in trajectories])
    totals = torch.tensor([r.total for r in results], dtype=torch.float32)
    components = {
        key: torch.tensor([r.components[key] for r in results], dtype=torch.float32)
        for key in results[0].components
    }
    grpo_config = config.grpo
    edges, on = {"low": 0.1, "high": 0.9}, answer
    if grpo_config.group_filter == "drop_saturated":
        edges.update(grpo_config.group_filter_params)
        on = grpo_config.group_filter_on
    scores = totals if on == "total" else components.get(on)
    if scores is not None:
        below, above = saturated_groups(scores, group_ids, **edges)
        out["filter/low_frac"] = float(below.float().mean())
        out["filter/high_frac"] = float(above.float().mean())
    if sufficiency in components:
        correct = [
            answer_right(t.final_answer, e.answers) for t, e in zip(trajectories, examples, strict=True)
        ]
        sufficient = [r.components[sufficiency] >= 0.5 for r in results]
        for c_name, c in (("correct", True), ("wrong", False)):
            for s_name, s in (("sufficient", True), ("insufficient", False)):
                cell = [x == c and y == s for x, y in zip(correct, sufficient, strict=True)]
                out[f"suff/{c_name}_{s_name}"] = sum(cell) / len(cell)
    if grpo_config.advantage == "tiresrag":
        params = grpo_config.advantage_params
        terms = advantage_terms(
            totals, group_ids, components=components, weights=results[0].weights, **params
        )
        _, groups = batch_groups(totals, group_ids)
        w, pen = groups.mean(terms["weight"]), terms["penalty"]
        out.update({"adv/W_mean": float(w.mean()), "adv/W_min": float(w.min()), "adv/W_max": float(w.max())})
        out.update({"adv/penalty_mean": float(pen.mean()), "adv/penalty_max": float(pen.max()),
                    "adv/penalty_share": float((pen > 0).float().mean())})  # fmt: skip
    return out


# --- the warm start's demonstrator --------------------------------------------------------------------

REFLECTION_THOUGHT = "I read the question and the information again, and my answer stands."


class TiresragOracle:
    """The world's search oracle (``OracleDemonstrator``: one search per gold hop, then the gold answer),
    then the reflection pass: it re-reads and gives the same answer again. A warm start on it teaches
    the pass and its format; what the pass is worth is left to RL. Uses gold fields: an upper bound and
    a source of SFT demonstrations."""

    name = "tiresrag_oracle"

    def __init__(self, prefill: str = "") -> None:
        self.search_oracle: Any = OracleDemonstrator()
        self.prefill = prefill
        """The protocol's prefill: the first turn continues it instead of repeating it."""

    def wrap(self, inner: Any) -> TiresragOracle:  # noqa: ANN401
        """This oracle around another world demonstrator (``--demos quote``: the quoting oracle's
        entity queries and quoted evidence, then the reflection pass)."""
        oracle = TiresragOracle(self.prefill)
        oracle.search_oracle = inner
        return oracle

    def next_turn(self, example: Example, history: list[Turn]) -> str:
        answered = [t.action.content for t in history if t.action.kind == "answer"]
        if answered:
            return answer_turn(REFLECTION_THOUGHT, answered[-1])
        text = self.search_oracle.next_turn(example, history)
        if not history and self.prefill and text.startswith(self.prefill):
            text = text[len(self.prefill) :]
        return text


READS_THE_RESPONSE = ("tiresrag_answer", "tiresrag_sufficiency", "tiresrag_thinking")
"""The components that read the response text as the code does, the protocol's prefill included."""


def with_prefill(components: list[dict[str, Any]], prefill: str) -> list[dict[str, Any]]:
    """The reward components, those that read the response text given the protocol's ``prefill``
    (one set in a component must be the protocol's)."""
    out = []
    for i, spec in enumerate(components):
        if isinstance(spec, Mapping) and spec.get("name") in READS_THE_RESPONSE:
            if spec.get("prefill", prefill) != prefill:
                raise RagrlError(
                    f"reward.{i}.prefill: {spec['prefill']!r} differs from protocol.prefill {prefill!r} "
                    "(leave it out: the component reads the protocol's)"
                )
            spec = {**spec, "prefill": prefill}
        out.append(spec)
    return out


def build_method(cfg: Any) -> Method:
    """TIRESRAG-R1 from a loaded config (``ragrl.methods.load_method``)."""
    config = to_dataclass(TiresragConfig, cfg)
    if not config.reward:
        raise RagrlError("reward: TIRESRAG-R1 needs its reward components (see tiresrag.yaml)")
    g = config.train.grpo
    if (
        g.advantage == "tiresrag"
        and g.advantage_params.get("baseline") == "reinforce_pp"
        and g.whiten == "none"
    ):
        raise RagrlError(
            "train.grpo.advantage_params.baseline: reinforce_pp normalises the advantages over the update "
            "batch: set train.grpo.whiten to token (the code's replay-buffer whitening) or sample"
        )
    return Method(
        name=config.method,
        config=config,
        protocol=TiresragProtocol(config.protocol),
        rollout=config.rollout,
        reward=build_reward(with_prefill(config.reward, config.protocol.prefill)),
        train=config.train,
        diagnostics=functools.partial(
            diagnostics,
            prefill=config.protocol.prefill,
            empty_answer=config.protocol.empty_answer == "answer",
        ),
        step_diagnostics=step_diagnostics,
        oracle=TiresragOracle(config.protocol.prefill),
    )


# --- R^A: the answer reward (§2.1) --------------------------------------------------------------------


def answer_f1(prediction: str, golds: list[str]) -> float:
    """Token F1 with the method's normalization and the yes/no rule, maximised over the gold answers."""
    return float(f1(prediction, golds, variant=VARIANT)[0])


def answer_right(answer: str | None, golds: list[str]) -> bool:
    """Cover-EM with the method's normalization: every token of some gold answer is in the answer (the
    "right" of the paper's R^R, the reflection transitions, the 2×2 and the §4 analysis)."""
    return answer is not None and cover_em(answer, golds, VARIANT) == 1.0


def code_prediction(response: str) -> str:
    """The code's ``extract_answer_math``: the text after the last ``<answer>`` up to its
    ``</answer>``, stripped; the whole response when it has no ``<answer>``."""
    return response.split("<answer>")[-1].split("</answer>")[0].strip()


@register_reward("tiresrag_answer")
def answer_reward(
    trajectory: Trajectory, example: Example, ctx: RewardContext, no_answer: str = "zero", prefill: str = ""
) -> float:
    """R^A: F1 of the last ``<answer>``; without one, 0 (``zero``) or the F1 of what the released code
    extracts from the response, the prefill included (``text``; ``code_prediction``). ``prefill`` is the
    protocol's (``build_method`` sets it)."""
    if no_answer not in NO_ANSWER_MODES:
        raise RagrlError(f"tiresrag_answer.no_answer must be one of {NO_ANSWER_MODES}, got {no_answer!r}")
    if trajectory.final_answer is not None:
        return answer_f1(trajectory.final_answer, example.answers)
    if no_answer == "zero":
        return 0.0
    return answer_f1(code_prediction(response_text(trajectory, prefill)), example.answers)


# --- R^R: the reflection reward (§2.4) ----------------------------------------------------------------


def reflection_value(answers: list[str], golds: list[str], mode: str = "paper") -> float:
    """R^R of an episode whose ``<answer>`` bodies are ``answers``, in writing order."""
    if mode not in REFLECTION_MODES:
        raise RagrlError(f"tiresrag_reflection.mode must be one of {REFLECTION_MODES}, got {mode!r}")
    if not answers:
        return 0.0
    first, last = answers[0], answers[-1]
    if mode == "paper":
        if len(answers) < 2:
            return 0.0
        return float(answer_right(last, golds)) - float(answer_right(first, golds))  # +1, −1 or 0

    def ok(answer: str) -> bool:
        return answer_f1(answer, golds) > 0.5 or answer_right(answer, golds)

    if len(answers) == 1:
        return 0.0 if ok(first) else -1.0
    if not ok(last):
        return -1.0
    if ok(first) and answer_f1(last, golds) < answer_f1(first, golds):
        return -1.0
    return 0.0


@register_reward("tiresrag_reflection")
def reflection_reward(
    trajectory: Trajectory, example: Example, ctx: RewardContext, mode: str = "paper"
) -> float:
    """R^R: did the reflection pass fix a wrong answer (+1) or break a right one (−1)?"""
    return reflection_value(trajectory.answers, example.answers, mode)


# --- advantages: consistency penalty and difficulty weight (§2.8, §3.1, §3.2) ------------------------


def consistency_penalty(
    z_answer: Tensor, z_thinking: Tensor, z_sufficiency: Tensor, *, lam: float = 0.1
) -> Tensor:
    """``A^P = −λ_p · zA · zT · zS`` where that product is negative, else 0 (so ``A^P ≥ 0``)."""
    product = z_answer * z_thinking * z_sufficiency
    return torch.where(product < 0, -lam * product, torch.zeros_like(product))


def advantage_terms(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    components: Mapping[str, Tensor],
    weights: Mapping[str, float] | None = None,
    answer: str = "tiresrag_answer",
    thinking: str = "tiresrag_thinking",
    sufficiency: str = "tiresrag_sufficiency",
    baseline: str = "grpo",
    penalty: str = "paper",
    lam: float = 0.1,
    difficulty: bool | None = None,
    weight_a: float = 0.4,
    weight_b: float = 1.5,
    rho0: float = 0.75,
    k: float = 10.0,
    std: str = "population",
    eps: float = 1e-8,
    penalty_std: str = "population",
    penalty_eps: float = 1e-8,
) -> dict[str, Tensor]:
    """The advantage and its parts, per rollout: ``advantage``, the consistency ``penalty`` A^P (0 where
    off) and the difficulty ``weight`` W of its group (1 where off). ``answer``, ``thinking`` and
    ``sufficiency`` name the reward components (their reporting keys) the estimator reads.

    ``baseline: grpo`` is the group z-score; ``reinforce_pp`` is the code's Reinforce++ path, r − mean_g
    (its normalisation over the update batch is the trainer's ``train.grpo.whiten``, after the filter).
    ``difficulty`` (W) defaults to on for ``grpo`` and off for ``reinforce_pp``, as the code. ``std`` and
    ``eps`` are A_i's group z-score; ``penalty_std`` and ``penalty_eps`` the penalty's (the code's
    ``np.std``, population, + 1e-8, whatever A_i uses)."""
    if baseline not in BASELINES:
        raise RagrlError(f"advantage_params.baseline must be one of {BASELINES}, got {baseline!r}")
    for key, value in (("std", std), ("penalty_std", penalty_std)):
        if value not in STDS:
            raise RagrlError(f"advantage_params.{key} must be one of {STDS}, got {value!r}")
    if penalty not in PENALTY_MODES:
        raise RagrlError(f"advantage_params.penalty must be one of {PENALTY_MODES}, got {penalty!r}")
    if difficulty is None:  # the code's Reinforce++ path has no W
        difficulty = baseline == "grpo"
    wanted: dict[str, str] = {}
    if penalty != "none":
        wanted.update(answer=answer, thinking=thinking, sufficiency=sufficiency)
    if difficulty:
        wanted["sufficiency"] = sufficiency
    missing = [f"{role}={key!r}" for role, key in wanted.items() if key not in components]
    if missing:
        raise RagrlError(
            f"the tiresrag advantage reads the reward components {', '.join(missing)}, which the reward "
            f"does not have (it has {', '.join(map(repr, components)) or 'none'})"
        )
    r, groups = batch_groups(rewards, group_ids)

    def z(x: Tensor, std: str, eps: float) -> Tensor:  # the group z-score (0 in a group of equal values)
        return grpo(x.to(r), group_ids, std=std, eps=eps)

    advantage = z(r, std, eps) if baseline == "grpo" else grpo_mean_only(r, group_ids)
    pen = torch.zeros_like(r)
    if penalty != "none":
        z_a, z_t, z_s = (
            z(components[key], penalty_std, penalty_eps) for key in (answer, thinking, sufficiency)
        )
        if penalty == "code":
            if weights is None or thinking not in weights or sufficiency not in weights:
                raise RagrlError("penalty: code scales by the components' weights in force; none were given")
            z_t, z_s = weights[thinking] * z_t, weights[sufficiency] * z_s
        pen = consistency_penalty(z_a, z_t, z_s, lam=lam)
        advantage = advantage - pen
    w = torch.ones_like(r)
    if difficulty:
        rho = groups.mean(components[sufficiency].to(r))
        w = difficulty_weight(rho, a=weight_a, b=weight_b, rho0=rho0, k=k).to(r)[groups.inverse]
        advantage = advantage * w
    return {"advantage": advantage, "penalty": pen, "weight": w}


@register_advantage("tiresrag")
def tiresrag_advantage(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    components: Mapping[str, Tensor],
    weights: Mapping[str, float] | None = None,
    **params: Any,
) -> Tensor:
    """``A' = (A − A^P) · W(mean_g R^S)`` over each group (module docstring; ``advantage_terms`` takes
    the parameters)."""
    accepted = [p for p in inspect.signature(advantage_terms).parameters if p not in ("rewards", "group_ids")]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise RagrlError(f"advantage_params: the tiresrag advantage takes no {unknown} (it takes {accepted})")
    return advantage_terms(rewards, group_ids, components=components, weights=weights, **params)["advantage"]


# the parameters are advantage_terms', so that a config's advantage_params are checked when it loads
tiresrag_advantage.__signature__ = inspect.signature(advantage_terms)  # type: ignore[attr-defined]
