"""GRPO step throughput: ragrl's ``GRPOTrainer`` vs TRL's ``GRPOTrainer``, same model, prompts and sizes.

    .venv/bin/python benchmarks/grpo_vs_trl.py [--prompts 8] [--group 8] [--new-tokens 32] [--steps 3]
        [--repeats 2] [--workdir DIR] [--hidden 128] [--layers 4]

Setup (in a temp dir, or ``--workdir`` to keep and reuse it): the synthetic world (seed 0, small) and
the untrained tiny policy (its tokenizer trained with every method's prompt texts), loaded once in fp32
on CPU; each trainer gets its own ``copy.deepcopy`` of it, so both start from the same weights.

The workload, single-turn on both sides (TRL's GRPO has no multi-turn search loop): the first
``--prompts`` training questions, rendered as Search-R1 chat messages through the tokenizer's chat
template (the same token ids on both sides: checked), ``--group`` samples each, ``--new-tokens`` new
tokens at most, temperature 1.0 (no top-p/top-k), one optimizer step per generation batch
(prompts x group sequences in one forward/backward), lr 1e-5 constant, β = 0 (no reference model),
clip 0.2, μ = 1 (π_old = π_θ detached, no extra forward pass), token-mean loss (TRL: ``dapo``), group
reward normalisation, gradient-norm clip 1.0, no gradient checkpointing, fp32.

* ragrl: ``load_method("search_r1")`` with ``rollout.max_turns=1`` and no retriever, the reward
  replaced by ``bench_len``; ``GRPOTrainer.step()`` is timed (rollout, reward, advantages, update,
  metrics) plus the metrics-log write that ``Trainer.train`` does after each step.
* TRL: ``trl.GRPOTrainer`` with a reward function computing the same thing; ``trainer.train()`` with a
  callback stamping ``on_step_end``; a step is the time between two stamps (batch fetch, generation
  with ``model.generate``, reward, update, TRL's per-step logging).

The reward (both sides): the share of the letter ``e`` among the completion's characters, a
deterministic function of the text that varies within every group, so both sides compute non-zero
advantages and a real update (an EM reward on an untrained model would be 0 everywhere).

Lengths: an untrained policy rarely emits EOS, so most sequences run to ``--new-tokens``; ragrl's
Search-R1 rollout also stops at ``</search>`` / ``</answer>`` (TRL only at EOS). The mean completion
length of each side is printed so the reader can check the work is comparable.

Each repeat builds both trainers afresh (construction not timed), runs 1 warm-up step plus ``--steps``
timed steps on each, alternating which side goes first; a side's time per step is the median of its
timed steps within a repeat, the best repeat is kept (the median over repeats is printed too). The ratio
is TRL's seconds per step / ragrl's (= ragrl's steps per second / TRL's); the last line printed.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import logging
import os
import statistics
import sys
import time
import warnings

import torch
from tiny_setup import add_model_args, open_workdir, world_and_policy

from ragrl.data.io import read_examples
from ragrl.methods import load_method
from ragrl.rewards.registry import register_reward
from ragrl.train.grpo import GRPOTrainer


def letter_share(text: str) -> float:
    """The benchmark reward: the share of ``e`` among the characters of a completion."""
    return text.count("e") / max(len(text), 1)


@register_reward("bench_len")
def bench_len(trajectory, example, ctx) -> float:  # noqa: ANN001
    return letter_share(trajectory.policy_text)


def trl_reward(completions, **kwargs) -> list[float]:  # noqa: ANN001, ANN003
    """The same reward for TRL (conversational completions are ``[{"role", "content"}]`` lists)."""
    return [letter_share(c[-1]["content"] if isinstance(c, list) else c) for c in completions]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="questions per step (P)")
    ap.add_argument("--group", type=int, default=8, help="samples per question (G)")
    ap.add_argument("--new-tokens", type=int, default=32, help="max new tokens per completion (L)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per side and repeat")
    ap.add_argument("--repeats", type=int, default=2)
    add_model_args(ap)
    args = ap.parse_args()
    P, G, L, S = args.prompts, args.group, args.new_tokens, args.steps

    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    import datasets
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()

    tmp, workdir = open_workdir(args.workdir, "ragrl-grpo-vs-trl-")
    t_setup = time.perf_counter()
    data, model_dir = world_and_policy(workdir, args.hidden, args.layers)
    examples, _ = read_examples(data / "train.jsonl")
    examples = examples[:P]
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    base = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)

    overrides = {
        "rollout.max_turns": 1,
        "rollout.n": G,
        "rollout.max_new_tokens": L,
        "rollout.max_total_tokens": max(L, 1024),
        "rollout.temperature": 1.0,
        "rollout.top_p": 1.0,
        "rollout.top_k": 0,
        "reward": [{"name": "bench_len", "weight": 1.0}],
        "train.steps": S + 1,
        "train.optim.lr": 1e-5,
        "train.optim.schedule": "constant",
        "train.optim.max_grad_norm": 1.0,
        "train.grpo.prompts_per_step": P,
        "train.grpo.kl_coef": 0.0,
        "train.grpo.ppo_epochs": 1,
        "train.grpo.minibatches": 1,
        "train.grpo.micro_batch_size": 0,
        "train.grpo.loss_agg": "token_mean",
        "train.grpo.group_filter": "keep_all",
        "train.model.generation_batch_size": P * G,
        "train.model.gradient_checkpointing": False,
    }
    method = load_method("search_r1", overrides)

    # the same prompts, token for token: ours through the protocol, TRL's the way it renders them
    ours_prompt = [method.protocol.prompt_ids(ex, tokenizer) for ex in examples]
    messages = [method.protocol.messages(ex) for ex in examples]
    rendered = tokenizer.apply_chat_template(
        conversation=messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    trl_prompt = [list(ids) for ids in rendered["input_ids"]]
    dataset = datasets.Dataset.from_list([{"prompt": m} for m in messages])
    print(
        f"setup: tiny policy {sum(p.numel() for p in base.parameters()):,} params "
        f"(hidden {args.hidden}, layers {args.layers}), P={P} prompts x G={G}, {L} new tokens, "
        f"torch threads {torch.get_num_threads()}, cpus {os.cpu_count()}, trl {trl.__version__} "
        f"({time.perf_counter() - t_setup:.1f} s)"
    )
    print(
        f"prompt tokens (mean): ragrl {statistics.mean(map(len, ours_prompt)):.1f}, "
        f"TRL {statistics.mean(map(len, trl_prompt)):.1f}; identical ids: {ours_prompt == trl_prompt}"
    )

    class Stamps(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.cpu_ends: list[float] = []
            self.lengths: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
            self.ends.append(time.perf_counter())
            self.cpu_ends.append(time.process_time())

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN003
            if logs and "completions/mean_length" in logs:
                self.lengths.append(float(logs["completions/mean_length"]))

    def run_ours(rep: int) -> tuple[list[float], list[float], list[float]]:
        trainer = GRPOTrainer(
            method, method.train, run_dir=workdir / f"ours-{rep}", train_examples=examples,
            eval_examples=[], retriever=None, model=copy.deepcopy(base), tokenizer=tokenizer,
        )  # fmt: skip
        times, cpu, lengths = [], [], []
        for _ in range(S + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            metrics = trainer.step()
            trainer.log.log(trainer.kind, trainer.step_count, metrics)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            lengths.append(float(metrics["response_len"]))
        return times[1:], cpu[1:], lengths[1:]

    def run_trl(rep: int) -> tuple[list[float], list[float], list[float], trl.GRPOConfig]:
        config = trl.GRPOConfig(
            output_dir=str(workdir / f"trl-{rep}"),
            per_device_train_batch_size=P * G,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_generations=G,
            max_completion_length=L,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            learning_rate=1e-5,
            lr_scheduler_type="constant",
            max_grad_norm=1.0,
            beta=0.0,
            num_iterations=1,
            epsilon=0.2,
            loss_type="dapo",
            scale_rewards="group",
            gradient_checkpointing=False,
            bf16=False,
            use_cpu=True,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            max_steps=S + 1,
            seed=0,
        )
        stamps = Stamps()
        trainer = trl.GRPOTrainer(
            model=copy.deepcopy(base), processing_class=tokenizer, reward_funcs=[trl_reward],
            args=config, train_dataset=dataset, callbacks=[stamps],
        )  # fmt: skip
        trainer.remove_callback(PrinterCallback)  # TRL's per-step log dicts on stdout
        trainer.train()
        times = [b - a for a, b in itertools.pairwise(stamps.ends)]
        cpu = [b - a for a, b in itertools.pairwise(stamps.cpu_ends)]
        return times, cpu, stamps.lengths[1:], config

    per_step: dict[str, list[float]] = {"ragrl": [], "trl": []}
    cpu_step: dict[str, list[float]] = {"ragrl": [], "trl": []}  # process CPU seconds: a shared-machine check
    lengths: dict[str, list[float]] = {"ragrl": [], "trl": []}
    trl_config = None
    for rep in range(args.repeats):
        order = ("ragrl", "trl") if rep % 2 == 0 else ("trl", "ragrl")
        for side in order:
            if side == "ragrl":
                times, cpu, lens = run_ours(rep)
            else:
                times, cpu, lens, trl_config = run_trl(rep)
            assert len(times) == S, f"{side}: {len(times)} timed steps, expected {S}"
            per_step[side].append(statistics.median(times))
            cpu_step[side].append(statistics.median(cpu))
            lengths[side] += lens

    assert trl_config is not None
    print(
        f"TRL config: loss {trl_config.loss_type}, optim {trl_config.optim}, scale_rewards "
        f"{trl_config.scale_rewards}, steps_per_generation {trl_config.steps_per_generation}, "
        f"generation_batch_size {trl_config.generation_batch_size}"
    )
    print(
        f"completion tokens (mean over timed steps): ragrl {statistics.mean(lengths['ragrl']):.2f}, "
        f"TRL {statistics.mean(lengths['trl']):.2f} (max {L})"
    )
    for side, name in (("ragrl", "ragrl"), ("trl", "TRL  ")):
        t = per_step[side]
        print(
            f"{name}: {min(t):.3f} s/step (best of {args.repeats} repeats x median of {S} steps; "
            f"median {statistics.median(t):.3f}; all {', '.join(f'{x:.3f}' for x in t)})"
        )
    med = {side: statistics.median(t) for side, t in per_step.items()}
    cpu_best = {side: min(t) for side, t in cpu_step.items()}
    print(
        f"median-repeat ratio: {med['trl'] / med['ragrl']:.2f}; CPU seconds/step (best): ragrl "
        f"{cpu_best['ragrl']:.3f}, TRL {cpu_best['trl']:.3f}, ratio {cpu_best['trl'] / cpu_best['ragrl']:.2f}"
    )

    if tmp is not None:
        tmp.cleanup()
    sys.stdout.flush()
    print(f"ragrl/TRL GRPO step throughput ratio: {min(per_step['trl']) / min(per_step['ragrl']):.2f}")


if __name__ == "__main__":
    main()
