"""Stop strings in a generation, found as each token arrives (the transformers backend's decoding loop)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class StopMatcher:
    """Finds a stop string completed by the newest token, decoding only the tail of the generation.

    The tail window is decoded with and without its last token; a stop string counts when it is in
    the former and not in the latter (both decodes start at the same token, so a decoding artefact at
    the window start cannot create a match on its own).
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        longest = max((len(s) for s in self.stops), default=0)
        # A character can take up to 4 byte-level tokens; a few more for tokens that decode to "".
        self.window = 4 * longest + 4
        # Fast path: a stop string can only be completed by a token whose own text holds the stop
        # string's last character (or that decodes to nothing readable on its own, e.g. part of a
        # multi-byte character). Not used when a stop string ends in whitespace, which decoders move.
        self.last_chars = {s[-1] for s in self.stops}
        self.fast = not any(c.isspace() for c in self.last_chars)
        self._pieces: dict[int, str] = {}

    def _could_complete(self, token: int) -> bool:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self.tokenizer.decode([token], skip_special_tokens=False)
        return not piece or "\ufffd" in piece or any(c in piece for c in self.last_chars)

    def __call__(self, ids: Sequence[int]) -> str | None:
        if not self.stops or not ids:
            return None
        if self.fast and not self._could_complete(int(ids[-1])):
            return None
        tail = list(ids[-self.window :])
        text = self.tokenizer.decode(tail, skip_special_tokens=False)
        hits = [(text.find(s), i) for i, s in enumerate(self.stops) if s in text]
        if not hits:
            return None
        before = self.tokenizer.decode(tail[:-1], skip_special_tokens=False) if len(tail) > 1 else ""
        hits = [(pos, i) for pos, i in hits if self.stops[i] not in before]
        if not hits:
            return None
        return self.stops[min(hits)[1]]
