"""One GRPO update pass in micro-batches: peak memory and time against one micro-batch of the whole batch.

    .venv/bin/python benchmarks/micro_batch_memory.py [--batch 64] [--micro 64 32 16] [--length 480]
        [--policy-tokens 60] [--repeats 3]

The shipped reader base (the demo's policy) takes ``--batch`` sequences of ``--length`` tokens, half of
them right-padded by 80 tokens (the lengths of a GRPO batch differ), of which ``--policy-tokens`` per
sequence are the policy's (scored); ``token_logprobs`` with the loss mask, then backward, in
micro-batches of each ``--micro`` size (gradients accumulated: the same update). Each size runs in a
process of its own, so its peak resident memory (``ru_maxrss``) is its own; it is reported above the
process's resident memory after loading the model (``/proc/self/statm``). Seconds are the median of
``--repeats`` whole passes after one warm-up, on this machine's threads (printed). The last line is
the headline: each size's peak and time as a multiple of the first size's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from process_memory import timed_passes


def child(batch: int, micro: int, length: int, policy_tokens: int, repeats: int) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from ragrl.llm.logprobs import token_logprobs
    from ragrl.train.reader import resolve_base

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(resolve_base("shipped"))
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (batch, length))
    attention = torch.ones(batch, length, dtype=torch.long)
    attention[: batch // 2, length - 80 :] = 0  # half the sequences are shorter: right padding
    start = length // 5  # the shortest prompt
    scored = torch.zeros(batch, length - start)
    first = length - start - 80 - policy_tokens  # the policy's last turn, before any padding
    scored[:, first : first + policy_tokens] = 1

    def one_pass() -> None:
        for lo in range(0, batch, micro):
            rows = slice(lo, lo + micro)
            logp = token_logprobs(model, ids[rows], attention[rows], start=start, mask=scored[rows])
            (-(logp * scored[rows]).sum() / scored.sum()).backward()
        model.zero_grad(set_to_none=True)

    row = timed_passes(one_pass, repeats)  # above the loaded model
    return {"micro": micro, "peak_mb": row["peak_above_mb"], "seconds": row["seconds"],
            "threads": torch.get_num_threads()}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--micro", type=int, nargs="+", default=[64, 32, 16])
    ap.add_argument("--length", type=int, default=480)
    ap.add_argument("--policy-tokens", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    room = args.length - args.length // 5 - 80  # after the shortest prompt, before the padding
    if not 0 < args.policy_tokens <= room:
        ap.error(
            f"--policy-tokens must be in 1..{room} for --length {args.length} "
            f"(prompt {args.length // 5}, padding 80)"
        )
    if args.child:
        row = child(args.batch, args.child, args.length, args.policy_tokens, args.repeats)
        print(json.dumps(row))
        return
    rows = []
    for micro in args.micro:
        cmd = [sys.executable, __file__, "--child", str(micro), "--batch", str(args.batch),
               "--length", str(args.length), "--policy-tokens", str(args.policy_tokens),
               "--repeats", str(args.repeats)]  # fmt: skip
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"micro-batch {micro:>3} of {args.batch}: peak {r['peak_mb']:.0f} MB above the loaded model, "
              f"{r['seconds']:.2f} s a pass on {r['threads']} threads", flush=True)  # fmt: skip
    base = rows[0]
    ratios = [
        f"{r['micro']}: peak x{r['peak_mb'] / base['peak_mb']:.2f}, "
        f"time x{r['seconds'] / base['seconds']:.2f}"
        for r in rows[1:]
    ]
    print(f"against micro-batch {base['micro']}: " + "; ".join(ratios))


if __name__ == "__main__":
    main()
