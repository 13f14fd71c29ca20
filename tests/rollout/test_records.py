"""Trajectories written to jsonl and read back; a bad line is named with its file and line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from ragrl.errors import DataError
from ragrl.rollout.records import read_trajectories, write_trajectories
from ragrl.rollout.trajectory import Trajectory

_spec = importlib.util.spec_from_file_location("rollout_world", Path(__file__).parent / "scripted_world.py")
world = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(world)
bm25 = world.bm25  # the module's BM25 index fixture
example, script, engine, TWO_SEARCHES = world.example, world.script, world.engine, world.TWO_SEARCHES


def test_jsonl_round_trip(tmp_path, bm25):
    eng, _ = engine(script(TWO_SEARCHES), bm25, max_obs_tokens=9)
    trajs = eng.run([example(0), example(1)], n=2)  # cut observations: the policy never answers
    path = tmp_path / "t.jsonl"
    assert write_trajectories(path, trajs) == 4
    back = read_trajectories(path)
    assert [t.to_dict() for t in back] == [t.to_dict() for t in trajs]
    assert back[0].loss_mask == trajs[0].loss_mask and back[0].segments[1].truncated


def test_jsonl_bad_lines(tmp_path):
    good = Trajectory("q", [1, 2]).to_dict()
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(good) + "\n" + "{not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2"):
        read_trajectories(p)
    p.write_text(json.dumps(good) + "\n\n" + json.dumps({"example_id": "x", "bogus": 1}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:3: not a trajectory"):
        read_trajectories(p)
    p.write_text("[1, 2]\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: expected a JSON object"):
        read_trajectories(p)
    bad_seg = dict(good, segments=[{"kind": "weird", "token_ids": [], "text": ""}])
    p.write_text(json.dumps(bad_seg) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1"):
        read_trajectories(p)
