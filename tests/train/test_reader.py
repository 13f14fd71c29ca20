"""The pretrained reader base (``ragrl.train.reader``): fair by construction, checked when loaded, and
built end to end at toy scale."""

from __future__ import annotations

import json

import pytest

from ragrl.errors import RagrlError
from ragrl.llm.checksums import SUMS, file_sha256, verify_checksums
from ragrl.metrics import normalize
from ragrl.synth.fairness import cross_world_overlap, held_out_named_facts, mentions, shared_facts
from ragrl.synth.generate import generate_world
from ragrl.train.reader import ReaderRecipe, pretrain_reader, resolve_base
from ragrl.train.reader_worlds import choose_worlds


@pytest.fixture(scope="module")
def world0():
    return generate_world(0, "small")


def test_a_world_states_every_fact_its_held_out_questions_need(world0):
    needed = held_out_named_facts(world0)
    by_passage = {e.passage_id: e for e in world0.store}
    ex = next(e for e in world0.splits["test"] if len(e.decomposition) == 2)
    step = ex.decomposition[0]
    name, answer = by_passage[step.supporting_ids[0]].name, step.answers[0]
    assert (normalize(name), normalize(answer)) in needed
    # every needed fact, removed passages included, is something the world's passages could state
    assert shared_facts(world0, needed) == {(a, b) for a, b in needed if a != b}
    report = cross_world_overlap([world0], [world0])
    assert report["shared_facts"] > 0 and report["shared_questions"] > 0


def test_two_names_in_one_passage_are_a_stated_pair_either_way(world0):
    """A company's passage names its founder and its founding year: (founder, year) counts as stated,
    though it is no fact of the founder's own passage."""
    company = next(e for e in world0.store if e.kind == "company")
    founder = next(e for e in world0.store if e.id == company.rels["founded_by"])
    year = str(company.facts["founded_year"])
    said = mentions(world0)
    assert company.id in said[normalize(founder.name)] & said[normalize(year)]
    assert shared_facts(world0, {(normalize(founder.name), normalize(year))}) == {
        (normalize(founder.name), normalize(year))
    }


def test_other_seeds_share_names_but_no_needed_fact(world0):
    report = cross_world_overlap([generate_world(1000, "small"), generate_world(1001, "small")], [world0])
    assert report["shared_facts"] == 0 and report["shared_questions"] == 0
    assert report["shared_name_words"] > 0  # names recur across worlds, with other facts
    assert report["reader_seeds"] == [1000, 1001] and report["protected_worlds"] == ["0/small/facts"]


def test_a_candidate_world_stating_one_protected_fact_is_skipped(monkeypatch, world0):
    """Candidate 1001 gets one person renamed to a protected held-out entity, born in the protected
    fact's year: that one fact is enough to skip the world."""
    from ragrl.synth import generate

    by_passage = {e.passage_id: e for e in world0.store}
    person, year = next(
        (by_passage[s.supporting_ids[0]], s.answers[0])
        for e in world0.splits["test"]
        for s in e.decomposition
        if s.question.startswith("When was") and s.question.endswith("born?") and s.supporting_ids
        and by_passage[s.supporting_ids[0]].kind == "person"
    )  # fmt: skip
    original = generate.generate_world

    def fake(seed, size="small", **kw):
        world = original(seed, size, **kw)
        if seed == 1001:
            planted = next(e for e in world.store if e.kind == "person")
            planted.name, planted.aliases = person.name, [person.name]
            planted.facts["birth_year"] = int(year)
        return world

    monkeypatch.setattr(generate, "generate_world", fake)
    recipe = ReaderRecipe(worlds=2, first_seed=1000, protected=(0,))
    chosen = choose_worlds(recipe.worlds, recipe.first_seed, recipe.size, recipe.protected)
    assert [w.seed for w in chosen.worlds] == [1000, 1002] and chosen.validation.seed == 1003
    assert list(chosen.skipped) == [1001] and chosen.report["skipped_seeds"] == {"1001": chosen.skipped[1001]}
    assert chosen.report["shared_facts"] == 0
    assert {p.split("/")[2] for p in chosen.report["protected_worlds"]} == {"facts", "entities"}


def test_the_recipe_keeps_pretraining_seeds_above_the_protected_ones():
    with pytest.raises(RagrlError, match="first_seed 5 must lie above the protected seeds"):
        ReaderRecipe(first_seed=5)
    with pytest.raises(RagrlError, match="protected must name"):
        ReaderRecipe(protected=())
    with pytest.raises(RagrlError, match="steps must be >= 1"):
        ReaderRecipe(steps=0)
    assert resolve_base("scratch") is None and resolve_base(None) is None
    with pytest.raises(RagrlError, match="is not a folder"):
        resolve_base("/nonexistent/base")


def test_a_toy_base_is_built_validated_and_checked_on_load(toy_base):
    out, manifest = toy_base
    assert manifest["seeds"] == [1000, 1001] and manifest["validation_seed"] == 1002
    assert manifest["fairness"]["shared_facts"] == 0 and manifest["fairness"]["validation_shared_facts"] == 0
    assert manifest["validation"]["n"] == 4
    assert set(manifest["validation_curve_em_answerable"]) == {"0", "1", "2", "3"}  # every quarter
    assert manifest["command"] == "ragrl model reader --worlds 2 --steps 3"
    assert manifest["weights_sha256"] == file_sha256(out / "model.safetensors")
    assert {"torch", "transformers", "tokenizers"} <= set(manifest["environment"]["versions"])
    assert manifest["environment"]["torch_threads"] >= 1 and manifest["environment"]["cpu_capability"]
    assert json.loads((out / "ragrl_reader.json").read_text())["recipe"]["steps"] == 3
    assert not (out.parent / ".base.work").exists()  # the scratch folder is gone
    files = {line.split("  ")[1] for line in (out / SUMS).read_text().splitlines()}
    assert {"model.safetensors", "tokenizer.json", "config.json", "ragrl_reader.json"} <= files
    assert verify_checksums(out) == len(files)
    # it loads as an ordinary checkpoint, and its tokenizer spells a name it never saw
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    ids = tok(" Qwarzimbelox Thrumquist", add_special_tokens=False).input_ids
    assert tok.unk_token_id not in ids and tok.decode(ids) == " Qwarzimbelox Thrumquist"
    with pytest.raises(RagrlError, match="already exists"):
        pretrain_reader(out, ReaderRecipe(worlds=1, protected=(0,)))


def test_a_base_continues_in_another_grammar_and_is_validated_in_it(toy_base, tmp_path):
    """``--init BASE --also arena-tiny``: the same worlds, the base's own tokenizer (no copy steps), the
    ARENA demonstrations added to the search ones, and a validation score in each grammar."""
    from ragrl.llm.checksums import file_sha256

    start, start_manifest = toy_base
    recipe = ReaderRecipe(
        worlds=2, protected=(0,), steps=2, batch_size=4, validation_questions=4, init=str(start),
        also=("arena-tiny",),
    )  # fmt: skip
    manifest = pretrain_reader(tmp_path / "given", recipe)
    assert manifest["seeds"] == [1000, 1001] and manifest["validation_seed"] == 1002
    assert manifest["copy_pretraining"] is None and manifest["recipe"]["init"] == str(start)
    assert (manifest["recipe"]["hidden"], manifest["recipe"]["copy_steps"]) == (32, 0)  # the start's shape
    assert manifest["tokenizer_sha256"] == file_sha256(start / "tokenizer.json")
    assert manifest["init_weights_sha256"] == file_sha256(start / "model.safetensors")
    assert manifest["weights_sha256"] != manifest["init_weights_sha256"]
    assert set(manifest["validation_also"]) == {"arena-tiny"}
    assert manifest["validation_also"]["arena-tiny"]["n"] == 4
    # one demonstration per distinct prompt and grammar: more than the search grammar alone on the same
    # worlds (the start's own run read them in that grammar only)
    assert start_manifest["seeds"] == manifest["seeds"] and not start_manifest["recipe"]["also"]
    assert manifest["demonstrations"] > start_manifest["demonstrations"]
    # a continuation must read the worlds its start read, and validate on one neither saw
    with pytest.raises(RagrlError, match="a continuation must read them too"):
        pretrain_reader(tmp_path / "fewer", ReaderRecipe(**{**recipe.__dict__, "worlds": 1}))


def test_a_continuation_is_refused_where_it_would_not_be_fair_or_would_overwrite_its_start(
    toy_base, tmp_path
):
    from ragrl.train.reader import check_continuation

    start, _ = toy_base
    recipe = ReaderRecipe(worlds=2, protected=(0,), init=str(start))
    check_continuation(recipe, [1000, 1001], 1002, tmp_path / "new")  # the same worlds, an unseen one
    check_continuation(recipe, [1000, 1001, 1002], 1003, tmp_path / "new")  # more worlds
    with pytest.raises(RagrlError, match="validate on a world neither saw"):
        check_continuation(recipe, [1000, 1001, 1002], 1001, tmp_path / "new")
    with pytest.raises(RagrlError, match="of size 'small', this recipe 'medium'"):
        check_continuation(
            ReaderRecipe(**{**recipe.__dict__, "size": "medium"}), [1000, 1001], 1002, tmp_path
        )
    with pytest.raises(RagrlError, match="is the base it continues from"):
        check_continuation(recipe, [1000, 1001], 1002, start)
    with pytest.raises(RagrlError, match="not a reader base"):
        check_continuation(
            ReaderRecipe(**{**recipe.__dict__, "init": str(tmp_path)}), [1000], 1002, tmp_path / "x"
        )
    with pytest.raises(RagrlError, match="not 'scratch'"):
        check_continuation(
            ReaderRecipe(**{**recipe.__dict__, "init": "scratch"}), [1000], 1002, tmp_path / "x"
        )
    with pytest.raises(RagrlError, match="names a config twice"):
        ReaderRecipe(also=("arena-tiny", "arena-tiny"))


def test_a_method_starts_from_the_base_with_its_limits_scaled_and_the_base_prompt():
    from ragrl.train.from_base import BASE_PASSAGES_SETTINGS, base_overrides, base_prompt, base_recipe

    search = base_overrides("search_r1-tiny")
    assert base_prompt() in search and set(base_recipe()) <= set(search)
    assert "rollout.max_new_tokens=96" in search  # 48 word-level tokens, twice for the BPE
    arena = base_overrides("arena-tiny")  # ARENA's built-in prompt shows {question} and {references}
    assert set(BASE_PASSAGES_SETTINGS) <= set(arena) and base_prompt() not in arena
    assert arena.index("rollout.max_new_tokens=160") > arena.index("rollout.max_new_tokens=128")  # it wins
    r2ag = base_overrides("r2ag-tiny")  # a prompt with other fields is kept
    assert not set(BASE_PASSAGES_SETTINGS) & set(r2ag) and base_prompt() not in r2ag


def test_the_shipped_base_is_whole_fair_and_loads():
    """The base the demo starts from is in the package, every file matches its SHA256SUMS, its manifest
    says how it was made and that it shares no fact with the protected worlds, and it loads."""
    from ragrl.llm.hf_backend import TransformersBackend
    from ragrl.train.reader import MANIFEST, SHIPPED_BASE

    assert verify_checksums(SHIPPED_BASE) >= 7
    manifest = json.loads((SHIPPED_BASE / MANIFEST).read_text())
    assert manifest["weights_sha256"] == file_sha256(SHIPPED_BASE / "model.safetensors")
    assert manifest["fairness"]["shared_facts"] == 0 and manifest["fairness"]["shared_questions"] == 0
    assert set(manifest["recipe"]["protected"]) >= {0, 1, 2} and min(manifest["seeds"]) >= 1000
    assert "ragrl model reader" in manifest["command"] and manifest["validation"]["n"] == 100
    assert (SHIPPED_BASE / "model.safetensors").stat().st_size < 30 * 2**20
    backend = TransformersBackend(str(SHIPPED_BASE))
    assert backend.tokenizer.unk_token_id not in backend.tokenizer(" Qwarzimbelox").input_ids
