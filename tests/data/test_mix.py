"""``ragrl data mix``: seeded samples of several question files, shuffled together, with exclusions."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.data.io import read_examples, write_examples
from ragrl.data.mix import mix, parse_take
from ragrl.data.schema import Example
from ragrl.errors import RagrlError


def _file(path, prefix, n):
    write_examples(path, [Example(f"{prefix}{i}", f"Q {prefix}{i}?", ["a"]) for i in range(n)])
    return path


def test_a_mix_takes_n_of_each_source_and_is_reproducible(tmp_path):
    a, b = _file(tmp_path / "a.jsonl", "a", 10), _file(tmp_path / "b.jsonl", "b", 30)
    out = mix([(a, 4), (b, None)], seed=3)
    assert len(out) == 34 and sum(ex.id.startswith("a") for ex in out) == 4
    assert {ex.metadata["mix_source"] for ex in out} == {str(a), str(b)}
    assert [ex.id for ex in mix([(a, 4), (b, None)], seed=3)] == [ex.id for ex in out]
    assert [ex.id for ex in mix([(a, 4), (b, None)], seed=4)] != [ex.id for ex in out]
    held = mix([(a, 6)], seed=0, exclude=[ex.id for ex in out])
    assert not {ex.id for ex in held} & {ex.id for ex in out}


def test_bad_mixes_name_the_file(tmp_path):
    a = _file(tmp_path / "a.jsonl", "a", 3)
    with pytest.raises(RagrlError, match=r"a.jsonl: asked for 5 questions, it has 3"):
        mix([(a, 5)], seed=0)
    with pytest.raises(RagrlError, match="question id 'a0' is also in"):
        mix([(a, None), (a, None)], seed=0)
    assert parse_take("x/y.jsonl:12") == (tmp_path.__class__("x/y.jsonl"), 12)
    assert parse_take("C:/data.jsonl")[1] is None
    for bad, says in ((f"{a}:-3", "the count must be >= 1"), (f"{a}:0", "the count must be >= 1"),
                      (f"{a}:abc", "not FILE:N")):  # fmt: skip
        with pytest.raises(RagrlError, match=f"--take {re.escape(bad)}: {says}"):
            parse_take(bad)
    odd = _file(tmp_path / "a:2.jsonl", "odd", 2)  # a file whose name holds a ':' is taken whole
    assert parse_take(str(odd)) == (odd, None)


def test_the_cli_writes_the_mix_and_a_disjoint_validation_set(tmp_path):
    a, b = _file(tmp_path / "a.jsonl", "a", 20), _file(tmp_path / "b.jsonl", "b", 20)
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    r = CliRunner().invoke(app, ["data", "mix", "--take", f"{a}:5", "--take", f"{b}:7", "--out", str(train)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(
        app, ["data", "mix", "--take", f"{b}:13", "--exclude", str(train), "--out", str(val)]
    )
    assert r.exit_code == 0, r.output
    got_train, got_val = read_examples(train)[0], read_examples(val)[0]
    assert len(got_train) == 12 and len(got_val) == 13
    assert not {e.id for e in got_train} & {e.id for e in got_val}


def test_a_field_a_mix_does_not_keep_is_said_on_the_command_line(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text('{"id": "a0", "question": "Q?", "golden_answers": ["x"], "hops": 2}\n')
    heard = []
    (ex,) = mix([(a, None)], seed=0, on_warning=heard.append)
    assert "hops" not in ex.metadata and len(heard) == 1
    assert heard[0].startswith(f"{a}: field 'hops' is not part of a canonical record")
    result = CliRunner().invoke(app, ["data", "mix", "--take", str(a), "--out", str(tmp_path / "m.jsonl")])
    assert result.exit_code == 0, result.output
    assert "warning: " in result.output and "field 'hops' is not part of a canonical record" in " ".join(
        result.output.split()
    )
