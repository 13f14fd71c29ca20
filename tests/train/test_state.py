"""PromptSampler (seeded epochs, resumable position) and checkpoint discovery."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragrl.errors import RagrlError
from ragrl.train.state import (
    PromptSampler,
    checkpoint_dir,
    list_checkpoints,
    read_trainer_state,
    resolve_checkpoint,
)

# -- PromptSampler ----------------------------------------------------------------------------------------


def test_take_covers_every_index_once_per_epoch() -> None:
    n = 7
    s = PromptSampler(n, seed=3)
    drawn = [i for _ in range(7) for i in s.take(5)]  # 35 indices = 5 epochs, chunks cross epoch ends
    assert len(drawn) == 35
    epochs = [drawn[e * n : (e + 1) * n] for e in range(5)]
    for order in epochs:
        assert sorted(order) == list(range(n))
    assert len({tuple(o) for o in epochs}) > 1  # a fresh permutation each epoch
    assert s.state_dict() == {"n": 7, "seed": 3, "epoch": 5, "position": 0}


def test_take_crossing_an_epoch_and_chunking() -> None:
    a, b = PromptSampler(10, seed=1), PromptSampler(10, seed=1)
    first = a.take(13)  # all of epoch 0, then 3 of epoch 1
    assert sorted(first[:10]) == list(range(10))
    assert len(set(first[10:])) == 3
    assert a.state_dict() == {"n": 10, "seed": 1, "epoch": 1, "position": 3}
    # how the indices are requested does not change the sequence
    assert b.take(4) + b.take(6) + b.take(3) == first
    assert a.take(0) == []
    assert a.state_dict()["position"] == 3
    # more than two epochs in one call
    c = PromptSampler(3, seed=1)
    big = c.take(8)
    assert sorted(big[:3]) == sorted(big[3:6]) == [0, 1, 2]
    assert c.state_dict() == {"n": 3, "seed": 1, "epoch": 2, "position": 2}


def test_sampler_is_deterministic_per_seed() -> None:
    a, b, other = PromptSampler(20, seed=0), PromptSampler(20, seed=0), PromptSampler(20, seed=1)
    seq_a, seq_b, seq_other = a.take(60), b.take(60), other.take(60)
    assert seq_a == seq_b
    assert seq_a != seq_other
    assert sorted(seq_other[:20]) == list(range(20))
    assert seq_a[:20] != list(range(20))  # shuffled, not the identity


def test_state_dict_round_trip_continues_identically() -> None:
    uninterrupted = PromptSampler(11, seed=42)
    interrupted = PromptSampler(11, seed=42)
    assert interrupted.take(15) == uninterrupted.take(15)
    state = json.loads(json.dumps(interrupted.state_dict()))  # survives serialisation
    assert state == {"n": 11, "seed": 42, "epoch": 1, "position": 4}
    resumed = PromptSampler(11, seed=42)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    assert resumed.take(30) == uninterrupted.take(30)


@pytest.mark.parametrize("n, seed", [(12, 42), (11, 7)])
def test_load_state_dict_rejects_other_data_or_seed(n: int, seed: int) -> None:
    saved = PromptSampler(11, seed=42)
    saved.take(5)
    s = PromptSampler(n, seed=seed)
    with pytest.raises(RagrlError, match="same data, seed and train.data.train_answerable_only"):
        s.load_state_dict(saved.state_dict())
    assert s.state_dict()["epoch"] == 0 and s.state_dict()["position"] == 0  # untouched


def test_sampler_rejects_empty_training_set() -> None:
    with pytest.raises(RagrlError, match="empty"):
        PromptSampler(0, seed=0)


# -- checkpoints ------------------------------------------------------------------------------------------


def _ckpt(run: Path, name: str, state: dict | None = None) -> Path:
    p = run / "checkpoints" / name
    p.mkdir(parents=True)
    if state is not None:
        (p / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
    return p


def test_checkpoint_dir_name(tmp_path: Path) -> None:
    assert checkpoint_dir(tmp_path, 40) == tmp_path / "checkpoints" / "step-000040"
    assert checkpoint_dir(str(tmp_path), 1234567).name == "step-1234567"


def test_resolve_latest_picks_highest_complete_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    two = _ckpt(run, "step-000002", {"step": 2})
    ten = _ckpt(run, "step-000010", {"step": 10})
    _ckpt(run, "step-000011")  # incomplete: no trainer_state.json
    _ckpt(run, "step-000012.tmp")  # a save in progress
    (run / "checkpoints" / "step-000011" / "state").mkdir()
    assert list_checkpoints(run) == [two, ten]
    assert resolve_checkpoint("latest", run) == ten
    assert read_trainer_state(resolve_checkpoint("latest", run)) == {"step": 10}
    # a checkpoint folder is taken as is; a run folder gives its newest checkpoint
    assert resolve_checkpoint(two, tmp_path / "elsewhere") == two
    assert resolve_checkpoint(str(run), tmp_path / "elsewhere") == ten


def test_list_checkpoints_sorts_numerically(tmp_path: Path) -> None:
    big = _ckpt(tmp_path, checkpoint_dir(tmp_path, 1_000_000).name, {"step": 1_000_000})
    small = _ckpt(tmp_path, checkpoint_dir(tmp_path, 200).name, {"step": 200})
    assert list_checkpoints(tmp_path) == [small, big]
    assert resolve_checkpoint("latest", tmp_path) == big


def test_resolve_errors_name_the_folder(tmp_path: Path) -> None:
    run = tmp_path / "my-run"
    assert list_checkpoints(run) == []
    with pytest.raises(RagrlError, match="no checkpoint") as e:
        resolve_checkpoint("latest", run)
    assert str(run) in str(e.value)
    _ckpt(run, "step-000005")  # only an incomplete one
    with pytest.raises(RagrlError) as e:
        resolve_checkpoint("latest", run)
    assert str(run) in str(e.value)
    with pytest.raises(RagrlError, match="not a checkpoint") as e:
        resolve_checkpoint(run / "checkpoints" / "step-000005", run)
    assert "step-000005" in str(e.value)


def test_read_trainer_state_errors(tmp_path: Path) -> None:
    missing = _ckpt(tmp_path, "step-000001")
    with pytest.raises(RagrlError, match="trainer_state.json"):
        read_trainer_state(missing)
    bad = _ckpt(tmp_path, "step-000002")
    (bad / "trainer_state.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(RagrlError, match="unreadable"):
        read_trainer_state(bad)


def test_tmp_folder_with_trainer_state_is_ignored(tmp_path: Path) -> None:
    ten = _ckpt(tmp_path, "step-000010", {"step": 10})
    _ckpt(tmp_path, "step-000012.tmp", {"step": 12})  # crash between writing the state and os.replace
    assert list_checkpoints(tmp_path) == [ten]
