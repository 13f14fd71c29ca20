"""EVO-RAG against the Search-R1 baseline on the CPU substrate, and its schedule ablation.

Per seed: the demo's substrate (``tiny_setup.world``: the seed's facts-split world, BM25, the tiny
policy with copy pre-training); every arm starts with the same warm start budget (``--sft-steps`` of
SFT on its method's oracle: the world's search oracle, which EVO-RAG's refuses with ``<refuse/>`` where
the corpus cannot answer; with ``--quote`` every arm plays the quoting oracle instead). Then:

* ``search_r1``: GRPO, ``--steps`` steps of ``search_r1-tiny`` (EM reward);
* ``evo_rag``: ``evo_rag-tiny``'s two curriculum stages of preference cycles (siblings, the seven
  scheduled rewards, reward models, DPO), each stage up to ``--cycles`` cycles and stopped after two
  without a new best dev EM, Refinement from Discovery's best (``mode: time_dynamic``);
* ``two_stage_fixed`` (``--ablation``): the same with constant weights inside each stage.

Held-out: the seed's test questions, greedy. For each arm: EM, EM on the answerable questions, the most
common answer's share (collapse check), steps and searches per question, the duplicate-search rate
(max cosine to an earlier query > 0.8, all-MiniLM-L6-v2), and the refusal rate (a ``<refuse/>`` or an
``unknown`` answer) on the answerable and the unanswerable questions, before and after training. EVO-RAG
is scored with its final policy and with the policy it keeps (best dev EM).

    python benchmarks/evo_rag_vs_search_r1.py --seeds 0 1 2 --ablation
    python benchmarks/evo_rag_vs_search_r1.py --ablation --quote --set train.sft.name_swap=1.0 \
        --set train.sft.batch_size=32 --search-r1-set rollout.temperature=1.0 ...  # the demo's recipe
    python benchmarks/evo_rag_vs_search_r1.py --arm 'best3:schedule.keep=[best3]' \
        --arm 'bt:schedule.keep=[bt]' --arm 'half:rewards.step_cost=-0.5'  # Tables 6 and 5, the step cost
    python benchmarks/evo_rag_vs_search_r1.py --no-baseline --set schedule.mode=two_stage_fixed \
        --warm-start 'runs/evo/corpus-{seed}/warm_start/policy'  # from a saved warm start (no SFT)
    python benchmarks/evo_rag_vs_search_r1.py --base shipped --seeds 0 1 2  # from the reader base

With ``--base shipped`` (or a reader-base folder) every arm starts from the pretrained reader base
instead of a per-seed tiny policy, with the demo's recipe, its token limits scaled for the BPE
(``ragrl.train.from_base.base_overrides``) and the quoting oracle's warm start (``--quote``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_setup import base_overrides, open_workdir, resolve_base, warm_start_then_grpo, world  # noqa: E402

from ragrl.config.train import ModelConfig  # noqa: E402
from ragrl.data.io import read_examples  # noqa: E402
from ragrl.eval.runner import collapse_check, evaluate  # noqa: E402
from ragrl.llm.hf_backend import TransformersBackend  # noqa: E402
from ragrl.methods import load_method  # noqa: E402
from ragrl.methods.evo_rag.rewards import max_cosines  # noqa: E402
from ragrl.metrics.normalize import normalize  # noqa: E402
from ragrl.retrieval.base import load_retriever  # noqa: E402
from ragrl.synth.demonstrators import OracleDemonstrator, QuotingOracle  # noqa: E402
from ragrl.synth.questions import UNANSWERABLE_ANSWER  # noqa: E402
from ragrl.train.demo import DEFAULT_COPY_STEPS  # noqa: E402
from ragrl.train.setup import load_policy, make_accelerator  # noqa: E402
from ragrl.train.sft import SFTTrainer, demonstration_trajectories  # noqa: E402
from ragrl.train.stages import run_stages  # noqa: E402

COLUMNS = (
    "em",
    "em_answerable",
    "top_answer_share",
    "steps",
    "searches",
    "duplicate_rate",
    "refusal_answerable",
    "refusal_unanswerable",
)


def measure(backend: Any, retriever: Any, method: Any, examples: list) -> dict[str, Any]:
    """The held-out measurements of one policy (see the module docstring)."""
    report = evaluate(backend, retriever, method, examples)
    trajectories = report.trajectories
    cosines = [c for row in max_cosines(trajectories) for c in row if c is not None]
    answerable = [ex.answerable for ex in examples]

    def refused(t: Any) -> bool:
        last = t.actions[-1].kind if t.actions else ""
        return last == "refuse" or normalize(t.final_answer or "") == UNANSWERABLE_ANSWER

    def rate(flags: list[bool]) -> float:
        return round(statistics.mean(flags), 3) if flags else 0.0

    check = collapse_check(report.rows, examples)
    return {
        "em": round(report.scores["em"], 3),
        "em_answerable": round(check["eval/em_answerable"], 3),
        "top_answer_share": round(check["eval/top_answer_share"], 3),
        "top_answer": check["eval/top_answer"],
        "steps": round(statistics.mean(len(t.actions) for t in trajectories), 2),
        "searches": round(
            statistics.mean(sum(a.kind == "search" for a in t.actions) for t in trajectories), 2
        ),
        "duplicate_rate": rate([c > 0.8 for c in cosines]),
        "refusal_answerable": rate([refused(t) for t, a in zip(trajectories, answerable, strict=True) if a]),
        "refusal_unanswerable": rate(
            [refused(t) for t, a in zip(trajectories, answerable, strict=True) if not a]
        ),
    }


def _policy(path: Path) -> TransformersBackend:
    import torch

    model, tokenizer = load_policy(ModelConfig(path=str(path)), torch.device("cpu"))
    return TransformersBackend(model, tokenizer, batch_size=128)


def search_r1(workdir: Path, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    base = resolve_base(args.base)
    data, index, model_dir = world(workdir, seed, args.copy_steps, base=base)
    out = workdir / f"search_r1-{seed}"
    method = load_method(
        "search_r1-tiny",
        [
            *(base_overrides("search_r1-tiny") if base is not None else []),
            f"train.seed={seed}",
            f"train.model.path={model_dir}",
            f"train.out={out}",
            f"train.data.train={data / 'train.jsonl'}",
            f"train.sft.world={data / 'world.json'}",
            f"train.sft.max_steps={args.sft_steps}",
            f"train.steps={args.steps}",
            *args.overrides,
            *args.search_r1_overrides,
        ],
    )
    retriever = load_retriever(index)
    train = method.prepare_examples(read_examples(data / "train.jsonl")[0], "train")
    test = method.prepare_examples(read_examples(data / "test.jsonl")[0], "test")
    t0 = time.perf_counter()
    demonstrator = QuotingOracle() if args.quote or base is not None else OracleDemonstrator()
    grpo = warm_start_then_grpo(method, demonstrator, train, retriever, out)
    before = measure(grpo.backend, retriever, method, test)
    t1 = time.perf_counter()
    grpo.train()
    return {
        "seed": seed,
        "arm": "search_r1",
        "n_test": len(test),
        "before": before,
        "after": measure(grpo.backend, retriever, method, test),
        "train_seconds": round(time.perf_counter() - t1, 1),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def evo_rag(
    workdir: Path, seed: int, args: argparse.Namespace, arm: str, overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """One EVO-RAG arm: ``evo_rag-tiny`` with ``overrides`` (``schedule.mode=two_stage_fixed``, a
    component mask ``schedule.keep=[bt,ans]``, ``rewards.step_cost=-0.5``, ...)."""
    warm_start = Path(args.warm_start.format(seed=seed)) if args.warm_start else None
    base = resolve_base(args.base)
    data, index, model_dir = world(workdir, seed, args.copy_steps, policy=warm_start is None, base=base)
    out = workdir / f"{arm}-{seed}"
    paths = [
        *(base_overrides("evo_rag-tiny") if base is not None else []),
        f"train.seed={seed}",
        f"train.data.train={data / 'train.jsonl'}",
        f"train.data.eval={data / 'dev.jsonl'}",
        f"train.data.index={index}",
        f"train.steps={args.cycles}",
        f"train.sft.world={data / 'world.json'}",
    ]
    extra = [*args.overrides, *overrides]  # last: they win, as in the Search-R1 arm
    method = load_method(
        "evo_rag-tiny",
        [*paths, f"train.model.path={model_dir}", f"train.sft.max_steps={args.sft_steps}", *extra],
    )
    retriever = load_retriever(index)
    train = method.prepare_examples(read_examples(data / "train.jsonl")[0], "train")
    test = method.prepare_examples(read_examples(data / "test.jsonl")[0], "test")
    t0 = time.perf_counter()
    if warm_start is None:
        warm_start = out / "warm_start" / "policy"
        acc = make_accelerator(method.train)
        model, tokenizer = load_policy(method.train.model, acc.device)
        quote = args.quote or base is not None  # the base reads as the quoting oracle taught it
        oracle = method.oracle.wrap(QuotingOracle()) if quote else method.oracle
        demos = demonstration_trajectories(method, tokenizer, oracle, train, retriever)
        sft = SFTTrainer(
            method,
            method.train,
            demos,
            run_dir=out / "warm_start",
            eval_examples=[],
            retriever=retriever,
            accelerator=acc,
            model=model,
            tokenizer=tokenizer,
        )
        sft.train()
    before = measure(_policy(warm_start), retriever, method, test)
    t1 = time.perf_counter()
    run_stages(
        load_method(
            "evo_rag-tiny",
            [*paths, *extra, f"train.model.path={warm_start}", f"train.out={out / 'stages'}"],
        )
    )
    train_seconds = time.perf_counter() - t1
    final, kept = (
        out / "stages" / "stage-1-refinement" / "policy",
        out / "stages" / "stage-1-refinement" / "best",
    )
    cycles = []
    for stage in sorted((out / "stages").glob("stage-*")):
        rows = [json.loads(x) for x in (stage / "metrics.jsonl").read_text().splitlines()]
        cycles += [r for r in rows if r["kind"] == "cycle"]
    training = {
        "cycles": len(cycles),
        "policy_pairs": sum(r["policy_pairs"] for r in cycles),
        "rm_pairs": sum(r["rm_pairs"] for r in cycles),
        "rm_multi_val_loss": _mean(cycles, "rm/multi/val/loss"),
        "rm_single_val_loss": _mean(cycles, "rm/single/val/loss"),
        "rm_multi_val_accuracy": _mean(cycles, "rm/multi/val/accuracy"),
        "rm_single_val_accuracy": _mean(cycles, "rm/single/val/accuracy"),
    }
    return {
        "seed": seed,
        "arm": arm,
        "n_test": len(test),
        "before": before,
        "after": measure(_policy(final), retriever, method, test),
        "kept": measure(_policy(kept), retriever, method, test),
        "training": training,
        "train_seconds": round(train_seconds, 1),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return round(statistics.mean(values), 3) if values else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--sft-steps", type=int, default=200)
    ap.add_argument("--steps", type=int, default=40, help="Search-R1's GRPO steps")
    ap.add_argument("--cycles", type=int, default=6, help="EVO-RAG's cycles per curriculum stage (at most)")
    ap.add_argument("--copy-steps", type=int, default=DEFAULT_COPY_STEPS)
    ap.add_argument("--ablation", action="store_true", help="also two_stage_fixed")
    ap.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE[;KEY=VALUE]",
        help="another EVO-RAG arm with these overrides (Tables 5 and 6, the step cost): "
        "'best3:schedule.keep=[best3]', 'cost-half:rewards.step_cost=-0.5'",
    )
    ap.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="a config override for every arm (the warm start's: train.sft.name_swap=1.0, ...)",
    )  # fmt: skip
    ap.add_argument(
        "--search-r1-set", dest="search_r1_overrides", action="append", default=[], metavar="KEY=VALUE",
        help="a config override for the Search-R1 arm only (rollout.temperature=0.8, ...)",
    )  # fmt: skip
    ap.add_argument(
        "--quote", action="store_true",
        help="warm-start every arm on the quoting oracle (the demo's; EVO-RAG's in its own grammar)",
    )  # fmt: skip
    ap.add_argument(
        "--no-baseline", action="store_true",
        help="leave out the Search-R1 arm (it does not depend on the EVO-RAG arms' options)",
    )  # fmt: skip
    ap.add_argument(
        "--warm-start", default=None, metavar="DIR",
        help="EVO-RAG's warm-start policy folder, '{seed}' for the seed (skips its SFT; every arm starts "
        "from it): runs/evo/corpus-{seed}/warm_start/policy",
    )  # fmt: skip
    ap.add_argument(
        "--base", default="scratch",
        help="scratch (a tiny policy per world: the docs' tables), shipped (the reader base) or a folder",
    )  # fmt: skip
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    tmp, workdir = open_workdir(args.workdir, "evo-rag-")
    results = []
    for seed in args.seeds:
        runs = [] if args.no_baseline else [lambda s=seed: search_r1(workdir, s, args)]
        runs.append(lambda s=seed: evo_rag(workdir, s, args, "evo_rag"))
        if args.ablation:
            runs.append(
                lambda s=seed: evo_rag(workdir, s, args, "two_stage_fixed", ["schedule.mode=two_stage_fixed"])
            )
        for spec in args.arm:
            name, _, sets = spec.partition(":")
            runs.append(lambda s=seed, n=name, o=sets.split(";"): evo_rag(workdir, s, args, n, o))
        for run in runs:
            results.append(run())
            print(json.dumps(results[-1]), flush=True)
    (workdir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results), encoding="utf-8")
    print(f"\n| seed | arm | questions | policy | {' | '.join(COLUMNS)} | train s |")
    print("|---|---|---|---|" + "---|" * (len(COLUMNS) + 1))
    for r in results:
        for phase in ("before", "after", "kept"):
            if phase in r:
                cells = " | ".join(str(r[phase][k]) for k in COLUMNS)
                seconds = r["train_seconds"] if phase == "after" else ""
                print(f"| {r['seed']} | {r['arm']} | {r['n_test']} | {phase} | {cells} | {seconds} |")
    for arm in dict.fromkeys(r["arm"] for r in results):
        gains = [
            100 * (r["after"]["em_answerable"] - r["before"]["em_answerable"])
            for r in results
            if r["arm"] == arm
        ]
        spread = f", sample std {statistics.stdev(gains):.1f}" if len(gains) > 1 else ""
        print(
            f"{arm}: answerable EM gain over its warm start, mean {statistics.mean(gains):+.1f} points"
            f"{spread} ({', '.join(f'{g:+.1f}' for g in gains)})"
        )
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
