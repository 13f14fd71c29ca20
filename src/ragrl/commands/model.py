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


@app.command()
def reader(
    out: Path = typer.Option(None, "--out", "-o", help="Folder for the base (default: the shipped one's)."),
    worlds: int = typer.Option(16, "--worlds", help="Pretraining worlds."),
    first_seed: int = typer.Option(1000, "--first-seed", help="Seed of the first pretraining world."),
    steps: int = typer.Option(2000, "--steps", help="Reading SFT steps."),
    batch_size: int = typer.Option(32, "--batch-size", help="Demonstrations per SFT step."),
    lr: float = typer.Option(1e-3, "--lr", help="SFT learning rate."),
    hidden: int = typer.Option(128, "--hidden", help="Hidden size."),
    layers: int = typer.Option(4, "--layers", help="Transformer layers."),
    heads: int = typer.Option(4, "--heads", help="Attention heads."),
    vocab_size: int = typer.Option(8192, "--vocab-size", help="BPE vocabulary, tags included."),
    copy_steps: int = typer.Option(1500, "--copy-steps", help="At most this many copy pre-training steps."),
    seed: int = typer.Option(0, "--seed", help="Seed of the weights and the SFT order."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --out."),
    also: list[str] = typer.Option(
        [],
        "--also",
        help="A method config whose grammar the base also reads in (repeatable: arena-tiny).",
    ),
    init: str | None = typer.Option(
        None,
        "--init",
        help="Continue from this reader base ('shipped' or a folder): no new tokenizer or copy steps.",
    ),
    set_: list[str] = typer.Option([], "--set", help="Override of the reading SFT's config (k=v)."),
) -> None:
    """Build the pretrained reader base: a tiny policy taught to read on other synthetic worlds
    (docs/models.md). The shipped base is `make reader-base`."""
    import shlex
    import sys

    from ragrl.train.reader import SHIPPED_BASE, ReaderRecipe, pretrain_reader

    recipe = ReaderRecipe(
        worlds=worlds, first_seed=first_seed, steps=steps, batch_size=batch_size, lr=lr, hidden=hidden,
        layers=layers, heads=heads, intermediate=3 * hidden, vocab_size=vocab_size, copy_steps=copy_steps,
        seed=seed, also=tuple(also), init=init,
    )  # fmt: skip
    command = "ragrl " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    manifest = pretrain_reader(out or SHIPPED_BASE, recipe, overrides=set_, force=force, command=command)
    v = manifest["validation"]
    typer.echo(f"parameters: {manifest['parameters']:,}  (vocabulary {manifest['vocab_size']}, BPE)")
    typer.echo(
        f"worlds: {manifest['seeds']}; skipped for a shared fact: {manifest['fairness']['skipped_seeds']}"
    )
    typer.echo(
        f"validation world {manifest['validation_seed']}: EM {v['em']:.3f}, answerable EM "
        f"{v['em_answerable']:.3f}, answerable misses {v['outcomes_answerable']}"
    )
    for config, scores in manifest["validation_also"].items():
        typer.echo(f"  in {config}'s grammar: answerable EM {scores['em_answerable']:.3f}")
    typer.echo(
        f"saved to: {out or SHIPPED_BASE} "
        f"({manifest['wall_seconds']} s, peak {manifest['peak_memory_mb']} MB)"
    )


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
    reader = f"transformers {manifest['transformers']}"
    for name, (read, declared) in manifest["special_tokens_from_file"].items():
        typer.echo(f"{name}: {declared} as the file declares it ({reader} read {read})")
    typer.echo(f"source sha256 {manifest['sha256']}")
    typer.echo(f"saved to: {out}  ({manifest['seconds']} s)")
