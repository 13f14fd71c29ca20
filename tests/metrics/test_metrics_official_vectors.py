"""Our squad-variant metrics reproduce the official HotpotQA scorer exactly (==, not approx).

The vectors in ``data/hotpot_official_vectors.json`` were produced by ``make_official_vectors.py`` from
the official ``hotpot_evaluate_v1.py``. When ``RAGRL_HOTPOT_EVAL`` points at a local copy of that
script, a hypothesis differential test also compares both on arbitrary text.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragrl.metrics import exact_match, f1, joint_scores, normalize, supporting_fact_scores

VECTORS = json.loads((Path(__file__).parent / "data" / "hotpot_official_vectors.json").read_text("utf-8"))


def test_vector_file_is_substantial():
    assert len(VECTORS["answer"]) > 3000
    assert len(VECTORS["normalize"]) > 3000
    assert len(VECTORS["sp"]) > 500 and len(VECTORS["joint"]) > 200


@pytest.mark.parametrize("alias", ["squad", "hotpotqa", "flashrag"])
def test_normalize_matches_official(alias):
    bad = [(s, want, normalize(s, alias)) for s, want in VECTORS["normalize"] if normalize(s, alias) != want]
    assert not bad, bad[:5]


def test_answer_em_f1_match_official():
    bad = []
    for pred, gold, em, f, p, r in VECTORS["answer"]:
        got_em = exact_match(pred, gold)
        got = f1(pred, gold)
        if got_em != em or got != (f, p, r):
            bad.append((pred, gold, (em, f, p, r), (got_em, got)))
    assert not bad, bad[:5]


def test_answer_with_gold_list_of_one_matches_official():
    for pred, gold, em, f, p, r in VECTORS["answer"][:500]:
        assert exact_match(pred, [gold]) == em
        assert f1(pred, [gold]) == (f, p, r)


def test_sp_matches_official():
    for pred_sp, gold_sp, em, f, p, r in VECTORS["sp"]:
        assert tuple(supporting_fact_scores(pred_sp, gold_sp)) == (em, f, p, r), (pred_sp, gold_sp)


def test_joint_matches_official_eval():
    for case in VECTORS["joint"]:
        want = case["metrics"]
        em = exact_match(case["pred"], case["gold"])
        f, p, r = f1(case["pred"], case["gold"])
        sp = supporting_fact_scores(case["pred_sp"], case["gold_sp"])
        joint = joint_scores(em, p, r, sp)
        got = {
            "em": em,
            "f1": f,
            "prec": p,
            "recall": r,
            "sp_em": sp.em,
            "sp_f1": sp.f1,
            "sp_prec": sp.precision,
            "sp_recall": sp.recall,
            "joint_em": joint.em,
            "joint_f1": joint.f1,
            "joint_prec": joint.precision,
            "joint_recall": joint.recall,
        }
        assert got == want, case


# --- differential test against the official script itself (only when it is available) ---------

OFFICIAL_PATH = os.environ.get("RAGRL_HOTPOT_EVAL")


def _load_official():
    sys.modules.setdefault("ujson", json)
    spec = importlib.util.spec_from_file_location("_hotpot_official", OFFICIAL_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


needs_official = pytest.mark.skipif(
    not OFFICIAL_PATH or not Path(OFFICIAL_PATH).is_file(),
    reason="set RAGRL_HOTPOT_EVAL to a local hotpot_evaluate_v1.py to run the differential test",
)

_WORDS = st.sampled_from(
    ["a", "an", "the", "The", "yes", "no", "noanswer", "cat", "U.S.", "Röntgen", "1,000"]
)
_TEXT = st.one_of(
    st.text(max_size=30),
    st.lists(st.one_of(_WORDS, st.text(max_size=4)), max_size=6).map(" ".join),
)


@needs_official
@settings(max_examples=3000, deadline=None)
@given(pred=_TEXT, gold=_TEXT)
def test_differential_against_official(pred, gold):
    official = _load_official.__dict__.setdefault("module", _load_official())
    assert normalize(pred) == official.normalize_answer(pred)
    assert exact_match(pred, gold) == official.exact_match_score(pred, gold)
    assert f1(pred, gold) == official.f1_score(pred, gold)


@needs_official
@settings(max_examples=500, deadline=None)
@given(
    pred=st.lists(st.tuples(st.sampled_from(["A", "B", "C"]), st.integers(0, 3)), max_size=6),
    gold=st.lists(st.tuples(st.sampled_from(["A", "B", "C"]), st.integers(0, 3)), max_size=6),
)
def test_sp_differential_against_official(pred, gold):
    official = _load_official.__dict__.setdefault("module", _load_official())
    metrics = {"sp_em": 0, "sp_f1": 0, "sp_prec": 0, "sp_recall": 0}
    em, p, r = official.update_sp(metrics, pred, gold)
    assert tuple(supporting_fact_scores(pred, gold)) == (em, metrics["sp_f1"], p, r)
