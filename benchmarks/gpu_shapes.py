"""The papers' model shapes on one GPU: generation speed, a GRPO step's phases and peak memory, TRL's step.

Models of the papers' shapes need no download: each is built from its published config with random
weights (Qwen2.5-0.5B / 1.5B / 3B: hidden size, layers, heads, KV heads, intermediate size, the 151,936
vocabulary, tied embeddings), in bf16 on the GPU. The tokenizer is the shipped reader base's (its ids
are a subset of the vocabulary; ids it does not have decode to nothing, which is all a random model's
text needs). For each size and each number of questions per step (``--questions``; groups of
``--group``, the Search-R1 recipe's shapes: a prompt of ``--prompt-tokens``, up to 4 turns of
``--new-tokens``):

* ``generate``: plain ``model.generate`` at the same batch and lengths (every sequence runs the full
  ``--new-tokens``): the physical reference for the rollout, in generated tokens per second;
* ``ragrl``: one ``GRPOTrainer.step()`` after a warm-up step, split into rollout, log-prob passes and
  update (``rollout_seconds``, ``logprob_seconds``, ``update_seconds``), with the peak GPU memory;
* ``trl``: TRL's ``GRPOTrainer`` on a model built from the same seed, the same prompts, batch, lengths
  and update (one optimizer step over the same micro-batches, β = 0, token-mean loss), when ``trl`` is
  installed: the time of its second step, its completions' mean length (beside ragrl's), and the
  throughput ratio TRL s/step ÷ ragrl s/step.

Every side does the same work: one turn of ``--new-tokens`` per sequence (``--max-turns 1``). A
random model never closes a tag, so with more turns ragrl's rollout would go on with the corrective
observation, turn after turn, while ``generate`` and TRL stop after one (the first GPU run, 4 turns:
ragrl's rollout made 504 tokens a sequence against their 128). The table gives ragrl's rollout in
tokens/s beside ``generate``'s. ``--profile`` writes a cProfile of one more ragrl step after the
measured one (``profile.txt``) beside the tables, for the run's first row: where a GPU step's time
goes in Python, without the profiler's cost in the measured figures.
A batch that runs out of GPU memory is recorded as ``OOM`` and ends that size's sweep: the last row
before it is the largest batch that fits without sharding.

    python benchmarks/gpu_shapes.py --out runs/gpu-shapes               # GPU: 0.5B, 1.5B, 3B
    python benchmarks/gpu_shapes.py --toy --out runs/gpu-shapes-toy     # CPU: a toy shape, seconds

Writes ``shapes.md`` and ``shapes.json`` in ``--out``; the table is printed last.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import itertools
import json
import logging
import pstats
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

VOCAB = 151_936
SHAPES: dict[str, dict[str, Any]] = {
    # the published configs (Qwen/Qwen2.5-{0.5B,1.5B,3B}-Instruct config.json)
    "qwen2.5-0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "intermediate_size": 4864},
    "qwen2.5-1.5b": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
                     "num_key_value_heads": 2, "intermediate_size": 8960},
    "qwen2.5-3b": {"hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16,
                   "num_key_value_heads": 2, "intermediate_size": 11008},
    # SmolLM2-135M (HuggingFaceTB/SmolLM2-135M-Instruct config.json): its own 49,152-token vocabulary
    "smollm2-135m": {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
                     "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49_152},
    # the CPU's toy path: the same vocabulary and code, two narrow layers
    "toy": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 128},
}  # fmt: skip


def build(
    shape: str, device: torch.device, dtype: torch.dtype, tokenizer: Any, seed: int = 0, vocab: int = VOCAB
) -> Any:
    """A randomly initialised Qwen2 causal LM of ``shape`` (with a ``vocab``-token embedding), built on
    ``device``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape_config = {"vocab_size": vocab, **SHAPES[shape]}
    config = Qwen2Config(
        tie_word_embeddings=True, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        max_position_embeddings=32768, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **shape_config,
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gb(device: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None


def filler_messages(tokenizer: Any, questions: list[Any], method: Any, prompt_tokens: int) -> list[Any]:
    """The questions with a system message of filler words that brings each prompt to about
    ``prompt_tokens`` tokens (the recipe's prompt length)."""
    import dataclasses

    shortest = min(len(method.protocol.prompt_ids(q, tokenizer)) for q in questions)
    words = " ".join(f"passage {i} says nothing" for i in range(prompt_tokens))
    ids = tokenizer(words, add_special_tokens=False)["input_ids"][: max(0, prompt_tokens - shortest)]
    return [dataclasses.replace(q, question=tokenizer.decode(ids) + " " + q.question) for q in questions]


def measure_generate(
    model: Any, batch: int, prompt: int, new: int, device: torch.device, *, padded: bool = False,
    static: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """``model.generate`` on ``batch`` random prompts of ``prompt`` tokens, every row ``new`` tokens.

    ``padded``: the prompts' lengths spread evenly from half of ``prompt`` to all of it, left-padded
    with an attention mask, as ragrl's rollout decodes rows. ``static``: a static KV cache, for which
    transformers compiles the decoding step (CUDA graphs) on a GPU; its first call, the compilation
    included, is timed apart (``first_seconds``), and the measured call is the third (a second may
    record its graphs again for a new cache). The model decodes in eval mode, as ragrl's rollout does
    (in training mode, with gradient checkpointing on, some transformers versions drop the KV cache)."""

    def once() -> tuple[float, int]:
        ids = torch.randint(10, 8000, (batch, prompt), device=device)
        mask = torch.ones_like(ids)
        if padded:
            for row, n in enumerate(torch.linspace(prompt // 2, prompt, batch).round().long().tolist()):
                mask[row, : prompt - n] = 0
                ids[row, : prompt - n] = model.generation_config.pad_token_id
        extra = {"cache_implementation": "static"} if static else {}
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                do_sample=True, temperature=1.0, top_k=0, top_p=1.0, **extra,
            )  # fmt: skip
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0, (out.shape[1] - prompt) * batch

    free(device)
    was_training = model.training
    model.eval()
    try:
        first = None
        if static:
            first = once()[0]  # the compilation
            once()  # a second call may record its graphs again for a new cache
        seconds, tokens = once()
    finally:
        model.train(was_training)
    result = {
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds),
        "peak_gb": peak_gb(device),
    }
    return result if first is None else {**result, "first_seconds": round(first, 2)}


def generate_variants(model: Any, batch: int, args: argparse.Namespace, device: torch.device) -> dict:
    """``generate`` as the row's reference measured it (``plain``, timed again here on a warm process so
    the three compare), padded as ragrl's rows are, and padded with a static, compiled KV cache: what
    padding costs and what CUDA graphs would buy the rollout (the second GPU run: ragrl's decoding step
    of 256 rows took 93 ms against unpadded ``generate``'s 51 ms). A variant that fails is recorded,
    not fatal."""
    variants: dict[str, Any] = {}
    options = {"plain": {}, "padded": {"padded": True}, "static": {"padded": True, "static": True}}
    for name, extra in options.items():
        try:
            variants[name] = measure_generate(
                model, batch, args.prompt_tokens, args.new_tokens, device, **extra
            )
        except Exception as e:  # noqa: BLE001 - a compiler's or a cache's failure is the figure here
            if out_of_memory(e):
                variants[name] = {"oom": True}
            else:
                variants[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        finally:
            try:  # the compiled step and its CUDA graphs' memory go before the next side
                torch._dynamo.reset()
                free(device)
            except Exception as e:  # noqa: BLE001 - a broken context: the next side will say so
                variants[name] = {**variants.get(name, {}), "cleanup_error": f"{type(e).__name__}: {e}"[:300]}
    return variants


def measure_ragrl(
    model: Any, tokenizer: Any, method: Any, questions: list[Any], device: torch.device,
    profile: Path | None = None,
) -> dict:  # fmt: skip
    from ragrl.train.grpo import GRPOTrainer

    free(device)
    trainer = GRPOTrainer(
        method, method.train, run_dir=Path(method.train.out), train_examples=questions, eval_examples=[],
        retriever=None, model=model, tokenizer=tokenizer,
    )  # fmt: skip
    trainer.step()  # warm-up: kernels, allocator
    trainer.backend.decode_log.clear()
    m = trainer.step()  # the measured step, never under the profiler (it slows Python-heavy phases)
    decoded = dict(trainer.backend.decode_log)  # what decoded the measured step's batches
    refusal = trainer.backend.graphs.refusal  # why the CUDA graph was given up, if it was
    if profile is not None:  # a third step, profiled
        profiler = cProfile.Profile()
        profiler.runcall(trainer.step)
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text).strip_dirs()
        stats.sort_stats("cumulative").print_stats(40)
        stats.sort_stats("tottime").print_stats(25)
        profile.write_text(text.getvalue(), encoding="utf-8")
    keys = ("step_seconds", "rollout_seconds", "logprob_seconds", "update_seconds", "response_len")
    out = {k: m[k] for k in keys}
    sequences = len(questions) * method.rollout.n
    out["rollout_tokens_per_s"] = round(sequences * m["response_len"] / m["rollout_seconds"])
    return {**out, "peak_gb": peak_gb(device), "decode": decoded, "decode_refusal": refusal}


def measure_trl(
    model: Any, tokenizer: Any, messages: list[Any], args: argparse.Namespace, batch: int
) -> dict:
    import datasets
    import trl
    from grpo_vs_trl import trl_reward
    from transformers import PrinterCallback, TrainerCallback

    datasets.disable_progress_bars()
    ends: list[float] = []

    class Stamps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
            ends.append(time.perf_counter())

    micro = min(args.micro_batch, batch)
    config = trl.GRPOConfig(
        output_dir=str(args.out / "trl"), per_device_train_batch_size=micro,
        gradient_accumulation_steps=batch // micro, steps_per_generation=batch // micro,
        num_generations=args.group, max_completion_length=args.new_tokens, temperature=1.0, top_p=1.0,
        top_k=0, learning_rate=1e-6, lr_scheduler_type="constant", max_grad_norm=1.0, beta=0.0,
        num_iterations=1, epsilon=0.2, loss_type="dapo", scale_rewards="group",
        gradient_checkpointing=args.gradient_checkpointing, bf16=args.device == "cuda",
        use_cpu=args.device != "cuda", logging_steps=1, report_to="none", save_strategy="no",
        disable_tqdm=True, max_steps=2, seed=0,
    )  # fmt: skip
    dataset = datasets.Dataset.from_list([{"prompt": m} for m in messages])
    trainer = trl.GRPOTrainer(
        model=model, processing_class=tokenizer, reward_funcs=[trl_reward], args=config,
        train_dataset=dataset, callbacks=[Stamps()],
    )  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    seconds = [b - a for a, b in itertools.pairwise(ends)]
    # its completions' mean length (TRL's own log): a step that stops its rows early is not like for like
    lengths = [
        h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h
    ]
    return {
        "step_seconds": round(statistics.median(seconds), 3), "trl": trl.__version__,
        "completion_length": round(lengths[-1], 1) if lengths else None,
    }  # fmt: skip


def method_for(args: argparse.Namespace, questions: int, micro: int, decode: str | None = None) -> Any:
    from ragrl.methods import load_method

    return load_method(
        "search_r1",
        {
            "rollout.max_turns": args.max_turns, "rollout.n": args.group,
            "rollout.max_new_tokens": args.new_tokens,
            "rollout.max_total_tokens": args.prompt_tokens + args.max_turns * (args.new_tokens + 512),
            "rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.top_k": 0,
            "reward": [{"name": "bench_len", "weight": 1.0}],
            "train.out": str(args.out / "ragrl"), "train.steps": 2, "train.optim.lr": 1e-6,
            "train.grpo.prompts_per_step": questions, "train.grpo.kl_coef": 0.0,
            "train.grpo.micro_batch_size": micro, "train.grpo.loss_agg": "token_mean",
            "train.grpo.group_filter": "keep_all",
            "train.model.generation_batch_size": questions * args.group,
            "train.model.decode": decode or args.decode,
            "train.model.gradient_checkpointing": args.gradient_checkpointing,
            # TRL's side runs bf16 autocast on a GPU: the same here, and one precision for accelerate's
            # process-wide state (a second shape's ragrl trainer asking 'no' after TRL's 'bf16' was
            # refused in the second GPU run)
            "train.mixed_precision": "bf16" if args.device == "cuda" else "no",
        },
    )  # fmt: skip


def sweep(
    shape: str, args: argparse.Namespace, tokenizer: Any, examples: list[Any], on_row: Any = None
) -> list[dict[str, Any]]:
    """Every batch of ``args.questions`` for one shape, until one runs out of memory. ``on_row(row)`` is
    called as each part of a row is measured (``generate``, then ``ragrl``, then the whole row: the same
    row object, grown), so the tables hold what a call cut at its limit measured."""
    device = torch.device(args.device)
    report = on_row or (lambda row: None)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    for questions in args.questions:
        row: dict[str, Any] = {"shape": shape, "questions": questions, "sequences": questions * args.group}
        try:
            model = build(shape, device, dtype, tokenizer)
            if args.gradient_checkpointing:  # as TRL's side (load_policy is skipped for a model object)
                model.gradient_checkpointing_enable()
            row["parameters"] = sum(p.numel() for p in model.parameters())
            batch = questions * args.group
            method = method_for(args, questions, args.micro_batch)
            qs = filler_messages(tokenizer, (examples * questions)[:questions], method, args.prompt_tokens)
            row["prompt_tokens"] = round(
                statistics.mean(len(method.protocol.prompt_ids(q, tokenizer)) for q in qs)
            )
            row["generate"] = measure_generate(model, batch, args.prompt_tokens, args.new_tokens, device)
            report(row)  # each part as soon as it is measured: a call cut at its limit keeps the row so far
            profile = args.tables_dir / "profile.txt" if args.profile and not args.profiled else None
            row["ragrl"] = measure_ragrl(model, tokenizer, method, qs, device, profile)
            report(row)
            if args.generate_variants:  # after ragrl's step: a compiler's failure cannot cost the row
                row["generate_variants"] = generate_variants(model, batch, args, device)
                # the same step with the plain decoding loop, on the same warm process
                loop = method_for(args, questions, args.micro_batch, decode="loop")
                row["ragrl_loop"] = measure_ragrl(model, tokenizer, loop, qs, device)
            args.profiled = args.profiled or profile is not None  # the first row of the whole run
            del model
            free(device)
            row["trl"] = trl_side(shape, args, tokenizer, method, qs, batch, device, dtype)
            if "step_seconds" in row["trl"]:
                row["trl_over_ragrl"] = round(row["trl"]["step_seconds"] / row["ragrl"]["step_seconds"], 2)
        except Exception as e:  # noqa: BLE001 - an out-of-memory batch ends the sweep; anything else is raised
            if not out_of_memory(e):
                raise
            row["oom"] = True
        free(device)
        rows.append(row)
        print(json.dumps(row), flush=True)
        report(row)
        if row.get("oom"):
            break
    return rows


def out_of_memory(e: BaseException) -> bool:
    """A CUDA allocation failure (torch's own error, or cuBLAS failing to allocate its workspace)."""
    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and ("out of memory" in str(e) or "CUBLAS_STATUS_ALLOC_FAILED" in str(e))
    )


def trl_side(
    shape: str, args: argparse.Namespace, tokenizer: Any, method: Any, qs: list, batch: int,
    device: torch.device, dtype: torch.dtype,
) -> dict[str, Any]:  # fmt: skip
    """TRL's step on a model built from the same seed; its failure is recorded, not fatal to the sweep."""
    try:
        import trl  # noqa: F401
    except ImportError:
        return {"skipped": "trl is not installed (pip install 'ragrl[bench]')"}
    model = None
    try:
        model = build(shape, device, dtype, tokenizer)
        messages = [method.protocol.messages(q) for q in qs]
        return measure_trl(model, tokenizer, messages, args, batch)
    except Exception as e:  # noqa: BLE001 - TRL's own failure or OOM: reported in its cell
        return {"oom": True} if out_of_memory(e) else {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    finally:
        del model
        free(device)


def _split(ragrl: dict[str, Any]) -> str:
    """A ragrl step's seconds: rollout / log-probs / update."""
    return f"{ragrl['rollout_seconds']:.1f} / {ragrl['logprob_seconds']:.1f} / {ragrl['update_seconds']:.1f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| shape | params | questions × G | prompt | generate tok/s | ragrl rollout tok/s | ragrl step s "
        "(rollout / log-probs / update) | ragrl peak GB | TRL step s | TRL ÷ ragrl |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        g, o, t = r.get("generate"), r.get("ragrl"), r.get("trl")
        if r.get("oom") and g is None:  # out of memory before anything was measured
            lines.append(
                f"| {r['shape']} | | {r['questions']} × {r['sequences'] // r['questions']} | | OOM ||||||"
            )
            continue
        # a row still being measured, cut at the call's limit or out of memory part way: its parts so far
        if o is None:
            ragrl = f"— | {'OOM' if r.get('oom') else 'not reached'} | —"
        else:
            peak = o["peak_gb"] if o["peak_gb"] is not None else "—"
            ragrl = f"{o.get('rollout_tokens_per_s', 0):,} | {o['step_seconds']:.2f} ({_split(o)}) | {peak}"
        if t is None:
            trl, ratio = "not reached", "—"
        else:
            trl = f"{t['step_seconds']:.2f}" if "step_seconds" in t else "OOM" if t.get("oom") else "—"
            if t.get("completion_length") is not None:  # against ragrl's response_len
                trl += f" ({t['completion_length']:.0f} tokens; ragrl {o['response_len']:.0f})"
            ratio = r.get("trl_over_ragrl", "—")
        lines.append(
            f"| {r['shape']} | {r['parameters'] / 1e6:.0f}M | "
            f"{r['questions']} × {r['sequences'] // r['questions']} | {r.get('prompt_tokens', '—')} | "
            f"{g['tokens_per_s']:,} | {ragrl} | {trl} | {ratio} |"
        )
    variants = [r for r in rows if "generate_variants" in r]
    if variants:
        lines += ["", "| shape | questions × G | ragrl decode | ragrl step s (rollout) | rollout tok/s | "
                  "plain loop: step s (rollout) | plain loop: rollout tok/s |", "|" + "---|" * 7]  # fmt: skip
        for r in variants:
            o, p = r["ragrl"], r.get("ragrl_loop", {})
            loop = (f"{p['step_seconds']:.2f} ({p['rollout_seconds']:.2f}) | {p['rollout_tokens_per_s']:,}"
                    if "step_seconds" in p else "— | —")  # fmt: skip
            lines.append(
                f"| {r['shape']} | {r['questions']} × {r['sequences'] // r['questions']} | "
                f"{', '.join(f'{k} ×{v}' for k, v in o.get('decode', {}).items())}"
                f"{' (' + o['decode_refusal'][:150] + ')' if o.get('decode_refusal') else ''} | "
                f"{o['step_seconds']:.2f} ({o['rollout_seconds']:.2f}) | {o['rollout_tokens_per_s']:,} | "
                f"{loop} |"
            )
        lines += ["", "| shape | questions × G | generate tok/s (warm) | padded tok/s | padded, static cache "
                  "tok/s (first call s) |", "|" + "---|" * 5]  # fmt: skip
        for r in variants:
            cells = []
            for name in ("plain", "padded", "static"):
                v = r["generate_variants"][name]
                if "tokens_per_s" in v:
                    cell = f"{v['tokens_per_s']:,}"
                else:
                    cell = "OOM" if v.get("oom") else f"failed: {v.get('error', '?')[:60]}"
                cells.append(cell + (f" ({v['first_seconds']:.1f})" if "first_seconds" in v else ""))
            lines.append(
                f"| {r['shape']} | {r['questions']} × {r['sequences'] // r['questions']} | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--shapes", nargs="+", choices=list(SHAPES), default=["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b"]
    )
    ap.add_argument("--questions", type=int, nargs="+", default=[8, 16, 32, 64], help="questions per step")
    ap.add_argument("--group", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=500)
    ap.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward (both)")
    ap.add_argument("--max-turns", type=int, default=1, help="ragrl's rollout turns (1: the others' work)")
    ap.add_argument("--profile", action="store_true", help="cProfile the first measured ragrl step")
    ap.add_argument(
        "--generate-variants", action="store_true",
        help="also generate with padded prompts, and padded with a static (on a GPU, compiled) KV cache",
    )  # fmt: skip
    ap.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument(
        "--decode", default="auto", help="ragrl's train.model.decode (auto: a CUDA graph on a GPU)"
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=Path("runs/gpu-shapes"))
    ap.add_argument("--toy", action="store_true", help="the toy shape, tiny lengths, on the CPU")
    ap.add_argument("--tables", type=Path, default=None, help="where shapes.md/json go, after every row")
    args = ap.parse_args(argv)
    if args.toy:
        args.shapes, args.questions, args.group = ["toy"], [2], 2
        args.prompt_tokens, args.new_tokens, args.micro_batch = 48, 8, 2
        if args.decode == "auto":  # auto is the plain loop on a CPU: the GPU's path, without the graph
            args.decode = "static"
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    import grpo_vs_trl  # noqa: F401 - registers the benchmark reward ``bench_len``
    from transformers import AutoTokenizer

    from ragrl.data.io import atomic_write, read_examples
    from ragrl.synth import generate_world
    from ragrl.train.reader import SHIPPED_BASE

    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_BASE, local_files_only=True)
    world = args.out / "world"
    if not (world / "train.jsonl").is_file():
        generate_world(0, "small").write(world)
    examples = read_examples(world / "train.jsonl")[0][:64]
    tables = args.tables_dir = args.tables or args.out
    args.profiled = False
    tables.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []

    def write(row: dict[str, Any]) -> None:  # after every part of a row: a run stopped at its limit keeps it
        if not rows or rows[-1] is not row:  # a row's first part; later parts grow the same row
            rows.append(row)
        # whole files or none: a call killed mid-write leaves the last complete tables
        atomic_write(tables / "shapes.json", lambda f: f.write(json.dumps(rows, indent=2) + "\n"), mode="w")
        atomic_write(tables / "shapes.md", lambda f: f.write(table(rows) + "\n"), mode="w")

    for shape in args.shapes:
        sweep(shape, args, tokenizer, examples, on_row=write)
    print(table(rows))
    ratios = [r["trl_over_ragrl"] for r in rows if "trl_over_ragrl" in r]
    if ratios:
        print(f"TRL s/step ÷ ragrl s/step: median {statistics.median(ratios):.2f} (min {min(ratios):.2f})")


if __name__ == "__main__":
    main()
