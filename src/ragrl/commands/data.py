"""`ragrl data ...`: convert raw datasets to canonical files, and describe question files."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ragrl.console import console, styled
from ragrl.data.convert import convert as convert_dataset
from ragrl.data.loaders import FORMATS, load_dataset
from ragrl.data.stats import compute_stats, print_stats
from ragrl.synth.world import DEFAULT_CROSS_LINKS, DEFAULT_SPLIT_MODE

app = typer.Typer(help="Convert, inspect and generate datasets.", no_args_is_help=True)

FORMAT_HELP = f"Dataset layout: auto (detect from the content), {', '.join(FORMATS)}; canonical = flashrag."


@app.command()
def convert(
    path: Path = typer.Argument(..., help="A raw dataset file (any supported layout)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for questions.jsonl and corpus.jsonl."),
    format: str = typer.Option("auto", "--format", "-f", help=FORMAT_HELP),
    skip_invalid: bool = typer.Option(
        False,
        "--skip-invalid",
        help="Skip malformed records instead of stopping (the summary counts them by reason, with their "
        "lines).",
    ),
    source: str = typer.Option(None, "--source", help="Override metadata['source'] (e.g. nq for NQ)."),
) -> None:
    """Convert a dataset file to DIR/questions.jsonl (+ DIR/corpus.jsonl when it gives contexts)."""
    result = convert_dataset(path, out, format=format, skip_invalid=skip_invalid, source=source)
    console.print(result.summary(), highlight=False, markup=False, soft_wrap=True)


@app.command()
def stats(
    path: Path = typer.Argument(..., help="A canonical question file or any raw dataset file."),
    format: str = typer.Option("auto", "--format", "-f", help=FORMAT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    skip_invalid: bool = typer.Option(False, "--skip-invalid", help="Skip malformed records."),
) -> None:
    """Counts and distributions (hops, types, supporting ids, ARENA gold reference ids, passages,
    answers) of a question file."""
    examples, report = load_dataset(path, format, skip_invalid)
    result = compute_stats(examples)
    if report.skipped:
        result["skipped"] = len(report.skipped)
    if as_json:
        typer.echo(json.dumps(result, ensure_ascii=False, indent=2))
    else:
        print_stats(result, title=str(path))
    if report.skipped or report.warnings:
        console.print(report.summary(), highlight=False, markup=False, soft_wrap=True)


@app.command()
def mix(
    take: list[str] = typer.Option(
        ...,
        "--take",
        help="FILE:N (N questions of a canonical question file; FILE alone: all of them). Repeatable.",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="The mixed question file (jsonl)."),
    seed: int = typer.Option(0, "--seed", help="Sampling and shuffling seed."),
    exclude: list[Path] = typer.Option(
        [],
        "--exclude",
        help="Leave out the ids of this question file "
        "(repeatable): a validation mix apart from the training mix.",
    ),
) -> None:
    """A seeded mix of N questions from each file, shuffled together (R²AG's 500 HotpotQA + 3,000 2Wiki +
    1,174 MuSiQue)."""
    from ragrl.data.io import read_examples, write_examples
    from ragrl.data.mix import mix as make_mix
    from ragrl.data.mix import parse_take

    ids = [ex.id for path in exclude for ex in read_examples(path)[0]]
    examples = make_mix(
        [parse_take(t) for t in take], seed, ids, lambda w: console.print(styled("warning:", "yellow", w))
    )
    write_examples(out, examples)
    counts: dict[str, int] = {}
    for ex in examples:
        counts[ex.metadata["mix_source"]] = counts.get(ex.metadata["mix_source"], 0) + 1
    parts = ", ".join(f"{n} from {src}" for src, n in counts.items())
    console.print(f"wrote {len(examples)} questions to {out} ({parts})", highlight=False, soft_wrap=True)


@app.command("synth-corpus")
def synth_corpus(
    out: Path = typer.Option(..., "--out", "-o", help="The corpus file to write (jsonl {id, contents})."),
    passages: int = typer.Option(..., "--passages", "-n", min=1, help="How many passages."),
    seed: int = typer.Option(0, "--seed", help="Random seed: the same seed gives the same passages."),
    words: int = typer.Option(100, "--words", min=5, help="Words a passage, on average (DPR's: 100)."),
) -> None:
    """A synthetic corpus of any size for the retrieval paths at scale: the world's made-up language,
    Zipf-distributed, streamed to disk (docs/retrieval.md)."""
    from ragrl.console import progress
    from ragrl.data.io import write_corpus
    from ragrl.synth.scale import synthetic_corpus

    stream = progress(synthetic_corpus(passages, seed=seed, words=words), "writing passages", total=passages)
    n = write_corpus(out, stream)
    console.print(f"wrote {n:,} passages to {out}", highlight=False)


@app.command()
def synth(
    out: Path = typer.Option(..., "--out", "-o", help="Folder for train/dev/test.jsonl, corpus.jsonl, ..."),
    seed: int = typer.Option(0, "--seed", help="Random seed: the same seed gives byte-identical files."),
    size: str = typer.Option(
        "small", "--size", help="small (400/100/100 questions) or medium (4000/500/500)."
    ),
    unanswerable: float = typer.Option(
        0.1, "--unanswerable", help="Share of questions whose evidence passage is removed from the corpus."
    ),
    split: str = typer.Option(
        DEFAULT_SPLIT_MODE,
        "--split",
        help="facts: held-out questions need facts no training question needs, names are shared; "
        "entities: the splits share no person, company, work or city (harder).",
    ),
    cross_links: float = typer.Option(
        DEFAULT_CROSS_LINKS,
        "--cross-links",
        help="facts split: share of relations that point into another split's pool.",
    ),
) -> None:
    """Generate the synthetic multi-hop world: DIR/{train,dev,test}.jsonl, corpus.jsonl, world.json,
    stats.json (see docs/synth.md)."""
    from ragrl.synth import generate_world

    world = generate_world(
        seed, size, split=split, cross_links=cross_links, unanswerable_fraction=unanswerable
    )
    paths = world.write(out)
    st = world.stats
    lines = [
        f"synthetic world seed={seed} size={size} split={split}: {sum(st['entities'].values())} entities"
    ]
    for name, s in st["splits"].items():
        types = ", ".join(f"{k} {v}" for k, v in s["type"].items())
        hops = ", ".join(f"{k}-hop {v}" for k, v in s["hops"].items())
        lines.append(
            f"  {name}: {s['questions']} questions ({types}; {hops}; "
            f"{s['answerable_share']:.0%} answerable) -> {paths[name]}"
        )
    c = st["corpus"]
    lines.append(f"  corpus: {c['passages']} passages ({c['removed']} removed) -> {paths['corpus']}")
    f = st["fairness"]["test"]
    lines.append(
        f"  fairness (test vs train): answer overlap {f['answer_overlap']:.2f} "
        f"(open answers {f['answer_overlap_open']:.2f}), memoriser EM {f['memoriser_template_em']:.3f} "
        f"(answerable {f['memoriser_template_em_answerable']:.3f}), "
        f"most-frequent-answer EM {f['memoriser_global_em']:.3f}; facts shared with train "
        f"{st['fact_overlap']['test&train']}, test questions naming a training entity "
        f"{st['questions_naming_a_training_entity']['test']:.0%}"
    )
    lines.append(f"  world.json, stats.json -> {Path(out)}")
    console.print("\n".join(lines), highlight=False, markup=False, soft_wrap=True)
