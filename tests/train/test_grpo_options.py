"""The GRPO trainer's options end to end on the test world: whitening, name swap and renamed worlds,
early stopping (patience, time budget), answerable-only training, the engine log-prob comparison and
truncated importance sampling. (The step itself, resume and processes: test_grpo.py.)"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from ragrl.data.io import read_examples
from ragrl.methods import load_method
from ragrl.rollout.outcomes import OUTCOMES
from ragrl.train.grpo import GRPOTrainer

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("grpo_run", HERE / "grpo_run.py")
grpo_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(grpo_run)
small_method, records = grpo_run.small_method, grpo_run.records


def test_whitening_normalises_what_reaches_the_update(world_dir, tmp_path):
    from ragrl.rollout.sample import Sample

    method = small_method(world_dir, tmp_path / "w", "train.grpo.whiten=sample")
    trainer = GRPOTrainer(method, method.train, eval_examples=[])

    def samples():  # noqa: ANN202
        return [
            Sample([1], [5] * n, [1] * n, [0.0] * n, group=0, episode=i, step=0, advantage=a)
            for i, (n, a) in enumerate([(1, 3.0), (3, -1.0), (4, 0.0)])
        ]

    by_sample = samples()
    trainer._whiten(by_sample, by_tokens=False)
    a = np.array([3.0, -1.0, 0.0])
    assert [s.advantage for s in by_sample] == pytest.approx(((a - a.mean()) / a.std()).tolist())
    by_token = samples()
    trainer._whiten(by_token, by_tokens=True)  # 1, 3 and 4 tokens
    tokens = np.repeat(a, [1, 3, 4])
    assert [s.advantage for s in by_token] == pytest.approx(((a - tokens.mean()) / tokens.std()).tolist())
    metrics = trainer.step()  # a whole step runs whitened
    assert math.isfinite(metrics["loss"])


def test_name_swap_renames_what_reaches_the_update_and_only_the_names(world_dir, tmp_path):
    method = small_method(world_dir, tmp_path / "n", "train.grpo.name_swap=1.0")
    trainer = GRPOTrainer(method, method.train, eval_examples=[])
    swap = trainer.name_swap
    assert swap is not None and swap.size > 100
    names = set(swap.spaced) | set(swap.bare)
    played = trainer._play(0, 4).samples
    renamed = trainer._renamed(played)
    assert [s.completion_ids for s in trainer._renamed(played)] == [s.completion_ids for s in renamed]
    changed = 0
    for before, after in zip(played, renamed, strict=True):
        old, new = before.prompt_ids + before.completion_ids, after.prompt_ids + after.completion_ids
        pairs = list(zip(old, new, strict=True))
        assert all(a == b for a, b in pairs if a not in names)  # only name tokens change
        mapping = {a: b for a, b in pairs if a in names}
        assert all(mapping[a] == b for a, b in pairs if a in names)  # consistently
        changed += any(a != b for a, b in mapping.items())
        for key in ("advantage", "loss_mask", "group"):
            assert getattr(after, key) == getattr(before, key)
    assert changed >= len(played) - 1  # every question names an entity
    seen = []
    update = trainer._update
    trainer._update = lambda samples: seen.append(samples) or update(samples)
    metrics = trainer.step()
    assert math.isfinite(metrics["loss"]) and seen and all(s.completion_ids for s in seen[0])
    assert metrics["kept_frac"] == 1.0  # keep_all: every episode reached the update, renamed or not


def test_name_swap_config_errors(world_dir, tmp_path):
    from ragrl.errors import RagrlError

    with pytest.raises(RagrlError, match=r"train.grpo.name_swap is a share of samples in \[0, 1\]"):
        small_method(world_dir, tmp_path / "a", "train.grpo.name_swap=2").train.validate()
    with pytest.raises(RagrlError, match="rollout log-probs no longer apply"):
        small_method(
            world_dir, tmp_path / "b", "train.grpo.name_swap=1", "train.grpo.old_logprobs=rollout"
        ).train.validate()
    method = small_method(
        world_dir, tmp_path / "c", "train.grpo.name_swap=1", f"train.sft.world={tmp_path / 'none.json'}"
    )
    with pytest.raises(RagrlError, match=r"train.grpo.name_swap needs the world's names: .*none.json"):
        GRPOTrainer(method, method.train, eval_examples=[])


def _evaluated_every_step(world_dir, out, *overrides):
    """A small GRPO run evaluated on the dev questions after every step, and its summary."""
    method = small_method(world_dir, out, "train.eval_every=1", *overrides)
    method.train.data.eval = str(world_dir / "dev.jsonl")
    return method, GRPOTrainer(method, method.train).train()


def test_patience_stops_a_run_without_a_new_best_and_a_resume_keeps_it_stopped(world_dir, tmp_path):
    # eval/n never changes, and a tie keeps the earlier best: the evaluation before training stays best
    method, summary = _evaluated_every_step(
        world_dir, tmp_path / "run", "train.steps=6", "train.data.eval_limit=2",
        "train.best_metric=eval/n", "train.patience=2",
    )  # fmt: skip
    assert summary["steps"] == 2 and summary["best"]["step"] == 0
    evals = records(tmp_path / "run", "eval")
    phases = [r["phase"] for r in evals]
    assert phases == ["before", "train", "train", "after"]
    # the run ended right after its step-2 evaluation: the same record, not a second evaluation
    assert {k: v for k, v in evals[3].items() if k != "phase"} == {
        k: v for k, v in evals[2].items() if k != "phase"
    }
    again = GRPOTrainer(method, method.train)
    assert again.train(resume="latest")["steps"] == 2
    assert [r["phase"] for r in records(tmp_path / "run", "eval")] == phases


def test_a_time_budget_ends_the_run_after_the_step_that_reaches_it_and_a_resume_keeps_it(world_dir, tmp_path):
    # a budget any step exceeds: the run ends after its first step, evaluated and saved as finished
    method = small_method(world_dir, tmp_path / "run", "train.steps=3", "train.max_seconds=1e-6")
    method.train.data.eval, method.train.data.eval_limit = str(world_dir / "dev.jsonl"), 2
    summary = GRPOTrainer(method, method.train).train()
    assert summary["steps"] == 1 and summary["stopped"] == "time"
    assert [r["phase"] for r in records(tmp_path / "run", "eval")] == ["before", "after"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["stopped"] == "time"
    assert (tmp_path / "run" / "policy" / "config.json").is_file()
    # resumed under the same budget it stays stopped; with the budget lifted it trains to the end
    assert GRPOTrainer(method, method.train).train(resume="latest")["steps"] == 1
    lifted = small_method(world_dir, tmp_path / "run", "train.steps=3", "train.max_seconds=0")
    summary = GRPOTrainer(lifted, lifted.train).train(resume="latest")
    assert summary["steps"] == 3 and "stopped" not in summary


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_a_bad_time_budget_is_refused_with_its_key(world_dir, tmp_path, value):
    from ragrl.errors import RagrlError

    with pytest.raises(RagrlError, match="train.max_seconds must be >= 0"):
        small_method(world_dir, tmp_path / "run", f"train.max_seconds={value}")


def test_an_outcome_share_is_logged_and_can_pick_the_best_policy(world_dir, tmp_path):
    _, summary = _evaluated_every_step(
        world_dir, tmp_path / "run", "train.steps=1", "train.data.eval_limit=3",
        "train.best_metric=eval/outcome/no_answer", "train.best_mode=min",
    )  # fmt: skip
    evals = records(tmp_path / "run", "eval")
    for e in evals:  # every outcome's share of the 3 questions, summing to 1
        shares = {k: v for k, v in e.items() if k.startswith("eval/outcome/")}
        assert len(shares) == len(OUTCOMES) and sum(shares.values()) == pytest.approx(1.0, abs=1e-3)
        assert all(round(3 * v, 3) == round(3 * v) for v in shares.values())
    assert summary["best"]["metric"] == "eval/outcome/no_answer"
    lowest = min(e["eval/outcome/no_answer"] for e in evals)  # min mode; a tie keeps the earlier policy
    first = next(e["step"] for e in evals if e["eval/outcome/no_answer"] == lowest)
    assert summary["best"] == {"step": first, "metric": "eval/outcome/no_answer", "value": lowest}


def test_patience_needs_a_best_metric(world_dir, tmp_path):
    from ragrl.errors import RagrlError

    with pytest.raises(RagrlError, match="train.patience must be >= 0 and needs train.best_metric"):
        small_method(world_dir, tmp_path / "run", "train.patience=2")


def test_train_answerable_only_leaves_the_unanswerable_questions_out_and_says_so(world_dir, tmp_path, capsys):
    from ragrl.errors import RagrlError

    questions, _ = read_examples(world_dir / "train.jsonl")
    unanswerable = {e.id for e in questions if not e.answerable}
    assert 0 < len(unanswerable) < len(questions)  # the test world has both kinds
    method = small_method(world_dir, tmp_path / "a", "train.data.train_answerable_only=true")
    trainer = GRPOTrainer(method, method.train, eval_examples=questions)
    kept = {e.id for e in trainer.train_examples}
    assert kept == {e.id for e in questions} - unanswerable
    assert len(trainer.eval_examples) == len(questions)  # the evaluation keeps every question
    out = capsys.readouterr().err  # the console writes to stderr
    assert f"training on {len(kept)} of {len(questions)} questions ({len(unanswerable)} marked" in out
    # the default trains on all of them
    method = small_method(world_dir, tmp_path / "b")
    assert len(GRPOTrainer(method, method.train, eval_examples=[]).train_examples) == len(questions)
    only_unanswerable = [e for e in questions if not e.answerable]
    method = small_method(world_dir, tmp_path / "c", "train.data.train_answerable_only=true")
    with pytest.raises(RagrlError, match=f"all {len(only_unanswerable)} training questions are marked"):
        GRPOTrainer(method, method.train, train_examples=only_unanswerable, eval_examples=[])


def test_rename_world_plays_each_step_in_a_renamed_world_and_evaluates_in_the_real_one(world_dir, tmp_path):
    from ragrl.rollout.scripted import ScriptedBackend
    from ragrl.train.augment import RenamedRetriever

    method = small_method(
        world_dir,
        tmp_path / "w",
        "train.grpo.rename_world=true",
        "train.eval_every=1",
        "train.data.eval_limit=2",
    )
    examples, _ = read_examples(world_dir / "dev.jsonl")
    trainer = GRPOTrainer(method, method.train, eval_examples=examples[:2])
    assert isinstance(trainer.rollout_retriever, RenamedRetriever)
    drawn, searched = [], []  # the worlds drawn, and what the real index returned (real queries)
    draw, search = trainer.world.draw, trainer.retriever.search
    trainer.world.draw = lambda rng: drawn.append(draw(rng)) or drawn[-1]
    trainer.retriever.search = lambda queries, k: (
        searched.append((queries, search(queries, k))) or searched[-1][1]
    )

    def policy(prompt_ids: list[int], index: int) -> str:  # search the question, then answer
        text = trainer.tokenizer.decode(prompt_ids)
        if "(Title:" in text:  # a search came back
            return "<answer> x </answer>"
        names = [w for w in text.split("Question:")[-1].split() if w.strip("?.,") in drawn[-1].inverse]
        return f"<search> {' '.join(w.strip('?.,') for w in names[:3])} </search>"  # the renamed names

    trainer.rollout = method.make_rollout(
        ScriptedBackend(trainer.tokenizer, policy), trainer.rollout_retriever
    )
    real = {e.id: e for e in trainer.train_examples}
    played = trainer._play(0, 4)
    (renaming,) = drawn
    for owner in played.owners:  # the questions and gold answers the reward read are the renamed ones
        assert owner.question == renaming.forward(real[owner.id].question) != real[owner.id].question
        assert owner.answers == [renaming.forward(a) for a in real[owner.id].answers]
    # the policy's queries were read back into the real names, and it read the hits renamed
    queries = [
        a.content for t in played.episodes for a in t.actions if a.kind == "search" and a.error is None
    ]
    asked = [q for batch, _ in searched for q in batch]
    assert queries and sorted(asked) == sorted(renaming.backward(q) for q in queries)
    seen = " ".join(s.text for t in played.episodes for s in t.segments if s.kind == "env")
    titles = {h.passage.title for _, found in searched for hits in found for h in hits}
    assert titles and all(f"(Title: {renaming.forward(title)})" in seen for title in titles)
    assert any(renaming.forward(title) != title for title in titles)
    assert trainer.rollout_retriever.renaming is None  # only the round's episodes play the renamed world
    # the same step of a rerun draws the same world; the next step another
    again = GRPOTrainer(method, method.train, eval_examples=[])
    again.world.draw = lambda rng: drawn.append(draw(rng)) or drawn[-1]
    again._play(0, 4)
    assert drawn[1].mapping == renaming.mapping
    trainer.step()  # step 0 again (the same world), then step 1's
    assert drawn[-1].mapping == renaming.mapping
    trainer._play(0, 4)
    assert drawn[-1].mapping != renaming.mapping
    # evaluation searches the real world (the real index, no renaming)
    searched.clear()
    trainer.backend = ScriptedBackend(trainer.tokenizer, policy)
    evaluated = trainer.evaluate("after")
    assert evaluated["eval/n"] == 2 and trainer.rollout_retriever.renaming is None
    questions = " ".join(e.question for e in examples[:2])
    asked = [q for batch, _ in searched for q in batch]
    assert asked and all(w in questions for q in asked for w in q.split())  # the real names, as written


def test_rename_world_config_errors(world_dir, tmp_path):
    from ragrl.errors import RagrlError

    method = small_method(
        world_dir, tmp_path / "c", "train.grpo.rename_world=true", f"train.sft.world={tmp_path / 'none.json'}"
    )
    with pytest.raises(RagrlError, match=r"train.grpo.rename_world needs the world's names: .*none.json"):
        GRPOTrainer(method, method.train, eval_examples=[])
    with pytest.raises(
        RagrlError, match=r"rename_world renames the worlds of GRPO's rollouts; train.algo 'cycles'"
    ):
        small_method(
            world_dir, tmp_path / "d", "train.grpo.rename_world=true", "train.algo=cycles"
        ).train.validate()
    r2ag = load_method(
        "r2ag-tiny",
        [
            f"train.model.path={world_dir / 'model'}",
            f"train.data.train={world_dir / 'train.jsonl'}",
            f"train.data.index={world_dir / 'bm25'}",
            f"train.out={tmp_path / 'e'}",
            "train.grpo.rename_world=true",
        ],
    )
    with pytest.raises(
        RagrlError, match="the r2ag method grows its next questions from each step's episodes"
    ):
        GRPOTrainer(r2ag, r2ag.train, eval_examples=[])


def test_a_recomputed_pi_old_is_compared_with_the_backends_logprobs_and_can_weight_the_loss(
    world_dir, tmp_path
):
    """With π_old recomputed, every step logs how far the backend's log-probs of its sampled tokens are
    from the trainer's (the transformers backend decodes with a KV cache, the trainer in one pass: the
    same up to float order); ``tis_cap`` weights the loss by the capped ratio, which here cuts nothing."""
    method = small_method(world_dir, tmp_path / "a", "train.steps=1", "train.grpo.old_logprobs=recompute")
    row = GRPOTrainer(method, method.train, eval_examples=[]).step()
    assert 0 <= row["engine/logprob_diff"] < 1e-4 and abs(row["engine/kl"]) < 1e-6
    assert 0 <= row["engine/prob_diff"] < 1e-4 and "engine/tis_cut_frac" not in row
    assert "engine/staleness" not in row  # the policy decodes: no engine to keep current
    method = small_method(world_dir, tmp_path / "b", "train.steps=1", "train.grpo.tis_cap=2")
    row = GRPOTrainer(method, method.train, eval_examples=[]).step()  # auto: recomputed for the weights
    assert row["engine/tis_cut_frac"] == 0.0 and row["engine/logprob_diff"] < 1e-4 and row["grad_norm"] > 0
    # the default (one update, no engine): π_old is π_θ detached and nothing is compared
    method = small_method(world_dir, tmp_path / "c", "train.steps=1")
    assert "engine/logprob_diff" not in GRPOTrainer(method, method.train, eval_examples=[]).step()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["train.engine.backend=sglang"],
            "train.engine.backend must be one of transformers, vllm, got 'sglang'",
        ),
        (["train.engine.sync_every=0"], "train.engine.sync_every must be >= 1, got 0"),
        (
            ["train.model.decode=fast"],
            "train.model.decode must be one of auto, loop, static, graph, got 'fast'",
        ),
        (["train.grpo.tis_cap=0.5"], "train.grpo.tis_cap must be 0 .off. or >= 1"),
        (["train.grpo.tis_cap=2", "train.grpo.old_logprobs=rollout"], "with 'rollout'"),
        (["train.engine.backend=vllm", "train.algo=cycles"], "train.algo 'cycles' generates with the policy"),
        (["train.engine.backend=vllm", "train.parallel.mode=fsdp"], "not with train.model.lora nor"),
        (
            ["train.engine.backend=vllm", "train.engine.sync_every=3", "train.save_every=4"],
            r"train.save_every \(4\) must be a multiple of train.engine.sync_every \(3\)",
        ),
        (
            ["train.engine.backend=vllm", "train.grpo.old_logprobs=rollout"],
            "up to sync_every - 1 steps stale",
        ),
    ],
)
def test_engine_config_errors_name_the_key(world_dir, tmp_path, overrides, message):
    from ragrl.errors import RagrlError

    with pytest.raises(RagrlError, match=message):
        small_method(world_dir, tmp_path / "run", *overrides).train.validate()


class _ReportsLower:
    """The trainer's own backend, reporting every log-prob ``log 4`` lower: π_old / π_backend = 4."""

    def __init__(self, backend) -> None:  # noqa: ANN001
        self.backend, self.tokenizer = backend, backend.tokenizer

    def generate(self, prompts, params):  # noqa: ANN001, ANN201
        import dataclasses

        gens = self.backend.generate(prompts, params)
        return [dataclasses.replace(g, logprobs=[x - math.log(4) for x in g.logprobs]) for g in gens]


def test_truncated_importance_weights_reach_the_loss(world_dir, tmp_path):
    """Every token's ratio is 4, cut to the cap of 2: the gradient is exactly twice TIS-off's (no KL term,
    a pre-clip norm), and every token counts as cut."""
    rows = {}
    for cap in (0, 2):
        method = small_method(
            world_dir, tmp_path / f"cap{cap}", "train.steps=1", "train.grpo.old_logprobs=recompute",
            f"train.grpo.tis_cap={cap}",
        )  # fmt: skip
        trainer = GRPOTrainer(method, method.train, eval_examples=[])
        trainer.rollout = method.make_rollout(_ReportsLower(trainer.backend), trainer.rollout_retriever)
        rows[cap] = trainer.step()
        assert rows[cap]["engine/logprob_diff"] == pytest.approx(math.log(4), abs=1e-4)
    assert rows[2]["engine/tis_cut_frac"] == 1.0 and "engine/tis_cut_frac" not in rows[0]
    assert rows[2]["grad_norm"] == pytest.approx(2 * rows[0]["grad_norm"], rel=1e-4)


def test_tis_is_refused_where_the_backends_logprobs_do_not_describe_the_trained_tokens(world_dir, tmp_path):
    from ragrl.errors import RagrlError

    method = small_method(world_dir, tmp_path / "a", "train.grpo.tis_cap=2", "rollout.greedy_samples=1")
    with pytest.raises(RagrlError, match="a greedy token has no sampling probability"):
        GRPOTrainer(method, method.train, eval_examples=[])
    with pytest.raises(RagrlError, match="renamed tokens were not sampled"):
        small_method(
            world_dir, tmp_path / "b", "train.grpo.tis_cap=2", "train.grpo.name_swap=0.5"
        ).train.validate()


def test_static_decoding_rolls_out_what_the_loop_does(world_dir, tmp_path):
    """``train.model.decode=static`` (the step a GPU replays as a CUDA graph) samples the same rollouts as
    the plain loop from the same seed: the same step metrics, and the summary says what decoded."""
    rows = {}
    for decode in ("loop", "static"):
        method = small_method(world_dir, tmp_path / decode, "train.steps=1", f"train.model.decode={decode}")
        trainer = GRPOTrainer(method, method.train, eval_examples=[])
        rows[decode] = trainer.step()
        assert set(trainer.backend.decode_log) == {decode}
    keys = ("response_len", "reward", "searches", "entropy", "loss", "grad_norm")
    for key in keys:
        assert rows["static"][key] == pytest.approx(rows["loop"][key], rel=1e-4, abs=1e-6), key
