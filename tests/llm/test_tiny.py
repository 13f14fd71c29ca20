"""The tiny policy: locally trained tokenizer, chat template, Llama model, save/reload, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from ragrl.cli import app, main
from ragrl.errors import RagrlError
from ragrl.llm.tiny import (
    DEFAULT_TAGS,
    EOT_TOKEN,
    CopyPretraining,
    TinyConfig,
    build_tiny_model,
    collect_texts,
    count_parameters,
    create_tiny_policy,
    read_tiny_info,
    train_tokenizer,
    weights_hash,
)

SMALL = TinyConfig(hidden=32, layers=2, heads=2, intermediate=64)

QUESTIONS = [
    {
        "id": "q1",
        "question": "Who founded Zorvex Labs?",
        "golden_answers": ["Mira Okafor"],
        "metadata": {
            "decomposition": [
                {"question": "Which company makes the Quill engine?", "answers": ["Zorvex Labs"]},
                {"question": "Who founded Zorvex Labs?", "answers": ["Mira Okafor"]},
            ]
        },
    },
    {
        "id": "q2",
        "question": "In which year was Zorvex Labs founded?",
        "golden_answers": ["1987"],
        "metadata": {
            "passages": [
                {"id": "g1", "title": "Quill engine", "text": "The Quill engine is made by Zorvex Labs."}
            ]
        },
    },
]
CORPUS = [
    {"id": "c1", "contents": "Zorvex Labs\nZorvex Labs was founded by Mira Okafor in 1987 in Lagos."},
    {"id": "c2", "contents": "Mira Okafor\nMira Okafor is an engineer. She founded Zorvex Labs."},
]
TRACE = (
    "<think> Zorvex Labs makes the Quill engine. </think> <search> Zorvex Labs </search> "
    "<information> Zorvex Labs was founded by Mira Okafor in 1987. </information> "
    "<answer> Mira Okafor </answer>"
)


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("data")
    _write_jsonl(d / "questions.jsonl", QUESTIONS)
    _write_jsonl(d / "corpus.jsonl", CORPUS)
    return d


@pytest.fixture(scope="module")
def tiny_dir(data_dir, tmp_path_factory) -> Path:
    return create_tiny_policy(data_dir, tmp_path_factory.mktemp("models") / "tiny", seed=3, config=SMALL)


@pytest.fixture(scope="module")
def tokenizers(data_dir):
    texts, _ = collect_texts(data_dir)
    return {kind: train_tokenizer(texts, kind=kind, vocab_size=600) for kind in ("word", "bpe")}


# --- tokenizer ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["word", "bpe"])
def test_tags_are_single_tokens_and_survive_decode(tokenizers, kind):
    tok = tokenizers[kind]
    for tag in DEFAULT_TAGS:
        ids = tok.encode(tag, add_special_tokens=False)
        assert len(ids) == 1, (tag, ids)
        # glued to words on both sides, a tag is still one token
        glued = tok.encode(f"Zorvex{tag}Zorvex")
        assert glued.count(ids[0]) == 1 and tok.decode(glued) == f"Zorvex{tag}Zorvex"
    ids = tok.encode(TRACE)
    assert tok.decode(ids) == TRACE
    assert tok.decode(ids, skip_special_tokens=True) == TRACE  # tags are not special
    # special tokens are: skipped on request
    with_eot = tok.encode(TRACE + EOT_TOKEN)
    assert tok.convert_ids_to_tokens(with_eot[-1]) == EOT_TOKEN
    assert tok.decode(with_eot, skip_special_tokens=True) == TRACE


def test_plain_pre_tokenizer_would_split_tags(tokenizers):
    """The pitfall the added tokens avoid: pre-tokenization alone cuts ``<search>`` apart."""
    pieces = [p for p, _ in tokenizers["word"]._tokenizer.pre_tokenizer.pre_tokenize_str("<search> Mira")]
    assert "<search>" not in pieces
    assert tokenizers["word"].tokenize("<search> Mira") == ["<search>", " Mira"]


def test_word_tokenizer_is_short_readable_and_marks_unknown_words(tokenizers):
    word, bpe = tokenizers["word"], tokenizers["bpe"]
    text = "Zorvex Labs was founded by Mira Okafor in 1987."
    assert word.tokenize(text) == [
        "Zorvex",
        " Labs",
        " was",
        " founded",
        " by",
        " Mira",
        " Okafor",
        " in",
        " 1",
        "9",
        "8",
        "7",
        ".",
    ]
    assert len(word.encode(text)) <= len(bpe.encode(text))
    # digits and punctuation are always in the vocabulary; unknown words become <|unk|>
    assert word.decode(word.encode("Mira, 2024!")) == "Mira, 2024!"
    assert word.decode(word.encode("Mira Qwertyuiop")) == "Mira<|unk|>"
    assert word.unk_token_id in word.encode(" Qwertyuiop")


@settings(max_examples=60)
@given(
    st.lists(
        st.one_of(
            st.text(max_size=12), st.sampled_from(DEFAULT_TAGS), st.sampled_from([" ", "\n", "é", "日本"])
        ),
        max_size=12,
    )
)
def test_bpe_round_trips_any_text(tokenizers, parts):
    tok = tokenizers["bpe"]
    text = "".join(parts)
    ids = tok.encode(text)
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == text


def test_vocab_size_and_bad_arguments(tokenizers):
    assert len(tokenizers["bpe"]) <= 600  # fewer when the test corpus runs out of merges
    assert len(tokenizers["word"]) <= 600
    with pytest.raises(RagrlError, match="unknown tokenizer kind"):
        train_tokenizer(["a b"], kind="char")
    with pytest.raises(RagrlError, match="too small"):
        train_tokenizer(["a b"], vocab_size=50)
    with pytest.raises(RagrlError, match="clash"):
        train_tokenizer(["a b"], special_tags=["<|eot|>"])


# --- chat template --------------------------------------------------------------------------------

MESSAGES = [
    {"role": "system", "content": "Answer the question."},
    {"role": "user", "content": "Who founded Zorvex Labs?"},
    {"role": "assistant", "content": "<answer> Mira Okafor </answer>"},
    {"role": "user", "content": "In which year?"},
]


def _ids(encoded) -> list[int]:
    """``apply_chat_template(tokenize=True)`` returns a list (transformers 4) or a BatchEncoding (5)."""
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


@pytest.mark.parametrize("kind", ["word", "bpe"])
def test_chat_template_renders_roles_and_generation_prompt(tokenizers, kind):
    tok = tokenizers[kind]
    text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|bos|><|system|>\nAnswer the question.<|eot|>\n<|user|>\nWho founded Zorvex Labs?<|eot|>\n"
        "<|assistant|>\n<answer> Mira Okafor </answer><|eot|>\n<|user|>\nIn which year?<|eot|>\n"
        "<|assistant|>\n"
    )
    without = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=False)
    assert text == without + "<|assistant|>\n"
    ids = _ids(tok.apply_chat_template(MESSAGES, add_generation_prompt=True))
    assert ids == tok.encode(text, add_special_tokens=False)
    assert ids[0] == tok.bos_token_id
    assert ids[-2:] == tok.encode("<|assistant|>\n", add_special_tokens=False)
    assert tok.eos_token == EOT_TOKEN and ids.count(tok.eos_token_id) == 4
    with pytest.raises(Exception, match="roles system, user and assistant"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


# --- model ----------------------------------------------------------------------------------------


def test_reload_with_auto_classes_gives_identical_logits(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    model.eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    prompts = [
        tok.apply_chat_template(MESSAGES[:2], tokenize=False, add_generation_prompt=True),
        "Zorvex Labs <search> Mira </search>",
    ]
    batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert tok.padding_side == "left" and batch["input_ids"][1, 0] == tok.pad_token_id

    original = build_tiny_model(tok, SMALL, seed=3)
    with torch.no_grad():
        a = original(**batch).logits
        b = model(**batch).logits
    assert a.shape == (2, batch["input_ids"].shape[1], len(tok))
    assert torch.equal(a, b)
    assert weights_hash(model) == weights_hash(original) == read_tiny_info(tiny_dir)["weights_sha256"]

    assert model.generation_config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids(EOT_TOKEN)
    assert model.generation_config.pad_token_id == tok.pad_token_id
    out = model.generate(**batch, max_new_tokens=3, do_sample=False)
    assert out.shape[0] == 2


def test_reloaded_tokenizer_matches_and_applies_chat_template(tiny_dir, tokenizers):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert tok.decode(tok.encode(TRACE)) == TRACE
    text = tok.apply_chat_template(MESSAGES[:2], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|user|>\nWho founded Zorvex Labs?<|eot|>\n<|assistant|>\n")
    assert (tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token) == (
        "<|pad|>",
        "<|bos|>",
        "<|eot|>",
        "<|unk|>",
    )
    assert tok.model_max_length == SMALL.max_position_embeddings


def test_seeded_builds_are_identical_and_leave_global_rng_alone(tokenizers):
    tok = tokenizers["word"]
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = build_tiny_model(tok, SMALL, seed=7)
    assert torch.equal(torch.rand(1), expected_next)
    b = build_tiny_model(tok, SMALL, seed=7)
    c = build_tiny_model(tok, SMALL, seed=8)
    assert weights_hash(a) == weights_hash(b) != weights_hash(c)


class _FakeTokenizer:
    """Just enough of a tokenizer to size a model at a realistic vocabulary."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def test_parameter_count_within_documented_range():
    default = count_parameters(build_tiny_model(_FakeTokenizer(8192), TinyConfig()))
    assert default == 8192 * 128 + 4 * (4 * 128 * 128 + 3 * 128 * 384 + 2 * 128) + 128
    assert 1_000_000 <= default <= 3_000_000
    untied = count_parameters(build_tiny_model(_FakeTokenizer(8192), TinyConfig(tie_embeddings=False)))
    assert untied == default + 8192 * 128
    assert 1_000_000 <= untied <= 3_000_000
    gqa = build_tiny_model(_FakeTokenizer(500), TinyConfig(kv_heads=2))
    assert gqa.config.num_key_value_heads == 2


def test_bad_model_shapes_are_clear_errors():
    with pytest.raises(RagrlError, match="divisible by heads"):
        TinyConfig(hidden=100, heads=3)
    with pytest.raises(RagrlError, match="kv_heads"):
        TinyConfig(heads=4, kv_heads=3)


# --- data and files -------------------------------------------------------------------------------


def test_collect_texts_reads_questions_decompositions_passages_and_corpus(data_dir, tmp_path):
    texts, sources = collect_texts(data_dir)
    assert sources == {
        "questions": [str(data_dir / "questions.jsonl")],
        "corpus": [str(data_dir / "corpus.jsonl")],
    }
    for expected in (
        "Who founded Zorvex Labs?",
        "Mira Okafor",
        "Which company makes the Quill engine?",
        "Quill engine\nThe Quill engine is made by Zorvex Labs.",
        "Zorvex Labs\nZorvex Labs was founded by Mira Okafor in 1987 in Lagos.",
    ):
        assert expected in texts
    bad = tmp_path / "other.jsonl"
    bad.write_text('{"x": 1}\n')
    with pytest.raises(RagrlError, match="neither a canonical question file"):
        collect_texts([bad])


def test_info_file_records_how_the_model_was_made(tiny_dir, data_dir):
    info = read_tiny_info(tiny_dir)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert info["seed"] == 3 and info["tokenizer"] == "word"
    assert info["vocab_size"] == len(tok)
    assert info["config"]["hidden"] == SMALL.hidden
    assert info["parameters"] == count_parameters(AutoModelForCausalLM.from_pretrained(tiny_dir))
    assert info["sources"]["corpus"] == [str(data_dir / "corpus.jsonl")]
    assert read_tiny_info(data_dir) is None


# --- CLI ------------------------------------------------------------------------------------------


def test_cli_builds_a_model(data_dir, tmp_path):
    out = tmp_path / "m"
    args = ["model", "tiny", "--data", str(data_dir), "--out", str(out), "--seed", "1"]
    args += ["--tokenizer", "bpe", "--hidden", "32", "--layers", "1", "--heads", "2", "--vocab-size", "500"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    info = read_tiny_info(out)
    assert f"parameters: {info['parameters']:,}" in result.output
    assert "vocab size: 500" in result.output and str(out) in result.output
    assert info["tokenizer"] == "bpe" and info["seed"] == 1 and info["config"]["intermediate"] == 96


def test_cli_errors_are_clear(data_dir, tmp_path, capsys):
    runner = CliRunner()
    empty = tmp_path / "empty"
    empty.mkdir()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("x")
    cases = [
        (["--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o1")], "no such directory"),
        (["--data", str(empty), "--out", str(tmp_path / "o2")], "no \\*.jsonl files"),
        (["--data", str(data_dir), "--out", str(taken)], "not an empty directory"),
        (
            ["--data", str(data_dir), "--out", str(tmp_path / "o3"), "--tokenizer", "char"],
            "unknown tokenizer",
        ),
        (["--data", str(data_dir), "--out", str(tmp_path / "o4"), "--heads", "3"], "divisible by heads"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["model", "tiny", *args])
        assert isinstance(result.exception, RagrlError), result.output
        with pytest.raises(RagrlError, match=message):
            raise result.exception
    with pytest.raises(SystemExit) as exit_info:
        main(["model", "tiny", "--data", str(empty), "--out", str(tmp_path / "o5")])
    assert exit_info.value.code == 2
    assert "no *.jsonl files" in capsys.readouterr().err


def test_word_vocabulary_knows_every_word_with_and_without_its_leading_space():
    # "Who" only ever starts a text and "founded" only follows a space: both forms must be known,
    # or "<search> Who ..." and "founded..." after a tag would be unknown.
    tok = train_tokenizer(["Who founded Zorvex Labs?", "Zorvex Labs was founded in 1946."], kind="word")
    for text in ("<search> Who founded Zorvex Labs? </search>", "<think>founded Zorvex</think>"):
        ids = tok.encode(text)
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == text


# --- copy pre-training ------------------------------------------------------------------------------


def test_induction_sequences_copy_spans_of_the_body():
    import random

    from ragrl.llm.copy_pretrain import MAX_SPAN, induction_sequence

    rng = random.Random(0)
    words = list(range(10, 500))
    for length in (32, 256):
        for _ in range(50):
            ids, mask = induction_sequence(words, length, 1, rng)
            assert len(ids) == len(mask) == length + 1 and ids[0] == 1 and mask[0] == 0
            first = mask.index(1) - 1  # the copies start one token before the first masked one
            body = ids[1:first]
            assert 8 <= len(body) <= length - 2 * MAX_SPAN and not any(mask[: first + 1])
            # every masked token follows, in the body, the token before it: only copying predicts it
            for i in range(first, length + 1):
                if mask[i]:
                    assert any(body[j] == ids[i - 1] and body[j + 1] == ids[i] for j in range(len(body) - 1))


def test_copy_pretraining_is_recorded_and_deterministic(data_dir, tmp_path, capfd):
    config = TinyConfig(hidden=64, layers=2, heads=4, intermediate=128)
    plain = create_tiny_policy(data_dir, tmp_path / "plain", seed=0, config=config)
    copy = CopyPretraining(steps=6, batch_size=4, long_steps=2, long_length=64)
    taught = create_tiny_policy(data_dir, tmp_path / "taught", seed=0, config=config, copy=copy)
    info = read_tiny_info(taught)["copy_pretraining"]
    # the target (0.95 over the last 10 steps) cannot be reached in 6 steps: no long phase
    assert info["steps"] == 6 and not info["reached_target"] and info["long_steps"] == 0
    # ... and the user is told so in words, not in unrendered markup
    err = capfd.readouterr().err
    assert "warning: copy pre-training: accuracy 0.00 after 6 steps did not reach 0.95" in err
    assert "[yellow]" not in err
    assert {"copy_accuracy@20", "copy_accuracy@80", "copy_accuracy@200", "copy_loss"} <= set(info)
    assert read_tiny_info(plain)["copy_pretraining"] is None
    again = create_tiny_policy(data_dir, tmp_path / "again", seed=0, config=config, copy=copy)
    assert read_tiny_info(again)["weights_sha256"] == read_tiny_info(taught)["weights_sha256"]
    assert read_tiny_info(again)["weights_sha256"] != read_tiny_info(plain)["weights_sha256"]


def test_copy_pretraining_runs_the_long_phase_once_the_target_is_reached(data_dir, tmp_path):
    config = TinyConfig(hidden=64, layers=2, heads=4, intermediate=128)
    copy = CopyPretraining(
        steps=50, batch_size=4, window=3, target_accuracy=0.0, long_steps=2, long_length=64
    )
    info = read_tiny_info(create_tiny_policy(data_dir, tmp_path / "m", seed=0, config=config, copy=copy))
    assert info["copy_pretraining"]["steps"] == 3 and info["copy_pretraining"]["reached_target"]
    assert info["copy_pretraining"]["long_steps"] == 2


@pytest.mark.slow
def test_copy_pretraining_teaches_copying_by_content_at_any_distance(tmp_path):
    """At the default shape the induction circuit appears and then works at prompt distances. The old
    fixed-offset task (span 20, source always 20 tokens back) reached 1.0 at distance 20 and 0.03 at 40:
    a positional shortcut; this one must copy by content."""
    from ragrl.synth import generate_world

    generate_world(0, "small").write(tmp_path / "world")  # a real vocabulary: ~3,700 words
    taught = create_tiny_policy(
        tmp_path / "world", tmp_path / "taught", seed=0, copy=CopyPretraining(steps=1500)
    )
    info = read_tiny_info(taught)["copy_pretraining"]
    assert info["reached_target"] and info["steps"] < 1500  # phase 1 stopped early
    assert info["long_steps"] == 150
    for distance in (20, 80, 200):
        assert info[f"copy_accuracy@{distance}"] > 0.8, info


def test_copy_pretraining_settings_are_checked():
    bad_settings = (
        {"steps": -1},
        {"long_steps": -1},
        {"batch_size": 0},
        {"short_length": 8},
        {"long_length": 0},
        {"target_accuracy": -0.1},
        {"target_accuracy": 1.5},
        {"window": 0},
        {"lr": 0.0},
    )
    for bad in bad_settings:
        with pytest.raises(RagrlError, match="copy pre-training"):
            CopyPretraining(**bad)
