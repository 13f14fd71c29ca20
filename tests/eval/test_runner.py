"""``ragrl.eval.runner`` from Python: ``evaluate``'s report carries what its scores came from;
``collapse_check`` tells learning from a collapse onto one answer."""

from __future__ import annotations

from ragrl.data.io import read_examples
from ragrl.data.schema import Example
from ragrl.eval.runner import collapse_check, evaluate, repeated_searches, rollout_stats
from ragrl.llm.environment import environment
from ragrl.llm.hf_backend import load_tokenizer
from ragrl.methods import load_method
from ragrl.retrieval import load_retriever
from ragrl.rollout.scripted import DemonstratorBackend
from ragrl.synth.demonstrators import demonstrator_by_name


def test_a_report_records_the_environment_its_scores_came_from(world_dir):
    method = load_method("search_r1")
    examples, _ = read_examples(world_dir / "test.jsonl")
    examples = method.prepare_examples(examples[:6], str(world_dir / "test.jsonl"))
    retriever = load_retriever(world_dir / "bm25")
    oracle = demonstrator_by_name("oracle", world_dir / "world.json")
    backend = DemonstratorBackend.for_examples(
        load_tokenizer(world_dir / "model"), oracle, examples, method.protocol, retriever, method.rollout.k
    )
    report = evaluate(backend, retriever, method, examples)
    assert report.scores["em"] == 1.0 and report.scores["n_scored"] == 6
    env = report.environment
    assert env["versions"]["torch"] and any(p.startswith("torch==") for p in env["packages"])
    assert env == environment()  # this process's: the machine, the libraries, the commit


def test_collapse_check_separates_learning_from_a_constant_answer():
    """A policy answering ``unknown`` to everything scores the unanswerable share of EM; the check shows
    EM 0 on the answerable questions and one answer taking every row."""
    examples = [Example(f"q{i}", "?", ["x"], metadata={"answerable": i >= 8}) for i in range(10)]
    rows = [{"id": ex.id, "em": float(i < 2), "prediction": "unknown"} for i, ex in enumerate(examples)]
    assert collapse_check(rows, examples) == {
        "eval/em_answerable": 0.0,
        "eval/top_answer": "unknown",
        "eval/top_answer_share": 1.0,
    }
    rows = [{"id": "q8", "em": 1.0, "prediction": "x"}, {"id": "q9", "em": 0.0, "prediction": None}]
    assert collapse_check(rows, examples) == {
        "eval/em_answerable": 0.5,
        "eval/top_answer": "x",
        "eval/top_answer_share": 0.5,
    }
    rows = [{"id": "q9", "em": 0.0, "prediction": None}]
    assert collapse_check(rows, examples)["eval/top_answer"] == "(no answer)"
    assert collapse_check([], examples)["eval/top_answer_share"] == 0.0


def test_repeated_searches_count_a_query_asked_again_in_the_episode():
    from ragrl.rollout.trajectory import Action, Trajectory

    queries = [
        "Who founded Acme?",
        "who founded  acme",
        "The founder of Acme",
        "Who founded Acme?",
        "Acme city",
    ]
    assert repeated_searches(queries) == 2  # case, spacing and punctuation aside; "The" is an article
    assert repeated_searches(["founder of Acme", "the founder of Acme"]) == 1
    assert repeated_searches([]) == 0 and repeated_searches(["x y", "y x"]) == 0  # word order counts
    trajectory = Trajectory(
        "q", [1], actions=[Action("search", q) for q in queries] + [Action("answer", "x")]
    )
    (stats,) = rollout_stats([trajectory])
    assert stats["searches"] == 5 and stats["repeated_searches"] == 2
