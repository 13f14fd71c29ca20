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
* ``deepspeed`` (``DeepSpeedParallel``): DeepSpeed ZeRO (``train.parallel.zero_stage`` 1, 2 or 3),
  initialised directly over the torch optimizer ragrl builds (accelerate's DeepSpeed integration does
  not run on CPU processes). The step's micro-batches accumulate between gradient-accumulation
  boundaries that ragrl sets; ZeRO clips (``gradient_clipping`` = ``train.optim.max_grad_norm``) and
  skips an update whose gradient norm is not finite. Checkpoints are DeepSpeed's own folders (every
  process writes its optimizer partition); the exported policy is the consolidated state dict.

What a trainer calls: ``prepare`` (the model and the optimizer built over its parameters: after
sharding, under FSDP), ``backward``, ``no_sync``, ``step`` (clip, check, update), ``generating`` (around a
rollout or an evaluation: FSDP gathers the parameters once for the whole generation, so one process may
generate alone), ``save_state`` / ``load_state`` and ``export``. ``lockstep`` says whether every
process must run the same number of forward passes (FSDP's are collective): the GRPO update pads a
process's micro-batches with zero-loss passes then.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ragrl.config.train import TrainConfig
from ragrl.console import console, quiet_libraries
from ragrl.errors import RagrlError


class DataParallel:
    """``ddp``: accelerate's wrapping (DDP on several processes, the bare model on one)."""

    lockstep = False
    sharded = False

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

    def step(
        self, optimizer: Any, params: list[torch.Tensor], max_norm: float, check: Callable[[float], None]
    ) -> float:
        """Clip the gradients to ``max_norm``, ``check(norm)`` (it raises to stop the run before the
        update), then update; returns the norm before clipping."""
        norm = self.clip_grad_norm(params, max_norm)
        check(norm)
        optimizer.step()
        return norm

    @contextlib.contextmanager
    def generating(self, model: Any, backend: Any = None) -> Iterator[None]:
        with self.acc.autocast():  # bf16 compute over fp32 weights under train.mixed_precision (GPU)
            yield

    def save_state(self, folder: Path, model: Any, optimizer: Any) -> None:
        self.acc.save_state(str(folder), safe_serialization=True)

    def load_state(self, folder: Path, model: Any, optimizer: Any) -> None:
        self.acc.load_state(str(folder))

    def full_state_dict(self, model: Any) -> dict[str, torch.Tensor]:
        """The policy's whole weights (call it on every process: sharded, it is a gather; FSDP and
        ZeRO-3 return them on the main process only)."""
        return self.unwrap(model).state_dict()

    def export(self, model: Any, tokenizer: Any, out: Path) -> None:
        """The policy as ``save_pretrained`` writes it, on the main process (call it on every process:
        a sharded model's weights are gathered first)."""
        from ragrl.train.state import export_policy

        state = self.full_state_dict(model) if self.sharded else None
        if self.acc.is_main_process:
            export_policy(self.unwrap(model), tokenizer, out, state_dict=state)


class FullyShardedParallel(DataParallel):
    """``fsdp``: PyTorch FSDP2 over all the processes (see the module docstring)."""

    lockstep = True
    sharded = True

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
        group_of_one(device)
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
            # pinned host memory speeds the copies to a GPU; with no GPU there is none to pin
            options["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
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


STALE_LOCK_SECONDS = 600.0


def stale_build_locks(max_age_s: float = STALE_LOCK_SECONDS) -> list[tuple[Path, float]]:
    """Torch extension build locks (``<extensions dir>/<op>/lock``) older than ``max_age_s``, with their
    ages in seconds. torch's ``FileBaton`` waits while the lock exists, with no timeout: a DeepSpeed op
    build (its CPU ``shm_comm``, JIT-built on the first start) killed mid-way leaves its lock, and every
    later start then hangs. A build takes a minute or two, so a lock older than ten is almost surely such
    a leftover. The directory is torch's: ``TORCH_EXTENSIONS_DIR``, else every ``py*`` folder under
    ``torch.utils.cpp_extension.get_default_build_root()``."""
    import os
    import time

    from torch.utils.cpp_extension import get_default_build_root

    given = os.environ.get("TORCH_EXTENSIONS_DIR")
    roots = [Path(given)] if given else sorted(Path(get_default_build_root()).glob("py*"))
    now, found = time.time(), []
    for root in roots:
        for lock in sorted(root.glob("*/lock")):
            try:
                age = now - lock.stat().st_mtime
            except OSError:  # released meanwhile
                continue
            if age > max_age_s:
                found.append((lock, age))
    return found


def build_deepspeed_cpu_ops() -> Path | None:
    """Build (or load, when built already) the op DeepSpeed JIT-builds at the first start of a run on the
    CPU, its shared-memory collectives (``deepspeed_shm_comm``, which ``deepspeed.comm`` loads when it
    starts, as here): about 40 s of two cores, once for each virtualenv, in torch's extensions folder.
    ``make test`` calls it first, so that no test's timeout or budget holds the build (and no killed test
    leaves its lock: see ``stale_build_locks``). Returns the built library's path; None where DeepSpeed
    is not installed or has no such op for this machine's accelerator (a GPU's; an op marked
    incompatible). A failed build raises, as it would at DeepSpeed's start."""
    quiet_libraries()  # DeepSpeed's accelerator warning
    try:
        from deepspeed.comm.torch import build_shm_op  # what DeepSpeed's own start calls
    except ImportError:  # the deepspeed extra is not installed: nothing to build
        return None
    with contextlib.redirect_stdout(io.StringIO()):  # its bare print when the op loads
        module = build_shm_op()
    return None if module is None else Path(module.__file__)


class DeepSpeedParallel(DataParallel):
    """``deepspeed``: DeepSpeed ZeRO over all the processes (see the module docstring)."""

    lockstep = True  # ZeRO-2 reduces and ZeRO-3 gathers inside every backward / forward
    sharded = True

    @property
    def bf16(self) -> bool:
        """DeepSpeed's ``bf16`` mode: ``train.mixed_precision: bf16`` on a GPU (the CPU path stays fp32)."""
        return self.config.mixed_precision == "bf16" and self.acc.device.type == "cuda"

    def _ds_config(self, train: bool, model: Any = None) -> dict[str, Any]:
        """DeepSpeed's JSON config from ``train.parallel``, ``train.optim`` and ``train.mixed_precision``:
        one micro-batch per process per ``engine.step`` as DeepSpeed counts (ragrl sets the
        accumulation boundary itself), clipping at ``train.optim.max_grad_norm``; the communication
        buckets sized by the model's hidden size as transformers' "auto" values are (DeepSpeed's
        defaults, 5e8 elements, are 2 GB buffers in fp32: measured, ZeRO-3 then took more memory
        than DDP)."""
        p = self.config.parallel
        zero: dict[str, Any] = {"stage": p.zero_stage if train else 3 if p.zero_stage == 3 else 0}
        hidden = getattr(getattr(model, "config", None), "hidden_size", None)
        if isinstance(hidden, int):
            zero["reduce_bucket_size"] = zero["allgather_bucket_size"] = hidden * hidden
            if zero["stage"] == 3:
                zero["stage3_prefetch_bucket_size"] = int(0.9 * hidden * hidden)
                zero["stage3_param_persistence_threshold"] = 10 * hidden
        if p.offload and train:
            zero["offload_optimizer"] = {"device": "cpu"}
            if p.zero_stage == 3:
                zero["offload_param"] = {"device": "cpu"}
        return {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": float(self.config.optim.max_grad_norm or 0.0),
            "zero_optimization": zero,
            "zero_allow_untested_optimizer": True,  # ragrl's torch AdamW (train.optim)
            "zero_force_ds_cpu_optimizer": False,  # the same optimizer when its state is offloaded
            "bf16": {"enabled": self.bf16},
            "steps_per_print": 2**31 - 1,  # ragrl logs the steps
            "wall_clock_breakdown": False,
        }

    def _initialize(self, model: Any, optimizer: Any, train: bool) -> Any:
        import os

        os.environ.setdefault("LOCAL_RANK", str(self.acc.local_process_index))  # set by torchrun
        if self.acc.is_main_process:
            for lock, age in stale_build_locks():
                console.print(
                    f"warning: {lock}: a torch extension build lock {age / 60:.0f} minutes old. A DeepSpeed "
                    "build stopped mid-way (kill -9) leaves one, and every later start that builds the same "
                    "op waits on it forever; if no build is running, delete it"
                )
        import deepspeed

        group_of_one(self.acc.device)
        with contextlib.redirect_stdout(io.StringIO()):  # a bare print per rank when its CPU op loads
            deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())
        # DeepSpeed's collectives call torch names deprecated since 2.10, with a warning per call site
        deprecated = ".*(all_gather_into_tensor|reduce_scatter_tensor).* is deprecated"
        warnings.filterwarnings("ignore", message=deprecated, category=FutureWarning)
        config = self._ds_config(train, model)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        return engine

    def prepare(self, model: Any, make_optimizer: Callable[[Any], Any]) -> tuple[Any, Any]:
        optimizer = make_optimizer(model)  # the schedule steps this optimizer's learning rate
        self.engine = self._initialize(model, optimizer, train=True)
        return self.engine, self.engine.optimizer

    def prepare_frozen(self, model: Any) -> Any:
        """ZeRO-3: the reference sharded as the policy is (an engine without optimizer); else a whole
        copy on every process (ZeRO-1/2 shard only what a frozen model does not have)."""
        if self.config.parallel.zero_stage != 3:  # in the policy's compute dtype (bf16 on a GPU)
            return model.to(torch.bfloat16) if self.bf16 else model
        return self._initialize(model, None, train=False)

    def unwrap(self, model: Any) -> Any:
        return getattr(model, "module", model)

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    @contextlib.contextmanager
    def no_sync(self, model: Any) -> Iterator[None]:
        self.engine.set_gradient_accumulation_boundary(False)  # accumulate; the last micro-batch ends it
        try:
            yield
        finally:
            self.engine.set_gradient_accumulation_boundary(True)

    def step(
        self, optimizer: Any, params: list[torch.Tensor], max_norm: float, check: Callable[[float], None]
    ) -> float:
        """ZeRO computes the norm, clips and updates, and skips the update when the norm is not finite;
        ``check`` then sees the norm (the update it would stop was not applied)."""
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        norm = float("nan") if norm is None or norm < 0 else float(norm)  # -1: DeepSpeed's inf/NaN
        check(norm)
        return norm

    @contextlib.contextmanager
    def generating(self, model: Any, backend: Any = None) -> Iterator[None]:
        """ZeRO-3: every process gathers the whole model once (collective) and takes the engine's hooks
        off, so that its forwards are local and one process may generate alone or longer than another;
        the hooks go back on and the parameters are partitioned again on the way out. The prefix cache
        is emptied as under FSDP. (DeepSpeed's own ``unwrap_model_for_generation`` leaves the root's
        start-of-forward hook on, whose step reset is collective: one process generating alone hangs.)"""
        if backend is not None and hasattr(backend, "clear_prefix_cache"):
            backend.clear_prefix_cache()  # ZeRO writes the new weights in place (version counters kept)
        if self.config.parallel.zero_stage != 3:
            with super().generating(model, backend):
                yield
            return
        import deepspeed

        offload = self.engine.optimizer.parameter_offload
        with deepspeed.zero.GatheredParameters(list(self.engine.module.parameters())):
            offload._remove_module_hooks()  # the layers' gather/release hooks and the root's reset
            offload.forward_hooks, offload.backward_hooks = [], []
            try:
                yield
            finally:
                for p in self.engine.module.parameters():  # as TRL does: no stale module ids left
                    p.ds_active_sub_modules.clear()
                reset = offload.get_param_coordinator
                offload.fwd_pre_hook = offload.module.register_forward_pre_hook(
                    lambda *_: reset().reset_step()
                )
                offload._register_deepspeed_module(offload.module)

    def save_state(self, folder: Path, model: Any, optimizer: Any) -> None:
        self.acc.save_state(str(folder), safe_serialization=True)  # schedule, sampler, RNG streams
        self.engine.save_checkpoint(str(folder / "deepspeed"), tag="state", save_latest=False)

    def load_state(self, folder: Path, model: Any, optimizer: Any) -> None:
        if not (folder / "deepspeed").is_dir():
            raise RagrlError(
                f"{folder}: not a DeepSpeed checkpoint (no deepspeed/ folder); resume it with the "
                "train.parallel.mode it was written with"
            )
        partitions = sorted((folder / "deepspeed" / "state").glob("*optim_states.pt"))
        if len(partitions) != self.acc.num_processes:  # else DeepSpeed resets the optimizer silently
            raise RagrlError(
                f"{folder / 'deepspeed' / 'state'}: {len(partitions)} optimizer partitions for "
                f"{self.acc.num_processes} processes; resume with the number of processes and the "
                "train.parallel.zero_stage the checkpoint was written with"
            )
        self.acc.load_state(str(folder))
        loaded, _ = self.engine.load_checkpoint(
            str(folder / "deepspeed"), tag="state", load_optimizer_states=True, load_lr_scheduler_states=False
        )
        if loaded is None:
            raise RagrlError(f"{folder / 'deepspeed'}: DeepSpeed found no checkpoint to load")

    def full_state_dict(self, model: Any) -> dict[str, torch.Tensor]:
        """ZeRO-3: gathered layer by layer, on the main process only (an empty dict elsewhere)."""
        if self.config.parallel.zero_stage == 3:
            lora = self.config.model.lora is not None  # the adapters only: the frozen base is not gathered
            state = self.engine._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=lora)
            return dict(state or {})  # accelerate's way (collective); on the main process
        return self.unwrap(model).state_dict()


def is_sharded(model: Any) -> bool:
    """Whether FSDP2 or DeepSpeed ZeRO has taken ``model`` over in place: FSDP2 and ZeRO-3 shard its
    parameters (``ds_id``); ZeRO-1/2 map each one to its optimizer partition (``_hp_mapping``) and hook
    its gradients, which a second engine over the same parameters would not undo."""
    from torch.distributed.fsdp import FSDPModule

    marks = ("ds_id", "_hp_mapping")
    return isinstance(model, FSDPModule) or any(hasattr(p, m) for p in model.parameters() for m in marks)


def group_of_one(device: torch.device) -> None:
    """A process group of one when none was started (FSDP2 and DeepSpeed need one)."""
    if torch.distributed.is_initialized():
        return
    backend = "cuda:nccl,cpu:gloo" if device.type == "cuda" else "gloo"  # gloo: offloaded shards
    store = torch.distributed.HashStore()  # in memory: no port to find for a group of one
    torch.distributed.init_process_group(backend, store=store, rank=0, world_size=1)


def make_parallel(accelerator: Any, config: TrainConfig) -> DataParallel:
    """The engine of ``train.parallel.mode``."""
    if config.parallel.mode == "fsdp":
        return FullyShardedParallel(accelerator, config)
    if config.parallel.mode == "deepspeed":
        return DeepSpeedParallel(accelerator, config)
    return DataParallel(accelerator, config)
