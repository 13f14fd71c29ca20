"""The closed-book retriever: every search finds nothing.

Evaluating a policy with it (``ragrl eval --closed-book``, the demo's control) measures what the policy
answers from its weights alone; the gap to the same policy with a real retriever is what it gains by
searching and reading.
"""

from __future__ import annotations

from pathlib import Path

from ragrl.errors import RagrlError
from ragrl.retrieval.base import Hit, check_k


class NullRetriever:
    """A retriever with an empty corpus (``fingerprint`` ``"closed-book"``)."""

    fingerprint = "closed-book"

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        check_k(k)
        return [[] for _ in queries]

    def save(self, directory: str | Path) -> None:
        raise RagrlError(f"{directory}: the closed-book retriever has no index to save")
