"""The pretrained reader base (``ragrl.train.reader``): fair by construction, checked when loaded, and
built end to end at toy scale."""

from __future__ import annotations

import json

import pytest

from ragrl.errors import RagrlError
from ragrl.llm.checksums import SUMS, verify_checksums
from ragrl.metrics import normalize
from ragrl.synth.fairness import cross_world_overlap, held_out_named_facts, stated_named_facts
from ragrl.synth.generate import generate_world
from ragrl.train.reader import ReaderRecipe, choose_worlds, pretrain_reader


@pytest.fixture(scope="module")
def world0():
    return generate_world(0, "small")


def test_a_world_states_the_facts_its_held_out_questions_need(world0):
    needed = held_out_named_facts(world0)
    stated = stated_named_facts(world0)
    # every needed fact whose passage is in the corpus is stated (the rest belong to unanswerable
    # questions, whose supporting passages were removed)
    removed = set(world0.removed_ids)
    by_passage = {e.passage_id: e for e in world0.store}
    in_corpus = {
        (name, answer)
        for split, examples in world0.splits.items() if split != "train"
        for ex in examples for step in ex.decomposition for pid in step.supporting_ids if pid not in removed
        for name in [normalize(by_passage[pid].name)] for answer in [normalize(step.answers[0])]
    }  # fmt: skip
    assert in_corpus and in_corpus <= stated
    assert len(needed & stated) > 0.8 * len(needed)
    report = cross_world_overlap([world0], [world0])
    assert report["shared_facts"] == len(needed & stated) > 0


def test_other_seeds_share_names_but_no_needed_fact(world0):
    report = cross_world_overlap([generate_world(1000, "small"), generate_world(1001, "small")], [world0])
    assert report["shared_facts"] == 0
    assert report["shared_name_words"] > 0  # names recur across worlds, with other facts
    assert report["reader_seeds"] == [1000, 1001] and report["protected_seeds"] == [0]


def test_a_candidate_world_stating_a_protected_fact_is_skipped(monkeypatch, world0):
    from ragrl.synth import generate

    original = generate.generate_world

    def fake(seed, size="small", **kw):  # candidate 1001 is world 0 again: every fact shared
        return original(0 if seed == 1001 else seed, size, **kw)

    monkeypatch.setattr(generate, "generate_world", fake)
    chosen = choose_worlds(ReaderRecipe(worlds=2, first_seed=1000, protected=(0,)))
    assert [w.seed for w in chosen.worlds] == [1000, 1002]
    assert chosen.validation.seed == 1003
    assert chosen.skipped and list(chosen.skipped) == [1001] and chosen.skipped[1001] > 100
    assert chosen.report["shared_facts"] == 0 and chosen.report["skipped_seeds"] == {
        "1001": chosen.skipped[1001]
    }


def test_the_recipe_keeps_pretraining_seeds_above_the_protected_ones():
    with pytest.raises(RagrlError, match="first_seed 5 must lie above the protected seeds"):
        ReaderRecipe(first_seed=5)
    with pytest.raises(RagrlError, match="steps must be >= 1"):
        ReaderRecipe(steps=0)


def test_a_toy_base_is_built_validated_and_checked_on_load(tmp_path):
    recipe = ReaderRecipe(
        worlds=2, protected=(0,), steps=3, batch_size=4, hidden=32, layers=1, heads=2, intermediate=64,
        vocab_size=1024, copy_steps=0, validation_questions=4,
    )  # fmt: skip
    out = tmp_path / "base"
    manifest = pretrain_reader(out, recipe, command="ragrl model reader --worlds 2 --steps 3")
    assert manifest["seeds"] == [1000, 1001] and manifest["validation_seed"] == 1002
    assert manifest["fairness"]["shared_facts"] == 0
    assert manifest["validation"]["n"] == 4 and set(manifest["validation_curve_em_answerable"]) == {
        "0",
        "1",
        "2",
        "3",
    }
    assert manifest["command"] == "ragrl model reader --worlds 2 --steps 3"
    assert json.loads((out / "ragrl_reader.json").read_text())["recipe"]["steps"] == 3
    assert not (tmp_path / ".base.work").exists()  # the scratch folder is gone
    files = {line.split("  ")[1] for line in (out / SUMS).read_text().splitlines()}
    assert {"model.safetensors", "tokenizer.json", "config.json", "ragrl_reader.json"} <= files
    assert verify_checksums(out) == len(files)
    # it loads as an ordinary checkpoint, and its tokenizer spells a name it never saw
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    ids = tok(" Qwarzimbelox Thrumquist", add_special_tokens=False).input_ids
    assert tok.unk_token_id not in ids and tok.decode(ids) == " Qwarzimbelox Thrumquist"
    with pytest.raises(RagrlError, match="already exists"):
        pretrain_reader(out, recipe)
