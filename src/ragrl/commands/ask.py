"""``ragrl ask``: a few questions put to a policy, each episode shown turn by turn.

What a trained agent does with one question, without writing a question file: the policy's turns and
the retriever's observations on stderr as they were generated and read (greedy by default, the method's
evaluation rollout, as ``ragrl eval`` plays it), and one JSON object per question on stdout: the answer,
the searches, the passages found and why the episode ended.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from ragrl.commands import METHOD_CHOICES
from ragrl.console import console, styled
from ragrl.errors import RagrlError

METHOD_HELP = (
    f"Method: {METHOD_CHOICES}. Default: the config.yaml of the training run the model comes from "
    "(RUN/policy, RUN/warm_start/policy, RUN/checkpoints/step-N/policy), else search_r1."
)


def trained_with(model: Path) -> Path | None:
    """The config.yaml of the training run that saved ``model``, for the folders a run saves a policy in:
    ``RUN/policy``, ``RUN/best`` (a stage's run folder too), ``RUN/warm_start/policy`` (the demo's warm
    start) and ``RUN/checkpoints/step-N/policy``; a run folder holds ``config.yaml`` and ``metrics.jsonl``.
    Any other folder (the demo's untrained ``RUN/tiny-policy``, a model of one's own) has none."""
    model = Path(model).absolute()
    if model.name not in ("policy", "best"):
        return None
    runs = [model.parent]
    if model.name == "policy" and model.parent.name == "warm_start":
        runs.append(model.parent.parent)
    if model.name == "policy" and model.parent.parent.name == "checkpoints":
        runs.append(model.parent.parent.parent)
    for run in runs:
        if (run / "config.yaml").is_file() and (run / "metrics.jsonl").is_file():
            return run / "config.yaml"
    return None


def method_for(method: str | None, model: Path) -> str:
    """``--method`` as given, else the run's config that trained ``model`` (said on stderr: a policy
    played under another method's prompt and budgets scores nothing), else ``search_r1``."""
    if method is not None:
        return method
    config = trained_with(model)
    if config is None:
        return "search_r1"
    console.print(
        f"method: {config}, the run that trained {model} (--method chooses another)", highlight=False
    )
    return str(config)


def load_policy(model: Path, backend: str, device: str, batch_size: int) -> Any:
    """The generation backend of a checkpoint folder (``ragrl eval`` and ``ragrl ask``)."""
    if not model.is_dir():
        raise RagrlError(f"{model}: not a model directory")
    if backend == "vllm":
        from ragrl.llm.vllm_backend import VLLMBackend

        return VLLMBackend(str(model))
    if backend == "transformers":
        from ragrl.llm.hf_backend import TransformersBackend

        return TransformersBackend(str(model), device=device, batch_size=batch_size)
    raise RagrlError(f"unknown backend {backend!r} (expected transformers or vllm)")


def transcript(trajectory: Any) -> None:
    """The episode on stderr: each policy turn as generated, each observation dimmed."""
    for segment in trajectory.segments:
        text = segment.text.rstrip("\n")
        if segment.kind == "policy":
            console.print(styled("policy:", "bold cyan", text))
        else:
            console.print(styled("observation:", "dim", text + (" [cut]" if segment.truncated else "")))
    answer = trajectory.final_answer
    console.print(styled("answer:", "bold green", answer if answer is not None else "(none)"))


def ask(
    questions: Annotated[list[str], typer.Argument(metavar="QUESTION...", help="One or more questions.")],
    model: Annotated[Path, typer.Option(help="Policy checkpoint directory (from_pretrained).")],
    index: Annotated[
        str | None,
        typer.Option(
            metavar="DIR|URL",
            help="Retrieval index directory (ragrl index) or a retrieval server's URL (ragrl serve).",
        ),
    ] = None,
    method: Annotated[str | None, typer.Option(help=METHOD_HELP, show_default=False)] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="KEY=VALUE", help="Config override key.path=value (repeatable)."),
    ] = None,
    closed_book: Annotated[
        bool, typer.Option("--closed-book", help="Every search finds nothing (no --index).")
    ] = False,
    temperature: Annotated[float, typer.Option(help="Sampling temperature; 0 = greedy.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed for sampling.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:1, ...")] = "auto",
    backend: Annotated[
        Literal["transformers", "vllm"], typer.Option(help="Generation backend.")
    ] = "transformers",
    show: Annotated[
        bool, typer.Option("--transcript/--no-transcript", help="Show each episode turn by turn on stderr.")
    ] = True,
) -> None:
    """Ask a policy questions: each episode turn by turn on stderr, one JSON object per question on
    stdout ({question, answer, queries, retrieved_ids, finish_reason})."""
    from ragrl.data.schema import Example
    from ragrl.eval.runner import eval_rollout
    from ragrl.methods import load_method
    from ragrl.retrieval.open import close_all, open_retriever
    from ragrl.rollout.limits import check_prompts

    texts = [q.strip() for q in questions]
    if not all(texts):
        raise RagrlError("a QUESTION is empty: give the words of the question")
    method_obj = load_method(method_for(method, model), set_ or [])
    if not method_obj.protocol.needs_retriever:
        raise RagrlError(
            f"method {method_obj.name!r} reads the passages given with each question, which a QUESTION "
            "has none of: evaluate it on a question file with `ragrl eval`"
        )
    if closed_book == (index is not None):
        raise RagrlError("give --index (a folder or a server's URL) or --closed-book, one of them")
    if backend == "transformers":  # the device, before the index and the model load
        from ragrl.llm.devices import resolve_device

        resolve_device(device)
    examples = method_obj.prepare_examples(
        [Example(f"ask-{i}", q, []) for i, q in enumerate(texts)], "QUESTION"
    )
    if closed_book:
        from ragrl.retrieval.null import NullRetriever

        retriever: Any = NullRetriever()
    else:
        retriever = open_retriever(index)  # type: ignore[arg-type]
    policy = load_policy(model, backend, device, batch_size=len(examples))
    try:
        check_prompts(examples, method_obj.protocol, policy.tokenizer, method_obj.rollout, "QUESTION")
        rollout = eval_rollout(method_obj, policy, retriever, temperature=temperature, seed=seed)
        trajectories = rollout.run(examples, n=1, seed=seed)
    finally:
        close_all(policy, retriever)
    for example, trajectory in zip(examples, trajectories, strict=True):
        if show:
            console.print(styled("question:", "bold", example.question))
            transcript(trajectory)
        record = {
            "question": example.question,
            "answer": trajectory.final_answer,
            "queries": trajectory.queries,
            "retrieved_ids": list(dict.fromkeys(trajectory.retrieved_ids)),
            "finish_reason": trajectory.finish_reason,
        }
        typer.echo(json.dumps(record, ensure_ascii=False))
