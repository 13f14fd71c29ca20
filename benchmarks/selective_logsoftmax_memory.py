"""``selective_log_softmax``'s memory: peak resident memory of scoring chosen tokens, forward and
backward, against the plain ``log_softmax(logits.float(), -1).gather(...)``.

    .venv/bin/python benchmarks/selective_logsoftmax_memory.py [--batch 4] [--length 512]
        [--vocab 49152] [--dtype bfloat16 float32] [--repeats 3] [--sliced]

Random logits ``[batch, length, vocab]`` in ``--dtype`` (a leaf that requires grad, as a model's output
does) and random chosen ids; the log-probs summed and back-propagated to the logits. Each (dtype, way)
runs in a process of its own, so its peak resident memory (``ru_maxrss``) is its own; it is reported
above the process's resident memory once the logits and their gradient's buffer exist
(``/proc/self/statm``), so what is left is what the scoring itself holds. Seconds are the median of
``--repeats`` passes after one warm-up. The log-probs and gradients of the two ways are compared
(largest difference printed). The last line is the headline: selective's peak as a share of plain's,
per dtype.

``--sliced`` scores ``logits[:, :-1]`` of ``[batch, length + 1, vocab]`` logits, as ``token_logprobs``
does with a model's output (the last position predicts nothing): plain autograd on the slice, against
``shifted_log_softmax`` (the whole logits, the last position's dummy score dropped), which
``token_logprobs`` calls.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from process_memory import timed_passes

WAYS = ("plain", "selective")


def child(
    way: str, batch: int, length: int, vocab: int, dtype: str, repeats: int, sliced: bool
) -> dict[str, float]:
    import torch

    from ragrl.llm.logprobs import selective_log_softmax, shifted_log_softmax

    torch.manual_seed(0)
    logits = torch.randn(batch, length + sliced, vocab, dtype=getattr(torch, dtype)).requires_grad_()
    index = torch.randint(0, vocab, (batch, length))
    logits.grad = torch.zeros_like(logits)  # the gradient's buffer exists before the baseline is read

    def score() -> torch.Tensor:
        scored = logits[:, :-1] if sliced else logits
        if way == "plain":
            return torch.log_softmax(scored.float(), -1).gather(-1, index[..., None]).squeeze(-1)
        if sliced:  # what token_logprobs does with a model's output
            return shifted_log_softmax(logits, index)
        return selective_log_softmax(logits, index)

    def one_pass() -> None:
        score().sum().backward()

    row = timed_passes(one_pass, repeats)
    with torch.no_grad():  # the values the passes scored, for the two ways' comparison
        logp = score()
    return {
        **row,
        "logits_mb": logits.numel() * logits.element_size() / 2**20,
        "logp_sum": float(logp.detach().double().sum()),
        "grad_sum_abs": float(logits.grad.double().abs().sum()),
    }


def _ratio(ours: float, base: float) -> str:
    """``ours / base`` as ``1.23×``; ``n/a`` where the base measured nothing (toy sizes)."""
    return f"{ours / base:.2f}×" if base > 0 else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sliced", action="store_true", help="score logits[:, :-1], as token_logprobs does")
    ap.add_argument("--child", nargs=2, metavar=("WAY", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        way, dtype = args.child
        print(json.dumps(child(way, args.batch, args.length, args.vocab, dtype, args.repeats, args.sliced)))
        return

    import torch

    print(
        f"logits [{args.batch}, {args.length + args.sliced}, {args.vocab}]"
        f"{f' (the first {args.length} positions scored)' if args.sliced else ''}, "
        f"forward + backward; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    ratios = []
    for dtype in args.dtype:
        rows = {}
        for way in WAYS:
            command = [sys.executable, __file__, "--child", way, dtype]
            command += ["--batch", str(args.batch), "--length", str(args.length), "--vocab", str(args.vocab)]
            command += ["--repeats", str(args.repeats)] + ["--sliced"] * args.sliced
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            rows[way] = json.loads(done.stdout.strip().splitlines()[-1])
        plain, sel = rows["plain"], rows["selective"]
        print(f"{dtype}: logits {plain['logits_mb']:,.0f} MB (and as much again for their gradient)")
        for way in WAYS:
            r = rows[way]
            print(
                f"  {way:9s}: peak {r['peak_above_mb']:8,.0f} MB above the logits, "
                f"{r['seconds']:.3f} s a pass "
                f"(set-up's high-water mark {max(0.0, r['setup_above_mb']):,.0f} MB)"
            )
        print(
            f"  same values: log-prob sums {plain['logp_sum']:.4f} / {sel['logp_sum']:.4f}, "
            f"|grad| sums {plain['grad_sum_abs']:.4f} / {sel['grad_sum_abs']:.4f}"
        )
        ratios.append(f"{dtype} peak {_ratio(sel['peak_above_mb'], plain['peak_above_mb'])}, "
                      f"time {_ratio(sel['seconds'], plain['seconds'])}")  # fmt: skip
    print("selective / plain: " + "; ".join(ratios))


if __name__ == "__main__":
    main()
