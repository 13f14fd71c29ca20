"""One place for terminal output: a rich console on stderr for progress and messages, so stdout stays
clean for machine-readable results (JSON, jsonl)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

T = TypeVar("T")

console = Console(stderr=True)


def progress(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate with a progress bar on stderr (hidden when stderr is not a terminal)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(description, total=total)
        for item in items:
            yield item
            bar.advance(task)


def progress_bar(*, disable: bool = False) -> Progress:
    """A rich progress bar on stderr for a loop that updates it by hand (``with progress_bar() as bar``);
    hidden when stderr is not a terminal."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    return Progress(*columns, console=console, disable=disable or not console.is_terminal)
