"""Gradient checkpointing and LoRA, measured: peak memory and time of one training update at a real
model's shape, against the plain full fine-tune of the same batch.

    .venv/bin/python benchmarks/training_switches.py [--arms full checkpointing lora lora+checkpointing]
        [--batch 4] [--length 460] [--scored 0.24] [--repeats 2] [shape: --hidden 576 --layers 30 ...]

The default shape is SmolLM2-135M-Instruct's (hidden 576, 30 layers, 9 heads, 3 key/value heads, MLP
1,536, vocabulary 49,152, tied embeddings) with random weights, saved once into a temporary folder. Each
arm runs in a process of its own and loads that folder through ragrl's own ``load_policy``
(``train.model.gradient_checkpointing``, ``train.model.lora`` with its defaults: r 16 on the attention
projections), builds the trainer's optimizer (``make_optimizer``: AdamW over the trainable
parameters), then times whole updates: ``token_logprobs`` on the loss mask, backward, the optimizer's
step. The batch is ``--batch`` sequences of ``--length`` tokens with a ``--scored`` share of the
positions in the loss (0.24: the quoting oracle's SmolLM2 episodes, docs/performance.md). Peak
resident memory (``ru_maxrss``) is reported above the process's resident memory once the model is
loaded (``/proc/self/statm``): activations, gradients and the optimizer's state. Seconds are the median
of ``--repeats`` updates after one warm-up. The last line is the headline: each arm's peak and time as
a multiple of the first arm's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from process_memory import timed_passes

ARMS = ("full", "checkpointing", "lora", "lora+checkpointing")


def child(arm: str, path: Path, args: argparse.Namespace) -> dict[str, float]:
    import torch

    from ragrl.config.train import LoraConfig, ModelConfig, OptimConfig
    from ragrl.llm.logprobs import token_logprobs
    from ragrl.train.setup import load_policy, make_optimizer

    config = ModelConfig(
        path=str(path),
        dtype="float32",
        gradient_checkpointing="checkpointing" in arm,
        lora=LoraConfig() if arm.startswith("lora") else None,
    )
    model, _ = load_policy(config, torch.device("cpu"))
    optimizer, _ = make_optimizer(model, OptimConfig(lr=1e-6), total_steps=args.repeats + 1)
    torch.manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (args.batch, args.length))
    mask = torch.zeros(args.batch, args.length - 1)
    n = max(1, int(args.scored * (args.length - 1)))
    mask[:, -n:] = 1.0  # the policy's tokens: the sequence's last turns
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    def update() -> None:
        logp = token_logprobs(model, ids, start=1, mask=mask)
        (-(logp * mask).sum() / mask.sum()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    row = timed_passes(update, args.repeats)  # above the loaded model; setup_above_mb: loading's own peak
    return {
        **row,
        "trainable": trainable,
        "threads": torch.get_num_threads(),
    }


def build(path: Path, args: argparse.Namespace) -> int:
    """A random-weight Llama of the given shape saved into ``path``; its parameter count."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from ragrl.train.reader import resolve_base

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        intermediate_size=args.intermediate, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    # ragrl's loader wants the folder's tokenizer; the update never reads it (the ids are random)
    AutoTokenizer.from_pretrained(resolve_base("shipped")).save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=460)
    ap.add_argument("--scored", type=float, default=0.24, help="share of positions in the loss")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--child", nargs=2, metavar=("ARM", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        arm, path = args.child
        print(json.dumps(child(arm, Path(path), args)))
        return

    with tempfile.TemporaryDirectory(prefix="training-switches-") as tmp:
        millions = build(Path(tmp), args) / 1e6
        print(
            f"model: hidden {args.hidden}, {args.layers} layers, vocab {args.vocab} ({millions:.1f}M "
            f"parameters, random weights, fp32); batch {args.batch} x {args.length} tokens, "
            f"{args.scored:.0%} scored; one update = log-probs, backward, AdamW step",
            flush=True,
        )
        shape = ["--batch", str(args.batch), "--length", str(args.length), "--scored", str(args.scored)]
        shape += ["--repeats", str(args.repeats), "--hidden", str(args.hidden), "--layers", str(args.layers)]
        shape += ["--heads", str(args.heads), "--kv-heads", str(args.kv_heads)]
        shape += ["--intermediate", str(args.intermediate), "--vocab", str(args.vocab)]
        rows = {}
        for arm in args.arms:
            command = [sys.executable, __file__, "--child", arm, tmp, *shape]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"arm {arm} failed:\n{done.stderr[-3000:]}")
            rows[arm] = r = json.loads(done.stdout.strip().splitlines()[-1])
            print(
                f"{arm:>18}: peak {r['peak_above_mb']:7,.0f} MB above the loaded model, "
                f"{r['seconds']:6.2f} s an update, {r['trainable'] / 1e6:7.2f}M trainable, "
                f"{r['threads']} threads (loading's high-water mark {r['setup_above_mb']:,.0f} MB)",
                flush=True,
            )
    first, base = args.arms[0], rows[args.arms[0]]
    ratios = [
        f"{arm}: peak x{r['peak_above_mb'] / base['peak_above_mb']:.2f}, "
        f"time x{r['seconds'] / base['seconds']:.2f}"
        for arm, r in rows.items()
        if arm != first
    ]
    print(f"against {first}: " + "; ".join(ratios))


if __name__ == "__main__":
    main()
