"""ragrl inside verl: a method's reward as verl's reward function, ragrl's advantage estimators in verl's
registry, and ragrl questions as verl's dataset (docs/scale.md).

verl (``pip install 'ragrl[verl]'``; here ``make verl-env``) trains with its own workers; what ragrl adds
is each paper's protocol, reward and advantage, faithful to its code. This module imports without verl;
``register_estimators`` needs it.

**The reward.** In verl's config (its Hydra schema has no ``reward_kwargs`` key: the ``+`` adds it)::

    reward.custom_reward_function.path=pkg://ragrl.integrations.verl
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs={method: search_r1}

verl 0.9.1's reward loop scores one response at a time (``compute_score``, called from threads: the
method is loaded once, under a lock); ``compute_score_batch`` is the same for a caller that has a
batch. A response is read back into a ``Trajectory`` by the method's protocol (the text verl decoded,
observations included: ``ragrl.rollout.replay``), its question comes from the row's ``extra_info``
(``write_parquet`` puts the whole ``Example`` there) or, for verl's own datasets, from the ground truth
(a string, a list, or verl's Search-R1 ``{"target": [...]}``), and the method's reward scores it:
``score`` is the weighted total, every component is reported beside it, the same numbers as
``ragrl reward``. Refused: methods whose episodes text cannot carry (a protocol with its own replay:
EVO-RAG's and R²AG's retrieved ids; a rollout other than the linear one) and protocols that prefill
the answer (the prefill is not in verl's prompt). A scheduled reward is scored at its step-0 weights:
verl passes no step.

**The advantages.** ``register_estimators()`` registers each ragrl estimator that reads only the
rewards and the groups as ``ragrl_<name>`` (``algorithm.adv_estimator=ragrl_grpo``, ...), at the
estimator's default parameters (a method's ``advantage_params`` are not carried over). It must run in
the process that computes the advantages (verl's trainer); with Ray, a worker setup hook
(``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=ragrl.integrations.verl.register_estimators``)
is the way, not yet tried in a verl run. verl calls an estimator with ``token_level_rewards`` (their
sum is the response's reward), ``response_mask`` and ``index`` (the group of each response); the
advantage is broadcast over the response's tokens, and the returns equal it. Estimators that read the
reward's components (TIRESRAG-R1's) are not registered: verl hands an estimator no components.
"""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from ragrl.algos import ADVANTAGES, compute_advantages
from ragrl.config import Method
from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods import load_method
from ragrl.rewards import RewardContext
from ragrl.rollout.protocol import Protocol
from ragrl.rollout.replay import trajectory_from_completion

PREFIX = "ragrl_"
"""verl's name of a ragrl estimator: ``ragrl_grpo``, ``ragrl_rloo``, ..."""


_METHODS: dict[tuple[str, tuple[str, ...]], Method] = {}
_LOCK = threading.Lock()  # verl's reward loop calls compute_score from many threads at once


def loaded_method(name: str, overrides: Sequence[str] = ()) -> Method:
    """The method, loaded once per process and (name, overrides), under a lock (verl calls from many
    threads)."""
    key = (str(name), tuple(str(o) for o in overrides))
    with _LOCK:
        if key not in _METHODS:
            _METHODS[key] = load_method(key[0], list(key[1]))
        return _METHODS[key]


def _method(name: str, overrides: tuple[str, ...]) -> Method:
    """The method, loaded once, checked for what text can carry."""
    m = loaded_method(name, overrides)
    if type(m.protocol).replay is not Protocol.replay or m.rollout.kind != "multi_turn":
        raise RagrlError(
            f"{name}: its episodes carry more than text (its own replay or a {m.rollout.kind!r} "
            "rollout), which verl's decoded responses cannot give back; not on verl yet"
        )
    if m.protocol.prefill:
        raise RagrlError(
            f"{name}: its protocol prefills the answer with {m.protocol.prefill!r}, which verl's "
            "prompt would not hold; not on verl yet"
        )
    return m


def _example(ground_truth: Any, extra_info: Any, row: int) -> Example:
    """The row's question: the ``Example`` ``write_parquet`` put in ``extra_info``, or, for a dataset
    of verl's own, one made of the ground truth (a string or a list of answers)."""
    record = (extra_info or {}).get("ragrl_example") if isinstance(extra_info, dict) else None
    if record is not None:
        return Example.from_record(json.loads(record) if isinstance(record, str) else record, line=row)
    if ground_truth is None:
        raise RagrlError(f"row {row}: neither extra_info.ragrl_example nor a ground truth to score against")
    if isinstance(ground_truth, dict):  # verl's own Search-R1 data: {"target": [...]}
        if "target" not in ground_truth:
            raise RagrlError(f"row {row}: a ground truth mapping without 'target': {sorted(ground_truth)}")
        ground_truth = ground_truth["target"]
    if hasattr(ground_truth, "tolist"):  # a numpy array, as parquet gives lists back
        ground_truth = ground_truth.tolist()
    if isinstance(ground_truth, str):
        answers = [ground_truth]
    elif isinstance(ground_truth, (list, tuple)):
        answers = [str(a) for a in ground_truth]
    else:
        raise RagrlError(f"row {row}: a ground truth of type {type(ground_truth).__name__}")
    ex_id = str((extra_info or {}).get("index", row)) if isinstance(extra_info, dict) else str(row)
    return Example(id=ex_id, question="", answers=answers)


def compute_score_batch(
    data_sources: Sequence[Any],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Any] | None = None,
    *,
    method: str = "search_r1",
    overrides: Sequence[str] = (),
    step: int = 0,
    total_steps: int = 1,
    **_: Any,
) -> list[dict[str, float]]:
    """The method's reward of each response, in one batch: ``{"score": total, <component>: value}``."""
    m = _method(method, tuple(overrides))
    extra_infos = list(extra_infos) if extra_infos is not None else [None] * len(solution_strs)
    if not len(data_sources) == len(solution_strs) == len(ground_truths) == len(extra_infos):
        raise RagrlError(
            f"compute_score_batch: {len(data_sources)} data sources, {len(solution_strs)} responses, "
            f"{len(ground_truths)} ground truths and {len(extra_infos)} extra infos"
        )
    examples = [_example(g, x, i) for i, (g, x) in enumerate(zip(ground_truths, extra_infos, strict=True))]
    trajectories = [
        trajectory_from_completion(ex.id, text, m.protocol, fallback=m.rollout.answers_invalid)
        for ex, text in zip(examples, solution_strs, strict=True)
    ]
    results = m.reward.score(trajectories, examples, RewardContext(step=step, total_steps=total_steps))
    return [{"score": float(r.total), **{k: float(v) for k, v in r.components.items()}} for r in results]


def compute_score(
    data_source: Any,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    method: str = "search_r1",
    overrides: Sequence[str] = (),
    **kwargs: Any,
) -> dict[str, float]:
    """One response's reward (verl's naive reward manager): ``compute_score_batch`` of one."""
    return compute_score_batch(
        [data_source], [solution_str], [ground_truth], [extra_info], method=method, overrides=overrides,
        **kwargs,
    )[0]  # fmt: skip


def advantage_estimator(name: str) -> Any:
    """ragrl's estimator ``name`` with verl's signature: ``(token_level_rewards, response_mask, index=None,
    config=None, **kwargs) -> (advantages, returns)``, each ``[batch, response length]``."""
    if _reads_components(name):
        raise RagrlError(f"the {name!r} estimator reads the reward's components, which verl does not pass")

    def estimate(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: Sequence[Any] | None = None,
        config: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if index is None:
            raise RagrlError(f"{PREFIX}{name}: verl gave no index (the uid of each response's group)")
        groups: dict[Any, int] = {}
        group_ids = torch.tensor([groups.setdefault(u, len(groups)) for u in index])
        rewards = token_level_rewards.sum(dim=-1).float()
        with torch.no_grad():
            advantages = compute_advantages(name, rewards.cpu(), group_ids).to(token_level_rewards.device)
        per_token = advantages[:, None] * response_mask
        return per_token, per_token

    estimate.__name__ = f"{PREFIX}{name}"
    return estimate


def _reads_components(name: str) -> bool:
    return "components" in inspect.signature(ADVANTAGES.get(name)).parameters


def estimator_names() -> list[str]:
    """The ragrl estimators verl can call (those that read only rewards and groups)."""
    return [n for n in ADVANTAGES.names() if not _reads_components(n)]


def register_estimators() -> list[str]:
    """Register ``ragrl_<name>`` in verl's advantage registry for each of ``estimator_names()`` (again is
    fine); the names registered."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

    names = []
    for name in estimator_names():
        key = f"{PREFIX}{name}"
        if key not in ADV_ESTIMATOR_REGISTRY:
            register_adv_est(key)(advantage_estimator(name))
        names.append(key)
    return names


def verl_rows(
    examples: Iterable[Example],
    method: str = "search_r1",
    data_source: str = "ragrl",
    overrides: Sequence[str] = (),
    agent_name: str | None = None,
) -> list[dict]:
    """ragrl questions as verl dataset rows, prepared as the method prepares its training questions:
    ``prompt`` (the method's chat messages), ``data_source``, ``reward_model`` (rule-based, the gold
    answers as ground truth), ``extra_info`` (the row's index, the question's id and the whole
    ``Example`` for ``compute_score`` and the agent loop) and, when given, ``agent_name`` (the agent
    loop verl plays the row with: ``ragrl_agent`` for ``ragrl.integrations.verl_agent``)."""
    # scored from text by compute_score: only what text carries; played by ragrl's agent loop: any method
    m = _method(method, tuple(overrides)) if agent_name is None else loaded_method(method, overrides)
    rows = []
    for i, ex in enumerate(m.prepare_examples(list(examples), "verl rows")):
        rows.append(
            {
                "data_source": data_source,
                "prompt": m.protocol.messages(ex),
                "ability": "multi-hop-qa",
                "reward_model": {"style": "rule", "ground_truth": list(ex.answers)},
                "extra_info": {"index": i, "id": ex.id, "ragrl_example": json.dumps(ex.to_record())},
                **({"agent_name": agent_name} if agent_name else {}),
            }
        )
    return rows


def write_parquet(
    examples: Iterable[Example],
    path: str | Path,
    method: str = "search_r1",
    data_source: str = "ragrl",
    overrides: Sequence[str] = (),
    agent_name: str | None = None,
) -> int:
    """``verl_rows`` written as the parquet file verl's ``RLHFDataset`` reads; the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = verl_rows(examples, method, data_source, overrides, agent_name)
    if not rows:
        raise RagrlError(f"{path}: no questions to write")
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return len(rows)


if __name__ == "__main__":  # the path verl's reward.custom_reward_function.path wants
    print(Path(__file__).resolve())
