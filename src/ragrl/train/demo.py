"""``ragrl demo``: the project's main job on its embedded defaults, a policy learning on a CPU.

1. generate the synthetic multi-hop world (seeded; the ``facts`` split by default: held-out questions
   need facts no training question needs, entity names are shared) and index its corpus with BM25;
2. the policy: the **pretrained reader base** (``ragrl.train.reader``; the shipped one by default,
   checked against its ``SHA256SUMS`` when it loads), a tiny Llama with a BPE tokenizer that learned to
   read on other synthetic worlds, none of whose facts a held-out question of this world needs. With
   ``base=None`` (``--base scratch``, the earlier demo) a tiny policy is built on this world instead,
   with a word-level tokenizer, and pre-trained to copy (``ragrl.llm.copy_pretrain``);
3. a *partial* SFT warm start on the **quoting oracle**'s trajectories of this world's training
   questions (``QuotingOracle``: entity queries, the evidence sentence quoted before each step):
   ``BASE_SETTINGS`` from the base (the answer turns only: reading, not searching), ``DEMO_SETTINGS``'
   name-swapped one from scratch;
4. train it with GRPO and the Search-R1 method (``methods/configs/search_r1-tiny.yaml`` with the
   demo's settings: the one-line prompt, the rollout temperature, a lower rate, the answerable
   training questions only; from the base, the BPE's longer token limits), evaluated on the world's
   dev questions every 10 steps;
5. evaluate on the held-out test questions, read here only: the heuristic demonstrator, the warm start,
   the final policy, and the final policy closed-book (every search finds nothing: what it knows
   without reading). Write the run folder: the resolved ``config.yaml``, ``metrics.jsonl`` (its
   evaluations are the dev ones), ``samples.jsonl``, ``report.md`` + ``curves.png`` and
   ``summary.json`` (``warm_start/`` holds the SFT stage's own metrics and checkpoint).

``sft_control`` trains a finished run's warm start with SFT alone for the RL stage's wall time: the
control the papers' "RL beats SFT" claim needs.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragrl.console import console
from ragrl.errors import RagrlError
from ragrl.synth.world import DEFAULT_SPLIT_MODE

DEMO_CONFIG = "search_r1-tiny"
DEFAULT_COPY_STEPS = 1500
DEMO_SETTINGS = (
    # a model trained from scratch does not read an instruction: the prompt is the question alone
    # (sequences ~35% shorter, so each SFT and GRPO step is cheaper)
    "protocol.user='Question: {question}'",
    # the warm start: every demonstration name-swapped, so names can only be copied (docs/training.md)
    "train.sft.name_swap=1.0",
    "train.sft.batch_size=32",
    "train.sft.lr=1e-3",
    "train.sft.max_steps=200",
    # GRPO: after this warm start the policy is near-deterministic at T = 0.5 (entropy 0.02, 94% of the
    # groups without variance) and a rate of 2e-4 broke its format; T = 1 and 1e-4 keep it learning
    # (T = 0.8 measured no better: in probes of 50 and 80 steps and a three-seed run of 60; docs/training.md)
    "rollout.temperature=1.0",
    "train.optim.lr=1e-4",
    "train.steps=50",
    # GRPO on the answerable questions only: with them, the reward of `unknown` on the unanswerable ones
    # pulled the policy towards refusing (its share rose from 14% to 23% on seed 1's warm start, EM fell)
    "train.data.train_answerable_only=true",
    # the live held-out curve: the dev questions every 10 steps (the test questions are read at the end
    # only). Keeping the best policy by dev EM did worse than the last step (docs/training.md)
    "train.eval_every=10",
)


BASE_SETTINGS = (
    # the base's BPE spells a name in pieces (sequences ~40% longer than word-level): with the
    # word-level limits (320 / 48 / 160) 18% of the quoting oracle's episodes on a pretraining world
    # were cut short (53 of 296 at max_tokens, 10 quotes cut mid-turn); with these, none
    "rollout.max_total_tokens=512",
    "rollout.max_new_tokens=96",
    "rollout.max_obs_tokens=256",
    "train.sft.batch_size=32",
    "train.sft.lr=1e-3",
    # a short warm start on this world's quoting-oracle demonstrations, their answer turns only: the
    # policy learns to read this world (quote the evidence, then answer), not how to search it, which
    # GRPO learns (the second hop). Measured over seeds 0-2 against every turn, none and 100 steps
    # (docs/training.md, "Measured: the demo on the reader base")
    "train.sft.max_steps=25",
    "train.sft.turns=last",
    # the same update in micro-batches of 32 sequences (gradients accumulated): with the BPE's longer
    # sequences one pass over 64 of 480 tokens peaked 3.1 GB above the loaded model on the CPU, two of
    # 32 1.6 GB in 27% less time (benchmarks/micro_batch_memory.py); the demo's peak RSS fell from 3.7
    # to 2.6 GiB (docs/training.md, "Measured: the reading-only warm start")
    "train.grpo.micro_batch_size=32",
)
"""The demo's warm start and GRPO from the pretrained reader base, over ``DEMO_SETTINGS`` (whose name
swap needs a word-level tokenizer: the base's BPE spells names, and has read other worlds' facts). The
reader base is trained with the same protocol and rollout limits (``ragrl.train.reader``)."""


def warn_if_unprotected(base: Path, seed: int, size: str) -> None:
    """Say so when the demo's world is not one the base's fairness check protected (its held-out facts
    may then occur in what the base read)."""
    from ragrl.console import styled

    path = base / "ragrl_reader.json"
    if not path.is_file():  # a pretrained model of its own (SmolLM2, ...): nothing ragrl can check
        console.print(
            f"demo: {base} is not a ragrl reader base: what it read is not checked against the world "
            "(the closed-book row is the control)"
        )
        return
    recipe = json.loads(path.read_text(encoding="utf-8")).get("recipe", {})
    if seed not in recipe.get("protected", []) or size != recipe.get("size"):
        console.print(
            styled(
                "warning:",
                "yellow",
                f"the reader base {base} was not checked against world seed {seed} ({size}): its "
                "held-out facts may occur in what the base read (docs/models.md, 'Fair by construction')",
            )
        )


def base_settings() -> list[str]:
    """``DEMO_SETTINGS`` without the name swap, then ``BASE_SETTINGS``."""
    return [s for s in DEMO_SETTINGS if not s.startswith("train.sft.name_swap")] + list(BASE_SETTINGS)


def _held_out(report: Any, examples: Sequence[Any]) -> dict[str, Any]:
    """EM, EM on the answerable questions, the most common answer and its share, searches, the outcomes
    of the answerable questions, and the share of them the policy refused (answered the unanswerable
    questions' ``unknown``: a drift towards refusing is a wrong answer to the outcomes, not a missing
    one)."""
    from ragrl.eval.runner import collapse_check
    from ragrl.metrics.normalize import normalize
    from ragrl.rollout.outcomes import count_outcomes
    from ragrl.synth.questions import UNANSWERABLE_ANSWER

    check = collapse_check(report.rows, list(examples))
    answerable = {ex.id for ex in examples if ex.answerable}
    refusal = normalize(UNANSWERABLE_ANSWER)
    refused = [
        r for r in report.rows if r["id"] in answerable and normalize(r["prediction"] or "") == refusal
    ]
    return {
        "em": report.scores.get("em", 0.0),
        "em_answerable": check["eval/em_answerable"],
        "top_answer": check["eval/top_answer"],
        "top_answer_share": check["eval/top_answer_share"],
        "searches": report.scores.get("searches_per_question", 0.0),
        "n": len(examples),
        # why the answerable questions were missed: searching or reading (docs/eval.md, "Outcomes")
        "outcomes_answerable": count_outcomes([r["outcome"] for r in report.rows if r["id"] in answerable]),
        "em_answerable_by_type": em_by_type(report.rows, examples),
        "refused_answerable": round(len(refused) / len(answerable), 4) if answerable else 0.0,
    }


def em_by_type(rows: Sequence[dict[str, Any]], examples: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """EM on the answerable questions of each ``metadata.type`` (``bridge``, ``comparison``, ...;
    ``untyped`` where a question has none): ``{type: {"n": questions, "right": right, "em": share}}``.
    A comparison names its candidate answers, so a policy that guesses is right on some of them with no
    evidence at all; the closed-book row's bridge questions are what it could only know by heart."""
    kinds = {ex.id: str(ex.metadata.get("type") or "untyped") for ex in examples if ex.answerable}
    counts: dict[str, list[float]] = {}
    for row in rows:
        if row["id"] in kinds:
            counts.setdefault(kinds[row["id"]], []).append(float(row.get("em", 0.0)))
    return {
        kind: {"n": len(ems), "right": round(sum(ems), 6), "em": round(sum(ems) / len(ems), 6)}
        for kind, ems in sorted(counts.items())
    }


def run_demo(
    out: str | Path = "runs/demo",
    *,
    seed: int = 0,
    size: str = "small",
    split: str = DEFAULT_SPLIT_MODE,
    base: str | Path | None = None,
    copy_steps: int = DEFAULT_COPY_STEPS,
    warm_start: bool = True,
    settings: Sequence[str] | None = None,
    overrides: Sequence[str] = (),
    force: bool = False,
) -> dict[str, Any]:
    """Run the whole demo into ``out``; returns the summary (also written to ``summary.json``).

    ``base``: a pretrained reader base (``ragrl.train.reader``; its ``SHA256SUMS`` is checked when it
    loads) that the warm start starts from, with ``BASE_SETTINGS``; None builds the policy from scratch
    on the world (``copy_steps`` of copy pre-training, then ``DEMO_SETTINGS``' name-swapped warm start).
    ``warm_start=False`` skips the SFT: GRPO starts from the policy as it is (the "warm start" row is
    then that policy). ``settings`` replace those defaults (a pretrained instruct model's recipe,
    ``benchmarks/gpu_learning.py``); ``overrides`` go on top."""
    from ragrl.console import quiet_libraries
    from ragrl.data.io import read_corpus, read_examples
    from ragrl.eval.runner import evaluate
    from ragrl.llm.tiny import CopyPretraining, create_tiny_policy
    from ragrl.methods import load_method, vocabulary_texts
    from ragrl.retrieval.bm25 import BM25Retriever
    from ragrl.retrieval.null import NullRetriever
    from ragrl.rollout.scripted import DemonstratorBackend
    from ragrl.synth.demonstrators import HeuristicDemonstrator, QuotingOracle
    from ragrl.synth.generate import generate_world
    from ragrl.train.base import before_after
    from ragrl.train.grpo import GRPOTrainer
    from ragrl.train.report import write_report
    from ragrl.train.setup import load_policy, make_accelerator, peak_memory_mb
    from ragrl.train.sft import SFTTrainer, demonstration_trajectories

    quiet_libraries()
    t0 = time.perf_counter()
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not force:
            raise RagrlError(f"{out}: already exists; pass --force to replace it or choose another --out")
        shutil.rmtree(out)
    world_dir = out / "world"

    # 1. the world and its index
    console.print(f"demo: synthetic world (seed {seed}, {size}, {split} split) -> {world_dir}")
    generate_world(seed, size, split=split).write(world_dir)
    train, _ = read_examples(world_dir / "train.jsonl")
    test, _ = read_examples(world_dir / "test.jsonl")
    dev, _ = read_examples(world_dir / "dev.jsonl")
    passages, _ = read_corpus(world_dir / "corpus.jsonl")
    retriever = BM25Retriever.build(passages)
    retriever.save(world_dir / "bm25")

    # 2. the policy: the pretrained reader base, or a tiny policy built here and pre-trained to copy
    if base is not None:
        policy_dir, settings = Path(base), base_settings() if settings is None else list(settings)
        console.print(f"demo: the pretrained base {policy_dir}")
        warn_if_unprotected(policy_dir, seed, size)
    else:
        policy_dir = out / "tiny-policy"
        settings = list(DEMO_SETTINGS) if settings is None else list(settings)
        console.print(f"demo: tiny policy, copy pre-training (at most {copy_steps} steps)")
        create_tiny_policy(
            world_dir, policy_dir, seed=seed, copy=CopyPretraining(steps=copy_steps),
            extra_texts=vocabulary_texts(),
        )  # fmt: skip

    common = [
        f"train.seed={seed}",
        f"train.model.path={policy_dir}",
        f"train.data.train={world_dir / 'train.jsonl'}",
        f"train.data.eval={world_dir / 'dev.jsonl'}",
        f"train.data.index={world_dir / 'bm25'}",
        *settings,
    ]
    method = load_method(DEMO_CONFIG, [*common, *overrides])
    config = method.train
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(method.resolved_yaml(), encoding="utf-8")

    # 3. partial SFT warm start on the oracle demonstrator
    accelerator = make_accelerator(config)
    model, tokenizer = load_policy(config.model, accelerator.device)
    quiet_libraries()  # transformers is loaded now: its progress bars too
    warm_steps = 0
    if warm_start:
        demos = demonstration_trajectories(method, tokenizer, QuotingOracle(), train, retriever)
        turns = "their answer turns" if config.sft.turns == "last" else "every turn"
        console.print(
            f"demo: SFT warm start, {config.sft.max_steps} steps on {len(demos)} quoting-oracle "
            f"trajectories ({turns})"
        )
        sft = SFTTrainer(
            method, config, demos, run_dir=out / "warm_start", eval_examples=[], retriever=retriever,
            accelerator=accelerator, model=model, tokenizer=tokenizer,
        )  # fmt: skip
        sft.train()
        model, warm_steps = sft.policy, sft.step_count
    else:
        console.print("demo: no warm start: GRPO starts from the policy as it is")

    # 4. GRPO from the warm start, evaluated on the dev questions: the test questions are read by the
    # closing table only
    console.print(
        f"demo: GRPO, {config.steps} steps of {config.grpo.prompts_per_step} questions × {method.rollout.n}"
        f" (evaluated on the {len(dev)} dev questions)"
    )
    grpo = GRPOTrainer(
        method, config, run_dir=out, train_examples=train, eval_examples=dev, retriever=retriever,
        accelerator=make_accelerator(config), model=model, tokenizer=tokenizer,
    )  # fmt: skip
    # every row of the closing table is measured on these (the first train.data.eval_limit, as on dev)
    held_out = method.prepare_examples(test, str(world_dir / "test.jsonl"))[: config.data.eval_limit or None]

    def on_test(reader: Any) -> dict[str, Any]:
        run = evaluate(
            grpo.backend, reader, method, held_out, seed=config.seed, temperature=config.eval_temperature
        )
        return _held_out(run, held_out)

    gazetteer = HeuristicDemonstrator.from_world_json(world_dir / "world.json")
    heuristic = DemonstratorBackend.for_examples(
        tokenizer, gazetteer, held_out, method.protocol, retriever, method.rollout.k
    )
    heuristic_scores = _held_out(evaluate(heuristic, retriever, method, held_out), held_out)
    warm = on_test(retriever)
    rl_started = time.perf_counter()
    summary = grpo.train()
    rl_seconds = time.perf_counter() - rl_started
    after = on_test(retriever)

    # 5. the closed-book control, the summary (the whole demo's wall time and memory) and the report
    console.print("demo: the final policy closed-book (every search finds nothing)")
    closed = on_test(NullRetriever())
    summary["held_out"] = {
        "heuristic demonstrator": heuristic_scores,
        "warm start (SFT)": warm,
        "after GRPO": after,
        "after GRPO, closed-book": closed,
    }
    summary.update(
        split=split,
        base=str(base) if base is not None else None,
        copy_steps=copy_steps if base is None else 0,
        **before_after(warm, after),  # the test questions' (the trainer's own are the dev ones)
        n_dev=len(grpo.eval_examples),
        dev_em_answerable={str(e["step"]): e["eval/em_answerable"] for e in grpo.evals},
        em_warm_start=warm["em"],
        em_closed_book=closed["em"],
        em_answerable_closed_book=closed["em_answerable"],
        top_answer_closed_book=closed["top_answer"],
        em_heuristic=heuristic_scores["em"],
        em_answerable_heuristic=heuristic_scores["em_answerable"],
        warm_start_steps=warm_steps,
        rl_seconds=round(rl_seconds, 1),
        wall_seconds=round(time.perf_counter() - t0, 1),
        peak_memory_mb=peak_memory_mb(),
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    write_report(out, summary)
    return summary


MIN_SFT_STEP_SECONDS = 0.05
"""A floor on an SFT step's time: the control's step budget is at most ``seconds`` / this."""
PROBE_STEPS = 5
"""The control times this many SFT steps before it sets how many fit in the budget."""
CONTROL_SEED_OFFSET = 7919
"""The SFT-only control samples its batches with another seed than the warm start's."""


def sft_control(out: str | Path, seconds: float, *, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The SFT-only control of a finished demo run in ``out``: its warm start trained on with SFT on the
    same demonstrations (from the run's start when it had no warm start) for about ``seconds`` more (the
    RL stage's wall time, its dev evaluations included: a budget that favours the control; the steps
    that fit are set from the time of the first ``PROBE_STEPS``), learning every turn of the
    demonstrations (``train.sft.turns: all``: the searches too, where the demo's warm start learned the
    answer turns only), then evaluated on the held-out test questions as the closing table's rows are.
    Written to
    ``out/sft_control/``; returns the row with ``steps``, ``seconds`` and ``turns``."""
    from ragrl.console import quiet_libraries
    from ragrl.data.io import read_examples
    from ragrl.eval.runner import evaluate
    from ragrl.methods import load_method
    from ragrl.retrieval.bm25 import BM25Retriever
    from ragrl.synth.demonstrators import QuotingOracle
    from ragrl.train.setup import load_policy, make_accelerator
    from ragrl.train.sft import SFTTrainer, demonstration_trajectories

    quiet_libraries()
    out = Path(out)
    warm = out / "warm_start" / "policy"
    # from the warm start, or from the run's own start when it had none (``warm_start=False``)
    start = [f"train.model.path={warm}"] if warm.is_dir() else []
    upper = max(1, int(seconds / MIN_SFT_STEP_SECONDS))
    # plain SFT, every turn of the demonstrations learned, whatever the warm start learned
    method = load_method(
        out / "config.yaml", [*start, f"train.sft.max_steps={upper}", "train.sft.turns=all", *overrides]
    )
    config = method.train
    config.seed += CONTROL_SEED_OFFSET  # its batches continue the warm start's, not replay them
    world_dir = out / "world"
    train, _ = read_examples(world_dir / "train.jsonl")
    test, _ = read_examples(world_dir / "test.jsonl")
    retriever = BM25Retriever.load(world_dir / "bm25")
    accelerator = make_accelerator(config)
    model, tokenizer = load_policy(config.model, accelerator.device)
    demos = demonstration_trajectories(method, tokenizer, QuotingOracle(), train, retriever)
    console.print(f"demo control: SFT for ~{seconds:.0f} s (the RL stage's time)")
    started = time.perf_counter()
    sft = SFTTrainer(
        method, config, demos, run_dir=out / "sft_control", eval_examples=[], retriever=retriever,
        accelerator=accelerator, model=model, tokenizer=tokenizer,
    )  # fmt: skip
    # time a few steps, then run as many as the budget holds (the schedule is the SFT's constant rate)
    probe = min(PROBE_STEPS, upper)
    sft.train(until=probe)
    per_step = (time.perf_counter() - started) / probe
    steps = min(upper, max(probe, round(seconds / per_step)))
    if steps > probe:
        sft.train(until=steps)
    took = time.perf_counter() - started
    held_out = method.prepare_examples(test, str(world_dir / "test.jsonl"))[: config.data.eval_limit or None]
    report = evaluate(
        sft.backend, retriever, method, held_out, seed=config.seed, temperature=config.eval_temperature
    )
    row = {
        **_held_out(report, held_out),
        "steps": steps,
        "seconds": round(took, 1),
        "turns": config.sft.turns,
    }
    (out / "sft_control" / "scores.json").write_text(json.dumps(row, indent=2) + "\n", encoding="utf-8")
    return row


MISSES = "answerable missed: search / read / none"
MISS_KINDS = (("wrong_missing_evidence", "wrong_no_search"), ("wrong_with_all_evidence",), ("no_answer",))
"""The closing table's miss column: of the answerable questions a policy got wrong, how many it missed
in search (a supporting passage never retrieved, or no search at all), in reading (every supporting
passage retrieved, the answer wrong) and by giving no answer (``ragrl.rollout.outcomes``). On the
synthetic world, whose questions all name their supporting passages, the right ones and these add up
to the answerable questions."""


def summary_table(summary: dict[str, Any]) -> Any:
    """The demo's closing table: one row per policy on the held-out questions."""
    from rich.table import Table

    n = summary.get("n_eval", 0)
    table = Table(
        title=f"held-out questions ({n}, seed {summary.get('seed')}, {summary.get('split')} split)",
        caption="answerable missed: search = a supporting passage never retrieved (or no search), "
        "read = all retrieved but the answer wrong, none = no answer",
    )
    columns = ("policy", "EM", "EM answerable", MISSES, "most common answer", "searches / question")
    for column in columns:
        table.add_column(column, justify="left" if column in ("policy", "most common answer") else "right")
    for name, row in summary.get("held_out", {}).items():
        o = row.get("outcomes_answerable", {})
        table.add_row(
            name,
            f"{row['em']:.3f}",
            f"{row['em_answerable']:.3f}",
            " / ".join(str(sum(o.get(k, 0) for k in kinds)) for kinds in MISS_KINDS),
            f"{row['top_answer']} ({100 * row['top_answer_share']:.0f}%)",
            f"{row['searches']:.2f}",
        )
    return table
