"""The ``ragrl`` command line. Each sub-package owns its commands; this file only mounts them.

Errors caused by the user's input (``RagrlError``) are printed as one clear line and exit with
status 2, never as a traceback.
"""

from __future__ import annotations

import sys

import click
import typer

from ragrl.console import console
from ragrl.data.cli import app as data_app
from ragrl.errors import RagrlError
from ragrl.metrics.cli import score
from ragrl.retrieval.cli import index, search

app = typer.Typer(
    name="ragrl",
    help="Train and evaluate retrieval-augmented reasoning agents with reinforcement learning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(data_app, name="data")
app.command("score")(score)
app.command("index")(index)
app.command("search")(search)


def main(argv: list[str] | None = None) -> None:
    try:
        rv = app(args=argv, standalone_mode=False)
    except RagrlError as e:
        console.print(f"[bold red]error:[/] {e}", highlight=False, markup=True)
        sys.exit(2)
    except click.exceptions.Abort:
        console.print("aborted")
        sys.exit(130)
    except click.exceptions.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    if isinstance(rv, int):
        sys.exit(rv)


if __name__ == "__main__":
    main()
