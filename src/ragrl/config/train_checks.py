"""Every check of a ``train:`` section (``TrainConfig.validate``): each value in its range, each registry
name known, each registered function's parameters taken, and the settings that cannot go together
refused. Errors name the key."""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from ragrl.algos import ADVANTAGES, AGGREGATIONS, FILTERS, KL_ESTIMATORS, POLICY_LOSSES, PREFERENCE_LOSSES
from ragrl.errors import RagrlError
from ragrl.llm.hf_backend import DECODE_MODES
from ragrl.rollout.outcomes import OUTCOMES

WHITEN_MODES = ("none", "sample", "token")


ROLLOUT_BACKENDS = ("transformers", "vllm")


PARALLEL_MODES = ("ddp", "fsdp", "deepspeed")


RETRIEVAL_EVAL_METRICS = (
    *(f"eval/{m}@{k}" for m in ("recall", "full_recall") for k in (2, 5, 10)),
    "eval/map",
    "eval/mrr",
)
"""The retrieval values of a held-out evaluation record (when the questions have gold passages)."""


EVAL_METRICS = (
    "eval/em",
    "eval/f1",
    "eval/em_answerable",
    "eval/answer_rate",
    "eval/searches",
    "eval/top_answer_share",
    "eval/n",
    *RETRIEVAL_EVAL_METRICS,
    *(f"eval/outcome/{name}" for name in OUTCOMES),
)
"""The numeric values of a held-out evaluation record (``ragrl.train.base.Trainer.evaluate``); the
retrieval ones are there when the questions have gold passages, the outcomes' shares of the questions
(``ragrl.rollout.outcomes``) always, and the method's own diagnostics come as ``eval/method/<name>``
(R²AG's ``tree_recall``, ...)."""


ALGOS = ("grpo", "cycles")


def check_train_config(config: Any) -> None:
    """Check a ``TrainConfig`` (``load_method`` calls it through ``TrainConfig.validate``, so a typo fails
    when the config loads, before any model or data is read). An unquoted YAML ``no`` in
    ``mixed_precision`` is read back as ``"no"``."""
    g = config.grpo
    for key, name, registry in (
        ("train.grpo.advantage", g.advantage, ADVANTAGES),
        ("train.grpo.kl", g.kl, KL_ESTIMATORS),
        ("train.grpo.loss_agg", g.loss_agg, AGGREGATIONS),
        ("train.grpo.group_filter", g.group_filter, FILTERS),
        ("train.grpo.pg_loss", g.pg_loss, POLICY_LOSSES),
        ("train.dpo.loss_type", config.dpo.loss_type, PREFERENCE_LOSSES),
    ):
        registry.get(name, key=key)
    for key, fn, params, own in (
        ("train.grpo.advantage_params", ADVANTAGES.get(g.advantage), g.advantage_params,
         ("rewards", "group_ids", "components", "weights")),
        ("train.grpo.group_filter_params", FILTERS.get(g.group_filter), g.group_filter_params,
         ("scores", "group_ids")),
        ("train.grpo.kl_params", KL_ESTIMATORS.get(g.kl), g.kl_params, ("logp", "ref_logp")),
    ):  # fmt: skip
        _check_params(key, fn, params, own)
    c = config.cycles
    if config.algo not in ALGOS:
        raise RagrlError(f"train.algo must be one of {', '.join(ALGOS)}, got {config.algo!r}")
    for key, value, allowed in (
        ("train.cycles.policy_pair_scorer", c.policy_pair_scorer, ("true_return", "rm")),
        ("train.cycles.rm_labels", c.rm_labels, ("shared_total", "per_component")),
        ("train.cycles.return_mode", c.return_mode, ("prefix", "rollout")),
    ):
        if value not in allowed:
            raise RagrlError(f"{key} must be one of {', '.join(allowed)}, got {value!r}")
    if c.questions_per_cycle < 1 or c.n_candidates < 2 or c.rm_batch_size < 1:
        raise RagrlError(
            "train.cycles: questions_per_cycle and rm_batch_size must be >= 1 and n_candidates >= 2, got "
            f"{c.questions_per_cycle}, {c.rm_batch_size} and {c.n_candidates}"
        )
    if not 0.0 <= c.rm_val_fraction < 1.0 or c.rm_pair_threshold < 0 or c.pref_margin < 0:
        raise RagrlError(
            "train.cycles: rm_val_fraction must be in [0, 1) and the pair thresholds >= 0, got "
            f"{c.rm_val_fraction}, {c.rm_pair_threshold} and {c.pref_margin}"
        )
    if g.whiten not in WHITEN_MODES:
        raise RagrlError(f"train.grpo.whiten must be one of {', '.join(WHITEN_MODES)}, got {g.whiten!r}")
    if not 0.0 <= g.clip_low < 1.0 or g.clip_high < 0.0:
        raise RagrlError(
            f"train.grpo.clip_low must be in [0, 1) and train.grpo.clip_high >= 0, got "
            f"{g.clip_low} and {g.clip_high}"
        )
    for name, value in (
        ("train.steps", config.steps),
        ("train.grpo.prompts_per_step", g.prompts_per_step),
        ("train.grpo.ppo_epochs", g.ppo_epochs),
        ("train.grpo.minibatches", g.minibatches),
        ("train.sft.batch_size", config.sft.batch_size),
        ("train.sft.epochs", config.sft.epochs),
        ("train.dpo.batch_size", config.dpo.batch_size),
        ("train.dpo.epochs", config.dpo.epochs),
    ):
        if value < 1:
            raise RagrlError(f"{name} must be >= 1, got {value}")
    for name, value in (
        ("train.optim.warmup_steps", config.optim.warmup_steps),
        ("train.grpo.micro_batch_size", g.micro_batch_size),
        ("train.grpo.refill_rounds", g.refill_rounds),
        ("train.sft.max_steps", config.sft.max_steps),
        ("train.dpo.max_steps", config.dpo.max_steps),
        ("train.dpo.micro_batch_size", config.dpo.micro_batch_size),
        ("train.eval_every", config.eval_every),
        ("train.save_every", config.save_every),
    ):
        if value < 0:
            raise RagrlError(f"{name} must be >= 0, got {value}")
    if g.prompts_per_step % g.minibatches:
        raise RagrlError(
            f"train.grpo.prompts_per_step ({g.prompts_per_step}) must be a multiple of "
            f"train.grpo.minibatches ({g.minibatches}): minibatches hold whole groups"
        )
    if not 0.0 <= g.name_swap <= 1.0:
        raise RagrlError(f"train.grpo.name_swap is a share of samples in [0, 1], got {g.name_swap}")
    if g.rename_world and config.algo != "grpo":
        raise RagrlError(
            f"train.grpo.rename_world renames the worlds of GRPO's rollouts; train.algo {config.algo!r} "
            "plays none (set it false)"
        )
    if g.name_swap and g.old_logprobs == "rollout":
        raise RagrlError(
            "train.grpo.name_swap renames the sampled tokens: their rollout log-probs no longer apply "
            "(train.grpo.old_logprobs auto or recompute)"
        )
    if g.old_logprobs not in ("auto", "recompute", "rollout"):
        raise RagrlError(f"train.grpo.old_logprobs must be auto|recompute|rollout, got {g.old_logprobs!r}")
    if g.tis_cap and (g.tis_cap < 1.0 or g.old_logprobs == "rollout"):
        raise RagrlError(
            f"train.grpo.tis_cap must be 0 (off) or >= 1 with old_logprobs auto or recompute, got "
            f"{g.tis_cap} with {g.old_logprobs!r}"
        )
    if config.model.decode not in DECODE_MODES:
        raise RagrlError(
            f"train.model.decode must be one of {', '.join(DECODE_MODES)}, got {config.model.decode!r}"
        )
    e = config.engine
    if e.backend not in ROLLOUT_BACKENDS:
        raise RagrlError(
            f"train.engine.backend must be one of {', '.join(ROLLOUT_BACKENDS)}, got {e.backend!r}"
        )
    if e.sync_every < 1:
        raise RagrlError(f"train.engine.sync_every must be >= 1, got {e.sync_every}")
    if e.backend == "vllm" and config.save_every % e.sync_every:
        raise RagrlError(
            f"train.save_every ({config.save_every}) must be a multiple of train.engine.sync_every "
            f"({e.sync_every}): a run resumed between syncs would sample from other weights"
        )
    if e.backend == "vllm" and g.old_logprobs == "rollout":
        raise RagrlError(
            "train.grpo.old_logprobs: rollout with train.engine.backend: vllm: the engine's log-probs "
            "are up to sync_every - 1 steps stale and, under top-k / top-p, of the truncated "
            "distribution; use auto (recomputed, and compared with the engine's)"
        )
    if g.tis_cap and g.name_swap:
        raise RagrlError(
            "train.grpo.tis_cap weights each token by the engine's probability of sampling it: not with "
            "train.grpo.name_swap (renamed tokens were not sampled)"
        )
    if e.backend == "vllm" and config.algo != "grpo":
        raise RagrlError(
            f"train.engine.backend: vllm plays GRPO's rollouts; train.algo {config.algo!r} generates with "
            "the policy (set train.engine.backend: transformers)"
        )
    if e.backend == "vllm" and (config.model.lora is not None or config.parallel.mode != "ddp"):
        raise RagrlError(
            "train.engine.backend: vllm takes the whole policy's weights from one process: not with "
            "train.model.lora nor train.parallel.mode fsdp / deepspeed (yet)"
        )
    if not 0.0 <= config.sft.name_swap <= 1.0:
        raise RagrlError(
            f"train.sft.name_swap is a share of demonstrations in [0, 1], got {config.sft.name_swap}"
        )
    if config.sft.turns not in ("all", "last"):
        raise RagrlError(f"train.sft.turns must be all|last, got {config.sft.turns!r}")
    if config.mixed_precision == "False":  # YAML reads an unquoted `no` as the boolean false
        config.mixed_precision = "no"
    if config.mixed_precision not in ("no", "bf16", "fp16"):
        raise RagrlError(f"train.mixed_precision must be no|bf16|fp16, got {config.mixed_precision!r}")
    if config.cpu_mixed_precision and config.mixed_precision == "fp16":
        raise RagrlError(
            f"train.cpu_mixed_precision with train.mixed_precision {config.mixed_precision!r}: the CPU's "
            "autocast is bf16; use train.mixed_precision=bf16"
        )
    if config.dpo.beta <= 0 or not 0.0 <= config.dpo.label_smoothing < 0.5:
        raise RagrlError(
            f"train.dpo.beta must be > 0 and train.dpo.label_smoothing in [0, 0.5), got {config.dpo.beta} "
            f"and {config.dpo.label_smoothing}"
        )
    if config.patience < 0 or (config.patience and not config.best_metric):
        raise RagrlError(
            f"train.patience must be >= 0 and needs train.best_metric, got {config.patience} with "
            f"best_metric {config.best_metric!r}"
        )
    if config.best_mode not in ("max", "min"):
        raise RagrlError(f"train.best_mode must be max|min, got {config.best_mode!r}")
    if config.parallel.mode not in PARALLEL_MODES:
        raise RagrlError(
            f"train.parallel.mode must be one of {', '.join(PARALLEL_MODES)}, got {config.parallel.mode!r}"
        )
    if config.parallel.zero_stage not in (1, 2, 3):
        raise RagrlError(f"train.parallel.zero_stage must be 1, 2 or 3, got {config.parallel.zero_stage}")
    if config.parallel.mode == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        raise RagrlError(
            "train.parallel.mode: deepspeed is not installed (pip install deepspeed, or the "
            "`deepspeed` extra: pip install 'ragrl[deepspeed]')"
        )
    if config.parallel.mode != "ddp" and config.mixed_precision == "fp16":
        raise RagrlError(
            f"train.mixed_precision: fp16 under train.parallel.mode {config.parallel.mode} has no loss "
            "scaling in ragrl; use bf16"
        )
    if not config.max_seconds >= 0:  # NaN included
        raise RagrlError(f"train.max_seconds must be >= 0 (0: no time budget), got {config.max_seconds}")
    if config.best_metric and not (
        config.best_metric in EVAL_METRICS or config.best_metric.startswith("eval/method/")
    ):
        raise RagrlError(
            f"train.best_metric names a held-out evaluation value ({', '.join(EVAL_METRICS)}, or a "
            f"method's eval/method/<name>), got "
            f"{config.best_metric!r}"
        )
    names = [st.name for st in config.stages]
    if len(set(names)) != len(names) or not all(n.replace("-", "_").isidentifier() for n in names):
        raise RagrlError(f"train.stages: stage names must be distinct identifiers, got {names}")
    for i, st in enumerate(config.stages):
        if st.start_from not in ("previous", "previous_best", "config"):
            raise RagrlError(
                f"train.stages[{i}].start_from must be previous|previous_best|config, got {st.start_from!r}"
            )
        if st.start_from == "previous_best" and not config.best_metric:
            raise RagrlError(f"train.stages[{i}] starts from the previous best: set train.best_metric")
        bad = [o for o in st.overrides if "=" not in o or o.startswith(("train.stages", "train.out="))]
        if bad:
            raise RagrlError(f"train.stages[{i}].overrides: not key=value or not allowed in a stage: {bad}")
        changes = [o for o in st.overrides if o.startswith("train.parallel")]
        if changes:  # the processes and their checkpoints keep one layout through the run
            raise RagrlError(
                f"train.stages[{i}].overrides: a stage cannot change train.parallel ({changes}); set it "
                "for the whole run"
            )
    if not 0.0 <= config.optim.min_lr_ratio < 1.0 or (
        config.optim.min_lr_ratio and config.optim.schedule != "cosine"
    ):
        raise RagrlError(
            f"train.optim.min_lr_ratio must be in [0, 1) and needs schedule: cosine, got "
            f"{config.optim.min_lr_ratio} with {config.optim.schedule}"
        )
    if config.optim.schedule not in ("constant", "linear", "cosine"):
        raise RagrlError(
            f"train.optim.schedule must be constant|linear|cosine, got {config.optim.schedule!r}"
        )


def _check_params(key: str, fn: Any, params: Mapping[str, Any], own: Sequence[str]) -> None:
    """Refuse a parameter that the registered function ``fn`` does not take (its first arguments,
    ``own``, are the trainer's to pass); a function that takes ``**kwargs`` checks its own."""
    signature = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.values()):
        return
    accepted = [name for name in signature if name not in own]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise RagrlError(
            f"{key}: {fn.__name__} takes no {', '.join(map(repr, unknown))} "
            f"(it takes {', '.join(accepted) or 'nothing'})"
        )
