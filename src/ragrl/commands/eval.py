"""``ragrl eval``: run a policy over a question file with a retriever and score it (``ragrl reward``, which
re-scores saved completions, is in ``ragrl.commands.reward``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from ragrl.commands.ask import METHOD_HELP, load_policy, method_for
from ragrl.commands.retrieval import CacheMode
from ragrl.commands.score import BY_HELP, print_groups
from ragrl.console import console, progress_bar, styled
from ragrl.errors import RagrlError
from ragrl.eval.progress import (
    PARTIAL,
    PROGRESS,
    EvalProgress,
    count_partial,
    model_fingerprint,
    text_sha256,
)
from ragrl.llm.checksums import file_sha256


def _load_examples(path: Path, n: int | None):
    from ragrl.data.io import read_examples

    examples, _ = read_examples(path)
    if n is not None:
        if n < 1:
            raise RagrlError(f"--n must be >= 1, got {n}")
        examples = examples[:n]
    if not examples:
        raise RagrlError(f"{path}: no questions")
    return examples


def _demonstrator(name: str, data: Path, world: Path | None):
    from ragrl.synth.demonstrators import demonstrator_by_name

    return demonstrator_by_name(name, world or data.parent / "world.json")


def _few_shot(method: Any, pool_file: Path, shots: int, evaluated: list[Any], tokenizer: Any, retriever: Any):
    """The method's protocol with ``shots`` worked examples in front: the method's oracle (else the
    search oracle) played through the real rollout on the first questions of ``pool_file`` that are not
    evaluated (by id or by question text) and that it answers well (``shots_from_trajectories``).
    Returns the protocol and the shots' trajectories."""
    from ragrl.metrics.normalize import normalize
    from ragrl.rollout.fewshot import FewShotProtocol, dropped_shots, shots_from_trajectories
    from ragrl.synth.demonstrators import OracleDemonstrator
    from ragrl.train.sft import demonstration_trajectories

    if shots < 1:
        raise RagrlError(f"--shots must be >= 1, got {shots}")
    taken = {e.id for e in evaluated} | {normalize(e.question) for e in evaluated}
    pool: list[Any] = []
    for e in method.prepare_examples(_load_examples(pool_file, None), str(pool_file)):
        key = normalize(e.question)
        if e.id not in taken and key not in taken:
            taken |= {e.id, key}  # a question repeated in the pool is shown once
            pool.append(e)
    if not pool:
        raise RagrlError(
            f"--few-shot {pool_file}: no question in it is both usable by {method.name} and not evaluated; "
            "take shots from other questions"
        )
    if method.few_shot is not None:  # the method's own kind of worked example
        return method.few_shot(method, tokenizer, pool, retriever, shots)
    candidates = pool[: 4 * shots]
    oracle = method.oracle or OracleDemonstrator()
    played = demonstration_trajectories(method, tokenizer, oracle, candidates, retriever)
    by_id = {e.id: e for e in candidates}
    chosen = shots_from_trajectories(
        played, by_id, tokenizer.eos_token, must_search=method.protocol.needs_retriever,
        prefill=method.protocol.prefill,
    )[:shots]  # fmt: skip
    if len(chosen) < shots:
        raise RagrlError(
            f"--few-shot {pool_file}: only {len(chosen)} of the oracle's replies to the first "
            f"{len(candidates)} questions not evaluated are good enough to show (an answer, no invalid turn, "
            f"a search where the method searches); {shots} shots needed"
        )
    protocol = FewShotProtocol(method.protocol, chosen)
    dropped = dropped_shots(protocol, evaluated[0], tokenizer)
    if dropped:
        raise RagrlError(
            f"the model's chat template drops part of the worked examples {', '.join(dropped)} from the "
            "prompt (some templates keep only the text after </think> of earlier assistant turns); "
            "few-shot prompting cannot show them to this model"
        )
    kept = {s.example.id for s in chosen}
    return protocol, [t for t in played if t.example_id in kept]


EVAL_FILES = (
    "scores.json", "predictions.jsonl", "per_example.jsonl", "trajectories.jsonl", "shots.jsonl",
    "config.yaml", "environment.json",
)  # fmt: skip
"""What ``ragrl eval`` writes into ``--out``."""


def _earlier_evaluation(out: Path | None) -> list[str]:
    """The files of an earlier evaluation in ``out`` (a file where the folder should be is an error)."""
    if out is None or not out.exists():
        return []
    if not out.is_dir():
        raise RagrlError(f"--out {out}: a file is there, not a folder")
    run = [name for name in ("metrics.jsonl", "checkpoints") if (out / name).exists()]
    if run:  # its config.yaml and environment.json are the run's: never an evaluation's to replace
        raise RagrlError(f"--out {out}: a training run's folder ({', '.join(run)}); choose another --out")
    return [name for name in EVAL_FILES if (out / name).exists()]


def _check_resume(out: Path | None, resume: bool, force: bool) -> None:
    """--resume needs the folder of an interrupted evaluation; a folder holding one needs --resume or
    --force."""
    interrupted = out is not None and (out / PROGRESS).is_file()
    if resume and out is None:
        raise RagrlError("--resume continues an interrupted evaluation: give its folder with --out")
    if resume and not interrupted:
        raise RagrlError(f"--resume: {out} holds no interrupted evaluation ({PROGRESS} is missing)")
    if interrupted and not resume and not force:
        kept = count_partial(out / PARTIAL)  # type: ignore[operator]
        raise RagrlError(
            f"{out}: holds an interrupted evaluation ({kept} questions rolled out); --resume continues it, "
            "--force starts over"
        )


def _fingerprint(retriever: Any) -> str | None:
    """The retriever's fingerprint, asked for once while it is open; None for a server that reports none
    (Search-R1's has no /health) or no retriever."""
    try:
        return None if retriever is None else retriever.fingerprint
    except RagrlError:
        return None


def _provenance(model: Path, index: str | None, data: Path, fingerprint: str | None) -> dict[str, Any]:
    from ragrl import __version__
    from ragrl.retrieval.base import MANIFEST_NAME, read_manifest
    from ragrl.retrieval.open import is_url

    folder = index is not None and not is_url(index) and (Path(index) / MANIFEST_NAME).is_file()
    manifest = read_manifest(index) if folder else {}
    fingerprint = manifest.get("fingerprint") or (fingerprint if index is not None else None)
    return {
        "ragrl_version": __version__,
        "model": str(model),
        "data": str(data),
        "index": index,
        "index_fingerprint": fingerprint,
        "corpus_hash": manifest.get("corpus_hash"),
    }


def _demonstrator_policy(
    name: str, model: Path, method: Any, data: Path, world: Path | None, examples: list[Any], retriever: Any
) -> Any:
    """A scripted policy: the method's own (R²AG's), else a synthetic world's demonstrator."""
    from ragrl.llm.hf_backend import load_tokenizer
    from ragrl.rollout.scripted import DemonstratorBackend

    tokenizer = load_tokenizer(model)
    if method.scripted is not None:
        if name not in method.scripted:
            raise RagrlError(
                f"--demonstrator {name}: the {method.name} method plays {', '.join(sorted(method.scripted))}"
            )
        return method.scripted[name](tokenizer)
    return DemonstratorBackend.for_examples(
        tokenizer, _demonstrator(name, data, world), examples, method.protocol, retriever, method.rollout.k
    )


def _write_evaluation(out: Path, report: Any, shot_trajectories: list[Any], config_yaml: str) -> None:
    """The evaluation's files in ``out``, replacing an earlier evaluation's (--force)."""
    from ragrl.data.io import write_jsonl
    from ragrl.llm.environment import record_environment
    from ragrl.rollout.records import write_trajectories

    out.mkdir(parents=True, exist_ok=True)
    for name in _earlier_evaluation(out):  # --force: none of the earlier files outlives this evaluation
        (out / name).unlink()
    write_jsonl(
        out / "predictions.jsonl", ({"id": r["id"], "prediction": r["prediction"] or ""} for r in report.rows)
    )
    write_jsonl(out / "per_example.jsonl", report.rows)
    write_trajectories(out / "trajectories.jsonl", report.trajectories)
    if shot_trajectories:
        write_trajectories(out / "shots.jsonl", shot_trajectories)
    (out / "config.yaml").write_text(config_yaml, encoding="utf-8")  # as a run folder's
    record_environment(out / "environment.json", env=report.environment or None)  # what the scores came from
    (out / "scores.json").write_text(json.dumps(report.scores, indent=2) + "\n", encoding="utf-8")


def eval_command(
    model: Annotated[
        Path,
        typer.Option(
            help="Policy checkpoint directory (from_pretrained); with "
            "--demonstrator only its tokenizer is used."
        ),
    ],
    data: Annotated[Path, typer.Option(help="Canonical question file (jsonl).")],
    index: Annotated[
        str | None,
        typer.Option(
            metavar="DIR|URL",
            help="Retrieval index directory (ragrl index), or a retrieval server's URL (ragrl serve, "
            "Search-R1's retrieval_server.py); not needed by methods that read the passages given with "
            "each question (arena).",
        ),
    ] = None,
    retrieval_cache: Annotated[
        Path | None,
        typer.Option(
            help="sqlite retrieval cache in front of --index: a rerun searches only new queries "
            "(ragrl search --cache)."
        ),
    ] = None,
    cache_mode: Annotated[
        CacheMode, typer.Option(help="How to use --retrieval-cache (replay searches nothing).")
    ] = CacheMode.readwrite,
    method: Annotated[str | None, typer.Option(help=METHOD_HELP, show_default=False)] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="Config override key.path=value (repeatable), e.g. rollout.max_turns=6.",
        ),
    ] = None,
    n: Annotated[int | None, typer.Option(help="Evaluate only the first N questions.")] = None,
    out: Annotated[
        Path | None, typer.Option(help="Output directory (default runs/eval-<method>-<time>).")
    ] = None,
    demonstrator: Annotated[
        Literal["oracle", "quote", "heuristic", "single_step"] | None,
        typer.Option(
            help="Run a scripted policy instead of the model: the synthetic world's oracle, quoting oracle "
            "or heuristic demonstrator, or the method's own (R²AG: oracle, single_step).",
        ),
    ] = None,
    world: Annotated[
        Path | None, typer.Option(help="world.json for the heuristic demonstrator (default: next to --data).")
    ] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature; 0 = greedy.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed for sampling and bootstrap.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:1, ...")] = "auto",
    batch_size: Annotated[int, typer.Option(min=1, help="Generation batch size.")] = 32,
    backend: Annotated[
        Literal["transformers", "vllm"], typer.Option(help="Generation backend.")
    ] = "transformers",
    variant: Annotated[str, typer.Option(help="Answer normalization variant for the metrics.")] = "squad",
    bootstrap: Annotated[
        int, typer.Option(min=0, help="Bootstrap resamples for 95% confidence intervals (0: none).")
    ] = 0,
    closed_book: Annotated[
        bool,
        typer.Option(
            "--closed-book",
            help="Every search finds nothing: what the policy answers from its weights alone (no --index).",
        ),
    ] = False,
    few_shot: Annotated[
        Path | None,
        typer.Option(
            help="Few-shot prompting: a question file whose first questions (never evaluated ones) the "
            "method's oracle answers through the real rollout; its replies go in front of every prompt.",
        ),
    ] = None,
    shots: Annotated[
        int | None, typer.Option(help="How many worked examples --few-shot puts in front (default 2).")
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            help="Replace an earlier evaluation's files in --out (once this one is done), or start a stopped "
            "one over (its kept episodes are dropped at once)."
        ),
    ] = False,
    by: Annotated[str | None, typer.Option("--by", metavar="KEY", help=BY_HELP)] = None,
    resume: Annotated[
        bool,
        typer.Option(
            help="Continue the evaluation that was stopped in --out: only the questions it had not rolled "
            "out are (the same command otherwise)."
        ),
    ] = False,
) -> None:
    """Run a policy over a question file with a retriever (greedy by default) and score it."""
    from ragrl import __version__
    from ragrl.eval.runner import evaluate
    from ragrl.methods import load_method
    from ragrl.metrics.normalize import get_variant
    from ragrl.metrics.score import check_group_key
    from ragrl.retrieval.cache import CachedRetriever
    from ragrl.retrieval.open import close_all, open_retriever
    from ragrl.rollout.limits import check_prompts

    get_variant(variant)
    _check_resume(out, resume, force)
    earlier = _earlier_evaluation(out)
    if earlier and not force and not resume:  # a resumed evaluation replaces what its start could
        raise RagrlError(
            f"{out}: holds an earlier evaluation ({', '.join(earlier)}); pass --force to replace it or "
            "choose another --out"
        )
    if demonstrator is None:  # a trained policy: the method of the run that trained it, unless --method
        method = method_for(method, model)
    method_obj = load_method(method or "search_r1", set_ or [])
    if demonstrator is None and backend == "transformers":  # the device, before the data and the index
        from ragrl.llm.devices import resolve_device

        resolve_device(device)
    examples = method_obj.prepare_examples(_load_examples(data, n), str(data))
    if not examples:
        raise RagrlError(f"{data}: no question is left after {method_obj.name}'s preparation")
    if by is not None:  # before anything loads or rolls out
        by = check_group_key(examples, by, data)
    if closed_book and index is not None:
        raise RagrlError("--closed-book searches nothing: leave out --index")
    if retrieval_cache is not None and index is None:
        why = "--closed-book searches nothing" if closed_book else "pass --index too"
        raise RagrlError(f"--retrieval-cache keeps the searches of --index: {why}")
    if retrieval_cache is None and cache_mode is not CacheMode.readwrite:
        raise RagrlError(
            f"--cache-mode {cache_mode.value} says how to use --retrieval-cache: give the file too"
        )
    if index is None and method_obj.protocol.needs_retriever and not closed_book:
        raise RagrlError(
            f"method {method_obj.name!r} searches a corpus: pass --index (a folder built by "
            "`ragrl index`, or a retrieval server's URL)"
        )
    if not model.is_dir():
        raise RagrlError(f"{model}: not a model directory")
    if few_shot is None and shots is not None:
        raise RagrlError("--shots sets how many worked examples --few-shot shows: pass --few-shot FILE too")
    if few_shot is not None and (demonstrator is not None or closed_book):
        raise RagrlError(
            "--few-shot plays the oracle through the retriever to show a model worked examples: it cannot "
            "be combined with --demonstrator or --closed-book"
        )
    if world is not None and demonstrator != "heuristic":
        raise RagrlError(
            f"--world {world}: only the heuristic demonstrator reads a world (--demonstrator heuristic)"
        )
    out = out or Path("runs") / f"eval-{method_obj.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if closed_book:
        from ragrl.retrieval.null import NullRetriever

        retriever: Any = NullRetriever()
    else:
        cached = {"cache": retrieval_cache, "cache_mode": cache_mode.value}
        retriever = None if index is None else open_retriever(index, **cached)
    policy: Any = None
    saved: EvalProgress | None = None
    rolling = written = False  # what a stop says: how to go on from the rollout, or that the files are there
    try:  # from here on the retriever (and later the policy: a vLLM engine's processes) is closed at the end
        fingerprint = _fingerprint(retriever)
        settings = {
            "ragrl_version": __version__, "model": str(model), "model_fingerprint": model_fingerprint(model),
            "data": str(data), "data_sha256": file_sha256(data), "questions": len(examples), "index": index,
            "index_fingerprint": fingerprint, "closed_book": closed_book,
            "method_sha256": text_sha256(method_obj.resolved_yaml()), "demonstrator": demonstrator,
            "world": str(world) if world else None, "few_shot": str(few_shot) if few_shot else None,
            "few_shot_sha256": file_sha256(few_shot) if few_shot else None, "shots": shots,
            "temperature": temperature, "seed": seed, "backend": backend,
        }  # fmt: skip
        done: list[Any] = []
        if resume:  # before the model loads: another evaluation is refused at once
            saved, done = EvalProgress.resume(out, settings)
            console.print(f"resuming: {len(done)} of {len(examples)} questions were rolled out before")
        who = f"the {demonstrator} demonstrator" if demonstrator else str(model)
        console.print(f"evaluating {who} ({method_obj.name}) on {len(examples)} questions from {data}")
        if demonstrator is not None:
            policy = _demonstrator_policy(demonstrator, model, method_obj, data, world, examples, retriever)
        else:
            policy = load_policy(model, backend, device, batch_size)
        shot_trajectories: list[Any] = []
        if few_shot is not None:
            shots = 2 if shots is None else shots
            method_obj.protocol, shot_trajectories = _few_shot(
                method_obj, few_shot, shots, examples, policy.tokenizer, retriever
            )
            plural = "s" if shots != 1 else ""
            console.print(f"{shots} worked example{plural} in front of every prompt (from {few_shot})")
        try:
            check_prompts(examples, method_obj.protocol, policy.tokenizer, method_obj.rollout, str(data))
        except RagrlError as e:
            if few_shot is None:
                raise
            raise RagrlError(f"{e} (the worked examples in front count too: try fewer --shots)") from None
        if saved is None:
            saved = EvalProgress.start(out, settings)
            console.print(f"episodes kept in {out} as they are rolled out", highlight=False)
        t0 = time.perf_counter()
        rolling = True
        with progress_bar() as bar:
            task = bar.add_task(
                f"rolling out {len(examples)} questions", total=len(examples), completed=len(done)
            )

            def on_progress(done: int, total: int) -> None:
                bar.update(task, completed=done)
                if not console.is_terminal:  # a log gets one line per chunk instead of a bar
                    console.print(f"rolled out {done}/{total} questions ({time.perf_counter() - t0:.0f} s)")

            report = evaluate(
                policy,
                retriever,
                method_obj,
                examples,
                temperature=temperature,
                seed=seed,
                variant=variant,
                bootstrap=bootstrap,
                chunk=max(1024 if backend == "vllm" else 64, batch_size),  # vLLM: large batches, kept
                on_progress=on_progress,
                by=by,
                done=done,
                on_chunk=saved.append,
            )
        report.scores["policy"] = f"demonstrator:{demonstrator}" if demonstrator else str(model)
        if report.scores.get("prompt_unk_rate", 0.0) > 0.01:
            console.print(
                f"warning: {report.scores['prompt_unk_rate']:.1%} of the prompt tokens are unknown to "
                f"{model}'s tokenizer (was it built from other data? `ragrl model tiny --data` the data you "
                "evaluate on)"
            )
        provenance = _provenance(model, index, data, fingerprint)
        provenance["data_sha256"] = settings["data_sha256"]
        report.scores.update({"provenance": {**provenance, "closed_book": closed_book}})
        if resume:
            report.scores["resumed_from"] = len(done)  # rollout_seconds counts the resumed part only
        if isinstance(retriever, CachedRetriever):
            report.scores["retrieval_cache"] = {
                "file": str(retrieval_cache),
                "mode": retriever.mode,
                "queries_from_cache": retriever.queries_from_cache,
                "queries_searched": retriever.queries_searched,
            }
            console.print(
                f"retrieval cache {retrieval_cache}: {retriever.queries_from_cache:,} queries from it, "
                f"{retriever.queries_searched:,} searched ({retriever.mode})",
                highlight=False,
            )
        if few_shot is not None:
            report.scores["provenance"]["few_shot"] = {
                "file": str(few_shot),
                "ids": [t.example_id for t in shot_trajectories],
            }
        _write_evaluation(out, report, shot_trajectories, method_obj.resolved_yaml())
        written = True
        saved.finish()
    except BaseException:  # Ctrl-C, a server gone, out of memory, a full disk: what was rolled out is kept
        if written:
            console.print(f"the evaluation is written in {out}; its progress files could not be removed")
        elif rolling and saved is not None:
            console.print(
                f"stopped: {saved.kept} questions kept in {out}; the same command with --out {out} --resume "
                "continues",
                highlight=False,
            )
        raise
    finally:
        try:
            close_all(policy, retriever)
        except Exception as e:  # the evaluation is written (or its error is on its way): a word, not a loss
            console.print(styled("warning:", "yellow", f"closing the policy or the retriever failed: {e}"))
    console.print(f"wrote predictions, trajectories and scores to {out}", highlight=False)
    print_groups(report.scores)
    typer.echo(json.dumps(report.scores, indent=2))
