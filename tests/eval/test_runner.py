"""``ragrl.eval.runner.evaluate`` from Python: the report carries what its scores came from."""

from __future__ import annotations

from ragrl.data.io import read_examples
from ragrl.eval.runner import evaluate
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
