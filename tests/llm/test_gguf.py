"""``ragrl model import-gguf``: a GGUF file written here (a tiny Llama with a byte-level BPE tokenizer,
ChatML special tokens and a chat template, as SmolLM2 has) imports into a folder whose model computes
the same logits and whose tokenizer encodes the same ids; the real SmolLM2 file is a slow test."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

gguf = pytest.importorskip("gguf")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,  # noqa: E402
)
from typer.testing import CliRunner  # noqa: E402

from ragrl.cli import app  # noqa: E402
from ragrl.errors import RagrlError  # noqa: E402
from ragrl.llm.gguf import (  # noqa: E402
    MANIFEST_NAME,
    declared_special_tokens,
    import_gguf,
    read_import_manifest,
    use_declared_special_tokens,
)

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXTS = [
    "Zorvex was founded by Ana Lind in 1987. <search>Zorvex founder</search> <answer>Ana Lind</answer>",
    "The capital of Velmora is Ostrand. <information>Doc 1 (Title: Velmora)</information>",
    "Who directed the film? Let me think step by step. <think>first find the film</think>",
] * 20
SAMPLES = [
    "Who founded Zorvex? <search>Zorvex founder</search>",
    "<|im_start|>user\nWhere is Ostrand?<|im_end|>\n",
    "  spaces, tabs\tand ünïcode 京都 <answer>Ana Lind</answer><|im_end|>",
]


def _bpe() -> tuple[PreTrainedTokenizerFast, list[str], list[str]]:
    """A byte-level BPE trained here; the tags stay ordinary text (several tokens each)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TEXTS, trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    reference = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
        chat_template=CHATML, clean_up_tokenization_spaces=False,
    )  # fmt: skip
    return reference, tokens, merges


def _permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's rotary layout for q/k (transformers undoes it when it reads the file)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, drop: str | None = None) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """Write a tiny Llama and its tokenizer as a float32 GGUF file (without tensor ``drop``); returns the
    reference pair."""
    reference_tok, tokens, merges = _bpe()
    config = LlamaConfig(
        vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=True,
        bos_token_id=tokens.index("<|im_start|>"), eos_token_id=tokens.index("<|im_end|>"),
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-chatml")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(2)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(16)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
    w.add_token_merges(merges)
    # as SmolLM2's file says: with the key absent transformers 5.17 strips a leading space when decoding
    w.add_add_space_prefix(False)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_chat_template(CHATML)
    state = {k: v.detach().float() for k, v in model.state_dict().items()}
    names = {
        "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }  # fmt: skip
    w.add_tensor("token_embd.weight", state["model.embed_tokens.weight"].numpy())
    for i in range(2):
        for hf, g in names.items():
            t = state[f"model.layers.{i}.{hf}.weight"]
            if g == "attn_q":
                t = _permute(t, 4)
            elif g == "attn_k":
                t = _permute(t, 2)
            if f"blk.{i}.{g}.weight" != drop:
                w.add_tensor(f"blk.{i}.{g}.weight", t.contiguous().numpy())
    w.add_tensor("output_norm.weight", state["model.norm.weight"].numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model, reference_tok


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-chatml.F32.gguf"
    model, tok = write_tiny_gguf(path)
    return path, model, tok


def test_import_keeps_the_logits_the_tokens_and_the_chat_template(tiny_gguf, tmp_path):
    path, reference, reference_tok = tiny_gguf
    manifest = import_gguf(path, tmp_path / "m")
    out = tmp_path / "m"
    assert {"model.safetensors", "config.json", "tokenizer.json", MANIFEST_NAME} <= {
        p.name for p in out.iterdir()
    }
    assert manifest["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert manifest["parameters"] == sum(p.numel() for p in reference.parameters())
    assert manifest["chat_template"] is True and manifest["eos_token"] == "<|im_end|>"
    assert manifest["special_tokens"] == {
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None,
    }  # fmt: skip
    assert read_import_manifest(out) == manifest and read_import_manifest(tmp_path) is None

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    for text in SAMPLES:
        ids = tok(text, add_special_tokens=False).input_ids
        assert ids == reference_tok(text, add_special_tokens=False).input_ids, text
        assert tok.decode(ids) == text
    assert len(tok("<search>", add_special_tokens=False).input_ids) > 1  # tags are ordinary text
    assert tok.convert_tokens_to_ids("<|im_end|>") == reference_tok.eos_token_id == tok.eos_token_id
    assert tok.pad_token == "<|endoftext|>" and tok.bos_token == "<|im_start|>"
    messages = [{"role": "user", "content": "Where is Ostrand?"}]
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nWhere is Ostrand?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = torch.tensor([reference_tok(SAMPLES[0] + SAMPLES[1]).input_ids])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-5, atol=1e-5)


def test_the_special_tokens_are_the_ones_the_file_declares(tiny_gguf, tmp_path):
    """transformers 5.17 reads a ChatML file's eos as <|im_start|> and no pad; the file's ids win."""
    path, _, reference_tok = tiny_gguf
    declared = declared_special_tokens(path)
    assert declared == {"bos_token": 1, "eos_token": 2, "pad_token": 0}
    misread = copy.deepcopy(reference_tok)
    misread.eos_token, misread.pad_token = "<|im_start|>", None  # what 5.17 makes of the file
    changed = use_declared_special_tokens(misread, declared, path)
    assert changed == {"eos_token": ["<|im_start|>", "<|im_end|>"], "pad_token": [None, "<|endoftext|>"]}
    assert (misread.bos_token_id, misread.eos_token_id, misread.pad_token_id) == (1, 2, 0)
    misread.save_pretrained(tmp_path / "tok")
    again = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert (again.eos_token, again.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert use_declared_special_tokens(again, declared, path) == {}  # nothing left to set
    with pytest.raises(RagrlError, match=r"F32.gguf: tokenizer.ggml.eos_token_id is 999, outside the vocab"):
        use_declared_special_tokens(again, {"eos_token": 999}, path)


def _with_post_processor(tok: PreTrainedTokenizerFast, post) -> PreTrainedTokenizerFast:  # noqa: ANN001
    tok = copy.deepcopy(tok)
    tok.backend_tokenizer.post_processor = post
    return tok


def test_a_template_built_from_the_flags_is_built_again_with_the_files_tokens(tiny_gguf, tmp_path):
    """A file with ``add_bos_token``: setting bos alone left the post-processor prepending the misread one."""
    path, _, reference_tok = tiny_gguf
    plain = reference_tok("Ostrand", add_special_tokens=False).input_ids
    misread = copy.deepcopy(reference_tok)
    misread.bos_token, misread.add_bos_token = "<|endoftext|>", True  # id 0; the file declares 1
    assert misread("Ostrand").input_ids == [0, *plain]
    changed = use_declared_special_tokens(misread, {"bos_token": 1}, path)
    assert changed == {"bos_token": ["<|endoftext|>", "<|im_start|>"]}
    assert misread("Ostrand").input_ids == [1, *plain]
    misread.save_pretrained(tmp_path / "tok")
    assert AutoTokenizer.from_pretrained(tmp_path / "tok")("Ostrand").input_ids == [1, *plain]
    # transformers 5.17's misreading: eos read as the (right) bos. A template adding bos keeps adding
    # bos, not the file's eos (a swap by token name would have made it <|im_end|>)
    both = copy.deepcopy(reference_tok)
    both.eos_token, both.add_bos_token = "<|im_start|>", True
    assert both("Ostrand").input_ids == [1, *plain]
    use_declared_special_tokens(both, {"bos_token": 1, "eos_token": 2}, path)
    assert both("Ostrand").input_ids == [1, *plain] and both.eos_token == "<|im_end|>"


def test_another_post_processor_gets_the_files_token_where_it_had_the_misread_one(tiny_gguf):
    path, _, reference_tok = tiny_gguf
    plain = reference_tok("Ostrand", add_special_tokens=False).input_ids
    prefix = processors.TemplateProcessing(
        single="<|endoftext|>:0 $A:0", pair="<|endoftext|>:0 $A:0 $B:1", special_tokens=[("<|endoftext|>", 0)]
    )  # not what the flags (none set) build
    for post in (prefix, processors.Sequence([processors.ByteLevel(trim_offsets=False), prefix])):
        tok = _with_post_processor(reference_tok, post)
        tok.bos_token, tok.pad_token = "<|endoftext|>", None  # bos misread: the file declares 1
        assert tok("Ostrand").input_ids == [0, *plain]
        use_declared_special_tokens(tok, {"bos_token": 1}, path)
        assert tok("Ostrand").input_ids == [1, *plain], type(post).__name__
        state = json.loads(tok.backend_tokenizer.post_processor.__getstate__())
        assert state["type"] == type(post).__name__  # the same processor, ByteLevel kept in the Sequence
    # the misread token is still another special token (pad here): the template may mean that one
    tok = _with_post_processor(reference_tok, prefix)
    tok.bos_token = "<|endoftext|>"
    use_declared_special_tokens(tok, {"bos_token": 1}, path)
    assert tok.bos_token == "<|im_start|>" and tok("Ostrand").input_ids == [0, *plain]
    # one token read for two (bos and eos), the file declaring two others: which the template adds is unknown
    tok = _with_post_processor(reference_tok, prefix)
    tok.bos_token, tok.eos_token, tok.pad_token = "<|endoftext|>", "<|endoftext|>", None
    use_declared_special_tokens(tok, {"bos_token": 1, "eos_token": 2}, path)
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert tok("Ostrand").input_ids == [0, *plain]
    # a template without a replaced token is left exactly as it was (the flags would build "$A" alone)
    tok = _with_post_processor(reference_tok, prefix)
    tok.eos_token = "<|im_start|>"
    before = tok.backend_tokenizer.post_processor.__getstate__()
    use_declared_special_tokens(tok, {"eos_token": 2}, path)
    assert tok.backend_tokenizer.post_processor.__getstate__() == before
    assert tok("Ostrand").input_ids == [0, *plain]


def test_import_refuses_what_it_cannot_import(tiny_gguf, tmp_path):
    path, _, _ = tiny_gguf
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip, not a gguf")
    with pytest.raises(RagrlError, match=r"x.gguf: not a GGUF file \(it starts with b'PK"):
        import_gguf(not_gguf, tmp_path / "a")
    with pytest.raises(RagrlError, match="no such file"):
        import_gguf(tmp_path / "missing.gguf", tmp_path / "a")
    (tmp_path / "taken").mkdir()
    with pytest.raises(RagrlError, match="taken: already exists"):
        import_gguf(path, tmp_path / "taken")
    with pytest.raises(RagrlError, match="--dtype must be one of"):
        import_gguf(path, tmp_path / "b", dtype="int8")
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(RagrlError, match="cut.gguf: transformers cannot read this GGUF file"):
        import_gguf(truncated, tmp_path / "c")
    assert not (tmp_path / "c").exists() and not (tmp_path / "c.tmp").exists()
    incomplete = tmp_path / "incomplete.gguf"
    write_tiny_gguf(incomplete, drop="blk.1.ffn_down.weight")  # transformers would fill it at random
    with pytest.raises(RagrlError, match=r"incomplete.gguf: the file lacks weights .*layers.1.mlp.down_proj"):
        import_gguf(incomplete, tmp_path / "d")


def test_import_gguf_command_and_generation_from_the_folder(tiny_gguf, tmp_path):
    from ragrl.llm.backend import SamplingParams
    from ragrl.llm.hf_backend import TransformersBackend

    path, _, _ = tiny_gguf
    out = tmp_path / "model"
    result = CliRunner().invoke(app, ["model", "import-gguf", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "LlamaForCausalLM: " in result.stdout and "chat template yes" in result.stdout
    again = CliRunner().invoke(app, ["model", "import-gguf", str(path), "--out", str(out), "--force"])
    assert again.exit_code == 0, again.output
    backend = TransformersBackend(str(out), device="cpu")
    prompt = backend.tokenizer("<|im_start|>user\nhi<|im_end|>\n").input_ids
    [generation] = backend.generate([prompt], SamplingParams(max_new_tokens=5, temperature=0.0))
    assert 1 <= len(generation.token_ids) <= 5


REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = Path(
    os.environ.get("RAGRL_SMOLLM2_GGUF", REPO / "models" / ".download" / "SmolLM2-135M-Instruct.Q4_1.gguf")
)


@pytest.mark.slow
@pytest.mark.skipif(not SMOLLM2.is_file(), reason=f"{SMOLLM2} not found (make smollm2 fetches it)")
def test_the_real_smollm2_file_imports_and_answers_from_a_passage(tmp_path):
    from ragrl.llm.backend import SamplingParams
    from ragrl.llm.chat import encode_messages
    from ragrl.llm.hf_backend import TransformersBackend

    manifest = import_gguf(SMOLLM2, tmp_path / "smollm2")
    assert manifest["sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert manifest["parameters"] == 134_515_008 and manifest["vocab_size"] == 49_152
    backend = TransformersBackend(str(tmp_path / "smollm2"), device="cpu")
    messages = [
        {"role": "user", "content": "Passage: Zorvex was founded by Ana Lind in 1987.\nWho founded Zorvex?"}
    ]
    prompt = encode_messages(messages, backend.tokenizer)  # the chat template, as every protocol encodes
    assert backend.tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
    [generation] = backend.generate([prompt], SamplingParams(max_new_tokens=16, temperature=0.0))
    assert "Ana Lind" in backend.tokenizer.decode(generation.token_ids)
