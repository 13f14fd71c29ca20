"""Backends driven by Python code instead of a model: for tests, demos and demonstration data.

``ScriptedBackend(tokenizer, policy_fn)``: ``policy_fn(prompt_ids, index) -> str`` writes the next turn
(``index`` is the row in the current batch). The text is cut the way a model's generation would be,
then encoded once and returned with log-probs 0.0:

* at the end of the first stop string it contains → ``finish_reason "stop"``;
* at the first EOS / ``stop_token_ids`` token of its encoding, if that comes earlier → ``"eos"``;
  text with neither gets the tokenizer's EOS appended (a model that is done stops with EOS) →
  ``"eos"``; a tokenizer without EOS gives ``"length"``;
* to ``max_new_tokens`` tokens → ``"length"`` (this wins over the two above when it cuts first).

``DemonstratorBackend`` drives an object with ``next_turn(example, history) -> str`` through the real
engine: it recognises the example by its prompt ids (a prefix of every prompt the engine sends) and
rebuilds the history from what it generated before and the observation tokens the engine appended
since. The history is typed (``Turn``, oldest first): the demonstrator's own text, the observation, the
action the *protocol* parsed from the text (the one tag reader), and the passages a search retrieved
(looked up again with the engine's retriever and ``k``, which returns the same hits): a demonstrator
never re-parses text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ragrl.data.schema import Example, Passage
from ragrl.errors import RagrlError
from ragrl.llm.backend import Generation, SamplingParams
from ragrl.rollout.trajectory import Action

PolicyFn = Callable[[list[int], int], str]


def scripted_generation(tokenizer: Any, text: str, params: SamplingParams) -> tuple[Generation, str]:
    """Turn a turn's text into a ``Generation`` as a model would have produced it (see module doc).

    Returns the generation and the text that was kept (before encoding)."""
    stop_at: int | None = None
    stop_str: str | None = None
    for s in params.stop:
        if not s:
            continue
        i = text.find(s)
        if i >= 0 and (stop_at is None or i + len(s) < stop_at):
            stop_at, stop_str = i + len(s), s
    kept = text[:stop_at] if stop_at is not None else text
    ids = list(tokenizer.encode(kept, add_special_tokens=False))
    finish: str = "stop" if stop_str is not None else "length"
    stop: str | int | None = stop_str

    eos = getattr(tokenizer, "eos_token_id", None)
    enders = set(params.stop_token_ids) | ({eos} if eos is not None else set())
    for j, t in enumerate(ids):
        if t in enders:
            ids, finish, stop = ids[: j + 1], ("eos" if t == eos else "stop"), t
            break
    else:
        if stop_str is None and eos is not None:
            ids, finish, stop = [*ids, eos], "eos", eos
    if len(ids) > params.max_new_tokens:
        ids, finish, stop = ids[: params.max_new_tokens], "length", None
    gen = Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=finish, stop=stop)  # type: ignore[arg-type]
    return gen, kept


class ScriptedBackend:
    """A ``GenerationBackend`` whose "model" is ``policy_fn(prompt_ids, index) -> str``."""

    def __init__(self, tokenizer: Any, policy_fn: PolicyFn) -> None:
        self.tokenizer = tokenizer
        self.policy_fn = policy_fn
        self.calls: list[tuple[int, SamplingParams]] = []
        """One entry per ``generate`` call: (batch size, params)."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        self.calls.append((len(prompts), params))
        out = []
        for i, prompt in enumerate(prompts):
            gen, _ = scripted_generation(self.tokenizer, self.policy_fn(list(prompt), i), params)
            out.append(gen)
        return out


@dataclass
class Turn:
    """One earlier turn of a demonstrator's episode, as the engine played it."""

    text: str
    """What the demonstrator wrote (cut at the stop string, as a model's generation would be)."""
    observation: str
    """What the environment appended after it (empty when nothing was)."""
    action: Action
    """The protocol's parse of ``text``."""
    passages: list[Passage] = field(default_factory=list)
    """What a search retrieved, in rank order (empty for other actions or without a retriever)."""


class Demonstrator(Protocol):
    def next_turn(self, example: Example, history: list[Turn]) -> str: ...


class DemonstratorBackend:
    """Drives a ``Demonstrator`` through ``RolloutEngine`` (for demonstration / SFT data and tests).

    ``examples_by_prompt`` maps each example's prompt ids (as a tuple) to the example; build it with
    ``DemonstratorBackend.for_examples(tokenizer, demonstrator, examples, protocol)``. Observation text
    in the history is the decoding of the observation tokens (exact for byte-level tokenizers).
    """

    def __init__(
        self,
        tokenizer: Any,
        demonstrator: Demonstrator,
        examples_by_prompt: Mapping[tuple[int, ...], Example],
        protocol: Any,
        retriever: Any = None,
        k: int = 3,
    ) -> None:
        self.tokenizer = tokenizer
        self.demonstrator = demonstrator
        self.protocol, self.retriever, self.k = protocol, retriever, k
        self._hits: dict[str, list[Passage]] = {}
        self._by_len: dict[int, dict[tuple[int, ...], Example]] = {}
        for key, ex in examples_by_prompt.items():
            self._by_len.setdefault(len(key), {})[tuple(key)] = ex
        # (prompt + generated tokens) -> (example, history before the turn, the turn's kept text)
        self._after: dict[int, dict[tuple[int, ...], tuple[Example, list[Turn], str]]] = {}
        self.calls = 0

    @classmethod
    def for_examples(
        cls,
        tokenizer: Any,
        demonstrator: Demonstrator,
        examples: Iterable[Example],
        protocol: Any,
        retriever: Any = None,
        k: int = 3,
    ) -> DemonstratorBackend:
        """The backend for ``examples`` played with ``protocol``; pass the rollout's retriever and ``k``
        so that the history carries the passages each search retrieved."""
        table: dict[tuple[int, ...], Example] = {}
        for ex in examples:
            key = tuple(protocol.prompt_ids(ex, tokenizer))
            other = table.get(key)
            if other is not None and other.id != ex.id:
                raise RagrlError(f"examples {other.id!r} and {ex.id!r} have the same prompt")
            table[key] = ex
        return cls(tokenizer, demonstrator, table, protocol, retriever, k)

    def _longest_prefix(
        self, table: dict[int, dict[tuple[int, ...], Any]], prompt: list[int]
    ) -> tuple[int, Any] | None:
        for n in sorted(table, reverse=True):
            if n <= len(prompt):
                hit = table[n].get(tuple(prompt[:n]))
                if hit is not None:
                    return n, hit
        return None

    def _turn(self, text: str, observation: str, index: int) -> Turn:
        action = self.protocol.safe_parse(text, index)
        passages: list[Passage] = []
        if self.retriever is not None and self.protocol.is_search(action) and action.content:
            if action.content not in self._hits:
                (hits,) = self.retriever.search([action.content], self.k)
                self._hits[action.content] = [h.passage for h in hits]
            passages = self._hits[action.content]
        return Turn(text, observation, action, passages)

    def _state(self, prompt: list[int]) -> tuple[Example, list[Turn]]:
        found = self._longest_prefix(self._after, prompt)
        if found is not None:
            n, (ex, history, text) = found
            obs = self.tokenizer.decode(prompt[n:], skip_special_tokens=False)
            return ex, [*history, self._turn(text, obs, len(history))]
        start = self._longest_prefix(self._by_len, prompt)
        if start is None or start[0] != len(prompt):
            raise RagrlError(
                "DemonstratorBackend: a prompt matches no known example "
                "(was it built with the same protocol and tokenizer?)"
            )
        return start[1], []

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        self.calls += 1
        out = []
        for prompt in prompts:
            prompt = list(prompt)
            ex, history = self._state(prompt)
            gen, _ = scripted_generation(self.tokenizer, self.demonstrator.next_turn(ex, history), params)
            key = tuple(prompt + gen.token_ids)
            # the turn as the engine sees it: the decoded tokens (cut, unknown words and all)
            text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=False)
            self._after.setdefault(len(key), {})[key] = (ex, history, text)
            out.append(gen)
        return out
