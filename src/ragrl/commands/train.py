"""``ragrl train``, ``ragrl sft`` and ``ragrl demo``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ragrl.commands import METHOD_CHOICES, SetOption
from ragrl.console import console
from ragrl.errors import RagrlError
from ragrl.synth.world import DEFAULT_SPLIT_MODE
from ragrl.train.demo import DEFAULT_COPY_STEPS

ResumeOption = Annotated[
    str | None,
    typer.Option(help="Resume from 'latest' (the newest checkpoint of the run folder) or a checkpoint path."),
]


OutOption = Annotated[Path | None, typer.Option(help="Run folder (default: the config's train.out).")]


def _overrides(overrides: list[str] | None, out: Path | None) -> list[str]:
    """The ``--set`` overrides, with ``--out`` as ``train.out``."""
    return [*(overrides or []), *([f"train.out={out}"] if out is not None else [])]


def _load(config: str, overrides: list[str] | None, out: Path | None):  # noqa: ANN202
    from ragrl.methods import load_method

    return load_method(config, _overrides(overrides, out))


def _policy_run(config: str, overrides: list[str] | None, out: Path | None, resume: str | None):  # noqa: ANN202
    """What ``sft`` and ``dpo`` start from: the method, its run folder, the checkpoint to resume from, the
    accelerator, the retriever (``train.data.index``, opened before the model: a server that does not
    answer is an error at once) and the policy with its tokenizer."""
    from ragrl.train.base import load_index
    from ragrl.train.setup import load_policy, make_accelerator

    method = _load(config, overrides, out)
    run_dir, resume = _start_run_dir(method, resume)
    accelerator = make_accelerator(method.train)
    retriever = load_index(method.train)
    model, tokenizer = load_policy(method.train.model, accelerator.device)
    return method, run_dir, resume, accelerator, retriever, model, tokenizer


RUN_FILES = (
    "metrics.jsonl", "samples.jsonl", "summary.json", "report.md", "curves.png", "config.yaml",
    "environment.json", "checkpoints", "policy", "best",
)  # fmt: skip
"""What a run writes in its folder (a restart clears these and nothing else)."""


def _start_run_dir(method, resume: str | None) -> tuple[Path, str | None]:  # noqa: ANN001
    """The run folder, ready, and the checkpoint to resume from.

    ``--resume latest`` on a run that never finished and never completed a checkpoint (a config error, a
    kill during the first checkpoint write) starts it again from step 0, clearing the run's own files,
    instead of refusing both ways. A finished run (``summary.json``, ``policy/``) is never cleared. Under
    several processes every process looks before the main process writes."""
    import shutil

    from ragrl.train.setup import process_state
    from ragrl.train.state import list_checkpoints

    run_dir = Path(method.train.out)
    state = process_state()
    present = [name for name in RUN_FILES if name != "config.yaml" and (run_dir / name).exists()]
    restart = False
    if resume == "latest" and not list_checkpoints(run_dir):
        finished = [name for name in ("summary.json", "policy", "best") if (run_dir / name).exists()]
        if finished:
            raise RagrlError(
                f"{run_dir}: no checkpoint to resume from, and the run has finished ({', '.join(finished)}); "
                "choose another --out to train again"
            )
        restart, resume = bool(present), None
    elif resume is None and present:
        raise RagrlError(
            f"{run_dir}: a run is already there ({', '.join(present)}); pass --resume latest (it continues "
            "from the newest checkpoint, or starts again if the run never made one) or choose another --out"
        )
    state.wait_for_everyone()  # every process has looked before anything is removed or written
    if state.is_main_process:
        if restart:
            console.print(f"{run_dir}: no complete checkpoint to resume from; starting again from step 0")
            for name in present:
                target = run_dir / name
                if target.is_dir():
                    shutil.rmtree(target, ignore_errors=True)
                else:
                    target.unlink(missing_ok=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(method.resolved_yaml(), encoding="utf-8")
    state.wait_for_everyone()
    return run_dir, resume


def _report(run_dir: Path, summary: dict) -> None:
    """The run's report and its summary on stdout, once: by the main process of a launched run."""
    from ragrl.train.report import write_report
    from ragrl.train.setup import process_state

    if process_state().is_main_process:
        write_report(run_dir, summary)
        print(json.dumps(summary, indent=2))


def train(
    config: Annotated[str, typer.Argument(metavar="CONFIG", help=f"The method config: {METHOD_CHOICES}.")],
    set_: SetOption = None,
    out: OutOption = None,
    resume: ResumeOption = None,
) -> None:
    """Train a method's policy (train.algo: grpo, or cycles of sibling candidates, a reward model and
    DPO); writes the run folder and prints the summary as JSON. A config with train.stages runs each
    stage in turn (<out>/stage-<i>-<name>, docs/training.md)."""
    from ragrl.train.report import write_report
    from ragrl.train.setup import process_state
    from ragrl.train.stages import run_stages, stage_dir
    from ragrl.train.trainers import check_trainable, make_trainer

    method = _load(config, set_, out)
    if method.train.stages:
        if resume not in (None, "latest"):
            raise RagrlError(
                "a staged run resumes with --resume latest (each stage from its newest checkpoint)"
            )
        summaries = run_stages(method, resume=resume is not None)
        if process_state().is_main_process:
            for i, (summary, stage) in enumerate(zip(summaries, method.train.stages, strict=False)):
                write_report(stage_dir(Path(method.train.out), i, stage.name), summary)
            print(json.dumps({"stages": summaries}, indent=2))
        return
    check_trainable(method)  # before the run folder is made
    run_dir, resume = _start_run_dir(method, resume)
    summary = make_trainer(method, method.train, run_dir=run_dir).train(resume=resume)
    _report(run_dir, summary)


def sft(
    config: Annotated[str, typer.Argument(metavar="CONFIG", help=f"The method config: {METHOD_CHOICES}.")],
    demos: Annotated[
        str,
        typer.Option(
            help="Demonstrations: a trajectory jsonl file, 'oracle' (the method's own oracle, else the "
            "world's search oracle), 'quote' (the world's quoting oracle: entity queries, quoted evidence; "
            "the oracles of EVO-RAG, Eval-RAR, TIRESRAG-R1 and ARENA speak it in their own grammar) or "
            "'heuristic' (the world's)."
        ),
    ],
    world: Annotated[
        Path | None,
        typer.Option(help="world.json for the heuristic demonstrator (default: next to the data)."),
    ] = None,
    set_: SetOption = None,
    out: OutOption = None,
    resume: ResumeOption = None,
) -> None:
    """Supervised warm start on demonstration trajectories (loss on policy tokens only)."""
    from ragrl.rollout.records import read_trajectories, write_trajectories
    from ragrl.train.base import load_examples
    from ragrl.train.sft import SFTTrainer, demonstration_trajectories

    method, run_dir, resume, accelerator, retriever, model, tokenizer = _policy_run(config, set_, out, resume)
    cfg = method.train
    from ragrl.synth.demonstrators import DEMONSTRATORS, demonstrator_by_name

    if demos in DEMONSTRATORS:
        if not cfg.data.train:
            raise RagrlError(
                "--demos oracle|quote|heuristic plays the demonstrator on train.data.train: set it"
            )
        world_json = world or Path(cfg.data.train).parent / "world.json"
        if demos == "quote" and method.oracle is not None and not hasattr(method.oracle, "wrap"):
            raise RagrlError(
                f"--demos quote writes Search-R1 turns; {method.name} has its own grammar and oracle "
                "(--demos oracle)"
            )
        if demos == "oracle" and method.oracle is not None:
            demonstrator = method.oracle  # the method's own grammar (EVO-RAG's refusals, ...)
        elif demos == "quote" and method.oracle is not None:  # its grammar around the quoting oracle
            demonstrator = method.oracle.wrap(demonstrator_by_name(demos, world_json))
        else:
            demonstrator = demonstrator_by_name(demos, world_json)
        examples = method.prepare_examples(
            load_examples(cfg.data.train, "train.data.train"), "train.data.train"
        )
        trajectories = demonstration_trajectories(method, tokenizer, demonstrator, examples, retriever)
        if accelerator.is_main_process:  # what the warm start learned from, kept with the run
            write_trajectories(run_dir / "demonstrations.jsonl", trajectories)
    else:
        trajectories = read_trajectories(demos)
        if not trajectories:
            raise RagrlError(f"{demos}: no demonstrations (an empty file)")
    if accelerator.is_main_process:
        console.print(f"SFT on {len(trajectories)} demonstrations")
    trainer = SFTTrainer(
        method, cfg, trajectories, run_dir=run_dir, retriever=retriever, accelerator=accelerator,
        model=model, tokenizer=tokenizer,
    )  # fmt: skip
    summary = trainer.train(resume=resume)
    _report(run_dir, summary)


def dpo(
    config: Annotated[str, typer.Argument(metavar="CONFIG", help=f"The method config: {METHOD_CHOICES}.")],
    pairs: Annotated[
        Path,
        typer.Option(
            help="Preference pairs (jsonl): {prompt_ids, chosen: {completion_ids}, rejected: {...}} or "
            "{prompt, chosen, rejected} as text."
        ),
    ],
    set_: SetOption = None,
    out: OutOption = None,
    resume: ResumeOption = None,
) -> None:
    """Preference training (DPO and its variants, train.dpo.*) on (chosen, rejected) pairs."""
    from ragrl.train.dpo import DPOTrainer, read_pairs

    method, run_dir, resume, accelerator, retriever, model, tokenizer = _policy_run(config, set_, out, resume)
    cfg = method.train
    records = read_pairs(pairs, tokenizer)
    if accelerator.is_main_process:
        console.print(f"DPO ({cfg.dpo.loss_type}, beta {cfg.dpo.beta}) on {len(records)} pairs")
    trainer = DPOTrainer(
        method, cfg, records, run_dir=run_dir, accelerator=accelerator, model=model, tokenizer=tokenizer,
        retriever=retriever,
    )  # fmt: skip
    summary = trainer.train(resume=resume)
    _report(run_dir, summary)


def reward_model(
    pairs: Annotated[
        Path,
        typer.Option(
            help="Preference pairs (jsonl, as for `ragrl dpo`), optionally with head_signs per pair."
        ),
    ],
    encoder: Annotated[Path, typer.Option(help="The frozen encoder: a local causal-LM folder.")],
    out: Annotated[Path, typer.Option(help="Where to write the heads (a new folder).")],
    heads: Annotated[
        str, typer.Option(help="Comma-separated head names (one per reward component).")
    ] = "total",
    epochs: Annotated[int, typer.Option(min=1)] = 20,
    lr: Annotated[float, typer.Option(min=0.0)] = 1e-3,
    batch_size: Annotated[int, typer.Option(min=1)] = 64,
    val_fraction: Annotated[float, typer.Option(min=0.0, max=0.99)] = 0.1,
    seed: int = 0,
) -> None:
    """Train a multi-head reward model (named linear heads on a frozen encoder) on preference pairs;
    prints the last epoch's training and validation figures as JSON. Under `accelerate launch` or
    `torchrun` each process embeds an equal share of the pairs with its own copy of the encoder, and
    the heads train on all of them (their gradients added over processes): the same heads as one
    process would train on every pair."""
    import math

    import torch

    from ragrl.config.train import TrainConfig
    from ragrl.llm.environment import record_environment
    from ragrl.llm.hf_backend import _load, load_tokenizer
    from ragrl.train.reward_model import RewardModelConfig, RewardModelTrainer, read_reward_pairs
    from ragrl.train.setup import make_accelerator

    if out.exists() and any(out.iterdir()):
        raise RagrlError(f"{out}: already exists and is not empty; choose a new --out")
    if not encoder.is_dir():
        raise RagrlError(f"--encoder {encoder}: not a local model folder")
    acc = make_accelerator(TrainConfig())
    model = _load(encoder, torch.float32).eval().to(acc.device)
    tokenizer = load_tokenizer(encoder)
    records = read_reward_pairs(pairs, tokenizer)
    names = [h.strip() for h in heads.split(",") if h.strip()]
    config = RewardModelConfig(names, epochs, batch_size, lr, val_fraction=val_fraction, seed=seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if acc.is_main_process:
        processes = f" over {acc.num_processes} processes" if acc.num_processes > 1 else ""
        console.print(f"reward model: {len(names)} head(s) on {encoder}, {len(records)} pairs{processes}")
    share = math.ceil(len(records) / acc.num_processes)  # this process's contiguous share
    mine = records[acc.process_index * share : (acc.process_index + 1) * share]
    trainer = RewardModelTrainer(model, pad, mine, config, name=str(encoder), acc=acc)
    history = trainer.train()
    if acc.is_main_process:
        trainer.model.save(out)
        lines = "".join(json.dumps(r) + "\n" for r in history)
        (out / "metrics.jsonl").write_text(lines, encoding="utf-8")
        record_environment(out / "environment.json")  # as every training run's folder
        print(json.dumps({"out": str(out), "pairs": len(records), **history[-1]}, indent=2))
    acc.wait_for_everyone()


def demo(
    out: Annotated[Path, typer.Option(help="Run folder.")] = Path("runs/demo"),
    seed: Annotated[int, typer.Option(help="Seed of the world, the policy and training.")] = 0,
    split: Annotated[
        str,
        typer.Option(
            help="World split: facts (held-out questions need facts no training question needs; names "
            "shared) or entities (no shared person, company, work or city: harder)."
        ),
    ] = DEFAULT_SPLIT_MODE,
    copy_steps: Annotated[
        int,
        typer.Option(
            help="At most this many short-sequence copy pre-training steps of the tiny policy "
            "(it stops early once it copies; then the long-sequence steps run)."
        ),
    ] = DEFAULT_COPY_STEPS,
    base: Annotated[
        str,
        typer.Option(
            help="The policy to start from: 'shipped' (the pretrained reader base in the package, "
            "`make reader-base`), a reader-base folder, or 'scratch' (a tiny policy built on the world, "
            "pre-trained to copy: the earlier demo)."
        ),
    ] = "shipped",
    warm_start: Annotated[
        bool,
        typer.Option(
            help="The SFT warm start on the world's quoting-oracle demonstrations before GRPO (25 steps "
            "of their answer turns from a base, 200 name-swapped ones from scratch); --no-warm-start: "
            "GRPO from the policy as is."
        ),
    ] = True,
    set_: SetOption = None,
    force: Annotated[bool, typer.Option(help="Replace an existing run folder.")] = False,
) -> None:
    """The main job: world -> reader base -> SFT warm start -> GRPO -> held-out EM before/after."""
    from ragrl.train.demo import run_demo, summary_table
    from ragrl.train.reader import resolve_base
    from ragrl.train.setup import process_state

    if process_state().num_processes > 1:
        raise RagrlError("ragrl demo runs on one process; launch `ragrl train` on several instead")
    s = run_demo(
        out, seed=seed, split=split, base=resolve_base(base), copy_steps=copy_steps, warm_start=warm_start,
        overrides=set_ or (), force=force,
    )  # fmt: skip
    console.print(summary_table(s))
    gain = 100 * (s["em_answerable_after"] - s["em_answerable_before"])
    console.print(
        f"held-out EM on answerable questions: warm start {s['em_answerable_before']:.3f} -> after GRPO "
        f"{s['em_answerable_after']:.3f} ({gain:+.1f} points), closed-book "
        f"{s['em_answerable_closed_book']:.3f}; most common answer "
        f"{s['top_answer_after']!r} ({100 * s['top_answer_share_after']:.0f}%); "
        f"{s['wall_seconds']:.0f} s, peak memory {s['peak_memory_mb']:.0f} MB; report: {out / 'report.md'}"
    )
    print(json.dumps(s, indent=2))
