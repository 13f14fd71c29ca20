"""``ragrl demo``: the project's main job on its embedded defaults, a policy learning on a CPU.

1. generate the synthetic multi-hop world (seeded) and index its corpus with BM25;
2. build the tiny Llama policy with a tokenizer trained on the world's text;
3. warm-start it with a *partial* SFT on the oracle demonstrator's trajectories (``train.sft.max_steps``
   steps: the policy learns the protocol and to search step by step, but answers only a few held-out
   questions right; a fully trained imitation would leave nothing for RL to show);
4. train it with GRPO and the Search-R1 method (``methods/configs/search_r1-tiny.yaml``);
5. evaluate before and after on the held-out test questions and write the run folder: the resolved
   ``config.yaml``, ``metrics.jsonl``, ``samples.jsonl``, ``report.md`` + ``curves.png`` and
   ``summary.json`` (``warm_start/`` holds the SFT stage's own metrics and checkpoint).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragrl.console import console
from ragrl.errors import RagrlError
from ragrl.methods import load_method
from ragrl.train.config import resolved_config_yaml

DEMO_CONFIG = "search_r1-tiny"


def run_demo(
    out: str | Path = "runs/demo",
    *,
    seed: int = 0,
    size: str = "small",
    overrides: Sequence[str] = (),
    force: bool = False,
) -> dict[str, Any]:
    """Run the whole demo into ``out``; returns the summary (also written to ``summary.json``)."""
    from ragrl.data.io import read_corpus, read_examples
    from ragrl.data.synth.demonstrators import OracleDemonstrator
    from ragrl.data.synth.generate import generate_world
    from ragrl.llm.tiny import create_tiny_policy
    from ragrl.retrieval.bm25 import BM25Retriever
    from ragrl.train.grpo import GRPOTrainer
    from ragrl.train.report import write_report
    from ragrl.train.setup import load_policy, make_accelerator, peak_memory_mb
    from ragrl.train.sft import SFTTrainer, demonstration_trajectories

    t0 = time.perf_counter()
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not force:
            raise RagrlError(f"{out}: already exists; pass --force to replace it or choose another --out")
        shutil.rmtree(out)
    world_dir = out / "world"

    # 1. the world and its index
    console.print(f"demo: synthetic world (seed {seed}, {size}) -> {world_dir}")
    generate_world(seed, size).write(world_dir)
    train, _ = read_examples(world_dir / "train.jsonl")
    test, _ = read_examples(world_dir / "test.jsonl")
    passages, _ = read_corpus(world_dir / "corpus.jsonl")
    retriever = BM25Retriever.build(passages)
    retriever.save(world_dir / "bm25")

    # 2. the tiny policy
    create_tiny_policy(world_dir, out / "tiny-policy", seed=seed)

    base = [
        f"train.seed={seed}",
        f"train.model.path={out / 'tiny-policy'}",
        f"train.data.train={world_dir / 'train.jsonl'}",
        f"train.data.eval={world_dir / 'test.jsonl'}",
        f"train.data.index={world_dir / 'bm25'}",
    ]
    method = load_method(DEMO_CONFIG, [*base, *overrides])
    config = method.train
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(resolved_config_yaml(method), encoding="utf-8")

    # 3. partial SFT warm start on the oracle demonstrator
    accelerator = make_accelerator(config)
    model, tokenizer = load_policy(config.model, accelerator.device)
    demos = demonstration_trajectories(method, tokenizer, OracleDemonstrator(), train, retriever)
    console.print(f"demo: SFT warm start, {config.sft.max_steps} steps on {len(demos)} oracle trajectories")
    sft = SFTTrainer(
        method, config, demos, run_dir=out / "warm_start", eval_examples=[], retriever=retriever,
        accelerator=accelerator, model=model, tokenizer=tokenizer,
    )  # fmt: skip
    sft.train()

    # 4. GRPO from the warm start (held-out EM before = the warm start's)
    console.print(
        f"demo: GRPO, {config.steps} steps of {config.grpo.prompts_per_step} questions × {method.rollout.n}"
    )
    grpo = GRPOTrainer(
        method, config, run_dir=out, train_examples=train, eval_examples=test, retriever=retriever,
        accelerator=make_accelerator(config), model=sft.policy, tokenizer=tokenizer,
    )  # fmt: skip
    summary = grpo.train()

    # 5. the summary (the whole demo's wall time and memory) and the report
    summary.update(
        em_warm_start=summary.get("em_before"),
        warm_start_steps=sft.step_count,
        wall_seconds=round(time.perf_counter() - t0, 1),
        peak_memory_mb=peak_memory_mb(),
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    write_report(out, summary)
    return summary
