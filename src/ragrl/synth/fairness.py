"""Is the test split a fair test? Memorisation baselines, and the statistics written to ``stats.json``.

Each split has its own people, companies, works and cities; only the countries and their capitals are
shared. ``fairness_report(train, test)`` measures what memorising the training answers buys:

* ``answer_overlap``: share of test questions with an answer (any alias) that is also a train answer;
  ``answer_overlap_open`` the same without yes/no and unanswerable questions (whose answers are a fixed
  vocabulary by design);
* ``memoriser_template_em``: EM of predicting, for each test question, the most frequent train answer of
  the same template (the strongest "learn the answer distribution" baseline);
  ``memoriser_template_em_answerable`` the same on the answerable questions only (on the others it
  scores by answering ``unknown``, the most frequent answer of most templates);
* ``memoriser_global_em``: EM of predicting the single most frequent train answer everywhere;
* ``yes_no_constant_em``: the better of "always yes" / "always no" on the yes/no questions.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import Any

from ragrl.data.schema import Example
from ragrl.data.stats import compute_stats
from ragrl.metrics import exact_match, normalize
from ragrl.synth.synth_world import SynthWorld

_FIXED = {"yes", "no", "unknown"}


def _most_common(counter: Counter) -> str:
    # highest count, ties broken by the string itself (deterministic)
    return min(counter.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def fairness_report(train: list[Example], test: list[Example], variant: str = "squad") -> dict[str, Any]:
    train_norm = {normalize(a, variant) for ex in train for a in ex.answers}
    by_template: dict[str, Counter] = defaultdict(Counter)
    overall: Counter = Counter()
    for ex in train:
        by_template[ex.metadata.get("template", "")][ex.answers[0]] += 1
        overall[ex.answers[0]] += 1
    global_answer = _most_common(overall)

    overlap = overlap_open = n_open = 0
    tmpl_em = glob_em = tmpl_em_answerable = 0.0
    n_answerable = sum(ex.answerable for ex in test)
    yes_no = [ex for ex in test if ex.answers[0] in ("yes", "no")]
    for ex in test:
        hit = any(normalize(a, variant) in train_norm for a in ex.answers)
        overlap += hit
        if ex.answers[0] not in _FIXED:
            n_open += 1
            overlap_open += hit
        counter = by_template.get(ex.metadata.get("template", ""))
        guess = _most_common(counter) if counter else global_answer
        em = exact_match(guess, ex.answers, variant)
        tmpl_em += em
        if ex.answerable:
            tmpl_em_answerable += em
        glob_em += exact_match(global_answer, ex.answers, variant)
    n = max(len(test), 1)
    const = max((sum(ex.answers[0] == c for ex in yes_no) / len(yes_no) for c in ("yes", "no")), default=0.0)
    return {
        "test_questions": len(test),
        "answer_overlap": round(overlap / n, 4),
        "answer_overlap_open": round(overlap_open / max(n_open, 1), 4),
        "memoriser_template_em": round(tmpl_em / n, 4),
        "memoriser_template_em_answerable": round(tmpl_em_answerable / max(n_answerable, 1), 4),
        "memoriser_global_em": round(glob_em / n, 4),
        "memoriser_global_answer": global_answer,
        "yes_no_questions": len(yes_no),
        "yes_no_constant_em": round(const, 4),
    }


def seed_entity_overlap(world: SynthWorld) -> dict[str, int]:
    """Number of non-shared entities whose passages the gold chains of two different splits read (0 in
    both split modes)."""
    used: dict[str, set[str]] = {}
    pid_to_entity = {e.passage_id: e for e in world.store}
    for split, examples in world.splits.items():
        used[split] = {
            pid_to_entity[pid].id
            for ex in examples
            for pid in ex.supporting_ids
            if pid_to_entity[pid].split is not None
        }
    names = sorted(used)
    return {f"{a}&{b}": len(used[a] & used[b]) for i, a in enumerate(names) for b in names[i + 1 :]}


def _needed_facts(examples: list[Example]) -> set[tuple[str, str]]:
    """The facts the questions need: one (passage id, answer) per decomposition step, the answer being
    what that passage says for the step (each fact is stated in exactly one passage)."""
    return {
        (pid, step.answers[0]) for ex in examples for step in ex.decomposition for pid in step.supporting_ids
    }


def fact_overlap(world: SynthWorld) -> dict[str, int]:
    """Number of facts needed by questions of two different splits (0 for every pair in ``facts``
    mode; in ``entities`` mode only the shared background, the capitals, may be counted). A training
    question's answer and its demonstration's targets (the sub-questions and what they find) state only
    the facts of its own decomposition, so 0 here means no held-out fact is a training target."""
    needed = {split: _needed_facts(examples) for split, examples in world.splits.items()}
    names = sorted(needed)
    return {f"{a}&{b}": len(needed[a] & needed[b]) for i, a in enumerate(names) for b in names[i + 1 :]}


def name_sharing(world: SynthWorld) -> dict[str, float]:
    """Share of each held-out split's questions that name an entity also named in a training question,
    answer or sub-question (the demonstrations' text): shared words, not shared facts."""
    names = sorted({e.name for e in world.store}, key=len, reverse=True)
    pattern = re.compile(r"\b(?:" + "|".join(re.escape(n) for n in names) + r")\b")

    def named(ex: Example, with_targets: bool) -> set[str]:
        texts = [ex.question]
        if with_targets:
            texts += list(ex.answers)
            texts += [t for step in ex.decomposition for t in (step.question, *step.answers)]
        return {m for t in texts for m in pattern.findall(t)}

    train_names = set().union(*(named(ex, True) for ex in world.splits["train"]))
    out = {}
    for split, examples in world.splits.items():
        if split != "train":
            out[split] = round(
                sum(bool(named(ex, False) & train_names) for ex in examples) / max(len(examples), 1), 4
            )
    return out


# --- across worlds: what a reader base pretrained on other worlds may have seen ----------------------


def _key(text: str) -> str:
    return normalize(str(text), "squad")


def mentions(world: SynthWorld) -> dict[str, set[str]]:
    """What each entity's passage can put side by side, by name: for every entity (its passage removed
    or not: a demonstration may still name it), the normalized names and aliases of the entity, its
    facts' values and its related entities' names and aliases; returned as mention → the ids of the
    entities whose passages mention it. Two mentions that share an entity may be stated together, in
    either order ("founded by P in 1985" pairs P with the year as much as the company with P)."""
    by_id = {e.id: e for e in world.store}
    out: dict[str, set[str]] = {}
    for e in world.store:
        said = {e.name, *e.aliases, *(str(v) for v in e.facts.values())}
        for target in e.rels.values():
            said.update([by_id[target].name, *by_id[target].aliases])
        for m in said:
            out.setdefault(_key(m), set()).add(e.id)
    return out


def held_out_named_facts(world: SynthWorld) -> set[tuple[str, str]]:
    """The facts the held-out questions (every split but ``train``) need, by name: (the name or an alias
    of the entity whose passage a decomposition step reads, an answer of that step), normalized."""
    by_passage = {e.passage_id: e for e in world.store}
    out: set[tuple[str, str]] = set()
    for split, examples in world.splits.items():
        if split == "train":
            continue
        for ex in examples:
            for step in ex.decomposition:
                for pid in step.supporting_ids:
                    e = by_passage[pid]
                    out.update((_key(n), _key(a)) for n in {e.name, *e.aliases} for a in step.answers)
    return out


def held_out_questions(world: SynthWorld) -> set[tuple[str, str]]:
    """(question, answer) of every held-out question, normalized."""
    return {
        (_key(ex.question), _key(a))
        for split, examples in world.splits.items()
        if split != "train"
        for ex in examples
        for a in ex.answers
    }


def all_questions(world: SynthWorld) -> set[tuple[str, str]]:
    """(question, answer) of every question of every split, normalized."""
    return {
        (_key(ex.question), _key(a))
        for examples in world.splits.values()
        for ex in examples
        for a in ex.answers
    }


def shared_facts(reader: SynthWorld, needed: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The ``needed`` (name, value) pairs that some passage of ``reader`` could state: both mentioned by
    one of its entities (``mentions``)."""
    said = mentions(reader)
    return {(a, b) for a, b in needed if a != b and said.get(a, set()) & said.get(b, set())}


def cross_world_overlap(readers: list[SynthWorld], protected: list[SynthWorld]) -> dict[str, Any]:
    """Does any pretraining world (``readers``) state a fact a held-out question of a ``protected`` world
    needs, or ask one of its held-out questions with the same answer? Both counts must be 0;
    ``shared_name_words`` (name words of both) is allowed: names recur with other facts."""
    needed = set().union(*(held_out_named_facts(w) for w in protected)) if protected else set()
    asked = set().union(*(held_out_questions(w) for w in protected)) if protected else set()

    def words(worlds: list[SynthWorld]) -> set[str]:
        return {w for world in worlds for e in world.store for n in (e.name, *e.aliases) for w in n.split()}

    return {
        "reader_seeds": [w.seed for w in readers],
        "protected_worlds": [f"{w.seed}/{w.size}/{w.split}" for w in protected],
        "protected_held_out_facts": len(needed),
        "shared_facts": sum(len(shared_facts(w, needed)) for w in readers),
        "shared_questions": sum(len(all_questions(w) & asked) for w in readers),
        "shared_name_words": len(words(readers) & words(protected)),
    }


def split_stats(examples: list[Example]) -> dict[str, Any]:
    out = compute_stats(examples)
    templates = Counter(ex.metadata.get("template", "") for ex in examples)
    out["template"] = {k: templates[k] for k in sorted(templates)}
    yes_no: dict[str, dict[str, int]] = defaultdict(lambda: {"yes": 0, "no": 0})
    for ex in examples:
        if ex.answers[0] in ("yes", "no"):
            yes_no[ex.metadata["template"]][ex.answers[0]] += 1
    out["yes_no_balance"] = {k: yes_no[k] for k in sorted(yes_no)}
    n = max(len(examples), 1)
    out["answerable_share"] = round(sum(ex.answerable for ex in examples) / n, 4)
    return out


def world_stats(world: SynthWorld) -> dict[str, Any]:
    kinds = Counter(e.kind for e in world.store)
    pools: dict[str, Counter] = defaultdict(Counter)
    for e in world.store:
        pools[e.pool][e.kind] += 1
    train = world.splits["train"]
    return {
        "seed": world.seed,
        "size": world.size,
        "entities": {k: kinds[k] for k in sorted(kinds)},
        "entities_per_pool": {p: dict(sorted(c.items())) for p, c in sorted(pools.items())},
        "corpus": {
            "passages": len(world.corpus),
            "removed": len(world.removed_ids),
            "all_passages": len(world.passages),
        },
        "splits": {split: split_stats(examples) for split, examples in world.splits.items()},
        "fairness": {
            split: fairness_report(train, world.splits[split]) for split in world.splits if split != "train"
        },
        "split": world.split,
        "seed_entity_overlap": seed_entity_overlap(world),
        "fact_overlap": fact_overlap(world),
        "questions_naming_a_training_entity": name_sharing(world),
    }
