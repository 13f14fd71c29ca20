"""The output head only where the loss needs it: ``token_logprobs(..., mask=loss_mask)`` vs full logits.

    .venv/bin/python benchmarks/masked_logprobs.py [--batch 16] [--length 300] [--scored 0.3]
        [--hidden 128] [--layers 4] [--vocab 8192] [--heads H] [--kv-heads K] [--intermediate I]
        [--repeats 5]

One training step's forward and backward through ``token_logprobs`` on a Llama of the given shape
(default: the tiny policy's) and a batch like an SFT or GRPO micro-batch: ``--batch`` sequences of
``--length`` tokens of which a ``--scored`` share are the policy's (the rest: prompt and retrieved
passages, never scored). Both arms compute the same log-probs on the scored positions (checked); the
full arm applies the vocabulary-sized head at every position, the masked arm only at the scored ones.
SmolLM2-135M's shape: ``--hidden 576 --layers 30 --vocab 49152 --heads 9 --kv-heads 3 --intermediate
1536`` (random weights). Medians of ``--repeats`` timed steps after two warm-up steps, on this
machine's threads. The last line is the headline: the masked step's speed as a multiple of the full step's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from ragrl.llm.logprobs import token_logprobs


def step_seconds(
    model: LlamaForCausalLM, ids: torch.Tensor, mask: torch.Tensor, masked: bool, repeats: int
) -> float:
    times = []
    for i in range(repeats + 2):
        t0 = time.perf_counter()
        logp = token_logprobs(model, ids, start=1, mask=mask if masked else None)
        (-(logp * mask).sum() / mask.sum()).backward()
        model.zero_grad(set_to_none=True)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=300)
    ap.add_argument("--scored", type=float, default=0.3, help="share of positions in the loss")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=None, help="attention heads (default hidden / 32)")
    ap.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: --heads)")
    ap.add_argument("--intermediate", type=int, default=None, help="MLP width (default 3 x hidden)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    heads = args.heads or max(2, args.hidden // 32)
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=heads, num_key_value_heads=args.kv_heads or heads,
        intermediate_size=args.intermediate or 3 * args.hidden, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    ids = torch.randint(3, args.vocab, (args.batch, args.length))
    # the policy's tokens: a contiguous block per sequence, as after a prompt and between passages
    mask = torch.zeros(args.batch, args.length - 1)
    n = max(1, int(args.scored * (args.length - 1)))
    for b in range(args.batch):
        first = int(torch.randint(0, args.length - 1 - n + 1, ()).item())
        mask[b, first : first + n] = 1.0
    with torch.no_grad():
        full = token_logprobs(model, ids, start=1)
        part = token_logprobs(model, ids, start=1, mask=mask)
    gap = float(((full - part) * mask).abs().max())
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"transformers {transformers.__version__}; model: hidden {args.hidden}, {args.layers} layers, "
          f"vocab {args.vocab} ({millions:.2f}M parameters); batch {args.batch} x {args.length} tokens, "
          f"{int(mask.sum())} scored; threads {torch.get_num_threads()}")  # fmt: skip
    print(f"max |full - masked| on scored positions: {gap:.2e}")
    full_s = step_seconds(model, ids, mask, False, args.repeats)
    masked_s = step_seconds(model, ids, mask, True, args.repeats)
    print(f"full logits:   {full_s:.3f} s / step")
    print(f"masked head:   {masked_s:.3f} s / step")
    print(f"masked head speed: {full_s / masked_s:.2f}x the full logits' step")


if __name__ == "__main__":
    main()
