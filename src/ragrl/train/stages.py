"""Staged training: a list of runs (GRPO or preference cycles), each with its own overrides, each starting
from the previous stage's final or best policy (EVO-RAG's two curriculum stages; any warm-up then main phase).

``train.stages`` in a method config lists the stages::

    train:
      best_metric: eval/em
      stages:
        - {name: explore, overrides: [train.steps=20, "reward.1.weight=0.5"]}
        - {name: refine, overrides: [train.steps=40], start_from: previous_best}

``run_stages`` plays them in order. Stage ``i`` is an ordinary run in ``<out>/stage-<i>-<name>`` whose
config is the method config with the run's overrides, then the stage's, then its ``train.out`` and
``train.model.path``. The first stage starts from ``train.model.path``; a later one from the previous
stage's ``policy/`` (``start_from: previous``), its ``best/`` (``previous_best``: the policy that
scored best on ``train.best_metric``, the evaluation before training included), or the config's model
(``config``). ``<out>/stages.json`` records every finished stage, written atomically after it ends, so
``resume`` skips finished stages and resumes the stage in progress from its newest checkpoint: the
result is the same as a run that was never interrupted.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragrl.config import Method
from ragrl.console import console
from ragrl.errors import RagrlError
from ragrl.train.setup import process_state
from ragrl.train.state import list_checkpoints

STATE_FILE = "stages.json"


def stage_dir(out: Path, index: int, name: str) -> Path:
    return out / f"stage-{index}-{name}"


def run_stages(
    base: Method,
    *,
    resume: bool = False,
    stop: tuple[int, int] | None = None,
) -> list[dict[str, Any]]:
    """Run every stage of the method's ``train.stages``; returns one summary per stage. Each stage's
    method is ``base.with_overrides(...)``: the config is read once, by whoever loaded ``base``
    (``load_method`` checked every stage's config then).

    ``stop=(i, n)`` ends the run after step ``n`` of stage ``i`` with a checkpoint, as a crash right
    after saving would (for tests of exact resume)."""
    from ragrl.train.trainers import check_trainable, make_trainer

    stages, out = base.train.stages, Path(base.train.out)
    if not stages:
        raise RagrlError(f"{base.where}: train.stages is empty; use an ordinary run")
    state = process_state()  # under accelerate launch: the folder is the main process's to write
    finished = _read_state(out) if resume else []
    if not resume and out.is_dir() and any(out.iterdir()):
        raise RagrlError(
            f"{out}: a staged run is already there; pass --resume latest or choose another --out"
        )
    state.wait_for_everyone()  # every process has looked before any writes
    if state.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
    summaries = [f["summary"] for f in finished]
    for i, stage in enumerate(stages):  # before any stage trains: no stage that can never learn
        try:
            check_trainable(base.with_overrides([*stage.overrides, "train.stages=[]"]))
        except RagrlError as e:
            raise RagrlError(f"train.stages[{i}] ({stage.name}): {e}") from None
    for i, stage in enumerate(stages):
        if i < len(finished):
            continue
        where = stage_dir(out, i, stage.name)
        start = _start_policy(base, stages, finished, i)
        method = base.with_overrides([*stage.overrides, f"train.out={where}", f"train.model.path={start}"])
        in_progress = resume and bool(list_checkpoints(where))
        if not in_progress and state.is_main_process:  # a fresh start: nothing left of a crashed one
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir(parents=True)
            (where / "config.yaml").write_text(method.resolved_yaml(), encoding="utf-8")
        state.wait_for_everyone()
        if state.is_main_process:
            console.print(f"stage {i} ({stage.name}): from {start}, {method.train.steps} steps -> {where}")
        trainer = make_trainer(method, method.train, run_dir=where)
        until = stop[1] if stop is not None and stop[0] == i else None  # train() saves where it stops
        summary = trainer.train(resume="latest" if in_progress else None, until=until)
        ended_early = trainer.stopped_early or trainer.exhausted()  # patience, or its questions ran out
        if until is not None and trainer.step_count < method.train.steps and not ended_early:
            return summaries
        finished.append({"name": stage.name, "dir": str(where), "start": str(start), "summary": summary})
        if state.is_main_process:
            _write_state(out, finished)
        state.wait_for_everyone()
        summaries.append(summary)
    return summaries


def _start_policy(base: Method, stages: Sequence[Any], finished: list[dict[str, Any]], i: int) -> Path:
    if i == 0 or stages[i].start_from == "config":
        if not base.train.model.path:
            raise RagrlError("train.model.path: the first stage needs a model")
        return Path(base.train.model.path)
    previous = Path(finished[i - 1]["dir"])
    if stages[i].start_from == "previous":
        return previous / "policy"
    best = previous / "best"
    if not (best / "best.json").is_file():
        raise RagrlError(
            f"stage {i} ({stages[i].name}) starts from the previous stage's best policy, but {best} holds "
            "none: that stage ran no held-out evaluation (set train.data.eval)"
        )
    return best


def _read_state(out: Path) -> list[dict[str, Any]]:
    path = out / STATE_FILE
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RagrlError(f"{path}: not a stages record ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("finished"), list):
        raise RagrlError(f"{path}: not a stages record (no 'finished' list)")
    return data["finished"]


def _write_state(out: Path, finished: list[dict[str, Any]]) -> None:
    path = out / STATE_FILE
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"finished": finished}, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
