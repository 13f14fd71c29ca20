"""The KV cache that grows in place against transformers' own ``DynamicCache``, by context length.

    .venv/bin/python benchmarks/kv_cache_growth.py [--contexts 64 512 1536] [--new 64] [--rows 16]
        [--repeats 3] [shape: --hidden 128 --layers 4 --vocab 8192 ...]

A Llama of the given shape (default: the tiny policy's, 1.9M parameters) with random weights decodes
``--rows`` rows of a ``--contexts`` prompt for ``--new`` greedy tokens in a plain loop (a prefill, then
one forward a token with the cache), once with ``ragrl.llm.kv_cache.new_cache`` (layers that grow by
doubling and write each step in place) and once with ``DynamicCache`` (transformers' layers, which
concatenate the whole cache every step). Both caches give the same tokens (checked). The two are timed
interleaved, best of ``--repeats``; tokens/s counts the new tokens. The last line is the in-place
cache's throughput as a multiple of ``DynamicCache``'s, per context length.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from ragrl.llm.kv_cache import new_cache
from ragrl.llm.logprobs import cache_keyword


@torch.no_grad()
def decode(model: LlamaForCausalLM, prompt: torch.Tensor, new: int, cache: object) -> torch.Tensor:
    key = cache_keyword(model)  # ``cache`` (transformers 5.24) or ``past_key_values``
    out = model(input_ids=prompt, use_cache=True, **{key: cache})
    tokens = [out.logits[:, -1].argmax(-1)]
    for _ in range(new - 1):
        out = model(input_ids=tokens[-1][:, None], use_cache=True, **{key: getattr(out, key)})
        tokens.append(out.logits[:, -1].argmax(-1))
    return torch.stack(tokens, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[64, 512, 1536])
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--intermediate", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads or args.heads,
        intermediate_size=args.intermediate or 3 * args.hidden, tie_word_embeddings=True,
        max_position_embeddings=max(args.contexts) + args.new,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    print(
        f"model: hidden {args.hidden}, {args.layers} layers, vocab {args.vocab} ({millions:.1f}M parameters, "
        f"random, fp32); {args.rows} rows, {args.new} new tokens, greedy; {torch.get_num_threads()} threads"
    )
    ratios = []
    for context in args.contexts:
        prompt = torch.randint(3, args.vocab, (args.rows, context))
        caches = {"in place": lambda: new_cache(model), "DynamicCache": DynamicCache}
        same = torch.equal(
            decode(model, prompt, args.new, caches["in place"]()),
            decode(model, prompt, args.new, DynamicCache()),
        )
        assert same, f"context {context}: the two caches gave different tokens"
        best = {name: float("inf") for name in caches}
        for _ in range(args.repeats):
            for name, make in caches.items():
                t0 = time.perf_counter()
                decode(model, prompt, args.new, make())
                best[name] = min(best[name], time.perf_counter() - t0)
        rate = {name: args.rows * args.new / s for name, s in best.items()}
        print(
            f"context {context:>5}: in place {rate['in place']:8,.0f} tokens/s, "
            f"DynamicCache {rate['DynamicCache']:8,.0f} tokens/s (best of {args.repeats})",
            flush=True,
        )
        ratios.append(f"{context}: {rate['in place'] / rate['DynamicCache']:.2f}x")
    print("in place / DynamicCache throughput: " + ", ".join(ratios))


if __name__ == "__main__":
    main()
