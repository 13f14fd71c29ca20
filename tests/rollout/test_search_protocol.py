"""Search-R1 protocol: prompt rendering, the parse table, observations, config loading."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from transformers import PreTrainedTokenizerFast

from ragrl.config import available_methods, load_method_config
from ragrl.data.schema import Example, Passage
from ragrl.errors import RagrlError
from ragrl.llm.tiny import train_tokenizer
from ragrl.methods.search_r1 import SearchR1Config
from ragrl.retrieval.base import Hit
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.search_protocol import DEFAULT_USER, SearchR1Protocol, SearchR1ProtocolConfig, thoughts
from ragrl.rollout.search_protocol import TAGS as SEARCH_R1_TAGS
from ragrl.rollout.trajectory import Action

P = SearchR1Protocol()
EX = Example("q1", "  Who wrote Hamlet? ", ["Shakespeare"])
TAGS = list(SEARCH_R1_TAGS)


def tokenizer() -> PreTrainedTokenizerFast:
    tok = train_tokenizer([DEFAULT_USER], kind="bpe", vocab_size=400, special_tags=TAGS)
    tok.chat_template = None
    return tok


def test_messages_and_plain_prompt():
    msgs = P.messages(EX)
    assert msgs == [{"role": "user", "content": DEFAULT_USER.format(question="Who wrote Hamlet?")}]
    tok = tokenizer()
    ids = P.prompt_ids(EX, tok)
    assert tok.decode(ids) == P.prompt_text(EX)
    assert P.prompt_text(EX).endswith("Question: Who wrote Hamlet?")
    for tag in TAGS:
        assert (tag in P.prompt_text(EX)) is ("evaluate" not in tag)  # the evaluate step is off


def test_prompt_with_chat_template_and_system_message():
    tok = tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    p = SearchR1Protocol(SearchR1ProtocolConfig(system="You search. ({question})", user="Q: {question}"))
    text = tok.decode(p.prompt_ids(EX, tok))
    assert text == "<system>You search. (Who wrote Hamlet?)\n<user>Q: Who wrote Hamlet?\n<assistant>"


@pytest.mark.parametrize(
    ("text", "kind", "content"),
    [
        ("<think> x </think>\n<search> who wrote  Hamlet </search>", "search", "who wrote Hamlet"),
        ("<answer> William\nShakespeare </answer>", "answer", "William Shakespeare"),
        ("<search> a </search> then <answer> b </answer>", "answer", "b"),
        ("<answer> b </answer> <search> a </search>", "search", "a"),
        ("<search>a</search><search>b</search>", "search", "b"),
        ("<search> outer <search> inner </search>", "search", "inner"),
        ("<search> unclosed", "invalid", ""),
        ("<answer> unclosed </search>", "invalid", ""),
        ("just thinking", "invalid", ""),
        ("<think> only </think>", "invalid", ""),
        ("", "invalid", ""),
        ("<search>   </search>", "invalid", ""),
        ("<answer></answer>", "invalid", ""),
        ("<search> q </search></s>", "search", "q"),
        ("</search><search>", "invalid", ""),
    ],
)
def test_parse_table(text, kind, content):
    a = P.parse(text, 2)
    assert (a.kind, a.content, a.turn) == (kind, content, 2)
    if kind == "invalid":
        assert a.error


def test_parse_errors_name_the_problem():
    assert P.parse("<search> </search>", 0).error == "empty query"
    assert P.parse("<answer> </answer>", 0).error == "empty answer"
    assert P.parse("nothing", 0).error == "no <search> or <answer> block"


def test_prompt_tags_are_never_parsed():
    # the prompt shows "<answer> Paris </answer>"; only the generated segment is parsed
    assert "<answer> Paris </answer>" in P.prompt_text(EX)
    assert P.parse("<think> unsure </think>", 0).kind == "invalid"


def test_observation_and_corrective():
    hits = [
        Hit(Passage.make("Hamlet", "Hamlet is a tragedy by Shakespeare."), 3.2),
        Hit(Passage.make("Globe", "The Globe theatre."), 1.0),
    ]
    obs = P.observation(Action("search", "hamlet"), hits)
    assert obs == (
        "\n<information>Doc 1 (Title: Hamlet) Hamlet is a tragedy by Shakespeare.\n"
        "Doc 2 (Title: Globe) The Globe theatre.</information>\n"
    )
    assert P.observation(Action("search", "zzz"), []) == "\n<information>No passages found.</information>\n"
    bad = P.parse("<search></search>", 0)
    assert "empty query" in P.corrective(bad) and "<search>" in P.corrective(bad)
    assert P.is_final(Action("answer", "x")) and not P.is_final(Action("search", "x"))
    assert P.stop == ("</search>", "</answer>")
    assert thoughts("<think> a  b </think> x <think>c</think>") == ["a b", "c"]


def test_packaged_config_loads_into_dataclasses():
    assert "search_r1" in available_methods()
    cfg = SearchR1Config.load()
    assert cfg.rollout == RolloutConfig(max_turns=4, k=3, max_new_tokens=128, max_obs_tokens=400)
    assert cfg.protocol == SearchR1ProtocolConfig()  # the YAML and the dataclass defaults agree
    cfg = SearchR1Config.load("search_r1", ["rollout.max_turns=6", "protocol.no_results=none"])
    assert cfg.rollout.max_turns == 6 and cfg.protocol.no_results == "none"
    assert SearchR1Protocol(cfg.protocol).observation(Action("search", "x"), []).count("none") == 1


def test_config_from_path_and_errors(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("method: search_r1\nrollout:\n  max_turns: 2\n")
    assert SearchR1Config.load(p).rollout.max_turns == 2
    assert load_method_config(str(p), {"rollout.k": 5}).rollout.k == 5
    with pytest.raises(RagrlError, match="unknown method"):
        load_method_config("nope")
    with pytest.raises(RagrlError, match="no such config file"):
        load_method_config(tmp_path / "missing.yaml")
    with pytest.raises(RagrlError, match=f"{tmp_path}: a folder, not a config file$"):
        load_method_config(tmp_path)
    (tmp_path / "config.yaml").write_text("method: search_r1\n")  # a run folder: its config is named
    with pytest.raises(
        RagrlError, match=f"a folder, not a config file; its resolved config is {tmp_path}/config.yaml"
    ):
        load_method_config(str(tmp_path))


def test_a_folder_named_as_a_method_does_not_hide_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "search_r1").mkdir()  # `ragrl train search_r1 --out search_r1`, then --resume latest
    assert load_method_config("search_r1").method == "search_r1"
    with pytest.raises(RagrlError, match="a folder, not a config file"):
        load_method_config("./search_r1")  # a path is a path
    with pytest.raises(RagrlError, match="key.path=value"):
        load_method_config("search_r1", ["rollout.max_turns"])
    with pytest.raises(RagrlError, match="rollout.bogus|bogus"):
        SearchR1Config.load("search_r1", ["rollout.bogus=1"])
    with pytest.raises(RagrlError, match="max_turns"):
        SearchR1Config.load("search_r1", ["rollout.max_turns=0"])
    with pytest.raises(RagrlError):
        SearchR1Config.load("search_r1", ["rollout.max_turns=abc"])
    assert OmegaConf.select(load_method_config("search_r1"), "rollout.max_obs_tokens") == 400
