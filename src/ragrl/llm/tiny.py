"""The tiny policy: a Llama-architecture causal LM of a few million parameters with a tokenizer
trained locally on the project's own data.

It exists so every path (rollout, training, evaluation, the demo, the tests) runs on a laptop CPU with
the same code that runs a 7B Qwen/Llama: it is saved with ``save_pretrained`` and loads with
``AutoTokenizer.from_pretrained`` / ``AutoModelForCausalLM.from_pretrained`` like any checkpoint, and
its prompts go through ``tokenizer.apply_chat_template`` exactly like an instruct model's. Nothing
downstream may special-case it.

Tokenizer choices (see ``docs/models.md``):

``word`` (default)
    A word-level vocabulary over a pre-tokenizer that splits letters runs, single digits, single
    punctuation marks and whitespace, GPT-2 style: a word keeps its leading space (``" Labs"``), so
    decoding is plain concatenation and text made of in-vocabulary pieces round-trips exactly. Small
    vocabulary, short sequences (one token per word); a word outside the vocabulary becomes
    ``<|unk|>`` (digits, ASCII punctuation and common whitespace are always in the vocabulary, so
    every number can be written).
``bpe``
    Byte-level BPE (digits split individually): every string round-trips exactly, at the cost of
    longer sequences for the same vocabulary size.

Protocol tags (``<search>``, ``</answer>``, ``<backtrack/>`` ...) are *added tokens* that are not
special: each is exactly one id, it survives ``decode(..., skip_special_tokens=True)``, and it is
never split by the pre-tokenizer (a plain whitespace/punctuation pre-tokenizer would cut
``<search>`` into ``<``, ``search``, ``>``). Pad, BOS, end-of-turn (= EOS), UNK and the chat-role
markers are special tokens.
"""

from __future__ import annotations

import hashlib
import json
import string
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from ragrl.errors import RagrlError
from ragrl.llm.copy_pretrain import CopyPretraining, copy_pretrain

TokenizerKind = Literal["word", "bpe"]
TOKENIZER_KINDS: tuple[str, ...] = ("word", "bpe")

PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|bos|>"
EOT_TOKEN = "<|eot|>"
"""End of turn; the tokenizer's and the model's EOS."""
UNK_TOKEN = "<|unk|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOT_TOKEN, UNK_TOKEN, *ROLE_TOKENS.values())

DEFAULT_TAGS: tuple[str, ...] = (
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
    "<answer>",
    "</answer>",
    "<evaluate>",
    "</evaluate>",
    "<relevance>",
    "</relevance>",
    "<analysis>",
    "</analysis>",
    "<base-Q>",
    "</base-Q>",
    "<predicted-Q>",
    "</predicted-Q>",
    "<backtrack/>",
    "<refuse/>",
)
"""Every method's protocol tags (Search-R1, ARENA, Eval-RAR, TIRESRAG-R1, R²AG, EVO-RAG)."""

# Llama-3 / Qwen style: the template writes BOS itself (encoding plain text adds nothing), each turn
# is ``<|role|>\n{content}<|eot|>\n``, and the generation prompt opens an assistant turn. The model
# ends its turn with <|eot|>, the EOS, so generation stops there.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{- raise_exception('the tiny policy knows the roles system, user and assistant, not ' "
    "+ message['role']) -}}"
    "{%- endif -%}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|eot|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)

# Letter runs, single digits, single punctuation marks, each with an optional leading space;
# whitespace runs leave their last space to the next piece (GPT-2's ``\s+(?!\S)`` trick).
WORD_PATTERN = r" ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]|\s+(?!\S)|\s+"
_BASE_PIECES: tuple[str, ...] = tuple(
    dict.fromkeys(
        [" ", "  ", "\n", "\n\n", "\t"]
        + [p for c in string.digits + string.punctuation for p in (c, " " + c)]
    )
)
"""Always in a word-level vocabulary, whatever the corpus: whitespace, digits and punctuation."""

DEFAULT_VOCAB_SIZE = 8192

# Text that is always part of the tokenizer's training data, so the words of typical instructions
# are in a word-level vocabulary even when the corpus never uses them.
_INSTRUCTION_TEXT = """\
Answer the question below. Think step by step, and search for a fact whenever one is missing. The
passages found are shown to you; read them, evaluate whether they are useful, and search again if you
need more. When you are sure, give only the short final answer. Which documents are relevant? List
the relevant passage ids, analyze them, then answer. Reflect on the answer and revise it if it is
wrong. Rewrite the query, go back to a previous step, or refuse to answer when the evidence is not
enough. I need to find out who, what, where, when, which and how. I found it. So the answer is this.
The documents do not contain the fact I need. Next I need the first one. To answer this I first need
the second. Passage Document Doc Title Context Step Sub-question Question Answer Yes No yes no unknown
"""


def _require_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as e:  # pragma: no cover - tokenizers comes with transformers
        raise RagrlError(
            "the tiny policy needs the 'tokenizers' package (installed with transformers)"
        ) from e
    return tokenizers


def _word_pre_tokenizer() -> Any:
    tk = _require_tokenizers()
    return tk.pre_tokenizers.Split(tk.Regex(WORD_PATTERN), behavior="isolated")


def _train_word(texts: Iterable[str], vocab_size: int, reserved: int) -> Any:
    """A word-level vocabulary in which every word comes in both forms, bare (``Who`` at the start of
    a text or after a tag) and with its leading space (`` Who`` inside a sentence), so a word the
    corpus only ever showed in one position is not unknown in the other."""
    tk = _require_tokenizers()
    pre = _word_pre_tokenizer()
    counts: Counter[str] = Counter()
    for text in texts:
        for piece, _ in pre.pre_tokenize_str(text):
            word = piece[1:] if piece.startswith(" ") else piece
            if word and word[0].isalpha():
                counts[word] += 1
    budget = max(vocab_size - reserved, len(SPECIAL_TOKENS) + len(_BASE_PIECES))
    vocab: dict[str, int] = {}
    for piece in (*SPECIAL_TOKENS, *_BASE_PIECES):
        vocab.setdefault(piece, len(vocab))
    for word, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(vocab) + 2 > budget:
            break
        vocab.setdefault(word, len(vocab))
        vocab.setdefault(" " + word, len(vocab))
    tok = tk.Tokenizer(tk.models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = _word_pre_tokenizer()
    tok.decoder = tk.decoders.Fuse()
    return tok


def _train_bpe(texts: Iterable[str], vocab_size: int, reserved: int) -> Any:
    tk = _require_tokenizers()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [
            tk.pre_tokenizers.Digits(individual_digits=True),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=max(vocab_size - reserved, 256 + len(SPECIAL_TOKENS)),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def train_tokenizer(
    texts: Iterable[str],
    *,
    kind: TokenizerKind = "word",
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    special_tags: Sequence[str] = DEFAULT_TAGS,
) -> Any:
    """Train a tokenizer on ``texts`` and return it as a ``PreTrainedTokenizerFast`` with the chat
    template, pad/bos/eos/unk tokens set. ``vocab_size`` counts every token, tags included (a
    word-level vocabulary is smaller when the texts have fewer distinct pieces)."""
    tk = _require_tokenizers()
    from transformers import PreTrainedTokenizerFast

    if kind not in TOKENIZER_KINDS:
        raise RagrlError(f"unknown tokenizer kind {kind!r}; expected one of {', '.join(TOKENIZER_KINDS)}")
    tags = list(dict.fromkeys(special_tags))
    clash = [t for t in tags if t in SPECIAL_TOKENS]
    if clash:
        raise RagrlError(f"tags {clash} clash with the tokenizer's special tokens")
    reserved = len(tags) + (0 if kind == "bpe" else len(SPECIAL_TOKENS))
    if vocab_size < 2 * reserved + (len(_BASE_PIECES) if kind == "word" else 256):
        raise RagrlError(f"vocab_size {vocab_size} is too small for a {kind} tokenizer with {len(tags)} tags")

    def all_texts() -> Iterator[str]:
        yield _INSTRUCTION_TEXT
        yield from texts

    train = _train_word if kind == "word" else _train_bpe
    tok = train(all_texts(), vocab_size, reserved)
    # Special tokens are matched before pre-tokenization and skipped by skip_special_tokens; tags
    # are matched the same way but are not special, so they stay in decoded text.
    tok.add_special_tokens([tk.AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([tk.AddedToken(t, special=False, normalized=False) for t in tags])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOT_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=list(ROLE_TOKENS.values()),
        clean_up_tokenization_spaces=False,
        model_max_length=TinyConfig.max_position_embeddings,
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@dataclass(frozen=True)
class TinyConfig:
    """Shape of the tiny Llama. The defaults give about 1.9M parameters at an 8192-token vocabulary
    with tied embeddings (2.9M untied); see ``docs/models.md``."""

    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int | None = None
    """Key/value heads (grouped-query attention); None = ``heads``."""
    intermediate: int = 384
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        for name in ("hidden", "layers", "heads", "intermediate", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise RagrlError(f"tiny model: {name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise RagrlError(f"tiny model: hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if (self.hidden // self.heads) % 2:
            raise RagrlError(
                f"tiny model: head size hidden/heads = {self.hidden // self.heads} must be even (RoPE)"
            )
        kv = self.kv_heads or self.heads
        if kv < 1 or self.heads % kv:
            raise RagrlError(f"tiny model: heads ({self.heads}) must be divisible by kv_heads ({kv})")


def build_tiny_model(tokenizer: Any, config: TinyConfig | None = None, *, seed: int = 0) -> Any:
    """A freshly initialized ``LlamaForCausalLM`` for ``tokenizer``'s vocabulary; the same seed gives
    the same weights (the global torch RNG is left untouched)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = config or TinyConfig()
    llama_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden,
        intermediate_size=config.intermediate,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.kv_heads or config.heads,
        max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta,
        tie_word_embeddings=config.tie_embeddings,
        initializer_range=config.initializer_range,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        attention_bias=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(llama_config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.eval()
    return model


def count_parameters(model: Any) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())


def weights_hash(model: Any) -> str:
    """SHA-256 over the state dict (names, shapes and float32 values, in name order)."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(str(tuple(tensor.shape)).encode())
        h.update(tensor.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def _sniff_kind(path: Path) -> str | None:
    """'questions' or 'corpus' from the first record of a jsonl file, None if it is neither or not
    JSON (a file that is not UTF-8 text, or compressed, is an error naming the file and line)."""
    from ragrl.data.io import iter_jsonl
    from ragrl.errors import DataError

    for _, record in iter_jsonl(path, on_error="yield"):
        if isinstance(record, DataError):
            if record.message.startswith("invalid JSON"):
                return None
            raise record
        if isinstance(record, dict) and "question" in record:
            return "questions"
        if isinstance(record, dict) and ("contents" in record or "text" in record):
            return "corpus"
        return None
    return None


def collect_texts(data: str | Path | Sequence[str | Path]) -> tuple[list[str], dict[str, list[str]]]:
    """Texts to train the tokenizer on, from canonical question and corpus files: a directory (every
    ``*.jsonl`` in it, sorted) or a list of files. Returns the texts and ``{"questions": [...],
    "corpus": [...]}`` naming the files used."""
    from ragrl.data.io import read_corpus, read_examples

    if isinstance(data, str | Path):
        root = Path(data)
        if not root.exists():
            raise RagrlError(f"{root}: no such directory")
        if not root.is_dir():
            raise RagrlError(f"{root}: is a file, expected a directory of canonical jsonl files")
        files = sorted(root.glob("*.jsonl"))
        if not files:
            raise RagrlError(f"{root}: no *.jsonl files (expected canonical question and corpus files)")
    else:
        files = [Path(f) for f in data]
        for f in files:
            if not f.is_file():
                raise RagrlError(f"{f}: no such file")
        if not files:
            raise RagrlError("no data files given")
    texts: list[str] = []
    seen_passages: set[str] = set()
    sources: dict[str, list[str]] = {"questions": [], "corpus": []}
    for f in files:
        kind = _sniff_kind(f)
        if kind == "questions":
            examples, _ = read_examples(f)
            for ex in examples:
                texts.append(ex.question)
                texts.extend(ex.answers)
                for step in ex.decomposition or ():
                    texts.append(step.question)
                    texts.extend(step.answers)
                for p in ex.passages or ():
                    if p.id not in seen_passages:
                        seen_passages.add(p.id)
                        texts.append(p.contents)
        elif kind == "corpus":
            passages, _ = read_corpus(f)
            for p in passages:
                if p.id not in seen_passages:
                    seen_passages.add(p.id)
                    texts.append(p.contents)
        else:
            raise RagrlError(
                f"{f}: neither a canonical question file (id, question, golden_answers) nor a corpus "
                "file (id, contents) - its first record has neither 'question' nor 'contents'"
            )
        sources[kind].append(str(f))
    if not sources["questions"] and not sources["corpus"]:
        raise RagrlError("no texts found in the data files")
    return texts, sources


def unk_rate(tokenizer: Any, texts: Sequence[str], *, limit: int = 2000) -> float:
    """Fraction of tokens that are UNK over (at most ``limit`` of) ``texts``."""
    sample = list(texts[:limit])
    if not sample:
        return 0.0
    encodings = tokenizer._tokenizer.encode_batch(sample, add_special_tokens=False)
    total = sum(len(e.ids) for e in encodings)
    unk = sum(e.ids.count(tokenizer.unk_token_id) for e in encodings)
    return unk / total if total else 0.0


def create_tiny_policy(
    data: str | Path | Sequence[str | Path],
    out_dir: str | Path,
    *,
    seed: int = 0,
    kind: TokenizerKind = "word",
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    config: TinyConfig | None = None,
    extra_texts: Iterable[str] = (),
    special_tags: Sequence[str] = DEFAULT_TAGS,
    copy: CopyPretraining | None = None,
) -> Path:
    """Train a tokenizer on the texts of ``data`` (see ``collect_texts``) plus ``extra_texts`` (for
    example a method's prompt), build the tiny Llama and save both in ``out_dir`` (which must not
    exist or be empty), with ``ragrl_tiny.json`` recording how it was made. ``copy`` runs the copy
    pre-training stage (``CopyPretraining``) before saving. Returns ``out_dir``."""
    if kind not in TOKENIZER_KINDS:
        raise RagrlError(f"unknown tokenizer kind {kind!r}; expected one of {', '.join(TOKENIZER_KINDS)}")
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RagrlError(f"{out}: already exists and is not an empty directory; choose a new --out")
    config = config or TinyConfig()
    started = time.perf_counter()
    texts, sources = collect_texts(data)
    extra = list(extra_texts)
    tokenizer = train_tokenizer([*extra, *texts], kind=kind, vocab_size=vocab_size, special_tags=special_tags)
    tokenizer.model_max_length = config.max_position_embeddings
    model = build_tiny_model(tokenizer, config, seed=seed)
    copy_report = copy_pretrain(model, tokenizer, copy, seed=seed) if copy and copy.steps > 0 else None
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    portable_tokenizer_config(out)
    model.save_pretrained(out)
    info = {
        "format": "ragrl-tiny/1",
        "seed": seed,
        "tokenizer": kind,
        "vocab_size": len(tokenizer),
        "requested_vocab_size": vocab_size,
        "parameters": count_parameters(model),
        "config": asdict(config),
        "tags": list(dict.fromkeys(special_tags)),
        "sources": sources,
        "texts": len(texts) + len(extra),
        "unk_rate": round(unk_rate(tokenizer, texts), 6),
        "copy_pretraining": copy_report,
        "weights_sha256": weights_hash(model),
        "build_seconds": round(time.perf_counter() - started, 3),
    }
    (out / "ragrl_tiny.json").write_text(
        json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return out


def portable_tokenizer_config(out: Path) -> None:
    """Name the generic fast-tokenizer class (transformers 5 writes ``TokenizersBackend``, unknown to
    4.x; ``PreTrainedTokenizerFast`` loads in both), so ``AutoTokenizer`` never swaps in a
    model-specific class (e.g. LlamaTokenizer) that would rebuild the pipeline from the vocabulary."""
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def read_tiny_info(model_dir: str | Path) -> dict[str, Any] | None:
    """The ``ragrl_tiny.json`` of a tiny policy, or None for any other checkpoint."""
    path = Path(model_dir) / "ragrl_tiny.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))
