"""Property tests: token-in/token-out invariants and budgets over random generations and tokenizers."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ragrl.data.schema import Example, Passage
from ragrl.llm.tiny import train_tokenizer
from ragrl.retrieval.bm25 import BM25Retriever
from ragrl.rollout.config import FINISH_REASONS, RolloutConfig
from ragrl.rollout.engine import RolloutEngine
from ragrl.rollout.protocol import find_spans, last_span_of
from ragrl.rollout.scripted import ScriptedBackend
from ragrl.rollout.search_protocol import TAGS as SEARCH_R1_TAGS
from ragrl.rollout.search_protocol import SearchR1Protocol

TAGS = list(SEARCH_R1_TAGS)
PASSAGES = [
    Passage.make("Alan Turing", "Alan Turing was born in Maida Vale, London."),
    Passage.make("London", "London is the capital of England."),
    Passage.make("Kyōto", "Kyōto was the capital of Japan for a millennium. 京都"),
]
BM25 = BM25Retriever.build(PASSAGES)
PROTOCOL = SearchR1Protocol()


def byte_bpe() -> PreTrainedTokenizerFast:
    tok = train_tokenizer([p.contents for p in PASSAGES] * 2, kind="bpe", vocab_size=500, special_tags=TAGS)
    tok.chat_template = None
    return tok


def word_level() -> PreTrainedTokenizerFast:
    """Whitespace word-level vocabulary: unknown words become [UNK], decoding joins with spaces."""
    pre = pre_tokenizers.WhitespaceSplit()
    vocab = {"[UNK]": 0, "</s>": 1, "<pad>": 2}
    texts = [p.contents for p in PASSAGES] + [PROTOCOL.prompt_text(Example("x", "q", []))]
    for t in texts:
        for w, _ in pre.pre_tokenize_str(t):
            vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre
    tok.add_special_tokens(["</s>", "<pad>"])
    tok.add_tokens([AddedToken(t, normalized=False) for t in TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="[UNK]",
        clean_up_tokenization_spaces=False,
    )


CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chatml_bpe() -> PreTrainedTokenizerFast:
    """A real model's shape (SmolLM2, Qwen): byte-level BPE whose tags are several ordinary tokens, ChatML
    special tokens, ``<|im_end|>`` as EOS, and a chat template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([p.contents for p in PASSAGES] * 3 + [" ".join(TAGS)] * 3, trainer)
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHATML,
        clean_up_tokenization_spaces=False,
    )  # fmt: skip
    assert all(len(out(t, add_special_tokens=False).input_ids) > 1 for t in TAGS)  # multi-token tags
    return out


TOKENIZERS = {"bpe": byte_bpe(), "word": word_level(), "chatml": chatml_bpe()}
SMOLLM2 = Path(__file__).resolve().parents[2] / "models" / "smollm2-135m-instruct"
if (SMOLLM2 / "tokenizer.json").is_file():  # the real thing, after `make smollm2`
    TOKENIZERS["smollm2"] = AutoTokenizer.from_pretrained(SMOLLM2)

piece = st.one_of(
    st.sampled_from(
        TAGS + ["</s>", "<|im_end|>", " ", "\n", "Alan Turing", "London capital", "<", ">", "</", "search"]
    ),
    st.text(max_size=12),
)
turn_text = st.lists(piece, max_size=12).map("".join)
configs = st.builds(
    RolloutConfig,
    max_turns=st.integers(1, 4),
    max_total_tokens=st.integers(1, 160),
    max_new_tokens=st.integers(1, 40),
    max_obs_tokens=st.integers(1, 60),
    k=st.integers(1, 3),
    max_invalid=st.one_of(st.none(), st.integers(1, 3)),
    final_answer_turn=st.booleans(),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tok_name=st.sampled_from(sorted(TOKENIZERS)),
    turns=st.lists(turn_text, min_size=1, max_size=6),
    cfg=configs,
    n=st.integers(1, 2),
)
def test_rollout_invariants(tok_name, turns, cfg, n):
    tok = TOKENIZERS[tok_name]
    calls: list[list[int]] = []

    def policy(prompt_ids, index):
        calls.append(list(prompt_ids))
        return turns[(len(calls) + index) % len(turns)]

    engine = RolloutEngine(ScriptedBackend(tok, policy), BM25, PROTOCOL, cfg)
    examples = [Example("a", "Where was Alan Turing born?", ["London"]), Example("b", "Kyōto 京都?", ["x"])]
    trajs = engine.run(examples, n=n)
    assert len(trajs) == 2 * n
    full = {id(t): t.prompt_ids + t.completion_ids for t in trajs}
    for p in calls:  # every prompt sent is a prefix of some trajectory's final sequence
        assert any(seq[: len(p)] == p and len(p) >= len(t.prompt_ids) for t in trajs for seq in [full[id(t)]])
    for t in trajs:
        ids, mask = t.completion_ids, t.loss_mask
        assert ids == [x for s in t.segments for x in s.token_ids]
        assert len(mask) == len(ids) == len(t.completion_logprobs)
        pos = 0
        for s in t.segments:
            assert mask[pos : pos + len(s.token_ids)] == [1 if s.kind == "policy" else 0] * len(s.token_ids)
            pos += len(s.token_ids)
            if s.kind == "policy":
                assert tok.decode(s.token_ids, skip_special_tokens=False) == s.text
                assert len(s.logprobs) == len(s.token_ids) <= cfg.max_new_tokens
            else:
                assert len(s.token_ids) <= cfg.max_obs_tokens and s.logprobs is None
        assert sum(mask) == t.num_policy_tokens
        # budgets
        assert len(ids) <= cfg.max_total_tokens
        n_policy = sum(s.kind == "policy" for s in t.segments)
        assert 1 <= n_policy <= cfg.max_turns + int(cfg.final_answer_turn)
        assert len(t.actions) == n_policy
        if cfg.max_invalid is not None:
            assert t.num_invalid <= cfg.max_invalid
        assert t.finish_reason in FINISH_REASONS
        assert (t.final_answer is not None) == (t.finish_reason == "answer")
        assert t.truncated == (t.finish_reason in ("max_turns", "max_tokens"))
        for a in t.actions:
            assert a.kind in ("search", "answer", "invalid")
            assert len(a.retrieved_ids) == len(a.retrieved_scores) <= cfg.k


@settings(max_examples=500, deadline=None)
@given(text=st.one_of(st.text(), st.lists(piece, max_size=30).map("".join)), turn=st.integers(0, 10))
def test_parser_never_raises(text, turn):
    a = PROTOCOL.parse(text, turn)
    assert a.kind in ("search", "answer", "invalid") and a.turn == turn
    if a.kind == "invalid":
        assert a.error
    else:
        assert a.content and a.content == " ".join(a.content.split())
        span = last_span_of(text, ("search", "answer"))
        assert span is not None and span.tag == a.kind
    for tag in ("search", "answer", "think"):
        prev = 0
        for s in find_spans(text, tag):
            assert s.start >= prev and text[s.start : s.end] == f"<{tag}>{s.content}</{tag}>"
            assert f"<{tag}>" not in s.content and f"</{tag}>" not in s.content
            prev = s.end
