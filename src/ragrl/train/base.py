"""What the GRPO and SFT trainers share: setup on accelerate, the step loop with its progress bar,
held-out evaluation, checkpoints with exact resume, and the run folder's ``summary.json``.

A subclass implements ``step() -> metrics`` (one optimizer step's worth of work) and says how many
steps the run has (``total_steps``) and over how many items its sampler draws.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import set_seed

from ragrl.config import Method
from ragrl.config.train import TrainConfig
from ragrl.config.train_checks import RETRIEVAL_EVAL_METRICS
from ragrl.console import console, progress_bar
from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.eval.runner import collapse_check, evaluate
from ragrl.llm.environment import record_environment
from ragrl.llm.hf_backend import TransformersBackend
from ragrl.llm.logprobs import token_logprobs
from ragrl.retrieval.base import Retriever
from ragrl.rollout.limits import check_prompts
from ragrl.train.parallel import is_sharded, make_parallel
from ragrl.train.setup import (
    MetricsLog,
    TrainingDiverged,
    load_policy,
    make_accelerator,
    make_optimizer,
    peak_memory_mb,
)
from ragrl.train.state import (
    PromptSampler,
    list_checkpoints,
    read_trainer_state,
    resolve_checkpoint,
    save_checkpoint,
)


class Trainer:
    """Base class: subclasses set ``kind`` (the metrics record kind) and implement ``step``."""

    kind = "train"

    def __init__(
        self,
        method: Method,
        config: TrainConfig,
        *,
        run_dir: str | Path | None = None,
        eval_examples: Sequence[Example] | None = None,
        retriever: Retriever | None = None,
        accelerator: Any = None,
        model: Any = None,
        tokenizer: Any = None,
    ) -> None:
        config.validate()
        self.method, self.config = method, config
        self.run_dir = Path(run_dir or config.out)
        self.environment_recorded = False  # environment.json: recorded by the first train() (or a resume)
        self.acc = accelerator or make_accelerator(config)
        self.parallel = make_parallel(self.acc, config)
        """How the processes share the model (``train.parallel``): every step's backward, no-sync,
        clipping, generation and checkpoint go through it."""
        set_seed(config.seed)
        # the retriever first: a server that does not answer is an error before a model loads
        self.retriever = retriever if retriever is not None else load_index(config)
        if model is None:
            model, tokenizer = load_policy(config.model, self.acc.device)
        elif is_sharded(model):  # an earlier trainer's model, sharded (or held by ZeRO) in place
            raise RagrlError(
                f"{type(self).__name__}: the model object passed in is sharded already (by an earlier "
                "trainer) and cannot be sharded again: pass its saved folder as train.model.path"
            )
        if tokenizer is None:
            raise RagrlError(f"{type(self).__name__}: pass the tokenizer along with a model object")
        self.tokenizer = tokenizer
        self.model: Any = model  # replaced by the prepared model in _prepare
        if eval_examples is None:
            eval_examples = load_examples(config.data.eval, "train.data.eval") if config.data.eval else []
        eval_examples = method.prepare_examples(eval_examples, "train.data.eval")
        self.eval_examples = eval_examples[: config.data.eval_limit or None]
        check_prompts(self.eval_examples, method.protocol, self.tokenizer, method.rollout, "train.data.eval")
        if config.patience and not self.eval_examples:
            console.print(
                f"warning: train.patience = {config.patience} needs held-out evaluations (train.data.eval "
                "and train.eval_every): without them the run does not stop early"
            )
        self.step_count = 0
        self.log = MetricsLog(self.run_dir / "metrics.jsonl", enabled=self.acc.is_main_process)
        self.evals: list[dict[str, Any]] = []
        self.stopped: str | None = None
        """Why the run ended before ``total_steps``: ``patience`` or ``time`` (``train.max_seconds``)."""
        self.best: dict[str, Any] | None = None
        """The best evaluation so far by ``train.best_metric`` (``{step, metric, value}``)."""

    def training_questions(self, given: Sequence[Example] | None) -> list[Example]:
        """``given``, else ``train.data.train`` (the answerable ones with
        ``train.data.train_answerable_only``), as the method trains on them, their prompts checked
        against the rollout's limits."""
        if given is None:
            if not self.config.data.train:
                raise RagrlError("train.data.train: no training questions given")
            given = load_examples(self.config.data.train, "train.data.train")
        if self.config.data.train_answerable_only:
            answerable = [e for e in given if e.answerable]
            if given and not answerable:
                raise RagrlError(
                    f"train.data.train_answerable_only: all {len(given)} training questions are marked "
                    "unanswerable (metadata.answerable: false)"
                )
            if len(answerable) < len(given) and self.acc.is_main_process:
                console.print(
                    f"train.data.train_answerable_only: training on {len(answerable)} of {len(given)} "
                    f"questions ({len(given) - len(answerable)} marked unanswerable left out)"
                )
            given = answerable
        questions = self.method.prepare_examples(given, "train.data.train")
        m = self.method
        check_prompts(questions, m.protocol, self.tokenizer, m.rollout, "train.data.train")
        return questions

    def _prepare(self, n_items: int, total_updates: int, lr: float | None = None) -> None:
        """Optimizer, schedule, accelerate's wrapping, the sampler, and the generation backend."""
        optim = self.config.optim if lr is None else dataclasses.replace(self.config.optim, lr=lr)

        def build_optimizer(model: Any) -> Any:  # over the parameters as the engine placed them
            optimizer, self.scheduler = make_optimizer(model, optim, total_updates)
            return optimizer

        # the scheduler is not prepared: accelerate would step it once per process
        self.model, self.optimizer = self.parallel.prepare(self.model, build_optimizer)
        self.sampler = PromptSampler(n_items, self.config.seed)
        self.acc.register_for_checkpointing(self.scheduler, self.sampler)
        self.policy = self.parallel.unwrap(self.model)
        self.backend = TransformersBackend(
            self.policy,
            self.tokenizer,
            batch_size=self.config.model.generation_batch_size,
            decode=self.config.model.decode,
        )
        self.pad_id = self.backend.pad_token_id

    @property
    def total_steps(self) -> int:
        return self.config.steps

    def step(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _main_says(self, value: bool) -> bool:
        """The main process's ``value``, on every process."""
        if self.acc.num_processes == 1:
            return bool(value)
        return self.global_sum(float(bool(value) and self.acc.is_main_process)) > 0

    @property
    def stopped_early(self) -> bool:
        """``train.patience`` or ``train.max_seconds`` ended the run before ``total_steps``."""
        return self.stopped is not None

    def out_of_patience(self) -> bool:
        """``train.patience`` evaluations in a row since the best one (every process reads the same
        decision: the main process's, broadcast)."""
        patience = self.config.patience
        stale = False
        if patience and self.acc.is_main_process and self.best is not None:
            stale = sum(1 for e in self.evals if e["step"] > self.best["step"]) >= patience
        return self._main_says(stale)

    def out_of_time(self) -> bool:
        """The run's wall time (across resumes) has reached ``train.max_seconds`` (the main process's
        clock decides for every process)."""
        budget = self.config.max_seconds
        return bool(budget) and self._main_says(self.log.elapsed() >= budget)

    def exhausted(self) -> bool:
        """Whether the run has nothing left to train on before ``total_steps`` (a method's own source of
        questions can run out, R²AG's RR-Forest); the run then ends early, evaluated and saved."""
        return False

    # -- shared pieces of a step -------------------------------------------------------------------------
    def global_sum(self, value: float) -> float:
        """Sum of ``value`` over processes (for the global loss normalizer)."""
        if self.acc.num_processes == 1:
            return float(value)
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.acc.device)
        return float(self.acc.reduce(t, reduction="sum").item())

    def padding_pass(self, reference: bool) -> None:
        """A pass of a lockstep engine's micro-batch that adds nothing (a process with less to train on
        than another): the policy's forward, the reference's when ``reference`` (as the real pass runs
        them, in that order: sharded forwards are collective), then a backward of 0."""
        loss = self.zero_loss()
        if reference:
            with torch.no_grad():
                self.zero_ref_loss()
        self.parallel.backward(loss)

    def zero_ref_loss(self) -> torch.Tensor:
        """``zero_loss`` through the reference as the trainers run it: the frozen copy, or under LoRA the
        policy with the adapters off (ZeRO-3 gathers the parameters a pass uses: the padding must use the
        same ones)."""
        if getattr(self, "ref_model", None) is not None:
            return self.zero_loss(self.ref_model)
        with self.policy.disable_adapter():
            return self.zero_loss()

    def zero_loss(self, model: Any = None) -> torch.Tensor:
        """A loss of 0 through ``model`` (the policy): a pass that only joins the collective ones."""
        ids = torch.tensor([[self.pad_id, self.pad_id]], device=self.acc.device)
        return token_logprobs(self.model if model is None else model, ids).sum() * 0.0

    def global_max(self, value: float) -> float:
        """Largest ``value`` over processes."""
        if self.acc.num_processes == 1:
            return float(value)
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.acc.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t.item())

    def check_norm(self, norm: float) -> None:
        """The watchdog: a NaN/inf gradient norm stops the run before the update is applied."""
        if self.config.stop_on_nonfinite and not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            found = list_checkpoints(self.run_dir)
            last = f"the last good checkpoint is {found[-1]}" if found else "no checkpoint was saved yet"
            raise TrainingDiverged(
                f"step {self.step_count + 1}: the gradient norm is {norm} (NaN/inf loss or gradient); the "
                f"update was not applied and training stopped; {last}. Lower train.optim.lr, check the "
                "reward for NaN/inf values, or set train.optim.max_grad_norm."
            )

    def optimizer_step(self) -> float:
        """Clip, check (``check_norm``) and update through ``train.parallel``; then the schedule."""
        max_norm = self.config.optim.max_grad_norm
        params = [p for p in self.model.parameters() if p.requires_grad]
        norm = self.parallel.step(
            self.optimizer, params, max_norm if max_norm else float("inf"), self.check_norm
        )
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    # -- evaluation, checkpoints, the loop ------------------------------------------------------------------
    def evaluate(self, phase: str) -> dict[str, Any] | None:
        """Greedy held-out evaluation on the main process, logged as an ``eval`` record."""
        if not self.eval_examples:
            return None
        record, new_best = None, False
        with self.parallel.generating(self.model, self.backend):  # every process: FSDP gathers once
            if self.acc.is_main_process:
                report = evaluate(
                    self.backend, self.retriever, self.method, self.eval_examples,
                    temperature=self.config.eval_temperature, seed=self.config.seed,
                )  # fmt: skip
        if self.acc.is_main_process:
            s = report.scores
            values = {
                "phase": phase,
                "eval/em": s.get("em", 0.0),
                "eval/f1": s.get("f1", 0.0),
                "eval/answer_rate": s.get("answer_rate", 0.0),
                "eval/searches": s.get("searches_per_question", 0.0),
                "eval/n": len(self.eval_examples),
                **collapse_check(report.rows, self.eval_examples),
                **{k: s[k[len("eval/") :]] for k in RETRIEVAL_EVAL_METRICS if k[len("eval/") :] in s},
                **{f"eval/outcome/{k}": round(v / len(report.rows), 6) for k, v in s["outcomes"].items()},
            }
            pairs = zip(report.trajectories, self.eval_examples, strict=True)
            for key in dict.fromkeys(k for t, ex in pairs for k in self.method.diagnose(t, ex)):
                values[f"eval/method/{key}"] = s.get(key, 0.0)
            record = self.log.log("eval", self.step_count, values)
            self.evals.append(record)
            new_best = self._is_new_best(record)
            console.print(
                f"{self.kind} step {self.step_count} held-out EM {values['eval/em']:.3f} "
                f"(n={len(self.eval_examples)}, {phase})"
            )
        if self._main_says(new_best):  # every process: a sharded policy is gathered to be written
            out = self.run_dir / "best"
            self.parallel.export(self.model, self.tokenizer, out)
            if self.acc.is_main_process:
                (out / "best.json").write_text(json.dumps(self.best) + "\n", encoding="utf-8")
        self.acc.wait_for_everyone()
        return record

    def _is_new_best(self, record: dict[str, Any]) -> bool:
        """``train.best_metric``: whether this evaluation beats every earlier one (ties keep the earlier
        policy; recorded in ``self.best``). The policy then goes to ``<run>/best`` with ``best.json``
        naming the step and the value."""
        key = self.config.best_metric
        if not key:
            return False
        if key not in record or not isinstance(record[key], (int, float)):
            numeric = sorted(
                k for k, v in record.items() if k.startswith("eval/") and isinstance(v, (int, float))
            )
            raise RagrlError(f"train.best_metric: the evaluation has no value {key!r} (it has {numeric})")
        value, sign = float(record[key]), 1.0 if self.config.best_mode == "max" else -1.0
        if self.best is not None and sign * value <= sign * self.best["value"]:
            return False
        self.best = {"step": self.step_count, "metric": key, "value": value}
        return True

    def save(self) -> Path:
        state = {
            "kind": self.kind,
            "step": self.step_count,
            "elapsed_seconds": round(self.log.elapsed(), 3),
            "seed": self.config.seed,
            "evals": self.evals,
            "best": self.best,
            **self.extra_state(),
        }
        return save_checkpoint(
            self.parallel, self.run_dir, self.step_count, state, model=self.model, optimizer=self.optimizer,
            tokenizer=self.tokenizer, keep=self.config.keep_checkpoints, extra=self.save_extra,
        )  # fmt: skip

    def extra_state(self) -> dict[str, Any]:
        """A subclass's own entries of ``trainer_state.json``."""
        return {}

    def save_extra(self, folder: Path) -> None:
        """A subclass writes its own files into a checkpoint being written (before it is renamed into
        place, so a crash never leaves a checkpoint without them)."""

    def load(self, checkpoint: str | Path) -> Path:
        """Restore model, optimizer, schedule, sampler position, RNG streams, step and evals."""
        ckpt = resolve_checkpoint(checkpoint, self.run_dir)
        state = read_trainer_state(ckpt)
        if state.get("kind", self.kind) != self.kind:
            raise RagrlError(f"{ckpt}: a {state.get('kind')} checkpoint cannot resume a {self.kind} run")
        self.parallel.load_state(ckpt / "state", self.model, self.optimizer)
        self.step_count = int(state["step"])
        self.evals = list(state.get("evals", []))
        self.best = state.get("best")
        self.log.t0 = time.perf_counter() - float(state.get("elapsed_seconds", 0.0))
        # a run that stopped early stays stopped (a resume with a larger train.max_seconds goes on)
        self.stopped = "patience" if self.out_of_patience() else "time" if self.out_of_time() else None
        if self.acc.is_main_process:
            self.log.truncate_after(self.step_count)
        self.acc.wait_for_everyone()
        return ckpt

    def train(self, resume: str | Path | None = None, *, until: int | None = None) -> dict[str, Any]:
        """Run to ``total_steps`` (or stop after step ``until`` with a checkpoint); returns the summary."""
        cfg = self.config
        total = self.total_steps
        if resume is not None:
            ckpt = self.load(resume)
            if self.acc.is_main_process:
                console.print(f"resumed from {ckpt} at step {self.step_count}")
        if self.acc.is_main_process and (resume is not None or not self.environment_recorded):
            # what its numbers depend on beyond the config: once a trainer (a resume adds a start)
            record_environment(
                self.run_dir / "environment.json", step=self.step_count, device=self.acc.device
            )
        self.environment_recorded = True
        if resume is None and not self.evals:
            self.evaluate("before")
        stop = total if until is None else min(until, total)
        with progress_bar(disable=not self.acc.is_main_process) as bar:
            task = bar.add_task(self.kind.upper(), total=total, completed=self.step_count)
            while self.step_count < stop and not self.stopped_early:
                if self.exhausted():
                    if self.acc.is_main_process:
                        console.print(f"{self.kind}: nothing left to train on after step {self.step_count}")
                    break
                metrics = self.step()
                if cfg.log_every and self.step_count % cfg.log_every == 0:
                    self.log.log(self.kind, self.step_count, metrics)
                if cfg.eval_every and self.step_count % cfg.eval_every == 0 and self.step_count < total:
                    self.evaluate(self.kind)
                    if self.out_of_patience():
                        if self.acc.is_main_process:
                            console.print(
                                f"{self.kind}: no new best {cfg.best_metric} in {cfg.patience} evaluations; "
                                f"stopping at step {self.step_count} (best policy: {self.run_dir / 'best'})"
                            )
                        self.stopped = "patience"
                last_em = f" · held-out EM {self.evals[-1]['eval/em']:.2f}" if self.evals else ""
                line = _describe(self.kind, metrics) + last_em
                bar.update(task, advance=1, description=line)
                logged = cfg.log_every and self.step_count % cfg.log_every == 0
                if logged and self.acc.is_main_process and not console.is_terminal:  # a log: one line a step
                    console.print(f"step {self.step_count}/{total} {line} ({self.log.elapsed():.0f} s)")
                if cfg.save_every and self.step_count % cfg.save_every == 0 and self.step_count < stop:
                    self.save()
                if not self.stopped_early and self.out_of_time():
                    if self.acc.is_main_process:
                        console.print(
                            f"{self.kind}: train.max_seconds ({cfg.max_seconds:g} s) reached after step "
                            f"{self.step_count} of {total}"
                        )
                    self.stopped = "time"
        finished = self.step_count >= total or self.exhausted() or self.stopped_early
        # what the main process (the one that evaluates) recorded last, decided there for every process
        last = self.evals[-1] if self.evals else {}
        at_this_step = self._main_says(last.get("step") == self.step_count)
        after_recorded = at_this_step and self._main_says(last.get("phase") == "after")
        if finished and not after_recorded:  # once: a run resumed from its final checkpoint keeps its record
            if at_this_step:  # it ended early right after an evaluation: that policy, recorded as "after"
                if self.acc.is_main_process:
                    values = {k: v for k, v in last.items() if k not in ("kind", "step", "time")}
                    self.evals.append(self.log.log("eval", self.step_count, {**values, "phase": "after"}))
            else:
                self.evaluate("after")
        self.save()
        return self.finish()

    def finish(self) -> dict[str, Any]:
        """Export the policy to ``<run>/policy`` and write ``summary.json``."""
        summary: dict[str, Any] = {
            "trainer": self.kind,
            "method": self.method.name,
            "model": self.config.model.path,
            "seed": self.config.seed,
            "processes": self.acc.num_processes,
            "steps": self.step_count,
            "wall_seconds": round(self.log.elapsed(), 1),
            "peak_memory_mb": peak_memory_mb(),
        }
        backend = getattr(self, "backend", None)
        if getattr(backend, "decode_log", None):  # what decoded the policy's batches after their prefill
            summary["decode"] = dict(backend.decode_log)
            if backend.graphs.refusal is not None:  # why a GPU's CUDA graph was given up
                summary["decode_refusal"] = backend.graphs.refusal
        if self.best is not None:
            summary["best"] = self.best
        if self.stopped is not None:
            summary["stopped"] = self.stopped
        if self.evals:
            summary.update(before_after(self.evals[0], self.evals[-1], prefix="eval/"))
        self.parallel.export(self.model, self.tokenizer, self.run_dir / "policy")
        if self.acc.is_main_process:
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        self.acc.wait_for_everyone()
        return summary


def before_after(before: dict[str, Any], after: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A run summary's before/after keys from two evaluations with the values ``em``, ``em_answerable``,
    ``top_answer``, ``top_answer_share`` and ``n`` (named ``<prefix><value>``: ``eval/em`` in a logged
    evaluation record)."""
    b, a = (lambda k: before[prefix + k]), (lambda k: after[prefix + k])
    return {
        "em_before": b("em"),
        "em_after": a("em"),
        "em_gain": round(100 * (a("em") - b("em")), 2),
        "n_eval": b("n"),
        "em_answerable_before": b("em_answerable"),
        "em_answerable_after": a("em_answerable"),
        "top_answer_after": a("top_answer"),
        "top_answer_share_after": a("top_answer_share"),
    }


def _describe(kind: str, metrics: dict[str, Any]) -> str:
    if "reward" in metrics:
        return f"{kind.upper()} reward {metrics['reward']:.2f}"
    return f"{kind.upper()} loss {metrics.get('loss', 0.0):.3f}"


def load_examples(path: str, field: str) -> list[Example]:
    from ragrl.data.io import read_examples

    examples, _ = read_examples(path)
    if not examples:
        raise RagrlError(f"{field}: {path} holds no questions")
    return examples


def load_index(config: TrainConfig) -> Retriever | None:
    """``train.data.index``: an index folder, or a retrieval server's URL that every process asks."""
    from ragrl.retrieval.open import open_retriever

    return open_retriever(config.data.index) if config.data.index else None
