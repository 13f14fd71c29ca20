"""What a run's numbers depend on beyond its config and seed: the machine, the libraries and the code.

One config and seed give the same numbers in one environment; across environments, floating-point
rounding (the CPU's kernels, a library's version) can change them (docs/training.md, "Reproducibility").
``environment()`` records what to compare when two runs disagree. Every training run and every ``ragrl
eval`` writes it into its folder's ``environment.json``: the CPU and the instruction set torch's kernels
use, the GPU, the key libraries' versions, the code's commit and every installed distribution (as ``pip
freeze`` lists them), so two folders are compared with ``diff``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from ragrl.data.io import atomic_write

KEY_LIBRARIES = ("ragrl", "torch", "transformers", "tokenizers", "accelerate", "numpy", "bm25s", "faiss-cpu")
"""The distributions whose versions are listed by name (every installed one is in ``packages``)."""


@functools.cache  # once a process: what it imported is what was installed when it started
def installed_packages() -> tuple[str, ...]:
    """Every installed distribution as ``name==version``, sorted by name (what ``pip freeze`` lists)."""
    found = {}
    for dist in metadata.distributions():
        meta = dist.metadata  # None for a leftover .dist-info folder without its METADATA
        name = meta["Name"] if meta is not None else None
        if name:
            found.setdefault(name.lower(), f"{name}=={dist.version}")
    return tuple(found[name] for name in sorted(found))


def cpu_model() -> str:
    """The CPU's model name (Linux's ``/proc/cpuinfo``; elsewhere what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


REPOSITORY_VARIABLES = frozenset({
    "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR", "GIT_PREFIX", "GIT_NAMESPACE", "GIT_CEILING_DIRECTORIES",
})  # fmt: skip
"""The git variables that point git at another repository than the one holding ragrl's files (the
others, ``safe.directory`` set through ``GIT_CONFIG_*`` in a container, are kept)."""


@functools.cache  # once a process: the code it runs is the code it imported
def git_commit() -> str | None:
    """The commit of ragrl's source when it runs from a git checkout that tracks it (``-dirty`` when its
    files differ from the commit); None when it is installed elsewhere (a wheel inside some other
    repository, a virtualenv in a checkout, is not that repository's code)."""
    here = Path(__file__).parents[1]  # the ragrl package: its files are the code

    def git(*args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in REPOSITORY_VARIABLES}  # this folder's
        return subprocess.run(
            ["git", "--no-optional-locks", *args],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
            env=env,
        )

    try:
        if git("ls-files", "--error-unmatch", "--", "llm/environment.py").returncode != 0:
            return None  # not tracked here: installed, or no git at all
        commit = git("rev-parse", "HEAD").stdout.strip()
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not commit:
        return None
    return f"{commit}-dirty" if changed else commit


def environment(device: Any = None) -> dict[str, Any]:
    """The machine, the libraries and the code of this process (see the module docstring); ``device``:
    the torch device it computes on, when known (else CUDA's current device, once CUDA is started)."""
    import torch

    packages = installed_packages()
    installed = {}  # the list read once, not each name again; names as PEP 503 compares them
    for package in packages:
        name, version = package.split("==", 1)
        installed[re.sub(r"[-_.]+", "-", name.lower())] = version
    versions = {name: installed.get(name) for name in KEY_LIBRARIES}
    gpu = None
    if torch.cuda.is_available():
        # the device this process works on, once it has one: asking before would start CUDA on device 0
        # (a process meant for cuda:1, or vLLM's workers, must not find it started)
        given = torch.device(device) if device is not None else None
        if given is not None and given.type == "cuda":
            index = given.index if given.index is not None else torch.cuda.current_device()
        elif given is None and torch.cuda.is_initialized():
            index = torch.cuda.current_device()
        else:  # the CPU, or not started yet
            index = None
        gpu = {
            "name": torch.cuda.get_device_name(index) if index is not None else None,
            "index": index,
            "count": torch.cuda.device_count(),
            "cuda": torch.version.cuda,
        }
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the kernels torch dispatches to
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": gpu,
        "versions": versions,
        "git_commit": git_commit(),
        "packages_sha256": hashlib.sha256("\n".join(packages).encode()).hexdigest(),
        "packages": list(packages),
    }


def describe(env: dict[str, Any]) -> str:
    """One line of an environment record for a report: CPU, instruction set, torch, commit (a record
    edited by hand reads as what it holds, never an error)."""
    versions = env.get("versions") if isinstance(env.get("versions"), dict) else {}
    gpu = env.get("gpu") if isinstance(env.get("gpu"), dict) else None
    commit = str(env.get("git_commit") or "unknown")
    dirty = "-dirty" if commit.endswith("-dirty") else ""
    if not gpu:
        device = "no GPU"
    elif gpu.get("name"):
        device = f"GPU {gpu['name']}"
    else:
        device = f"{gpu.get('count')} GPU(s), unused"
    parts = [
        f"{env.get('cpu')} ({env.get('cpu_capability')}, {env.get('cpus')} CPUs, "
        f"{env.get('torch_threads')} threads)",
        device,
        f"torch {versions.get('torch')}",
        f"transformers {versions.get('transformers')}",
        f"commit {commit.removesuffix('-dirty')[:12]}{dirty}",
        f"packages {str(env.get('packages_sha256'))[:12]}",
    ]
    return ", ".join(parts)


COMPARED = ("cpu", "cpu_capability", "torch_threads", "gpu", "git_commit", "packages_sha256")
"""What a resumed run's new environment is compared on with the one it resumes from."""


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The fields of ``COMPARED`` (and the key libraries' versions) that differ, as ``name: a -> b``."""
    found = [f"{k}: {before.get(k)} -> {after.get(k)}" for k in COMPARED if before.get(k) != after.get(k)]
    old, new = before.get("versions") or {}, after.get("versions") or {}
    found += [f"{k}: {old.get(k)} -> {new.get(k)}" for k in KEY_LIBRARIES if old.get(k) != new.get(k)]
    return found


def record_environment(
    path: str | Path, *, step: int = 0, env: dict[str, Any] | None = None, device: Any = None
) -> dict[str, Any]:
    """Write this process's environment, started at ``step``, into ``path``: a list of the run's starts.
    A run started afresh (``step`` 0) writes a list of one; a resumed one adds its record and warns when
    its environment differs from the previous start's (its numbers may then differ from an uninterrupted
    run's). ``env``: the environment taken earlier (default: now, on ``device``). Returns the record."""
    from ragrl.console import console

    path = Path(path)
    starts: list[dict[str, Any]] = []
    if step and path.exists():
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            loaded = None
            console.print(f"warning: {path}: unreadable ({err}); it now holds this start only")
        if isinstance(loaded, list) and all(isinstance(r, dict) for r in loaded):
            starts = loaded
        elif loaded is not None:
            console.print(f"warning: {path}: not a list of starts; it now holds this start only")
    record = {"step": step, **(env if env is not None else environment(device))}
    if starts and (differ := changes(starts[-1], record)):
        console.print(
            f"warning: resumed at step {step} in another environment than step {starts[-1].get('step')}'s "
            f"({'; '.join(differ)}); its numbers may differ from an uninterrupted run's"
        )
    text = json.dumps([*starts, record], indent=2) + "\n"
    atomic_write(path, lambda f: f.write(text), "w")  # a kill mid-write never loses the earlier starts
    return record
