"""Preference cycles: rollouts with sibling candidates, one reward-model epoch and one DPO epoch a step.

EVO-RAG's training loop (spec §3.1-3.6; RAG-Gym's process supervision has the same shape), selected
with ``train.algo: cycles``. One step of ``CycleTrainer`` is one cycle, top to bottom:

1. the next ``train.cycles.questions_per_cycle`` training questions (a shuffled pass over the set) are
   played once each with the method's rollout, sampling as in training;
2. every visited state gets ``n_candidates - 1`` sibling actions beside the one the episode took, each
   scored as a branch with the method's reward (``ragrl.train.siblings``);
3. the reward model trains one epoch on the pairs whose returns differ by at least
   ``rm_pair_threshold`` (Δ): one head per reward component on the frozen reference's last-token
   embeddings, and beside it the single-head control; the pairs of a fixed share of the training
   questions (``rm_val_fraction``) are never trained on and give the validation loss and accuracy;
4. the policy trains one DPO epoch (``train.dpo``: β, loss, reference or reference-free; batches of
   ``train.dpo.batch_size``) on one pair per state, its best and worst sibling when they differ by at
   least ``pref_margin`` (δ), scored by the true return or by the reward model.

On several processes (``accelerate launch`` / ``torchrun``, any ``train.parallel.mode``) each process
plays an equal, contiguous share of the cycle's questions (episodes and siblings seeded by the question's
place in the whole cycle, so they are the ones one process would play), trains the reward model on its own
pairs with the heads' gradients added over processes (every process then holds the same heads), and
takes, from each shuffled DPO batch of the cycle's policy pairs, the pairs it made: one process's update
on all the pairs. Under a sharded engine (FSDP, ZeRO) every forward is collective, so a process with
fewer embeddings or pairs than another pads with passes that add nothing.

The shared trainer evaluates every ``train.eval_every`` cycles, keeps the best policy
(``train.best_metric``), stops after ``train.patience`` evaluations without a new best (EVO-RAG: dev EM,
2 cycles), checkpoints with exact resume (the reward-model heads and their optimizers included), and
``train.stages`` runs the curriculum stages, each from the previous stage's best policy.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object

from ragrl.config import Method
from ragrl.config.train import TrainConfig
from ragrl.errors import RagrlError
from ragrl.rewards.registry import RewardContext
from ragrl.train.base import Trainer
from ragrl.train.dpo import DPOTrainer
from ragrl.train.reward_model import (
    MultiHeadRewardModel,
    RewardModelConfig,
    RewardModelTrainer,
    embed_sequences,
    embedding_passes,
)
from ragrl.train.siblings import VisitedState, policy_pairs, reward_model_pairs, sample_siblings
from ragrl.train.state import read_trainer_state
from ragrl.train.step_metrics import mean_of

RM_FILES = {"multi": "reward_model", "single": "reward_model_single"}


class _AdaptersOff(torch.nn.Module):
    """The LoRA policy's base model as a frozen encoder: every call runs with the adapters off."""

    def __init__(self, policy: Any) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, **kwargs: Any) -> Any:
        with self.policy.disable_adapter():
            return self.policy(**kwargs)


class CycleTrainer(DPOTrainer):
    kind = "cycle"

    def __init__(
        self,
        method: Method,
        config: TrainConfig,
        *,
        train_examples: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        Trainer.__init__(self, method, config, **kwargs)
        if method.reward.keys and not method.reward.per_step:
            raise RagrlError(f"train.algo cycles needs a per-step reward; {method.name}'s is per episode")
        c = config.cycles
        if c.questions_per_cycle % self.acc.num_processes:
            raise RagrlError(
                f"train.cycles.questions_per_cycle ({c.questions_per_cycle}) must be a multiple of the "
                f"number of processes ({self.acc.num_processes}): each plays an equal share"
            )
        self.train_examples = self.training_questions(train_examples)
        self._setup_reference()
        updates = config.steps * math.ceil(
            c.questions_per_cycle * method.rollout.max_turns / config.dpo.batch_size
        )
        self._prepare(len(self.train_examples), updates, lr=config.dpo.lr)
        if self.ref_model is not None:  # placed as the policy is (sharded too under FSDP and ZeRO-3)
            self.ref_model = self.parallel.prepare_frozen(self.ref_model)
        if self.ref_model is None and config.model.lora is None:  # before a cycle is played
            self._encoder()  # raises: the reward model has nothing to embed with
        self.rollout = method.make_rollout(self.backend, self.retriever)
        ids = sorted(ex.id for ex in self.train_examples)
        random.Random(config.seed).shuffle(ids)
        self.rm_held_out = set(ids[: round(len(ids) * c.rm_val_fraction)])
        """The questions whose pairs validate the reward model (never trained on)."""
        self.reward_models: dict[str, tuple[MultiHeadRewardModel, torch.optim.Optimizer]] = {}
        self.padding_passes = 0
        """The cycle's forward passes that joined a lockstep engine's collectives and added nothing, on
        every process (the DPO epoch's and the reward model's embeddings, where the shares differ)."""

    @property
    def total_steps(self) -> int:
        return self.config.steps

    # -- one cycle ----------------------------------------------------------------------------------------
    def step(self) -> dict[str, Any]:
        c, t0 = self.config.cycles, time.perf_counter()
        per_process = c.questions_per_cycle // self.acc.num_processes
        offset = self.acc.process_index * per_process
        indices = self.sampler.take(c.questions_per_cycle)[offset : offset + per_process]
        questions = [self.train_examples[i] for i in indices]
        seed = self.config.seed * 1_000_003 + self.step_count
        self.padding_passes = 0

        # 1. one episode per question of this process's share, sampling (numbered within the whole cycle)
        self.policy.eval()
        ctx = RewardContext(step=self.step_count, total_steps=self.total_steps)
        with self.parallel.generating(self.model, self.backend):  # sharded: gathered once for the cycle
            episodes = self.rollout.run(questions, n=1, seed=seed, first_group=offset)
            results = self.method.reward.score(episodes, questions, ctx)

            # 2. sibling candidates at every visited state, each scored as a branch
            states = sample_siblings(
                self.method,
                self.backend,
                self.retriever,
                episodes,
                questions,
                n_candidates=c.n_candidates,
                temperature=c.temperature,
                seed=seed,
                ctx=ctx,
                return_mode=c.return_mode,
            )
        returns = "rollout_return" if c.return_mode == "rollout" else "prefix_return"
        t_rollout = time.perf_counter() - t0

        # 3. the reward model: one epoch on the Δ-filtered pairs (multi-head, and the one-head control)
        metrics: dict[str, Any] = {}
        rm_pairs = reward_model_pairs(states, c.rm_pair_threshold, c.rm_labels, returns)
        if self.global_sum(len(rm_pairs)):
            metrics.update(self._train_reward_model("multi", list(self.method.reward.keys), rm_pairs))
            if c.single_head_control:
                shared = reward_model_pairs(states, c.rm_pair_threshold, "shared_total", returns)
                if self.global_sum(len(shared)):
                    metrics.update(self._train_reward_model("single", ["total"], shared))
        if c.policy_pair_scorer == "rm":
            self._score_with_reward_model(states)

        # 4. the policy: one DPO epoch on one pair per state (best vs worst sibling, margin δ)
        pairs = policy_pairs(states, c.pref_margin, "rm_score" if c.policy_pair_scorer == "rm" else returns)
        self.policy.train()
        dpo = self._dpo_epoch(pairs, seed)
        self.step_count += 1

        metrics.update(dpo)
        metrics.update(_mean_rows(self._everyone(_episode_rows(episodes, questions, results, self.method))))
        metrics.update(_pair_metrics(self._everyone([_pair_counts(states, rm_pairs, pairs)])))
        metrics["padding_passes"] = self.padding_passes
        metrics.update(seconds_rollout=round(t_rollout, 2), step_seconds=round(time.perf_counter() - t0, 2))
        return metrics

    def _everyone(self, items: list[Any]) -> list[Any]:
        """``items`` of every process, in process order."""
        return gather_object(items) if self.acc.num_processes > 1 else items

    def _dpo_epoch(self, pairs: list[Any], seed: int) -> dict[str, Any]:
        """One pass over every process's ``pairs`` (in process order) in shuffled batches of
        ``train.dpo.batch_size`` (the last may be smaller); each process trains on the pairs of a batch
        that it made, padded to the same micro-batch passes under a lockstep engine."""
        counts = [int(n) for n in self._everyone([len(pairs)])]
        total = sum(counts)
        if not total:
            return {"dpo/updates": 0}
        starts = [sum(counts[:p]) for p in range(len(counts))]  # each process's first pair
        first = starts[self.acc.process_index]
        order = list(range(total))
        random.Random(seed).shuffle(order)
        size, micro = self.config.dpo.batch_size, self.config.dpo.micro_batch_size
        rows = []
        for i in range(0, total, size):
            batch = order[i : i + size]
            shares = [sum(a <= j < a + n for j in batch) for a, n in zip(starts, counts, strict=True)]
            pieces = [math.ceil(n / micro) if micro else int(n > 0) for n in shares]
            mine = [pairs[j - first] for j in batch if first <= j < first + len(pairs)]
            passes = [max(pieces) if self.parallel.lockstep else max(n, 1) for n in pieces]
            self.padding_passes += sum(passes) - sum(pieces)
            rows.append(
                (len(batch), self.preference_update(mine, len(batch), passes[self.acc.process_index]))
            )
        n = sum(k for k, _ in rows)
        out = {f"dpo/{key}": sum(k * r[key] for k, r in rows) / n for key in rows[0][1] if key != "lr"}
        return {**out, "dpo/updates": len(rows), "lr": rows[-1][1]["lr"], "loss": out["dpo/loss"]}

    # -- the reward model ------------------------------------------------------------------------------
    def _encoder(self) -> Any:
        if self.ref_model is not None:
            return self.ref_model
        if self.config.model.lora is not None:
            return _AdaptersOff(self.policy)
        raise RagrlError(
            "the reward model embeds with the frozen reference, and a reference-free run without LoRA has "
            "none: set train.dpo.reference_free false, or use LoRA"
        )

    def _train_reward_model(self, which: str, heads: list[str], pairs: list[Any]) -> dict[str, float]:
        c = self.config.cycles
        config = RewardModelConfig(
            heads=heads, epochs=1, batch_size=c.rm_batch_size, lr=c.rm_lr, seed=self.config.seed
        )
        model, optimizer = self.reward_models.get(which, (None, None))
        trainer = RewardModelTrainer(
            self._encoder(),
            self.pad_id,
            pairs,
            config,
            name=str(self.config.model.path or ""),
            model=model,
            optimizer=optimizer,
            held_out=self.rm_held_out,
            acc=self.acc,
            lockstep=self.parallel.lockstep,
        )
        self.reward_models[which] = (trainer.model, trainer.optimizer)
        self.padding_passes += trainer.padding_passes
        record = trainer.train()[-1]
        out = {f"rm/{which}/{k}": v for k, v in record.items() if k != "epoch" and isinstance(v, float)}
        return {
            **out,
            f"rm/{which}/pairs": len(trainer.train_rows),
            f"rm/{which}/val_pairs": len(trainer.val_rows),
        }

    def _score_with_reward_model(self, states: list[VisitedState]) -> None:
        """Each candidate's ``rm_score``: the multi-head reward model's mean head score."""
        if "multi" not in self.reward_models:
            return  # no pairs trained it yet: every rm_score stays 0 and no policy pair passes a margin
        model = self.reward_models["multi"][0]
        candidates = [(s, c) for s in states for c in s.candidates]
        passes = 0
        if self.parallel.lockstep:  # the encoder is sharded: every process makes as many passes
            own = embedding_passes(len(candidates))
            passes = int(self.global_max(own))
            self.padding_passes += int(passes * self.acc.num_processes - self.global_sum(own))
        if not (candidates or passes):
            return
        emb = embed_sequences(
            self._encoder(), [s.prompt_ids + c.token_ids for s, c in candidates], self.pad_id, passes=passes
        )
        with torch.no_grad():
            scores = model(emb).mean(dim=1).tolist()
        for (_, c), score in zip(candidates, scores, strict=True):
            c.rm_score = float(score)

    # -- checkpoints: the reward models go with the policy --------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        return {"reward_models": sorted(self.reward_models)}

    def save_extra(self, folder: Path) -> None:
        for which, (model, optimizer) in self.reward_models.items():
            model.save(folder / RM_FILES[which])
            torch.save(optimizer.state_dict(), folder / RM_FILES[which] / "optimizer.pt")

    def load(self, checkpoint: str | Path) -> Path:
        ckpt = super().load(checkpoint)
        state = read_trainer_state(ckpt)
        self.reward_models = {}
        for which in state.get("reward_models", []):
            folder = ckpt / RM_FILES[which]
            if not (folder / "optimizer.pt").is_file():
                raise RagrlError(
                    f"{ckpt}: the checkpoint lists the {which} reward model but {folder} is incomplete"
                )
            model = MultiHeadRewardModel.load(folder)
            optimizer = torch.optim.AdamW(model.parameters(), lr=self.config.cycles.rm_lr)
            optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
            self.reward_models[which] = (model, optimizer)
        return ckpt

    def finish(self) -> dict[str, Any]:
        summary = super().finish()
        if self.acc.is_main_process:
            for which, (model, _) in self.reward_models.items():
                model.save(self.run_dir / RM_FILES[which])
        return summary


# --- what a cycle logs ----------------------------------------------------------------------------------


def _episode_rows(
    episodes: list[Any], questions: list[Any], results: list[Any], method: Method
) -> list[dict[str, float]]:
    """One row of logged values per episode: its reward and components, steps, answer and truncation,
    and the method's own diagnostics."""
    rows = []
    for episode, question, result in zip(episodes, questions, results, strict=True):
        row = {
            "reward": result.total,
            "steps": len(episode.actions),
            "answer_rate": float(episode.final_answer is not None),
            "truncation_rate": float(episode.truncated),
        }
        row.update({f"reward/{key}": result.components[key] for key in method.reward.keys})
        row.update(method.diagnose(episode, question))
        rows.append(row)
    return rows


def _mean_rows(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each value's mean over the rows that have it, in the order the values first appear."""
    return {key: mean_of(rows, key) for key in dict.fromkeys(k for row in rows for k in row)}


def _pair_counts(states: list[VisitedState], rm_pairs: list[Any], pairs: list[Any]) -> dict[str, int]:
    """How many states, siblings and pairs the cycle made here, and the policy pairs by (chosen >
    rejected) action kinds (EVO-RAG §2.7 asks which decisions ever pass the margins)."""
    kinds: Counter[str] = Counter()
    by_id = {s.pair_prefix: s for s in states}
    for pair in pairs:
        prefix, i, j = pair.id.rsplit(".", 2)
        state = by_id[prefix]
        kinds[f"pairs/{state.candidates[int(i)].action.kind}>{state.candidates[int(j)].action.kind}"] += 1
    return {
        "states": len(states),
        "candidates": sum(len(s.candidates) for s in states),
        "rm_pairs": len(rm_pairs),
        "policy_pairs": len(pairs),
        **kinds,
    }


def _pair_metrics(counts: list[dict[str, int]]) -> dict[str, Any]:
    """Every process's ``_pair_counts`` added up; siblings as the mean candidates per state."""
    total: Counter[str] = Counter()
    for part in counts:
        total.update(part)
    return {
        "states": total["states"],
        "siblings": total["candidates"] / max(total["states"], 1),
        "rm_pairs": total["rm_pairs"],
        "policy_pairs": total["policy_pairs"],
        **{k: total[k] for k in sorted(total) if k.startswith("pairs/")},
    }
