import json
import random

import pytest
import torch

from ragrl.data.io import read_examples
from ragrl.errors import RagrlError
from ragrl.methods import load_method
from ragrl.retrieval import load_retriever
from ragrl.rollout.sample import Sample
from ragrl.synth.demonstrators import OracleDemonstrator
from ragrl.train.augment import NameSwap, name_words
from ragrl.train.setup import load_policy
from ragrl.train.sft import SFTTrainer, demonstration_trajectories


@pytest.fixture(scope="module")
def setup(world_dir):
    method = load_method(
        "search_r1-tiny",
        [
            f"train.model.path={world_dir / 'model'}",
            f"train.data.train={world_dir / 'train.jsonl'}",
            "train.sft.batch_size=4",
            "train.optim.warmup_steps=0",
        ],
    )
    model, tokenizer = load_policy(method.train.model, torch.device("cpu"))
    examples, _ = read_examples(world_dir / "train.jsonl")
    demos = demonstration_trajectories(
        method, tokenizer, OracleDemonstrator(), examples[:12], load_retriever(world_dir / "bm25")
    )
    return method, tokenizer, demos, NameSwap.from_world(world_dir / "world.json", tokenizer)


def _tokens(t):
    return [*t.prompt_ids, *(x for s in t.segments for x in s.token_ids)]


def test_name_words_are_the_words_of_exactly_one_entity(world_dir):
    words = name_words(world_dir / "world.json")
    entities = json.loads((world_dir / "world.json").read_text())["entities"]
    company = next(e for e in entities if e["kind"] == "company" and len(e["name"].split()) == 2)
    stem, suffix = company["name"].split()
    assert stem in words  # "Fulbru" of "Fulbru Labs" (also its alias "Fulbru")
    assert suffix not in words  # "Labs" is shared by many companies
    country = next(e for e in entities if e["kind"] == "country")
    assert country["name"] in words and "of" not in words


def test_swap_renames_names_consistently_and_keeps_everything_else(setup):
    _, tokenizer, demos, swap = setup
    names = set(swap.spaced) | set(swap.bare)
    for i, demo in enumerate(demos):
        new = swap(demo, random.Random(i))
        before, after = _tokens(demo), _tokens(new)
        assert len(before) == len(after)
        assert [len(s.token_ids) for s in new.segments] == [len(s.token_ids) for s in demo.segments]
        assert new.loss_mask == demo.loss_mask
        mapping = {}
        for a, b in zip(before, after, strict=True):
            if a in names:
                assert mapping.setdefault(a, b) == b  # the same name everywhere
                assert tokenizer.convert_ids_to_tokens(b).startswith(" ") == (
                    tokenizer.convert_ids_to_tokens(a).startswith(" ")
                )
            else:
                assert a == b
        assert len(set(mapping.values())) == len(mapping)  # one-to-one
        assert sum(a != b for a, b in mapping.items()) >= len(mapping) - 1
        # every name the oracle writes is copied from the question or a passage, before and after
        for traj in (demo, new):
            context = set(traj.prompt_ids) | {
                x for s in traj.segments if s.kind == "env" for x in s.token_ids
            }
            written = {x for s in traj.segments if s.kind == "policy" for x in s.token_ids if x in names}
            assert written and written <= context


def test_a_training_sample_is_renamed_as_its_trajectory_is(setup):
    _, _, demos, swap = setup
    for i, demo in enumerate(demos[:4]):
        sample = Sample.from_trajectory(demo, episode=i)
        sample.advantage = 0.75
        renamed = swap.sample(sample, random.Random(i))
        expected = Sample.from_trajectory(swap(demo, random.Random(i)))
        assert renamed.prompt_ids == expected.prompt_ids != sample.prompt_ids  # the question's names
        assert renamed.completion_ids == expected.completion_ids != sample.completion_ids
        kept = ("loss_mask", "completion_logprobs", "group", "episode", "step", "advantage", "example_id")
        assert all(getattr(renamed, k) == getattr(sample, k) for k in kept)


def test_swap_is_determined_by_its_rng(setup):
    _, _, demos, swap = setup
    demo = demos[0]
    assert _tokens(swap(demo, random.Random(7))) == _tokens(swap(demo, random.Random(7)))
    assert _tokens(swap(demo, random.Random(7))) != _tokens(swap(demo, random.Random(8)))


def test_swap_needs_a_word_level_tokenizer_and_a_world(world_dir, tmp_path):
    class Pieces:  # a subword vocabulary: no name is one token
        def get_vocab(self):
            return {"Kri": 0, "ones": 1, "land": 2, " the": 3}

    with pytest.raises(RagrlError, match="word-level tokenizer"):
        NameSwap.from_world(world_dir / "world.json", Pieces())
    bad = tmp_path / "world.json"
    bad.write_text('{"seed": 0}')
    with pytest.raises(RagrlError, match=r"world\.json: not a synthetic world"):
        name_words(bad)


def test_sft_with_name_swap_is_reproducible_step_by_step(setup, world_dir, tmp_path):
    method, tokenizer, demos, _ = setup
    losses = []
    for run in ("a", "b"):
        cfg = load_method(
            "search_r1-tiny",
            [
                f"train.model.path={world_dir / 'model'}",
                f"train.data.train={world_dir / 'train.jsonl'}",
                f"train.out={tmp_path / run}",
                "train.sft.batch_size=4",
                "train.sft.name_swap=1.0",
                "train.optim.warmup_steps=0",
            ],
        )
        model, _ = load_policy(cfg.train.model, torch.device("cpu"))
        trainer = SFTTrainer(cfg, cfg.train, demos, eval_examples=[], model=model, tokenizer=tokenizer)
        assert trainer.name_swap is not None and trainer.name_swap.size > 100
        losses.append([trainer.step()["loss"] for _ in range(3)])
    assert losses[0] == losses[1]
    # the swap changes what is learned: the first loss differs from the unswapped batch's
    model, _ = load_policy(method.train.model, torch.device("cpu"))
    plain = SFTTrainer(method, method.train, demos, eval_examples=[], model=model, tokenizer=tokenizer)
    assert plain.name_swap is None and plain.step()["loss"] != losses[0][0]


def test_name_swap_config_errors(setup, world_dir, tmp_path):
    with pytest.raises(RagrlError, match="train.sft.name_swap"):
        load_method("search_r1-tiny", ["train.sft.name_swap=1.5"]).train.validate()
    method = load_method(
        "search_r1-tiny",
        [
            f"train.model.path={world_dir / 'model'}",
            "train.sft.name_swap=0.5",
            f"train.sft.world={tmp_path / 'no.json'}",
        ],
    )
    model, tokenizer = load_policy(method.train.model, torch.device("cpu"))
    with pytest.raises(RagrlError, match="no.json not found"):
        SFTTrainer(method, method.train, setup[2], eval_examples=[], model=model, tokenizer=tokenizer)


def test_a_renamed_world_reads_the_same_through_the_retriever(world_dir):
    from ragrl.train.augment import RenamedRetriever, WorldRenaming

    world = WorldRenaming(name_words(world_dir / "world.json"))
    renaming = world.draw(random.Random(3))
    assert sorted(renaming.mapping) == sorted(renaming.mapping.values()) == world.words  # a permutation
    assert renaming.mapping == world.draw(random.Random(3)).mapping != world.draw(random.Random(4)).mapping
    example = next(e for e in read_examples(world_dir / "train.jsonl")[0] if e.answerable and e.passages)
    renamed = renaming.example(example)
    assert renamed.question != example.question and renaming.backward(renamed.question) == example.question
    assert [renaming.backward(a) for a in renamed.answers] == example.answers
    assert example.decomposition  # the world's questions carry their sub-questions: renamed alike
    for sub, real in zip(renamed.decomposition, example.decomposition, strict=True):
        assert sub.answers == tuple(renaming.forward(a) for a in real.answers)
        assert sub.question == renaming.forward(real.question)
    assert (renamed.id, renamed.supporting_ids, renamed.metadata) == (
        example.id,
        example.supporting_ids,
        example.metadata,
    )
    # a whole name word only: a word that merely starts with one stays
    word = world.words[0]
    assert (
        renaming.forward(f"{word} {word}x {word}.")
        == f"{renaming.mapping[word]} {word}x {renaming.mapping[word]}."
    )

    # the retriever: a renamed query finds the real query's passages, renamed; None is the real one
    base = load_retriever(world_dir / "bm25")
    retriever = RenamedRetriever(base)
    gold = next(p for p in example.passages if p.id in example.supporting_ids)
    real = base.search([gold.title], 2)[0]
    assert retriever.search([gold.title], 2)[0] == real
    retriever.renaming = renaming
    seen = retriever.search([renaming.forward(gold.title)], 2)[0]
    assert [h.id for h in seen] == [h.id for h in real] and [h.score for h in seen] == [h.score for h in real]
    assert [h.passage.text for h in seen] == [renaming.forward(h.passage.text) for h in real]
    assert seen[0].passage.title == renaming.forward(gold.title) != gold.title
