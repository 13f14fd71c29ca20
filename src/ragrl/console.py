"""One place for terminal output: a rich console on stderr for progress and messages, so stdout stays
clean for machine-readable results (JSON, jsonl)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.text import Text

T = TypeVar("T")

# Messages carry user text (paths, ids, JSON snippets): no markup parsing (a "[title, sentences]" would
# vanish), no highlighting, and no hard wrapping (a piped path must stay on one line). Styled parts are
# built with rich.text.Text.
console = Console(stderr=True, markup=False, highlight=False, soft_wrap=True)


def styled(label: str, style: str, message: str) -> Text:
    """``label`` in ``style`` followed by ``message`` verbatim (``styled("error:", "bold red", str(e))``)."""
    return Text.assemble((label, style), " ", message)


def quiet_libraries() -> None:
    """Keep library noise out of the user's terminal: transformers' and huggingface_hub's progress bars
    (weight loading, "Writing model shards") and their info/warning logs, DeepSpeed's warnings, and
    accelerate's "Removed shared tensor" notes on checkpoints of tied-embedding models. Errors still
    show. Call it again after transformers is imported to switch its progress bars off too."""
    import logging
    import os
    import sys

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # read when transformers is imported
    for name in ("accelerate", "transformers", "huggingface_hub", "sentence_transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # DeepSpeed (where installed, accelerate imports it to unwrap a model) sets its logger's level when
    # imported, so a filter: its warnings ("Setting accelerator to CPU" on every CPU run) stay out
    deepspeed = logging.getLogger("DeepSpeed")
    if not any(getattr(f, "ragrl", False) for f in deepspeed.filters):
        errors_only = logging.Filter()
        errors_only.filter = lambda record: record.levelno >= logging.ERROR  # type: ignore[method-assign]
        errors_only.ragrl = True  # type: ignore[attr-defined]
        deepspeed.addFilter(errors_only)
    if "transformers" in sys.modules:  # never import it here: every command would start seconds slower
        transformers = sys.modules["transformers"]
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()


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
