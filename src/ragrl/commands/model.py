"""`ragrl model ...`: build the tiny local policy, import a GGUF checkpoint."""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path

import typer

from ragrl.console import console

app = typer.Typer(help="Build and inspect policy models.", no_args_is_help=True)


@app.command()
def tiny(
    data: Path = typer.Option(
        ..., "--data", "-d", help="Folder of canonical question and corpus *.jsonl files."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="New (or empty) folder for the model and tokenizer."),
    seed: int = typer.Option(0, "--seed", help="Seed of the weight initialization."),
    tokenizer: str = typer.Option("word", "--tokenizer", help="word (small vocab, short sequences) or bpe."),
    hidden: int = typer.Option(128, "--hidden", help="Hidden size."),
    layers: int = typer.Option(4, "--layers", help="Number of transformer layers."),
    heads: int = typer.Option(4, "--heads", help="Attention heads (hidden must be divisible by heads)."),
    intermediate: int = typer.Option(None, "--intermediate", help="MLP size (default 3 x hidden)."),
    vocab_size: int = typer.Option(8192, "--vocab-size", help="Largest vocabulary, tags included."),
    copy_steps: int = typer.Option(
        0,
        "--copy-steps",
        help="At most this many copy (induction) pre-training steps on random words, then 150 on long "
        "sequences (0: none; at the default shape the first phase stopped after 773-811 steps, and both "
        "phases took ~110 s).",
    ),
) -> None:
    """Train a tokenizer on DIR's texts and save a tiny Llama policy that loads like any checkpoint."""
    from ragrl.llm.tiny import CopyPretraining, TinyConfig, create_tiny_policy, read_tiny_info
    from ragrl.methods import vocabulary_texts

    config = TinyConfig(hidden=hidden, layers=layers, heads=heads, intermediate=intermediate or 3 * hidden)
    started = time.perf_counter()
    # the copy stage shows its own progress bar (rich allows one live display at a time)
    with console.status("building the tiny policy") if not copy_steps else nullcontext():
        path = create_tiny_policy(
            data, out, seed=seed, kind=tokenizer, vocab_size=vocab_size, config=config,
            copy=CopyPretraining(steps=copy_steps), extra_texts=vocabulary_texts(),
        )  # fmt: skip
    info = read_tiny_info(path) or {}
    typer.echo(f"parameters: {info.get('parameters', 0):,}")
    typer.echo(f"vocab size: {info.get('vocab_size')} ({tokenizer}, unk rate {info.get('unk_rate', 0):.2%})")
    if info.get("copy_pretraining"):
        c = info["copy_pretraining"]
        typer.echo(
            f"copy pre-training: {c['steps']} + {c['long_steps']} steps, copy accuracy at distance "
            f"20 / 80 / 200: {c['copy_accuracy@20']:.2f} / {c['copy_accuracy@80']:.2f} / "
            f"{c['copy_accuracy@200']:.2f} ({c['seconds']} s)"
        )
    typer.echo(f"saved to:   {path}  ({time.perf_counter() - started:.1f} s)")


@app.command("import-gguf")
def import_gguf_command(
    gguf_file: Path = typer.Argument(..., metavar="FILE", help="A GGUF checkpoint transformers can read."),
    out: Path = typer.Option(..., "--out", "-o", help="The model folder to write."),
    dtype: str = typer.Option("float32", "--dtype", help="Weights dtype: float32, bfloat16 or float16."),
    force: bool = typer.Option(False, "--force", help="Replace an existing folder."),
) -> None:
    """Turn a GGUF checkpoint into an ordinary model folder (safetensors, tokenizer, chat template and a
    manifest with the source file's sha256) that every command loads with --model DIR."""
    from ragrl.llm.gguf import import_gguf

    with console.status(f"importing {gguf_file}"):
        manifest = import_gguf(gguf_file, out, dtype=dtype, force=force)
    typer.echo(
        f"{manifest['model_class']}: {manifest['parameters']:,} parameters ({manifest['dtype']}), "
        f"vocab {manifest['vocab_size']:,}, chat template {'yes' if manifest['chat_template'] else 'no'}"
    )
    typer.echo(f"source sha256 {manifest['sha256']}")
    typer.echo(f"saved to: {out}  ({manifest['seconds']} s)")
