"""A generation engine beside the trainer for GRPO's rollouts (``train.engine``, docs/backends.md).

With ``train.engine.backend: vllm`` the rollouts come from a vLLM engine (its own processes) built on the
run's starting checkpoint when the first rollout needs it, and the trainer keeps it current: before the
rollouts of step k, when k is a multiple of ``sync_every`` or the engine has never had this run's
weights (its first step, or the first after a resume), the policy's weights are loaded into it
(``VLLMBackend.load_weights``, which also drops the engine's prefix cache: keys and values of the old
weights). A run resumed at a multiple of ``sync_every`` therefore samples from the same weights as one
that was not stopped (``train.save_every`` is held to multiples of it); one resumed elsewhere (stopped
by ``train.max_seconds``) syncs at once, from newer weights than an uninterrupted run's. Each step
logs how old the weights it sampled from were (``engine/staleness``, in steps) and what a load cost
(``engine/sync_seconds``). The update compares the engine's log-probs with the trainer's
(``engine/logprob_diff`` and friends, ``ragrl.algos.engine_mismatch``) and can correct for the gap
(``train.grpo.tis_cap``).

Held-out evaluation stays on the transformers backend: it reads the trainer's weights as they are.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ragrl.config.train import TrainConfig
from ragrl.errors import RagrlError
from ragrl.llm.backend import Generation, SamplingParams


class SyncedEngine:
    """A ``GenerationBackend`` over an engine that holds its own copy of the policy's weights; the
    engine starts on first use and starts again after ``close()``."""

    def __init__(
        self,
        start: Callable[[], Any],
        policy: Any,
        tokenizer: Any,
        sync_every: int = 1,
        sleep: bool = False,
    ) -> None:
        self.start = start
        self.policy = policy
        self.tokenizer = tokenizer
        """The trainer's tokenizer: the rollout encodes with it (the engine's reads the same folder)."""
        self.sync_every = sync_every
        self.sleep = sleep
        self._backend: Any = None
        self.version: int | None = None
        """The trainer step whose weights the engine holds (None: not this run's weights yet)."""

    @property
    def backend(self) -> Any:
        if self._backend is None:
            self._backend = self.start()
            self.version = None  # a new engine holds the checkpoint it was built on
        return self._backend

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        return self.backend.generate(prompts, params)

    def before_rollouts(self, step: int) -> dict[str, float]:
        """Wake the engine (``sleep``) and give it the policy's weights if they are due; its metrics."""
        backend = self.backend
        if self.sleep:
            backend.wake_up()
        metrics: dict[str, float] = {}
        if self.version is None or step % self.sync_every == 0:
            metrics["engine/sync_seconds"] = self.sync(step)
        metrics["engine/staleness"] = float(step - self.version)
        return metrics

    def sync(self, step: int) -> float:
        """Load the policy's weights (those after ``step`` steps) into the engine; the seconds it took."""
        t0 = time.perf_counter()
        self.backend.load_weights(self.policy.state_dict().items())
        self.version = step
        return round(time.perf_counter() - t0, 4)

    def after_rollouts(self) -> None:
        if self.sleep:  # the update gets the memory the engine held
            self.backend.sleep()

    def close(self) -> None:
        """Stop the engine's processes (a process holding a running engine cannot exit)."""
        if self._backend is not None:
            self._backend.close()
            self._backend, self.version = None, None


def make_rollout_engine(
    config: TrainConfig, policy: Any, tokenizer: Any, processes: int = 1
) -> SyncedEngine | None:
    """The engine ``train.engine`` names (not started yet), or None for the transformers backend."""
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
    import torch

    from ragrl.llm.hf_backend import ADAPTER_CONFIG, adapter_base

    path = Path(config.model.path)
    if (path / ADAPTER_CONFIG).is_file():  # a LoRA stage's output: the engine starts from its base, and
        path = adapter_base(path)  # the first sync brings the merged weights the trainer loaded
    options = dict(e.options)
    if torch.cuda.is_available():  # the trainer's policy, optimizer and reference share the card
        options.setdefault("gpu_memory_utilization", 0.3)
    if e.sleep:
        if not torch.cuda.is_available():
            raise RagrlError("train.engine.sleep: vLLM's sleep mode needs a GPU")
        options.setdefault("enable_sleep_mode", True)

    def start() -> Any:
        from ragrl.llm.vllm_backend import VLLMBackend

        return VLLMBackend(str(path), **options)

    return SyncedEngine(start, policy, tokenizer, e.sync_every, e.sleep)
