"""The GRPO trainer: rewarded rollouts update the policy (on ``accelerate``).

One step, top to bottom (``GRPOTrainer.step``):

1. take this process's share of the step's questions (whole groups: a group never straddles processes),
   from the shuffled training set or from the method's own source (``Method.task_source``: R²AG's
   RR-Forest, which grows from every step's episodes, gathered from all processes, after step 6);
2. play each ``G = rollout.n`` times with the method's rollout and the current policy (seeded by step);
3. score the episodes with the method's reward, in one batch (named components, each logged);
4. cut the episodes into training samples (one per linear episode, one per turn or node otherwise),
   advantages within each sample's group (``algos`` registry; the estimator may read every component)
   and the group filter; with ``refill_rounds``, more questions until enough groups survive (1-4 are
   ``_play``, one call per round); with ``whiten``, the kept samples' advantages normalised over the
   whole update batch (Reinforce++);
5. π_old and π_ref log-probs where the config needs them;
6. ``ppo_epochs`` passes of minibatch updates: the registered policy loss (PPO-clip) + β·KL, aggregated
   over the *global* minibatch, gradient clipping, an optimizer and LR-schedule step, the NaN/inf
   watchdog;
7. diagnostics into ``metrics.jsonl`` (``step_metrics``; the method's per-episode and per-step ones included).

Losses are scaled so that ``accelerate launch --num_processes N`` computes the same update as one
process: each process divides its token (or sequence) sum by the global count, and DDP's gradient
average is undone by the factor N (see ``_update``).
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from accelerate.utils import gather_object

from ragrl.algos import compute_advantages, engine_mismatch, get_filter, policy_loss, tis_weights
from ragrl.config import Method
from ragrl.config.train import TrainConfig
from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.llm.logprobs import token_logprobs
from ragrl.rewards.registry import RewardContext, RewardResult
from ragrl.rollout.sample import Sample, return_to_go
from ragrl.rollout.trajectory import Trajectory
from ragrl.train.augment import NameSwap, RenamedRetriever, WorldRenaming
from ragrl.train.base import Trainer
from ragrl.train.batch import SequenceBatch, advantage_tensor, chunks, group_minibatches, sequence_batch
from ragrl.train.learnable import check_learnable
from ragrl.train.rollout_engine import make_rollout_engine
from ragrl.train.step_metrics import Averages, episode_rows, reduce_dicts, summarize


def step_seed(seed: int, step: int, round_index: int = 0) -> int:
    """The rollout seed of a step (and of its refill rounds): a function of the run's seed, the step and
    the round only."""
    return (int(seed) * 1_000_003 + int(step) * 9_973 + int(round_index) * 104_729 + 7) % (2**31 - 1)


@dataclass
class _Round:
    """One round of questions played in a step (round 0, then refills)."""

    owners: list[Example]
    episodes: list[Trajectory]
    results: list[RewardResult]
    samples: list[Sample]
    keep: list[bool]
    """Per sample: kept by the group filter."""


def _kept_groups(rounds: list[_Round]) -> int:
    return len({s.group for r in rounds for s, k in zip(r.samples, r.keep, strict=True) if k})


class GRPOTrainer(Trainer):
    """GRPO for any method (its protocol, rollout settings and reward) on a local causal LM.

    Components not passed in are loaded from ``config`` (``train.model.path``, ``train.data.*``).
    """

    kind = "train"

    def __init__(
        self,
        method: Method,
        config: TrainConfig,
        *,
        train_examples: Sequence[Example] | None = None,
        **kwargs: Any,
    ) -> None:
        check_learnable(method)  # before any model is loaded
        super().__init__(method, config, **kwargs)
        self.train_examples = self.training_questions(train_examples)
        g = config.grpo
        world = self.acc.num_processes
        if g.prompts_per_step % (world * g.minibatches):
            raise RagrlError(
                f"train.grpo.prompts_per_step ({g.prompts_per_step}) must be a multiple of the number of "
                f"processes × minibatches ({world} × {g.minibatches}): every process holds whole groups"
            )
        self.ref_model = None
        if g.kl_coef != 0.0 and config.model.lora is None:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self._prepare(len(self.train_examples), config.steps * g.ppo_epochs * g.minibatches)
        if self.ref_model is not None:  # placed as the policy is (sharded too under FSDP)
            self.ref_model = self.parallel.prepare_frozen(self.ref_model)
        self.world: WorldRenaming | None = None
        """``train.grpo.rename_world``: the world's name words; each round's rollouts search through
        ``self.rollout_retriever`` renamed by one permutation of them."""
        self.rollout_retriever: Any = self.retriever
        if g.rename_world:
            self.world = WorldRenaming.for_run(config, "train.grpo.rename_world")
            self.rollout_retriever = RenamedRetriever(self.retriever)
        self.engine = make_rollout_engine(config, self.policy, self.tokenizer, self.acc.num_processes)
        """``train.engine``: the vLLM engine that plays the rollouts, or None (the policy decodes)."""
        self.rollout = method.make_rollout(self.engine or self.backend, self.rollout_retriever)
        self.name_swap = None
        if g.name_swap:  # the world's names, renamed in the update's samples (ragrl.train.augment)
            self.name_swap = NameSwap.for_run(config, self.tokenizer, "train.grpo.name_swap")
        self.source = None
        """The method's own source of questions (``Method.task_source``, R²AG's RR-Forest), or None: the
        shuffled training set."""
        if method.task_source is not None:
            if g.refill_rounds:
                raise RagrlError(
                    f"train.grpo.refill_rounds: the {method.name} method trains on its own rounds of "
                    "questions, which grow from each step's episodes; set refill_rounds to 0"
                )
            if g.rename_world:
                raise RagrlError(
                    f"train.grpo.rename_world: the {method.name} method grows its next questions from each "
                    "step's episodes, which would carry one step's renamed world into the next; set "
                    "rename_world to false"
                )
            self.source = method.task_source(self.train_examples, config.seed)
            self.acc.register_for_checkpointing(self.source)

    def train(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """``Trainer.train``; the rollout engine's processes stop with it, however it ends (the engine
        starts again if the trainer goes on)."""
        try:
            return super().train(*args, **kwargs)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the rollout engine's processes, if any run (a trainer driven by ``step()`` calls this)."""
        if self.engine is not None:
            self.engine.close()

    def exhausted(self) -> bool:
        return self.source is not None and self.source.done

    # -- the step -------------------------------------------------------------------------------------
    def step(self) -> dict[str, Any]:
        """One GRPO step; returns its metrics (already reduced over processes)."""
        g = self.config.grpo
        t0 = time.perf_counter()
        per_process = g.prompts_per_step // self.acc.num_processes

        # 1-4. questions -> episodes -> rewards -> samples with advantages -> the group filter (_play);
        # with refill_rounds > 0, new questions are played until per_process groups survive the filter
        engine_metrics = self.engine.before_rollouts(self.step_count) if self.engine is not None else {}
        with self.parallel.generating(self.model, self.backend):  # FSDP: gathered once for the rollouts
            rounds = [self._play(0, per_process)]
            while len(rounds) <= g.refill_rounds and self._short_of_groups(rounds, per_process):
                rounds.append(self._play(len(rounds), per_process))
        if self.engine is not None:
            self.engine.after_rollouts()
        t_rollout = time.perf_counter() - t0

        # 5-6. the policy update on the kept samples (the first per_process kept groups when refilling)
        kept = [s for r in rounds for s, k in zip(r.samples, r.keep, strict=True) if k]
        if g.refill_rounds:
            first = list(dict.fromkeys(s.group for s in kept))[:per_process]
            kept = [s for s in kept if s.group in set(first)]
        if g.whiten != "none":  # Reinforce++: normalised over what reaches the update, all processes
            self._whiten(kept, by_tokens=g.whiten == "token")
        update = self._update(self._renamed(kept) if self.name_swap is not None else kept)

        # 7. diagnostics over every episode played this step, reduced over processes
        self.step_count += 1
        episodes = [t for r in rounds for t in r.episodes]
        results = [x for r in rounds for x in r.results]
        owners = [ex for r in rounds for ex in r.owners]
        if self.source is not None:  # the next round's questions, from every process's episodes
            records = self.source.grow(episodes, owners)
            if self.acc.num_processes > 1:
                records = [r for part in gather_object([records]) for r in part]
            self.source.add(records)
        diagnostics = [self.method.diagnose(t, ex) for t, ex in zip(episodes, owners, strict=True)]
        used, episode_kept, base = {id(s) for s in kept}, torch.zeros(len(episodes), dtype=torch.bool), 0
        for r in rounds:  # an episode counts as kept when one of its samples went into the update
            for sample in r.samples:
                episode_kept[base + sample.episode] |= id(sample) in used
            base += len(r.episodes)
        metrics = self._step_metrics(episodes, results, diagnostics, episode_kept.tolist(), update)
        step_diagnostics = self.method.diagnose_step(episodes, owners, results, self.config)
        if self.acc.num_processes > 1:  # each process's whole groups, reduced over processes
            step_diagnostics = reduce_dicts(gather_object([step_diagnostics]))
        metrics.update(step_diagnostics)
        if self.source is not None:
            metrics.update(self.source.metrics())
        metrics.update(engine_metrics)
        metrics["samples"] = int(self.global_sum(sum(len(r.samples) for r in rounds)))
        metrics["refill_rounds"] = len(rounds) - 1
        metrics["rollout_seconds"] = round(t_rollout, 3)
        metrics["step_seconds"] = round(time.perf_counter() - t0, 3)
        self._maybe_write_samples(rounds[0].episodes)
        return metrics

    def _short_of_groups(self, rounds: list[_Round], per_process: int) -> bool:
        """Whether any process holds fewer than ``per_process`` surviving groups: every process then
        plays one more round, so all of them take the same questions from the sampler."""
        short = _kept_groups(rounds) < per_process
        return self.global_sum(float(short)) > 0 if self.acc.num_processes > 1 else short

    def _play(self, round_index: int, per_process: int) -> _Round:
        """Steps 1-4 for one round of questions (round 0, then refills)."""
        cfg, g = self.config, self.config.grpo

        # 1. this process's questions: a contiguous share of the round's global batch; group ids are
        # global and distinct across rounds
        offset = self.acc.process_index * per_process
        first_group = round_index * g.prompts_per_step + offset
        if self.source is not None:
            examples = self.source.take(g.prompts_per_step)[offset : offset + per_process]
        else:
            indices = self.sampler.take(g.prompts_per_step)[offset : offset + per_process]
            examples = [self.train_examples[i] for i in indices]
        world: Any = nullcontext()
        if self.world is not None:  # the round's world: every name renamed, the same on every process
            renaming = self.world.draw(random.Random(f"{cfg.seed}:{self.step_count}:{round_index}:world"))
            examples = [renaming.example(ex) for ex in examples]
            world = self.rollout_retriever.playing(renaming)

        # 2. G episodes per question with the method's rollout and the current policy (in the round's
        # renamed world with rename_world, and only for these episodes)
        seed = step_seed(cfg.seed, self.step_count, round_index)
        with world:
            episodes = self.rollout.run(examples, seed=seed, first_group=first_group)

        # 3. rewards, each named component kept for logging; one batch, so judges see it whole
        ctx = RewardContext(step=self.step_count, total_steps=cfg.steps)
        owners = [examples[t.metadata["group"] - first_group] for t in episodes]
        results = self.method.reward.score(episodes, owners, ctx)

        # 4. the training samples (one per linear episode), advantages within each sample's group (the
        # estimator may read every component), and the filter that drops groups that teach nothing
        samples = self.rollout.samples(episodes)
        rows = [s.episode for s in samples]
        reward_of = getattr(self.rollout, "sample_reward", return_to_go)  # a tree's nodes: their own
        if reward_of is return_to_go:  # one sample per turn: the per-step rewards must cover every turn
            per_episode = Counter(x.episode for x in samples)
            for i, r in enumerate(results):
                if r.steps is not None and per_episode[i] > 1 and len(r.steps) != per_episode[i]:
                    raise RagrlError(
                        f"example {episodes[i].example_id!r}: {len(r.steps)} per-step rewards for "
                        f"{per_episode[i]} training samples (one per policy turn)"
                    )
        rewards = torch.tensor(
            [reward_of(results[x.episode].total, results[x.episode].steps, x) for x in samples],
            dtype=torch.float32,
        )
        components = {
            key: torch.tensor([results[i].components[key] for i in rows], dtype=torch.float32)
            for key in self.method.reward.keys
        }
        group_ids = torch.tensor([s.group for s in samples])
        weights = results[0].weights if results else {}  # the same for every episode of a step
        advantages = compute_advantages(
            g.advantage, rewards, group_ids, components=components, weights=weights, **g.advantage_params
        )
        scores = rewards if g.group_filter_on == "total" else components[g.group_filter_on]
        keep = get_filter(g.group_filter)(scores, group_ids, **g.group_filter_params).tolist()
        for sample, a in zip(samples, advantages.tolist(), strict=True):
            sample.advantage = a
        for i, (t, r) in enumerate(zip(episodes, results, strict=True)):
            mine = [s.advantage for s in samples if s.episode == i]
            advantage = mine[0] if len(mine) == 1 else mine
            t.metadata.update(reward=r.total, rewards=r.components, advantage=advantage, step=self.step_count)
        return _Round(owners, episodes, results, samples, keep)

    def _renamed(self, samples: list[Sample]) -> list[Sample]:
        """``train.grpo.name_swap``: that share of the samples with their entity names consistently
        renamed (same reward, same advantage), each seeded by (seed, step, group, episode, turn), so a
        resumed run renames the same way."""
        share, out = self.config.grpo.name_swap, []
        for s in samples:
            rng = random.Random(f"{self.config.seed}:{self.step_count}:{s.group}:{s.episode}:{s.step}")
            out.append(self.name_swap.sample(s, rng) if rng.random() < share else s)
        return out

    def _whiten(self, samples: list[Sample], by_tokens: bool, eps: float = 1e-8) -> None:
        """``a ← (a − mean) / (std + eps)`` over ``samples`` on every process, each counted once or once
        per policy token (population std)."""
        if any(not isinstance(s.advantage, (int, float)) for s in samples):
            raise RagrlError("train.grpo.whiten needs one advantage per sample, not one per token")
        a = torch.tensor([float(s.advantage) for s in samples], dtype=torch.float64)
        w = torch.tensor(
            [float(sum(s.loss_mask)) if by_tokens else 1.0 for s in samples], dtype=torch.float64
        )
        total = self.global_sum(float(w.sum()))
        if total == 0:
            return
        mean = self.global_sum(float((w * a).sum())) / total
        var = max(self.global_sum(float((w * (a - mean) ** 2).sum())) / total, 0.0)
        for s, x in zip(samples, ((a - mean) / (math.sqrt(var) + eps)).tolist(), strict=True):
            s.advantage = x

    def _update(self, samples: list[Sample]) -> dict[str, float]:
        """μ passes of minibatch updates over the kept samples; returns the update's metrics."""
        g = self.config.grpo
        temperature = self.method.rollout.temperature or 1.0
        t0 = time.perf_counter()
        minibatches = self._minibatches(samples, temperature)  # with the π_old / π_ref passes
        _synchronize(self.acc.device)
        t_logprobs = time.perf_counter() - t0
        by_tokens = g.loss_agg == "token_mean"  # otherwise the loss is a mean over sequences
        stats = Averages()
        loss_total = 0.0  # this process's share of each minibatch loss × N (mean over processes = loss)
        for epoch in range(g.ppo_epochs):
            for mb in minibatches:
                # normalise by the global minibatch, so N processes compute one process's update
                real = [x for x in mb if x is not None]
                global_units = self.global_sum(sum(b.num_tokens if by_tokens else len(b) for b, _ in real))
                if not mb:  # nothing of this minibatch here: still join the gradient all-reduce
                    self.parallel.backward(self.zero_loss())
                for k, item in enumerate(mb):
                    last = k == len(mb) - 1  # gradients are synchronised on the last micro-batch only
                    with nullcontext() if last else self.parallel.no_sync(self.model):
                        if item is None:  # lockstep padding: join the collective passes, add nothing
                            self.parallel.backward(self.zero_loss())
                            continue
                        b, adv = item
                        logp = self._logprobs(self.model, b, temperature, with_entropy=epoch == 0)
                        if epoch == 0:  # the entropy of the policy that sampled, measured once
                            logp, entropy = logp
                            mean = float((entropy * b.loss_mask).sum()) / max(b.num_tokens, 1)
                            stats.add("entropy", mean, b.num_tokens)
                        weights = None
                        if self._compares() and epoch == 0:  # π_old against what the backend reported
                            for name, v in engine_mismatch(
                                b.old_logprobs, b.rollout_logprobs, b.loss_mask
                            ).items():
                                stats.add(f"engine/{name}", float(v), b.num_tokens)
                        if g.tis_cap:
                            weights, cut = tis_weights(
                                b.old_logprobs, b.rollout_logprobs, b.loss_mask, g.tis_cap
                            )
                            stats.add("engine/tis_cut_frac", float(cut), b.num_tokens)
                        loss, m = policy_loss(
                            logp, b.old_logprobs, adv, b.loss_mask, ref_logp=b.ref_logprobs,
                            eps_low=g.clip_low, eps_high=g.clip_high, beta=g.kl_coef, kl=g.kl,
                            kl_params=g.kl_params, agg=g.loss_agg, constant=g.loss_agg_constant,
                            pg_loss=g.pg_loss, is_weights=weights,
                        )  # fmt: skip
                        units = b.num_tokens if by_tokens else len(b)
                        scale = units / max(global_units, 1) * self.acc.num_processes
                        self.parallel.backward(loss * scale)
                    loss_total += float(m["loss"]) * scale
                    for name in ("clip_frac", "clip_frac_low", "clip_frac_high", "approx_kl", "kl"):
                        if name in m:
                            stats.add(name, float(m[name]), b.num_tokens)
                stats.add("grad_norm", self.optimizer_step(), 1.0)
        _synchronize(self.acc.device)
        return {
            **stats.result(),
            "loss": loss_total / (g.ppo_epochs * len(minibatches)),
            "logprob_seconds": round(t_logprobs, 3),
            "update_seconds": round(time.perf_counter() - t0 - t_logprobs, 3),
        }

    def _minibatches(
        self, samples: list[Sample], temperature: float
    ) -> list[list[tuple[SequenceBatch, torch.Tensor] | None]]:
        """Split the samples into minibatches of whole groups and those into micro-batches of tensors
        (with their advantages: [B], or [B, T] when a sample carries one per token), with π_old (when it
        is not π_θ detached) and π_ref (when there is a KL term) attached. Under a lockstep engine
        (FSDP: every forward is collective) each minibatch holds the same number of micro-batches on
        every process, padded with ``None`` (a pass that joins the collectives and adds nothing)."""
        g = self.config.grpo
        dev = self.acc.device
        recompute = self._recomputes()
        out = []
        for mb in group_minibatches([s.group for s in samples], g.minibatches):
            pieces = chunks(mb, g.micro_batch_size)
            passes = int(self.global_max(len(pieces))) if self.parallel.lockstep else len(pieces)
            micro_batches: list[tuple[SequenceBatch, torch.Tensor] | None] = []
            for rows in pieces + [None] * (passes - len(pieces)):
                if rows is None:
                    with torch.no_grad():  # the no-grad passes the real micro-batches make
                        if recompute:
                            self.zero_loss()
                        if g.kl_coef:  # the reference's pass (under LoRA the policy, adapters off)
                            self.zero_ref_loss()
                    micro_batches.append(None)
                    continue
                b = sequence_batch([samples[i] for i in rows], self.pad_id, dev)
                with torch.no_grad():
                    if recompute:
                        b.old_logprobs = self._logprobs(self.model, b, temperature)
                    elif g.old_logprobs == "rollout":
                        b.old_logprobs = b.rollout_logprobs
                    if g.kl_coef:
                        b.ref_logprobs = self._ref_logprobs(b, temperature)
                micro_batches.append((b, advantage_tensor([samples[i] for i in rows], b).to(dev)))
            out.append(micro_batches)
        return out

    def _compares(self) -> bool:
        """Whether the update compares π_old with the backend's log-probs (``engine/*``): where π_old is
        recomputed and the backend's log-probs are those of the trained tokens as sampled (not with
        ``name_swap``'s renamed tokens, nor greedy episodes' temperature-1 log-probs)."""
        g = self.config.grpo
        return self._recomputes() and not g.name_swap and not self.method.rollout.greedy_samples

    def _recomputes(self) -> bool:
        """Whether π_old is a forward pass of its own before the updates (``train.grpo.old_logprobs``):
        always under ``recompute``; under ``auto`` when more than one update reads it, and when a vLLM
        engine or truncated importance sampling needs it against the engine's log-probs."""
        g = self.config.grpo
        return g.old_logprobs == "recompute" or (
            g.old_logprobs == "auto"
            and (g.ppo_epochs > 1 or g.minibatches > 1 or self.engine is not None or g.tis_cap > 0)
        )

    # -- pieces of the update -------------------------------------------------------------------------
    def _logprobs(self, model: Any, b: SequenceBatch, temperature: float, with_entropy: bool = False) -> Any:
        with self.acc.autocast():
            return token_logprobs(
                model,
                b.input_ids,
                b.attention_mask,
                temperature=temperature,
                start=b.start,
                with_entropy=with_entropy,
                mask=b.loss_mask,  # the head only on the policy's tokens: nothing else is scored
            )

    def _ref_logprobs(self, b: SequenceBatch, temperature: float) -> torch.Tensor:
        if self.ref_model is not None:
            return self._logprobs(self.ref_model, b, temperature)
        with self.policy.disable_adapter():  # LoRA: the base model is the reference
            return self._logprobs(self.model, b, temperature)

    # -- metrics ---------------------------------------------------------------------------------------
    def _step_metrics(self, episodes, results, diagnostics, kept, update) -> dict[str, Any]:  # noqa: ANN001
        """The step's metrics (``step_metrics``) over every process's episodes, and the update's."""
        rows = episode_rows(episodes, results, diagnostics, [t.metadata["group"] for t in episodes], kept)
        rows = gather_object(rows) if self.acc.num_processes > 1 else rows
        update = reduce_dicts(gather_object([update]) if self.acc.num_processes > 1 else [update])
        return {**summarize(rows, self.method, results, lr=self.scheduler.get_last_lr()[0]), **update}

    def _maybe_write_samples(self, rollouts: list[Trajectory]) -> None:
        every = self.config.samples_every
        last = self.step_count == self.config.steps
        if not self.acc.is_main_process or not (last or (every and self.step_count % every == 0)):
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with (self.run_dir / "samples.jsonl").open("a", encoding="utf-8") as f:
            for t in rollouts[: self.method.rollout.n]:  # the first group
                f.write(json.dumps(t.to_dict()) + "\n")


# -- helpers ------------------------------------------------------------------------------------------------


def _synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a GPU's kernels run asynchronously): a phase's wall time."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
