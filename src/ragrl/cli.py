"""The ``ragrl`` command line. Each sub-package owns its commands; this file only mounts them.

Errors caused by the user's input (``RagrlError``, and a file-system error about a path the user gave:
``PATH_ERRORS``) are printed as one clear line and exit with status 2, never as a traceback.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Annotated, Any

import typer

from ragrl.commands import CONFIG_EPILOG
from ragrl.commands.analyze import analyze_thinking_command
from ragrl.commands.ask import ask
from ragrl.commands.data import app as data_app
from ragrl.commands.eval import eval_command
from ragrl.commands.index import index
from ragrl.commands.model import app as model_app
from ragrl.commands.retrieval import search, serve
from ragrl.commands.reward import reward_command
from ragrl.commands.score import aggregate, compare, score
from ragrl.commands.train import demo, dpo, reward_model, sft, train
from ragrl.console import console, quiet_libraries, styled
from ragrl.errors import RagrlError

app = typer.Typer(
    name="ragrl",
    help="Train and evaluate retrieval-augmented reasoning agents with reinforcement learning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[
        bool, typer.Option("--version", help="Print the ragrl version and exit.", is_eager=True)
    ] = False,
) -> None:
    if version:
        from ragrl import __version__

        typer.echo(f"ragrl {__version__}")
        raise typer.Exit()


app.add_typer(data_app, name="data")
app.add_typer(model_app, name="model")
app.command("score")(score)
app.command("aggregate")(aggregate)
app.command("compare")(compare)
app.command("index")(index)
app.command("search")(search)
app.command("serve")(serve)
app.command("eval")(eval_command)
app.command("ask")(ask)
app.command("reward")(reward_command)
app.command("analyze-thinking")(analyze_thinking_command)
app.command("train", epilog=CONFIG_EPILOG)(train)
app.command("sft", epilog=CONFIG_EPILOG)(sft)
app.command("dpo", epilog=CONFIG_EPILOG)(dpo)
app.command("reward-model")(reward_model)
app.command("demo")(demo)


PATH_ERRORS = (IsADirectoryError, NotADirectoryError, FileExistsError, PermissionError)
"""File-system errors that are about a path the user gave (a folder where a file is to be written, a file
where a folder is to be made, a path this user may not write), shown as one line naming it. Others (a
missing file ragrl did not check for first, a full disk) keep their traceback."""


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``ragrl`` script: typer/click handle usage errors and exit codes; a
    ``RagrlError`` (bad input) or one of ``PATH_ERRORS`` is printed as one line and exits with status 2."""
    quiet_libraries()
    try:
        app(args=argv)
    except RagrlError as e:
        console.print(styled("error:", "bold red", str(e)))
        _leave(2)
    except PATH_ERRORS as e:
        if not isinstance(e.filename, str | bytes | os.PathLike):  # not a path: a failure to show in full
            _fail()
        console.print(styled("error:", "bold red", path_error(e)))
        _leave(2)
    except SystemExit as e:
        _leave(e.code)
    except BaseException:
        _fail()


def _fail() -> None:
    """The exception being handled, in full (a bug, not bad input): raised again, or in a launched
    process printed before it leaves its group (``_leave``) rather than abort."""
    if _process_group() is None:
        raise  # noqa: PLE0704 - called from the except blocks of main only
    traceback.print_exc()
    _leave(1)


def path_error(e: OSError) -> str:
    """A file-system error as one line naming the path: the target of a rename where there is one (the
    folder in the way of ``os.replace``), rather than the temporary file renamed onto it."""
    path = e.filename2 if e.filename2 is not None else e.filename
    what = {
        IsADirectoryError: "a folder is there, where a file is to be written or read",
        NotADirectoryError: "a part of the path is a file, not a folder",
        FileExistsError: "a file is there, where a folder is to be made",
    }.get(type(e), e.strerror or type(e).__name__)
    return f"{os.fsdecode(path)}: {what}"


def _process_group() -> Any:
    """``torch.distributed`` when this process belongs to an initialized process group, else None."""
    dist = sys.modules.get("torch.distributed")
    return dist if dist is not None and dist.is_available() and dist.is_initialized() else None


def _leave(code: int | str | None) -> None:
    """Exit with ``code``. A process of ``accelerate launch`` / ``torchrun`` exits at once, after leaving
    its process group if the command succeeded: left to the interpreter's teardown, gloo's worker
    threads abort the process now and then (``terminate called without an active exception``, exit
    -6), which turns a finished run into a failed one. Every file the commands write is closed by then."""
    dist = _process_group()
    if dist is None:
        sys.exit(code)
    if code in (0, None):  # after a failure, leave at once: a destroy could wait on a stuck peer
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group must not hide the exit status
            pass
    if isinstance(code, str):
        print(code, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (| head) or a closed stream
            pass
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))


if __name__ == "__main__":
    main()
