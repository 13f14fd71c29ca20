"""The pretrained reader base: a tiny policy that has learned to read before any demo or benchmark runs.

A policy trained from scratch inside the demo's ten minutes does not read new facts, so RL has nothing
to build on (docs/training.md). The papers start from a pretrained LLM that already reads and use RL to
teach it when and what to search and how to answer. This module builds the same shape for the CPU, once:

1. **worlds** — ``worlds`` synthetic worlds with seeds from ``first_seed`` (1000 by default, disjoint from
   the demo's and the benchmarks' seeds). A candidate world is skipped when it states a fact that a
   held-out question of a protected world (seeds ``protected``) needs (``ragrl.synth.fairness
   .cross_world_overlap``): names may recur across worlds, facts that a held-out question needs may not;
2. **tokenizer** — byte-level BPE trained on the pretraining worlds' text and the protocols' wording
   (``ragrl.methods.vocabulary_texts``): it spells any world's names, seen or not, as pieces (about two
   per name word), which a word-level vocabulary cannot;
3. **copy pre-training** (``ragrl.llm.copy_pretrain``), as the demo's policy had;
4. **reading** — SFT on the quoting oracle's demonstrations (``QuotingOracle``: search the entity each
   hop is about, quote the evidence sentence of the passages found, answer; ``unknown`` when the
   evidence was removed) over every question of every pretraining world, each played with its own
   world's BM25 index through the demo's protocol (``ragrl.train.demo.DEMO_CONFIG`` with the demo's
   prompt). Each world's facts are new, so copying from the passages is the only way to its answers;
5. **validation** — greedy evaluation on the held-out questions of one more world of the pretraining
   range (``first_seed + worlds`` onwards, never trained on): what the base reads on a world it never saw.

``pretrain_reader(out, recipe)`` writes an ordinary model folder (``from_pretrained`` loads it) with
``ragrl_reader.json`` (the recipe, the seeds used and skipped, the fairness report, the validation
scores, the wall time, the command that rebuilds it) and ``SHA256SUMS``, the sha256 of every file, which
every load of the folder checks (``ragrl.llm.checksums``).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ragrl.console import console
from ragrl.errors import RagrlError
from ragrl.llm.checksums import file_sha256, write_checksums
from ragrl.llm.environment import environment
from ragrl.train.from_base import base_demonstrator, base_overrides
from ragrl.train.reader_worlds import choose_worlds, world_texts

MANIFEST = "ragrl_reader.json"
FORMAT = "ragrl-reader/1"
SHIPPED_BASE = Path(__file__).resolve().parents[1] / "assets" / "reader-base"
"""Where the shipped reader base lives (``make reader-base`` rebuilds it there)."""


@dataclass
class ReaderRecipe:
    """How a reader base is built (module docstring). The defaults are the shipped base's."""

    worlds: int = 16
    first_seed: int = 1000
    size: str = "small"
    protected: tuple[int, ...] = tuple(range(10))
    """Seeds of the demo's and the benchmarks' worlds: no fact their held-out questions need may be
    stated in a pretraining world."""
    vocab_size: int = 8192
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    intermediate: int = 384
    copy_steps: int = 1500
    steps: int = 2000
    batch_size: int = 32
    lr: float = 1e-3
    seed: int = 0
    validation_questions: int = 100
    also: tuple[str, ...] = ()
    """Method configs whose grammar the base also learns to read in, each played by its own oracle
    around the quoting oracle (``base_demonstrator``) with the base's prompt (``base_overrides``) over
    the same worlds; e.g. ``("arena-tiny", "arena-naive-tiny")``, which read the passages given with a
    question in one reply. Validated on the validation world in each grammar."""
    init: str | None = None
    """A reader-base folder to continue from (its tokenizer and weights, checked against its
    ``SHA256SUMS``): no tokenizer is trained and no copy pre-training runs; ``steps`` more of reading."""

    def __post_init__(self) -> None:
        self.protected = tuple(int(s) for s in self.protected)
        self.also = tuple(str(c) for c in self.also)
        if len(set(self.also)) < len(self.also):
            raise RagrlError(f"reader recipe: also names a config twice: {', '.join(self.also)}")
        for name in ("worlds", "steps", "batch_size", "validation_questions"):
            if getattr(self, name) < 1:
                raise RagrlError(f"reader recipe: {name} must be >= 1, got {getattr(self, name)}")
        if not self.protected:
            raise RagrlError(
                "reader recipe: protected must name the seeds of the worlds the base is tested on"
            )
        if self.first_seed <= max(self.protected):
            raise RagrlError(
                f"reader recipe: first_seed {self.first_seed} must lie above the protected seeds "
                f"({min(self.protected)}-{max(self.protected)}): the pretraining worlds are other worlds"
            )


def distinct_prompts(method: Any, examples: list[Any]) -> list[Any]:
    """The first question of each prompt (a world can ask the same question in two splits, or twice in
    one; a demonstration is played by its prompt)."""
    seen: set[str] = set()
    out = []
    for ex in examples:
        prompt = method.protocol.prompt_text(ex)
        if prompt not in seen:
            seen.add(prompt)
            out.append(ex)
    return out


def reader_method(world_dir: Path, model_dir: Path, recipe: ReaderRecipe, overrides: list[str]) -> Any:
    """The demo's method from a base (its config, prompt and rollout limits: ``demo.base_settings``),
    pointed at one world, with the reading SFT's settings."""
    from ragrl.methods import load_method
    from ragrl.train.demo import DEMO_CONFIG, base_settings

    settings = [s for s in base_settings() if not s.startswith("train.sft.")]
    return load_method(
        DEMO_CONFIG,
        [
            *world_settings(world_dir, model_dir, recipe),
            *settings,
            f"train.sft.batch_size={recipe.batch_size}",
            f"train.sft.lr={recipe.lr}",
            f"train.sft.max_steps={recipe.steps}",
            "train.save_every=0",
            *overrides,
        ],
    )


def world_settings(world_dir: Path, model_dir: Path, recipe: ReaderRecipe) -> list[str]:
    """The overrides that point a method at one pretraining world and the model being trained."""
    return [
        f"train.seed={recipe.seed}",
        f"train.model.path={model_dir}",
        f"train.data.train={world_dir / 'train.jsonl'}",
        f"train.data.index={world_dir / 'bm25'}",
    ]


def grammar_method(
    config: str,
    settings: list[str],
    world_dir: Path,
    model_dir: Path,
    recipe: ReaderRecipe,
    overrides: list[str],
) -> Any:  # noqa: ANN401
    """Method ``config`` as the base reads in it (``settings``: its ``base_overrides``, the token limits
    and the base's prompt), pointed at one world (``ReaderRecipe.also``). Of the reading SFT's overrides
    only the ``train.`` ones apply: the others name the demo's config."""
    from ragrl.methods import load_method

    return load_method(
        config,
        [
            *settings,
            *world_settings(world_dir, model_dir, recipe),
            f"train.sft.world={world_dir / 'world.json'}",
            *(o for o in overrides if o.startswith("train.")),
        ],
    )


def continue_from(folder: str | Path) -> tuple[Any, Any, Path]:
    """The model, tokenizer and folder of the reader base a recipe continues from (``ReaderRecipe.init``),
    checked against its ``SHA256SUMS``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragrl.llm.checksums import verify_checksums

    path = init_folder(folder)
    verify_checksums(path, rebuild="make reader-base")
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path), path


def init_folder(init: str | Path) -> Path:
    """The reader base ``init`` names (``shipped`` or a folder with a manifest)."""
    path = resolve_base(init)
    if path is None:
        raise RagrlError("reader recipe: init must name a reader-base folder or 'shipped', not 'scratch'")
    if not (path / MANIFEST).is_file():
        raise RagrlError(f"reader recipe: init {init}: no {MANIFEST} in {path} (not a reader base)")
    return path


def check_continuation(recipe: ReaderRecipe, seeds: list[int], validation_seed: int, out: Path) -> None:
    """A continued base reads the worlds its start read (or more), at the same size, and its validation
    world is one neither has seen: else the validation score would be read on a world learned by heart.
    It is written elsewhere than its start."""
    assert recipe.init is not None
    path = init_folder(recipe.init)
    if path.resolve() == out.resolve():
        raise RagrlError(f"reader recipe: --out {out} is the base it continues from; choose another --out")
    earlier = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    if not isinstance(earlier.get("seeds"), list) or "recipe" not in earlier:
        raise RagrlError(f"reader recipe: init {recipe.init}: {MANIFEST} names no seeds or recipe")
    size = earlier["recipe"].get("size")
    if size != recipe.size:
        raise RagrlError(
            f"reader recipe: init {recipe.init} read worlds of size {size!r}, this recipe {recipe.size!r}: "
            "the same seeds at another size are other worlds"
        )
    read = set(earlier["seeds"])
    if validation_seed in read or not read <= set(seeds):
        raise RagrlError(
            f"reader recipe: init {recipe.init} read worlds {sorted(read)}; a continuation must read them "
            f"too and validate on a world neither saw (this recipe reads {seeds} and validates on "
            f"{validation_seed}): use the same --worlds and --first-seed or more"
        )


def recipe_of_start(recipe: ReaderRecipe, model: Any, tokenizer: Any) -> ReaderRecipe:  # noqa: ANN401
    """The recipe a continuation records: the shape and vocabulary of the base it started from (its own
    options for them do not apply) and no copy pre-training."""
    c = model.config
    return replace(
        recipe, hidden=c.hidden_size, layers=c.num_hidden_layers, heads=c.num_attention_heads,
        intermediate=c.intermediate_size, vocab_size=len(tokenizer), copy_steps=0,
    )  # fmt: skip


def pretrain_reader(
    out: str | Path,
    recipe: ReaderRecipe | None = None,
    *,
    overrides: list[str] | None = None,
    force: bool = False,
    command: str = "",
) -> dict[str, Any]:
    """Build a reader base into ``out`` (module docstring); returns its manifest, which records
    ``command`` (how to rebuild it)."""
    from ragrl.console import quiet_libraries
    from ragrl.eval.runner import evaluate
    from ragrl.llm.copy_pretrain import CopyPretraining, copy_pretrain
    from ragrl.llm.tiny import (
        TinyConfig,
        build_tiny_model,
        count_parameters,
        portable_tokenizer_config,
        train_tokenizer,
    )
    from ragrl.methods import vocabulary_texts
    from ragrl.retrieval.bm25 import BM25Retriever
    from ragrl.synth.demonstrators import QuotingOracle
    from ragrl.train.demo import _held_out
    from ragrl.train.setup import make_accelerator, peak_memory_mb
    from ragrl.train.sft import SFTTrainer, demonstration_trajectories

    recipe = recipe or ReaderRecipe()
    overrides = list(overrides or [])
    quiet_libraries()
    started = time.perf_counter()
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise RagrlError(f"{out}: already exists; pass --force to replace it or choose another --out")
    # everything is built in a scratch folder beside ``out``; ``out`` is replaced only at the end, so a
    # failed or interrupted build leaves the previous base as it was
    work = out.parent / f".{out.name}.work"
    shutil.rmtree(work, ignore_errors=True)

    # 1. the worlds, fair by construction
    console.print(f"reader: {recipe.worlds} pretraining worlds from seed {recipe.first_seed} (protected: "
                  f"{min(recipe.protected)}-{max(recipe.protected)})")  # fmt: skip
    # each other grammar's settings, loaded once: a config that does not load fails now, not after the
    # copy steps
    grammars = {config: base_overrides(config) for config in recipe.also}
    chosen = choose_worlds(recipe.worlds, recipe.first_seed, recipe.size, recipe.protected)
    seeds = [w.seed for w in chosen.worlds]
    if recipe.init is not None:
        check_continuation(recipe, seeds, chosen.validation.seed, out)

    # 2. the tokenizer and the model; 3. copy pre-training (or an earlier base to continue from)
    copy_report = None
    if recipe.init is not None:
        model, tokenizer, start_dir = continue_from(recipe.init)
        recipe = recipe_of_start(recipe, model, tokenizer)
        console.print(f"reader: continuing from {start_dir} ({count_parameters(model) / 1e6:.2f}M)")
    else:
        texts = [t for w in chosen.worlds for t in world_texts(w)]
        tokenizer = train_tokenizer([*vocabulary_texts(), *texts], kind="bpe", vocab_size=recipe.vocab_size)
        shape = TinyConfig(
            hidden=recipe.hidden, layers=recipe.layers, heads=recipe.heads, intermediate=recipe.intermediate
        )
        tokenizer.model_max_length = shape.max_position_embeddings
        model = build_tiny_model(tokenizer, shape, seed=recipe.seed)
        console.print(
            f"reader: {count_parameters(model) / 1e6:.2f}M parameters, BPE vocabulary {len(tokenizer)}"
        )
        if recipe.copy_steps:
            copy_report = copy_pretrain(
                model, tokenizer, CopyPretraining(steps=recipe.copy_steps), seed=recipe.seed
            )
        start_dir = work / "start"
        start_dir.mkdir(parents=True)
        tokenizer.save_pretrained(start_dir)
        portable_tokenizer_config(start_dir)
        model.save_pretrained(start_dir)

    # the validation world: the SFT's held-out curve (every quarter of the steps) and the final check
    unseen = chosen.validation
    validation_dir = work / "worlds" / f"validation-{unseen.seed}"
    unseen.write(validation_dir)
    validation_retriever = BM25Retriever.build(unseen.corpus)
    validation_retriever.save(validation_dir / "bm25")
    validation_method = reader_method(validation_dir, start_dir, recipe, overrides)
    held_out = validation_method.prepare_examples(unseen.splits["test"], "validation")
    held_out = held_out[: recipe.validation_questions]

    # 4. reading: the quoting oracle on every question of every world, through each world's index
    demos = []
    method = None
    for world in chosen.worlds:
        world_dir = work / "worlds" / str(world.seed)
        world.write(world_dir)
        retriever = BM25Retriever.build(world.corpus)
        retriever.save(world_dir / "bm25")
        method = reader_method(world_dir, start_dir, recipe, overrides)
        examples = [ex for split in ("train", "dev", "test") for ex in world.splits[split]]
        questions = distinct_prompts(method, examples)
        demos += demonstration_trajectories(method, tokenizer, QuotingOracle(), questions, retriever)
        for config, settings in grammars.items():  # the same questions in the other grammars
            other = grammar_method(config, settings, world_dir, start_dir, recipe, overrides)
            questions = distinct_prompts(other, other.prepare_examples(examples, f"world {world.seed}"))
            found = retriever if other.protocol.needs_retriever else None
            demos += demonstration_trajectories(other, tokenizer, base_demonstrator(other), questions, found)
    assert method is not None
    console.print(f"reader: SFT, {recipe.steps} steps of {recipe.batch_size} on {len(demos)} demonstrations")
    config = method.train
    config.eval_every = max(recipe.steps // 4, 1)
    sft = SFTTrainer(
        method, config, demos, run_dir=work / "sft", eval_examples=held_out,
        retriever=validation_retriever, accelerator=make_accelerator(config), model=model,
        tokenizer=tokenizer,
    )  # fmt: skip
    sft.train()
    policy = sft.policy
    curve = {str(e["step"]): e["eval/em_answerable"] for e in sft.evals}

    # 5. validation on a world it never saw
    report = evaluate(sft.backend, validation_retriever, validation_method, held_out, seed=recipe.seed)
    validation = _held_out(report, held_out)
    console.print(
        f"reader: validation world {unseen.seed}: EM {validation['em']:.3f}, answerable EM "
        f"{validation['em_answerable']:.3f}, outcomes {validation['outcomes_answerable']}"
    )
    validation_also = {}
    for config, settings in grammars.items():
        other = grammar_method(config, settings, validation_dir, start_dir, recipe, overrides)
        examples = other.prepare_examples(unseen.splits["test"], "validation")[: recipe.validation_questions]
        found = validation_retriever if other.protocol.needs_retriever else None
        report = evaluate(sft.backend, found, other, examples, seed=recipe.seed)
        validation_also[config] = _held_out(report, examples)
        console.print(
            f"reader: validation world {unseen.seed}, {config}: answerable EM "
            f"{validation_also[config]['em_answerable']:.3f} of {len(examples)}"
        )

    built = work / "base"
    built.mkdir(parents=True)
    tokenizer.save_pretrained(built)
    portable_tokenizer_config(built)
    policy.save_pretrained(built)
    manifest = {
        "format": FORMAT,
        "recipe": asdict(recipe),
        "overrides": overrides,
        "seeds": seeds,
        "validation_seed": unseen.seed,
        "fairness": chosen.report,
        "parameters": count_parameters(policy),
        "vocab_size": len(tokenizer),
        "demonstrations": len(demos),
        "copy_pretraining": copy_report,
        "validation": validation,
        "validation_curve_em_answerable": curve,
        "validation_also": validation_also,
        "wall_seconds": round(time.perf_counter() - started, 1),
        "peak_memory_mb": peak_memory_mb(),
        "command": command,
        "environment": environment(),
        "init_weights_sha256": file_sha256(start_dir / "model.safetensors") if recipe.init else None,
        "weights_sha256": file_sha256(built / "model.safetensors"),
        "tokenizer_sha256": file_sha256(built / "tokenizer.json"),
    }  # fmt: skip
    (built / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    write_checksums(built)
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    built.rename(out)
    shutil.rmtree(work, ignore_errors=True)
    return manifest


def resolve_base(name: str | Path | None) -> Path | None:
    """``--base``: ``scratch`` or None (no base: a tiny policy built on the world), ``shipped`` (the
    package's reader base) or a folder, which must exist."""
    if name is None or str(name) == "scratch":
        return None
    path = SHIPPED_BASE if str(name) == "shipped" else Path(name)
    if not path.is_dir():
        raise RagrlError(
            f"--base: {path} is not a folder (the shipped base is rebuilt by `make reader-base`)"
        )
    return path
