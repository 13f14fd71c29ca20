"""ragrl inside verl (``ragrl.integrations.verl``): the reward function scores what ``ragrl reward``
scores, the estimators give ragrl's advantages on verl's tensors, the dataset rows carry the question
whole; with real verl (``make test-verl``, its own virtualenv) the same through verl's own loaders and
registry."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from ragrl.algos import compute_advantages
from ragrl.cli import app
from ragrl.data.io import read_examples
from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.integrations import verl as rv
from ragrl.rollout.records import read_trajectories

runner = CliRunner()


@pytest.fixture(scope="module")
def responses(world_dir, tmp_path_factory):  # noqa: ANN001, ANN201
    """Eight test questions, the oracle's responses to six and two wrong ones, as the text verl decodes
    (observations included), and ``ragrl reward``'s rows for them (EM weighted 0.5)."""
    tmp = tmp_path_factory.mktemp("verl")
    args = ["eval", "--model", str(world_dir / "model"), "--demonstrator", "oracle", "--n", "6",
            "--data", str(world_dir / "test.jsonl"),
            "--index", str(world_dir / "bm25"), "--out", str(tmp / "oracle")]  # fmt: skip
    assert runner.invoke(app, args).exit_code == 0
    trajectories = read_trajectories(tmp / "oracle" / "trajectories.jsonl")
    texts = [t.completion_text for t in trajectories] + ["<answer> surely wrong </answer>", "no tags at all"]
    ids = [t.example_id for t in trajectories] + [trajectories[0].example_id, trajectories[1].example_id]
    (tmp / "c.jsonl").write_text(
        "".join(json.dumps({"id": i, "completion": c}) + "\n" for i, c in zip(ids, texts, strict=True))
    )
    gold = str(world_dir / "test.jsonl")
    args = ["reward", "search_r1", "--completions", str(tmp / "c.jsonl"), "--gold", gold,
            "--set", "reward.1.weight=0.5"]  # fmt: skip
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")][:-1]
    by_id = {ex.id: ex for ex in read_examples(world_dir / "test.jsonl")[0]}
    return [by_id[i] for i in ids], texts, rows


def test_the_reward_function_scores_what_ragrl_reward_scores(responses):  # noqa: ANN001
    examples, texts, expected = responses
    rows = rv.verl_rows(examples)
    scores = rv.compute_score_batch(
        [r["data_source"] for r in rows], texts, [r["reward_model"]["ground_truth"] for r in rows],
        [r["extra_info"] for r in rows], overrides=["reward.1.weight=0.5"],
    )  # fmt: skip
    assert [s["score"] for s in scores] == [r["total"] for r in expected]
    assert [s["em"] for s in scores] == [r["em"] for r in expected] == [1.0] * 6 + [0.0, 0.0]
    assert [s["search_r1_format"] for s in scores] == [r["search_r1_format"] for r in expected]
    # one at a time (verl's naive manager) gives the same; a dataset of verl's own (ground truth only)
    # scores the answer alone
    one = rv.compute_score("ragrl", texts[0], None, rows[0]["extra_info"], overrides=["reward.1.weight=0.5"])
    assert one == scores[0]
    bare = rv.compute_score("hotpotqa", texts[0], examples[0].answers, {"index": 0})
    assert bare["em"] == 1.0
    # verl's own Search-R1 rows: {"target": [...]}, the list as parquet gives it back (numpy)
    target = rv.compute_score("nq", texts[0], {"target": np.array(examples[0].answers, dtype=object)}, None)
    assert target["em"] == 1.0
    with pytest.raises(RagrlError, match="row 0: neither extra_info.ragrl_example nor a ground truth"):
        rv.compute_score("x", texts[0], None, {})
    with pytest.raises(RagrlError, match="a ground truth mapping without 'target'"):
        rv.compute_score("x", texts[0], {"answer": "y"}, None)


@pytest.mark.parametrize(
    ("method", "message"),
    [
        ("evo_rag", "carry more than text"),
        ("r2ag", "carry more than text"),
        ("tiresrag", "prefills the answer"),
    ],
)
def test_methods_whose_episodes_text_cannot_carry_are_refused(method, message):  # noqa: ANN001
    with pytest.raises(RagrlError, match=message):
        rv.compute_score("x", "<answer> a </answer>", ["a"], None, method=method)


def test_rows_carry_the_question_whole_and_the_methods_messages(responses):  # noqa: ANN001
    examples, _, _ = responses
    rows = rv.verl_rows(examples, method="search_r1")
    for i, (row, ex) in enumerate(zip(rows, examples, strict=True)):
        back = Example.from_record(json.loads(row["extra_info"]["ragrl_example"]))
        assert back.to_record() == ex.to_record() and row["extra_info"]["index"] == i
        assert row["prompt"][-1]["role"] == "user" and ex.question in row["prompt"][-1]["content"]
        assert row["reward_model"] == {"style": "rule", "ground_truth": ex.answers}


def test_the_estimators_give_ragrls_advantages_on_verls_tensors():
    torch.manual_seed(0)
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 1.0, 0.25])
    index = np.array(["a", "a", "a", "a", "b", "b", "b", "b"], dtype=object)
    mask = torch.zeros(8, 6)
    lengths = [6, 3, 4, 1, 5, 2, 6, 3]
    for i, n in enumerate(lengths):
        mask[i, :n] = 1.0
    token_level = torch.zeros(8, 6)
    for i, n in enumerate(lengths):  # an outcome reward sits on the last response token
        token_level[i, n - 1] = rewards[i]
    names = rv.estimator_names()
    assert {"grpo", "rloo"} <= set(names) and "tiresrag" not in names  # it reads components
    for name in names:
        advantages, returns = rv.advantage_estimator(name)(token_level, mask, index=index, config=None)
        expected = compute_advantages(name, rewards, torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]))
        assert torch.allclose(advantages, expected[:, None] * mask) and torch.equal(advantages, returns)
    with pytest.raises(RagrlError, match="reads the reward's components"):
        rv.advantage_estimator("tiresrag")
    with pytest.raises(RagrlError, match="gave no index"):
        rv.advantage_estimator("grpo")(token_level, mask)


# with real verl ----------------------------------------------------------------------------------
@pytest.mark.verl
def test_verls_own_loaders_and_registry_reach_ragrl(responses, tmp_path):  # noqa: ANN001
    pytest.importorskip("verl")
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.reward import get_custom_reward_fn

    examples, texts, expected = responses
    # the reward function, as docs/scale.md configures it, through verl's own Hydra config and loader
    from pathlib import Path

    import verl
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(
            config_name="ppo_trainer",
            overrides=[
                "reward.custom_reward_function.path=pkg://ragrl.integrations.verl",
                "reward.custom_reward_function.name=compute_score",
                "+reward.custom_reward_function.reward_kwargs="
                "{method: search_r1, overrides: ['reward.1.weight=0.5']}",
            ],
        )
    fn = get_custom_reward_fn(config)
    rows = rv.verl_rows(examples)
    got = [
        fn(r["data_source"], t, r["reward_model"]["ground_truth"], r["extra_info"])["score"]
        for r, t in zip(rows, texts, strict=True)
    ]
    assert got == [r["total"] for r in expected]
    # the estimators, from verl's registry by name
    assert "ragrl_grpo" in rv.register_estimators()
    rv.register_estimators()  # again: no error
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.5], [0.0, 1.0]])
    mask = torch.ones(4, 2)
    adv, _ = get_adv_estimator_fn("ragrl_grpo")(
        token_level_rewards=rewards,
        response_mask=mask,
        index=np.array(["q", "q", "q", "q"], dtype=object),
        config=None,
    )
    assert torch.allclose(
        adv[:, 0], compute_advantages("grpo", rewards.sum(-1), torch.zeros(4, dtype=torch.long))
    )
    # the parquet, read by verl's RLHFDataset with a real tokenizer and its chat template
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from ragrl.llm.hf_backend import load_tokenizer
    from ragrl.train.reader import SHIPPED_BASE

    path = tmp_path / "train.parquet"
    assert rv.write_parquet(examples, path) == len(examples)
    data_config = OmegaConf.create({"max_prompt_length": 1024, "filter_overlong_prompts": False,
                                    "cache_dir": str(tmp_path / "cache")})  # fmt: skip
    dataset = RLHFDataset([str(path)], load_tokenizer(SHIPPED_BASE), data_config)
    assert len(dataset) == len(examples)
    first = dataset[0]
    assert first["raw_prompt"] == rows[0]["prompt"] and first["extra_info"]["id"] == examples[0].id
    assert fn(first["data_source"], texts[0], first["reward_model"]["ground_truth"], first["extra_info"]) == {
        "score": expected[0]["total"],
        "em": expected[0]["em"],
        "search_r1_format": expected[0]["search_r1_format"],
    }
