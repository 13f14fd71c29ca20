"""Which device a command runs on: ``auto`` (CUDA when this torch sees a GPU, else the CPU), or a torch
device name checked before anything is loaded onto it."""

from __future__ import annotations

import torch

from ragrl.errors import RagrlError


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """``device`` as a ``torch.device``: ``auto`` (or none) picks CUDA when available, else the CPU. A name
    torch does not know, or a CUDA device this torch or machine does not have, is a ``RagrlError`` naming
    it (rather than torch's error from deep inside the first ``.to``)."""
    if isinstance(device, torch.device):
        return device
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError):
        raise RagrlError(f"device {device!r}: not a device name (auto, cpu, cuda, cuda:N)") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise RagrlError(
                f"device {device!r}: this torch ({torch.__version__}) sees no CUDA GPU; use cpu or auto"
            )
        count = torch.cuda.device_count()
        if resolved.index is not None and resolved.index >= count:
            raise RagrlError(f"device {device!r}: this machine has {count} CUDA device(s) (cuda:0 ...)")
    return resolved
