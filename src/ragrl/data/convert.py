"""Convert any supported dataset file into ragrl's canonical pair of files.

``convert(path, out_dir)`` writes ``out_dir/questions.jsonl`` (FlashRAG-style question records) and,
when the dataset gives contexts, ``out_dir/corpus.jsonl``: every given passage once (ids are content
hashes, so duplicates across questions collapse), in first-seen order, as ``{id, contents}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ragrl.data.io import LoadReport, write_corpus, write_examples
from ragrl.data.loaders import load_dataset, normalize_format
from ragrl.data.schema import Example, Passage

QUESTIONS_FILE = "questions.jsonl"
CORPUS_FILE = "corpus.jsonl"


@dataclass
class ConvertResult:
    format: str
    questions_path: Path
    n_questions: int
    report: LoadReport
    corpus_path: Path | None = None  # None when no question came with passages
    n_passages: int = 0
    n_passage_mentions: int = 0  # passages over all questions, before de-duplication
    empty_passages: list[str] = field(default_factory=list)  # ids left out of the corpus: no title, no text
    stale_corpus: bool = False  # an earlier corpus.jsonl was left in place untouched
    unresolved: list[tuple[str, list]] = field(default_factory=list)  # (question id, facts)

    def summary(self) -> str:
        read_and_skipped = [
            line for line in self.report.summary().splitlines() if not line.lstrip()[:1].isdigit()
        ]
        lines = [f"format: {self.format}", *read_and_skipped]
        lines.append(f"wrote {self.n_questions} questions to {self.questions_path}")
        if self.corpus_path is not None:
            lines.append(
                f"wrote {self.n_passages} distinct passages to {self.corpus_path} "
                f"(from {self.n_passage_mentions} given with the questions)"
            )
            if self.empty_passages:
                ids = ", ".join(self.empty_passages[:5]) + (", ..." if len(self.empty_passages) > 5 else "")
                lines.append(
                    f"  left out {len(self.empty_passages)} empty passages (no title and no text; "
                    f"`ragrl index` refuses them): {ids}"
                )
        else:
            lines.append("no corpus written: the questions come without contexts")
            if self.stale_corpus:
                lines.append(f"  note: an older {CORPUS_FILE} in that folder was left unchanged")
        if self.unresolved:
            n_facts = sum(len(f) for _, f in self.unresolved)
            lines.append(
                f"{n_facts} supporting facts in {len(self.unresolved)} questions could not be mapped to a "
                "passage (kept in metadata['unresolved_supporting_facts']):"
            )
            for qid, facts in self.unresolved[:10]:
                lines.append(f"  {qid}: {facts}")
            if len(self.unresolved) > 10:
                lines.append(f"  ... and {len(self.unresolved) - 10} more")
        other = [w for w in self.report.warnings if "not resolved" not in w]
        for w in other:
            lines.append(f"warning: {w}")
        return "\n".join(lines)


def build_corpus(examples: list[Example]) -> tuple[list[Passage], int, list[str]]:
    """Distinct given passages in first-seen order, how many were given in all, and the ids of those
    left out because they have neither a title nor a text (no search could find them by their words,
    and ``ragrl index`` refuses them)."""
    by_id: dict[str, Passage] = {}
    empty: dict[str, None] = {}
    mentions = 0
    for ex in examples:
        for p in ex.passages or ():
            mentions += 1
            if p.empty:
                empty.setdefault(p.id)
            else:
                by_id.setdefault(p.id, p)
    return list(by_id.values()), mentions, list(empty)


def convert(
    path: str | Path,
    out_dir: str | Path,
    *,
    format: str = "auto",
    skip_invalid: bool = False,
    source: str | None = None,
) -> ConvertResult:
    examples, report = load_dataset(path, normalize_format(format), skip_invalid, source=source)
    fmt = report.format
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    questions_path = out / QUESTIONS_FILE
    write_examples(questions_path, examples)
    result = ConvertResult(fmt, questions_path, len(examples), report)
    result.unresolved = [
        (ex.id, ex.metadata["unresolved_supporting_facts"])
        for ex in examples
        if ex.metadata.get("unresolved_supporting_facts")
    ]
    if any(ex.passages is not None for ex in examples):
        passages, mentions, result.empty_passages = build_corpus(examples)
        result.corpus_path = out / CORPUS_FILE
        result.n_passages = write_corpus(result.corpus_path, passages)
        result.n_passage_mentions = mentions
    else:
        result.stale_corpus = (out / CORPUS_FILE).exists()
    return result
