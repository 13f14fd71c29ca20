"""`ragrl data ...` commands. (Owned by the data loaders work; placeholder until it lands.)"""

import typer

app = typer.Typer(help="Convert, inspect and generate datasets.", no_args_is_help=True)
