"""A generation engine beside the trainer for GRPO's rollouts (``train.engine``, docs/backends.md).

With ``train.engine.backend: vllm`` the rollouts come from a vLLM engine built on the run's starting
checkpoint, and the trainer keeps it current: before a step's rollouts, when the engine's weights are
``sync_every`` or more steps old (or were never set by this process, as after a resume), the policy's
weights are loaded into it (``VLLMBackend.load_weights``). Each step logs how old the weights it sampled
from were (``engine/staleness``, in steps) and what a load cost (``engine/sync_seconds``). The update
compares the engine's log-probs with the trainer's (``engine/logprob_diff`` and friends,
``ragrl.algos.engine_mismatch``) and can correct for the gap (``train.grpo.tis_cap``).

Held-out evaluation stays on the transformers backend: it reads the trainer's weights as they are.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ragrl.errors import RagrlError
from ragrl.llm.backend import Generation, SamplingParams
from ragrl.methods.train_config import TrainConfig


class SyncedEngine:
    """A ``GenerationBackend`` over an engine that holds its own copy of the policy's weights."""

    def __init__(
        self, backend: Any, policy: Any, tokenizer: Any, sync_every: int = 1, sleep: bool = False
    ) -> None:
        self.backend = backend
        self.policy = policy
        self.tokenizer = tokenizer
        """The trainer's tokenizer: the rollout encodes with it (the engine's reads the same folder)."""
        self.sync_every = sync_every
        self.sleep = sleep
        self.version: int | None = None
        """The trainer step whose weights the engine holds (None: the checkpoint it was built on)."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        return self.backend.generate(prompts, params)

    def before_rollouts(self, step: int) -> dict[str, float]:
        """Wake the engine (``sleep``) and give it the policy's weights if they are due; its metrics."""
        if self.sleep:
            self.backend.wake_up()
        metrics: dict[str, float] = {}
        if self.version is None or step - self.version >= self.sync_every:
            metrics["engine/sync_seconds"] = self.sync(step)
        metrics["engine/staleness"] = float(step - self.version)
        return metrics

    def sync(self, step: int) -> float:
        """Load the policy's weights (those after ``step`` steps) into the engine; the seconds it took."""
        t0 = time.perf_counter()
        self.backend.load_weights(self.policy.state_dict().items())
        self.version = step
        return round(time.perf_counter() - t0, 4)

    def close(self) -> None:
        self.backend.close()

    def after_rollouts(self) -> None:
        if self.sleep:  # the update gets the memory the engine held
            self.backend.sleep()


def make_rollout_engine(
    config: TrainConfig, policy: Any, tokenizer: Any, processes: int = 1
) -> SyncedEngine | None:
    """The engine ``train.engine`` names, or None for the transformers backend (the policy decodes)."""
    e = config.engine
    if e.backend == "transformers":
        return None
    if e.backend != "vllm":  # validated when the config loads; a hand-built config may skip that
        raise RagrlError(f"train.engine.backend: unknown backend {e.backend!r}")
    if processes > 1:
        raise RagrlError(
            f"train.engine.backend: vllm runs beside one trainer process, not {processes} (an engine per "
            "process is not built yet; docs/backends.md)"
        )
    if config.model.path is None:
        raise RagrlError("train.engine.backend: vllm builds its engine from train.model.path (a folder)")
    from ragrl.llm.vllm_backend import VLLMBackend

    options = dict(e.options)
    if e.sleep:
        options.setdefault("enable_sleep_mode", True)
    return SyncedEngine(VLLMBackend(config.model.path, **options), policy, tokenizer, e.sync_every, e.sleep)
