"""Prompt encoding: the chat template when the tokenizer has one, the plain rendering otherwise."""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ragrl.llm.chat import encode_messages, has_chat_template, render_plain


def tokenizer(chat_template: str | None = None) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["look up the capital of France"], trainer)
    tok.add_tokens(
        [AddedToken(t, normalized=False) for t in ("<lookup>", "</lookup>", "<final>", "</final>")]
    )
    out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", clean_up_tokenization_spaces=False)
    if chat_template:
        out.chat_template = chat_template
    return out


def test_render_plain_joins_contents_with_a_blank_line_and_skips_empty_ones():
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": ""},
        {"role": "user", "content": "U"},
    ]
    assert render_plain(msgs) == "S\n\nU"


def test_encode_messages_with_and_without_chat_template():
    msgs = [{"role": "user", "content": "look up France"}]
    plain = tokenizer()
    assert encode_messages(msgs, plain) == plain.encode("look up France")
    chat = tokenizer(
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    ids = encode_messages(msgs, chat)
    assert chat.decode(ids) == "[user] look up France\n[assistant] "
    assert has_chat_template(chat) and not has_chat_template(plain)
