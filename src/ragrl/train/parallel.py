"""How the processes of a run share the model: the one interface the trainers' step code calls.

``train.parallel.mode``:

* ``ddp`` (``DataParallel``): accelerate's data parallelism. Every process holds the whole model and
  optimizer; gradients are averaged on the last micro-batch of a step (``no_sync`` until then).
* ``fsdp`` (``FullyShardedParallel``): PyTorch's FSDP2. ``fully_shard`` goes on each decoder layer (the
  model's ``_no_split_modules``), then on the model, over a one-dimensional device mesh of all the
  processes: parameters, gradients and the optimizer state are sharded, each forward and backward
  gathers a layer's parameters and frees them again. Checkpoints are ``torch.distributed.checkpoint``
  folders of the sharded model and optimizer (every process writes its own shard), beside accelerate's
  state of the schedule, the sampler and the RNG streams; the exported policy is the gathered full
  state dict, written once.

What a trainer calls: ``prepare`` (the model and the optimizer built over its parameters: after
sharding, under FSDP), ``backward``, ``no_sync``, ``clip_grad_norm``, ``generating`` (around a
rollout or an evaluation: FSDP gathers the parameters once for the whole generation, so one process may
generate alone), ``save_state`` / ``load_state`` and ``export``. ``lockstep`` says whether every
process must run the same number of forward passes (FSDP's are collective): the GRPO update pads a
process's micro-batches with zero-loss passes then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ragrl.errors import RagrlError
from ragrl.methods.train_config import TrainConfig


class DataParallel:
    """``ddp``: accelerate's wrapping (DDP on several processes, the bare model on one)."""

    lockstep = False

    def __init__(self, accelerator: Any, config: TrainConfig) -> None:
        self.acc = accelerator
        self.config = config

    def prepare(self, model: Any, make_optimizer: Callable[[Any], Any]) -> tuple[Any, Any]:
        return self.acc.prepare(model, make_optimizer(model))

    def prepare_frozen(self, model: Any) -> Any:
        """A frozen copy of the policy (the KL reference) placed as the policy is."""
        return model

    def unwrap(self, model: Any) -> Any:
        return self.acc.unwrap_model(model)

    def backward(self, loss: torch.Tensor) -> None:
        self.acc.backward(loss)

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager:
        return self.acc.no_sync(model)

    def clip_grad_norm(self, params: list[torch.Tensor], max_norm: float) -> float:
        return float(self.acc.clip_grad_norm_(params, max_norm))

    @contextlib.contextmanager
    def generating(self, model: Any, backend: Any = None) -> Iterator[None]:
        with self.acc.autocast():  # bf16 compute over fp32 weights under train.mixed_precision (GPU)
            yield

    def save_state(self, folder: Path, model: Any, optimizer: Any) -> None:
        self.acc.save_state(str(folder), safe_serialization=True)

    def load_state(self, folder: Path, model: Any, optimizer: Any) -> None:
        self.acc.load_state(str(folder))

    def full_state_dict(self, model: Any) -> dict[str, torch.Tensor]:
        """The policy's whole weights (call it on every process: under FSDP it is a gather)."""
        return self.unwrap(model).state_dict()

    def export(self, model: Any, tokenizer: Any, out: Path) -> None:
        """The policy as ``save_pretrained`` writes it, on the main process (call it on every process)."""
        from ragrl.train.state import export_policy

        if self.acc.is_main_process:
            export_policy(self.unwrap(model), tokenizer, out)


class FullyShardedParallel(DataParallel):
    """``fsdp``: PyTorch FSDP2 over all the processes (see the module docstring)."""

    lockstep = True

    def _shard(self, model: Any, reshard_after_forward: bool | None = None) -> Any:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        layer_names = set(getattr(model, "_no_split_modules", None) or ())
        layers = [m for m in model.modules() if type(m).__name__ in layer_names]
        if not layers:
            raise RagrlError(
                f"train.parallel.mode: fsdp needs the model's decoder layers to shard, and "
                f"{type(model).__name__} names none (_no_split_modules); use ddp"
            )
        device = self.acc.device
        if not torch.distributed.is_initialized():  # one process: a group of one (FSDP2 needs a group)
            backend = "cuda:nccl,cpu:gloo" if device.type == "cuda" else "gloo"  # gloo: offloaded shards
            store = torch.distributed.HashStore()  # in memory: no port to find for a group of one
            torch.distributed.init_process_group(backend, store=store, rank=0, world_size=1)
        mesh = init_device_mesh(device.type, (self.acc.num_processes,))
        if reshard_after_forward is None:
            reshard_after_forward = self.config.parallel.reshard_after_forward
        options: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
        if self.config.mixed_precision in ("bf16", "fp16") and device.type == "cuda":
            half = torch.bfloat16 if self.config.mixed_precision == "bf16" else torch.float16
            options["mp_policy"] = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)
        if self.config.parallel.offload:
            if device.type == "cuda" and self.acc.num_processes > 1:
                # clipping and gathering then reduce CPU tensors, over a group that has only NCCL
                raise RagrlError("train.parallel.offload: on several GPUs it is not supported yet; use one")
            options["offload_policy"] = CPUOffloadPolicy()
        for layer in layers:
            fully_shard(layer, **options)
        fully_shard(model, **options)
        return model

    def prepare(self, model: Any, make_optimizer: Callable[[Any], Any]) -> tuple[Any, Any]:
        model = self._shard(model)
        return model, make_optimizer(model)

    def prepare_frozen(self, model: Any) -> Any:
        return self._shard(model, reshard_after_forward=True)  # no backward would free it

    def unwrap(self, model: Any) -> Any:
        return model  # fully_shard changes the module in place

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    @contextlib.contextmanager
    def no_sync(self, model: Any) -> Iterator[None]:
        model.set_requires_gradient_sync(False)  # accumulate; reduce-scatter on the last micro-batch
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def clip_grad_norm(self, params: list[torch.Tensor], max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    @contextlib.contextmanager
    def generating(self, model: Any, backend: Any = None) -> Iterator[None]:
        """Every process gathers the parameters once (collective) and keeps them through the
        generation, whose forwards are then local; sharded again on the way out. The ``backend``'s
        prefix cache is emptied: gathered parameters keep their version counters across an update, so
        its own check cannot see that the weights changed."""
        from torch.distributed.fsdp import FSDPModule

        if backend is not None and hasattr(backend, "clear_prefix_cache"):
            backend.clear_prefix_cache()
        modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
        for m in modules:
            m.set_reshard_after_forward(False)
            m.unshard()
        try:
            yield
        finally:
            for m in modules:
                m.reshard()
                m.set_reshard_after_forward(self.config.parallel.reshard_after_forward)

    def save_state(self, folder: Path, model: Any, optimizer: Any) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self.acc.save_state(str(folder), safe_serialization=True)  # schedule, sampler, RNG streams
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(folder / "sharded"))

    def load_state(self, folder: Path, model: Any, optimizer: Any) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        if not (folder / "sharded").is_dir():
            raise RagrlError(
                f"{folder}: not an FSDP checkpoint (no sharded/ folder); resume it with the "
                "train.parallel.mode it was written with"
            )
        self.acc.load_state(str(folder))
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        dcp.load(state, checkpoint_id=str(folder / "sharded"))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])

    def full_state_dict(self, model: Any) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)  # collective: every process gathers

    def export(self, model: Any, tokenizer: Any, out: Path) -> None:
        from ragrl.train.state import export_policy

        state = self.full_state_dict(model)
        if self.acc.is_main_process:
            export_policy(model, tokenizer, out, state_dict=state)


def make_parallel(accelerator: Any, config: TrainConfig) -> DataParallel:
    """The engine of ``train.parallel.mode``."""
    if config.parallel.mode == "fsdp":
        return FullyShardedParallel(accelerator, config)
    return DataParallel(accelerator, config)
