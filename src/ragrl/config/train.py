"""Training configuration: the ``train:`` section of a method's YAML config.

A method config (``ragrl/methods/configs/<name>.yaml``) describes the agent (protocol, rollout, reward)
and, under ``train:``, how to train it. ``ragrl train CONFIG.yaml --set train.optim.lr=1e-5`` loads the
whole file, applies the overrides, validates it against these dataclasses and writes the resolved
config into the run folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ragrl.config.train_checks import (  # noqa: F401  (the names a config may take, re-exported)
    ALGOS,
    EVAL_METRICS,
    PARALLEL_MODES,
    RETRIEVAL_EVAL_METRICS,
    ROLLOUT_BACKENDS,
    WHITEN_MODES,
    check_train_config,
)


@dataclass
class LoraConfig:
    """LoRA adapters through peft (``pip install peft``); the reference model is the base with the
    adapters disabled, so no second copy of the weights is kept."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class ModelConfig:
    path: str | None = None
    """A local model directory (``from_pretrained``; nothing is downloaded)."""
    dtype: str = "auto"
    """Weights dtype: ``auto`` (fp32 on CPU, bf16 on GPU), ``float32``, ``bfloat16``, ``float16``."""
    gradient_checkpointing: bool = False
    lora: LoraConfig | None = None
    generation_batch_size: int = 64
    """Prompts decoded together by the rollout backend."""
    decode: str = "auto"
    """How the transformers backend decodes after each prefill (docs/backends.md): ``auto`` (the decoding
    step replayed as a CUDA graph on a GPU for Llama / Qwen2 / Qwen3 / Mistral models, else ``loop``),
    ``loop`` (the model's forward with a growing cache), ``static`` (static key/value buffers, eager) or
    ``graph``."""


@dataclass
class EngineConfig:
    """What generates GRPO's rollouts (docs/backends.md)."""

    backend: str = "transformers"
    """``transformers``: the policy itself (ragrl's decoding loop: every rollout on the current
    weights). ``vllm``: a vLLM engine beside the trainer (its own processes; ``pip install
    'ragrl[vllm]'``), given the policy's weights every ``sync_every`` steps; one trainer process, no
    LoRA, no sharding."""
    sync_every: int = 1
    """vLLM: load the policy's weights into the engine before the rollouts of every step that is a
    multiple of this (1: every step; N: rollouts from weights up to N - 1 steps old, logged as
    ``engine/staleness``); ``train.save_every`` must be a multiple of it (exact resume)."""
    options: dict[str, Any] = field(default_factory=dict)
    """vLLM: keyword arguments of ``vllm.LLM`` (``gpu_memory_utilization``: 0.3 on a GPU unless given,
    ``dtype``, ``enforce_eager``, ``max_model_len``, ...)."""
    sleep: bool = False
    """vLLM on a GPU: the engine sleeps through the update (level 1: its weights to CPU memory, its KV
    cache freed) and wakes for the next rollouts (``enable_sleep_mode`` is set for it)."""


@dataclass
class ParallelConfig:
    """How the processes of a run share the model (``ragrl.train.parallel``, docs/training.md)."""

    mode: str = "ddp"
    """``ddp``: every process holds the whole model and optimizer (accelerate; nothing to share on
    one process). ``fsdp``: PyTorch FSDP2 (``fully_shard`` on each decoder layer, then the model):
    parameters, gradients and optimizer state sharded over the processes. ``deepspeed``: DeepSpeed
    ZeRO at ``zero_stage`` (``pip install deepspeed``)."""
    zero_stage: int = 3
    """DeepSpeed: 1 shards the optimizer state, 2 also the gradients, 3 also the parameters (and the
    KL reference)."""
    reshard_after_forward: bool = True
    """FSDP: free the gathered parameters after each forward (ZeRO-3); False keeps them until the
    backward (ZeRO-2-like: more memory, one all-gather less per micro-batch)."""
    offload: bool = False
    """FSDP: keep the sharded parameters, gradients and optimizer state in CPU memory (a GPU's memory
    for activations only; the optimizer steps on the CPU). DeepSpeed: the optimizer state (ZeRO-1/2),
    and the parameters too (ZeRO-3), in CPU memory."""


@dataclass
class DataConfig:
    train: str | None = None
    """Training questions (canonical FlashRAG jsonl, or any format ``ragrl data convert`` reads)."""
    eval: str | None = None
    """Held-out questions for periodic evaluation (optional)."""
    index: str | None = None
    """A retriever folder built by ``ragrl index``, or the URL of a retrieval server (``ragrl serve``,
    Search-R1's ``retrieval_server.py``) that every process asks (optional for single-turn methods)."""
    eval_limit: int | None = None
    """Evaluate on the first N held-out questions only."""
    train_answerable_only: bool = False
    """GRPO and preference-cycle runs train on the answerable questions only (``Example.answerable``:
    not marked ``metadata.answerable: false``); SFT demonstrations and the held-out evaluation keep
    every question. Where a refusal earns the full reward, it can be a cheaper attractor than answering
    (docs/training.md)."""


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    schedule: str = "constant"
    """``constant``, ``linear`` or ``cosine`` decay after warmup (transformers' schedulers)."""
    min_lr_ratio: float = 0.0
    """``cosine`` only: decay to this fraction of ``lr`` instead of 0 (TIRESRAG-R1's 0.1)."""
    warmup_steps: int = 0
    max_grad_norm: float | None = 1.0


@dataclass
class GRPOConfig:
    prompts_per_step: int = 16
    """Questions per step (global, over all processes); each gets ``rollout.n`` rollouts."""
    ppo_epochs: int = 1
    """μ: passes over the step's rollouts."""
    minibatches: int = 1
    """Optimizer steps per pass (the rollouts are split into this many minibatches of whole groups)."""
    micro_batch_size: int = 0
    """Sequences per forward/backward (gradient accumulation within a minibatch); 0 = the whole one."""
    pg_loss: str = "ppo_clip"
    """The per-token policy loss (``ragrl.algos.losses.POLICY_LOSSES``)."""
    clip_low: float = 0.2
    clip_high: float = 0.2
    advantage: str = "grpo"
    advantage_params: dict[str, Any] = field(default_factory=dict)
    kl: str = "k3"
    kl_coef: float = 0.0
    """β; 0 disables the KL term and the reference model."""
    kl_params: dict[str, Any] = field(default_factory=dict)
    loss_agg: str = "token_mean"
    loss_agg_constant: float | None = None
    group_filter: str = "keep_all"
    group_filter_params: dict[str, Any] = field(default_factory=dict)
    group_filter_on: str = "total"
    """What the filter reads: ``total`` (the weighted reward) or a reward component's key (TIRESRAG-R1
    filters on answer F1 alone); checked against the method's reward when the config loads."""
    whiten: str = "none"
    """Normalise the advantages of the samples that reach the update, over the whole update batch (all
    processes), after the group filter: ``sample`` (each sample counts once), ``token`` (each sample
    counts once per policy token, as OpenRLHF and verl whiten a replay buffer) or ``none``.
    Reinforce++ normalises this way (TIRESRAG-R1's ``baseline: reinforce_pp`` needs it)."""
    refill_rounds: int = 0
    """DAPO's dynamic sampling: when fewer than ``prompts_per_step`` groups survive the filter, play up
    to this many more rounds of new questions, then train on the first ``prompts_per_step`` surviving
    groups (0: train on whatever survives)."""
    old_logprobs: str = "auto"
    """``auto``: π_old = π_θ detached when μ = 1 and one minibatch (one forward pass per sequence),
    else recomputed by a forward pass before the updates (also with a vLLM engine or ``tis_cap``: the
    engine's log-probs are compared with it); ``recompute``: always that pass; ``rollout``: the
    log-probs the generation backend reported."""
    tis_cap: float = 0.0
    """Truncated importance sampling (Yao et al. 2025, verl's ``tis_imp_ratio_cap``): each token's
    policy loss weighted by min(π_old / π_engine, cap), π_engine the probability the generation backend
    reported for the token it sampled. It corrects for the engine sampling from numerically different
    weights (a vLLM engine, a stale sync); 0: off, else >= 1 (verl uses 2)."""
    name_swap: float = 0.0
    """Share of the update's samples shown with their synthetic entity names consistently renamed
    (``ragrl.train.augment``, the world of ``train.sft.world``), as the SFT warm start does: the reward
    of a renamed episode is the same, but its facts are not the training questions', so the update
    teaches reading and copying rather than the training answers. Needs π_old from the renamed tokens
    (``old_logprobs`` auto or recompute)."""
    rename_world: bool = False
    """Play every step's rollouts in a renamed copy of the synthetic world (``ragrl.train.augment``,
    the world of ``train.sft.world``): one random permutation of all the world's name words per step,
    applied to the questions, their gold answers and every passage a search returns (a query is read
    back into the real names before it is searched). The training questions' names and facts are new at
    every step, so a rollout earns its reward by reading, never by recalling a training answer;
    evaluation plays the real world. GRPO only (``train.algo: grpo``), and not for a method that grows
    its own questions from the episodes (R²AG)."""


@dataclass
class SFTConfig:
    epochs: int = 1
    batch_size: int = 16
    max_steps: int = 0
    """Stop after this many optimizer steps (0: run all epochs)."""
    lr: float | None = None
    """Learning rate for SFT (None: ``train.optim.lr``)."""
    name_swap: float = 0.0
    """Share of demonstrations shown with their synthetic entity names consistently renamed
    (``ragrl.train.augment``): copying, not memorising, is then the only way to predict the names."""
    world: str | None = None
    """world.json whose names ``name_swap`` renames, here and in GRPO's ``train.grpo.name_swap`` (None:
    next to ``train.data.train``)."""
    turns: str = "all"
    """Which policy turns of a demonstration are learned: ``all``, or ``last`` (the turn that ends the
    episode, e.g. the evidence quoted and the answer; the earlier turns, e.g. the searches, stay in the
    sequence as context without a loss: the warm start learns to read the world, not how to search it)."""


@dataclass
class DPOConfig:
    """Preference training on (chosen, rejected) pairs (``ragrl dpo``; ``ragrl.train.dpo``)."""

    beta: float = 0.1
    loss_type: str = "sigmoid"
    """``ragrl.algos.preference``: sigmoid (DPO), robust, hinge, ipo."""
    label_smoothing: float = 0.0
    reference_free: bool = False
    """No reference model: the reference log-ratio is 0 (EVO-RAG's reference-free DPO)."""
    batch_size: int = 8
    """Pairs per optimizer step (global)."""
    micro_batch_size: int = 0
    """Pairs per forward/backward pass on a process (gradient accumulation up to the batch); 0: all at
    once."""
    epochs: int = 1
    max_steps: int = 0
    """Stop after this many optimizer steps (0: run all epochs)."""
    lr: float | None = None
    """Learning rate for DPO (None: ``train.optim.lr``)."""


@dataclass
class CycleConfig:
    """Preference cycles (``train.algo: cycles``; ``ragrl.train.cycles``): each training step rolls
    out questions, samples sibling candidates at every visited state, trains the reward model one
    epoch and the policy one DPO epoch (EVO-RAG §3)."""

    questions_per_cycle: int = 16
    """Training questions rolled out per cycle (one episode each)."""
    n_candidates: int = 4
    """Actions per visited state, the episode's own included."""
    temperature: float = 1.0
    """Sampling temperature of the extra candidates."""
    return_mode: str = "prefix"
    """What a sibling's return R(x) is: ``prefix`` (up to and including the candidate's step; only
    its step reward differs within a state) or ``rollout`` (the branch played on to its end by the
    policy, so a search is credited with the answer it leads to; costlier)."""
    rm_pair_threshold: float = 0.3
    """Δ: reward-model pairs differ in return by at least this much."""
    pref_margin: float = 0.2
    """δ: a state's policy pair (best vs worst sibling) needs this gap."""
    policy_pair_scorer: str = "true_return"
    """``true_return`` (the computed return R) or ``rm`` (the reward model's mean head score)."""
    rm_labels: str = "shared_total"
    """``shared_total``: every head takes the pair's order (the paper); ``per_component``: each head
    the order of its own weighted component (our extension)."""
    rm_lr: float = 1.0e-3
    rm_batch_size: int = 64
    rm_val_fraction: float = 0.1
    """Share of the questions whose pairs validate the reward model (never trained on)."""
    single_head_control: bool = True
    """Also train a one-head reward model on the same pairs (the paper's 0.62 vs 0.71 comparison)."""


@dataclass
class StageConfig:
    """One stage of a staged run (``ragrl.train.stages``)."""

    name: str = "stage"
    overrides: list[str] = field(default_factory=list)
    """``--set``-style overrides of the whole method config for this stage (``train.steps=20``,
    ``reward.1.weight=0.5``, ...), applied after the run's own."""
    start_from: str = "previous"
    """The policy this stage starts from: ``previous`` (the previous stage's final policy),
    ``previous_best`` (its best by ``train.best_metric``), or ``config`` (``train.model.path``). The
    first stage always starts from ``train.model.path``."""


@dataclass
class TrainConfig:
    out: str = "runs/train"
    seed: int = 0
    steps: int = 100
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    cycles: CycleConfig = field(default_factory=CycleConfig)
    algo: str = "grpo"
    """The trainer of ``ragrl train``: ``grpo`` (one policy-gradient step per step) or ``cycles``
    (preference cycles: siblings, reward model, DPO; ``train.cycles``)."""
    mixed_precision: str = "no"
    """accelerate's ``no`` / ``bf16`` / ``fp16`` (GPU); the CPU path stays fp32 (``cpu_mixed_precision``)."""
    cpu_mixed_precision: bool = False
    """Take ``mixed_precision: bf16`` on the CPU too (accelerate's CPU autocast). Off, a CPU run stays
    fp32 whatever the config asks. The GPU check's toy path turns it on, so that its CPU runs compute as
    the GPU recipe does: the first H200 run met a bf16-only failure the fp32 toy path had not."""
    eval_every: int = 0
    """Held-out evaluation every N steps (0: only before and after training)."""
    eval_temperature: float = 0.0
    save_every: int = 0
    """Checkpoint every N steps (0: only at the end)."""
    keep_checkpoints: int = 2
    log_every: int = 1
    samples_every: int = 0
    """Write the first rollout of N steps' batches to ``samples.jsonl`` (0: only the last step)."""
    stop_on_nonfinite: bool = True
    """The watchdog: stop with a clear message on a NaN / inf loss or gradient."""
    best_metric: str = ""
    """Keep the best policy by this held-out evaluation value (``eval/em``, ``eval/em_answerable``,
    ``eval/f1``, ...) in ``<run>/best`` (the evaluation before training counts); empty: off."""
    best_mode: str = "max"
    """``max`` or ``min``: which direction of ``best_metric`` is better."""
    patience: int = 0
    """Early stopping: end the run after this many held-out evaluations in a row without a new best
    ``best_metric`` (evaluated and saved as a finished run); 0: off."""
    max_seconds: float = 0.0
    """A wall-time budget for the training loop: end the run after the step during which its time
    (the run's, across resumes) reaches this many seconds, evaluated and saved as a finished run
    (``summary.json``: ``stopped: time``); 0: off. "As many steps as fit" on a lent machine."""
    stages: list[StageConfig] = field(default_factory=list)
    """Training stages (``ragrl.train.stages``): each a GRPO run with its own overrides, started from the
    previous stage's final or best policy. Empty: one ordinary run."""

    def validate(self) -> None:
        """Check every value and every registry name (``ragrl.config.train_checks``); ``load_method`` calls
        it, so a typo fails when the config loads, before any model or data is read. Errors name the key."""
        check_train_config(self)
