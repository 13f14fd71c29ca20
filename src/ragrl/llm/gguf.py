"""Import a GGUF checkpoint as an ordinary model folder (``ragrl model import-gguf``).

transformers reads GGUF files (with the ``gguf`` package installed: ``pip install 'ragrl[gguf]'``) and
dequantizes their weights, but refuses to save the result ("quantized with gguf") and has to re-read
and dequantize the file every time. The import does that once: the weights are copied into a fresh
model built from the same config (so nothing marks it quantized), saved as safetensors beside the
tokenizer (with the file's chat template) and a manifest naming the source file and its sha256. Every
ragrl command then loads the folder with ``--model DIR`` like any other checkpoint.

The tokenizer's special tokens are the ones the file declares (``tokenizer.ggml.*_token_id``), whatever
the installed transformers read: 5.17 reads a ChatML file's end of turn as its beginning (eos
``<|im_start|>``) and drops its padding token, where 5.24 reads both right. A token set from the file is
named in the manifest (``special_tokens_from_file``) and printed by the command.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ragrl.errors import RagrlError

GGUF_EXTRA = "pip install 'ragrl[gguf]'"
MANIFEST_NAME = "ragrl_import.json"
GGUF_MAGIC = b"GGUF"
DTYPES = ("float32", "bfloat16", "float16")
SPECIAL_TOKEN_KEYS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
}
"""The tokenizer's special tokens and the GGUF metadata keys that declare their ids."""


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def check_gguf_file(path: str | Path) -> Path:
    """``path`` if it is a readable GGUF file, else a one-line error naming it."""
    p = Path(path)
    if not p.is_file():
        raise RagrlError(f"{p}: no such file")
    with p.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise RagrlError(f"{p}: not a GGUF file (it starts with {magic!r}, a GGUF file with {GGUF_MAGIC!r})")
    return p


def import_gguf(
    gguf_file: str | Path, out: str | Path, *, dtype: str = "float32", force: bool = False
) -> dict:
    """Import ``gguf_file`` into the model folder ``out``; returns the manifest written there.

    The folder is written beside ``out`` and renamed into place at the end, so an interrupted import
    never leaves a folder that looks complete."""
    path = check_gguf_file(gguf_file)
    out = Path(out)
    if dtype not in DTYPES:
        raise RagrlError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if out.exists() and not force:
        raise RagrlError(f"{out}: already exists (pass --force to replace it)")
    try:
        import gguf  # noqa: F401 - transformers reads GGUF files through it
    except ImportError:
        raise RagrlError(f"importing a GGUF file needs the gguf package: {GGUF_EXTRA}") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    torch_dtype = getattr(torch, dtype)
    # transformers < 4.56 spells it torch_dtype
    dtype_kw = {"dtype" if _at_least("transformers", "4.56") else "torch_dtype": torch_dtype}
    try:
        with _no_dequantize_bar():
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            loaded, info = AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, output_loading_info=True, **dtype_kw
            )
    except Exception as e:  # noqa: BLE001 - a damaged or unsupported file fails in many ways; name it
        reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise RagrlError(
            f"{path}: transformers cannot read this GGUF file ({type(e).__name__}: {reason})"
        ) from None

    # transformers fills a tensor the file lacks with random values: an incomplete file is refused
    absent = [*info.get("missing_keys", ()), *info.get("mismatched_keys", ())]
    if absent:
        raise RagrlError(
            f"{path}: the file lacks weights the model needs ({', '.join(map(str, absent[:3]))})"
        )
    config = loaded.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    from_file = use_declared_special_tokens(tokenizer, declared_special_tokens(path), path)
    model = AutoModelForCausalLM.from_config(config, **dtype_kw)
    model.load_state_dict(loaded.state_dict())  # the same architecture: every key fits
    model.generation_config = loaded.generation_config
    del loaded

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    manifest = {
        "source": str(path.resolve()),
        "source_name": path.name,
        "sha256": sha256_file(path),
        "bytes": path.stat().st_size,
        "architecture": config.model_type,
        "model_class": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": dtype,
        "vocab_size": len(tokenizer),
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "eos_token": tokenizer.eos_token,
        "special_tokens": {name: getattr(tokenizer, name) for name in SPECIAL_TOKEN_KEYS},
        "special_tokens_from_file": from_file,
        "transformers": _version("transformers"),
        "gguf": _version("gguf"),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return manifest


def declared_special_tokens(path: Path) -> dict[str, int]:
    """The special-token ids ``path`` declares in its metadata (``SPECIAL_TOKEN_KEYS``), by token name."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    declared = {}
    for name, key in SPECIAL_TOKEN_KEYS.items():
        field = reader.get_field(key)
        if field is not None and field.data:
            declared[name] = int(field.parts[field.data[0]][0])
    return declared


def use_declared_special_tokens(tokenizer: Any, declared: dict[str, int], path: Path) -> dict[str, list]:
    """Set each special token of ``tokenizer`` that differs from the one the file declares to the file's;
    returns ``{name: [as transformers read it, as the file declares it]}`` for those it set. The
    post-processor follows (``_follow_in_post_processor``)."""
    from_flags = _built_from_flags(tokenizer)
    changed = {}
    for name, token_id in declared.items():
        if not 0 <= token_id < len(tokenizer):
            raise RagrlError(
                f"{path}: {SPECIAL_TOKEN_KEYS[name]} is {token_id}, outside the vocabulary of "
                f"{len(tokenizer):,} tokens"
            )
        token = tokenizer.convert_ids_to_tokens(token_id)
        read = getattr(tokenizer, name)
        if read != token:
            setattr(tokenizer, name, token)
            changed[name] = [read, token]
    if changed:
        _follow_in_post_processor(tokenizer, changed, declared, from_flags)
    return changed


def _post_processor_state(tokenizer: Any) -> dict[str, Any] | None:
    post = getattr(getattr(tokenizer, "_tokenizer", None), "post_processor", None)
    return None if post is None else json.loads(post.__getstate__())


def _built_from_flags(tokenizer: Any) -> bool:
    """Whether the post-processor is the template transformers builds from the tokenizer's
    ``add_bos_token`` / ``add_eos_token`` flags and its bos and eos (``update_post_processor``), as it
    builds a GGUF file's from the file's flags. Asked by building it and putting the old one back."""
    state = _post_processor_state(tokenizer)
    if state is None or not hasattr(tokenizer, "update_post_processor"):
        return False
    for flag, token in (("add_bos_token", "bos_token"), ("add_eos_token", "eos_token")):
        if getattr(tokenizer, flag, False) and getattr(tokenizer, token) is None:
            return False  # update_post_processor would clear the flag: not asked
    backend = tokenizer._tokenizer
    post = backend.post_processor
    try:
        tokenizer.update_post_processor()
        built = _post_processor_state(tokenizer)
    except Exception:  # a template it cannot build (transformers 4.x raises on some): not built from them
        return False
    finally:
        backend.post_processor = post
    return built == state


def _follow_in_post_processor(
    tokenizer: Any, changed: dict[str, list], declared: dict[str, int], from_flags: bool
) -> None:
    """Setting ``bos_token`` / ``eos_token`` leaves the fast tokenizer's post-processor as it was read: a
    template that adds a replaced token (a file with ``add_bos_token``) would still add it.

    A template built from the flags (a GGUF file's) is built again from them with the file's tokens.
    In any other post-processor, each ``TemplateProcessing`` (a ``Sequence``'s included) gets the file's
    token and id where it had one transformers read, unless that token is still one of the tokenizer's
    special tokens or was read for two of them (then which one the template means is unknown, and it is
    left as it is). Nothing else changes."""
    if from_flags:
        tokenizer.update_post_processor()
        return
    state = _post_processor_state(tokenizer)
    still = {getattr(tokenizer, name) for name in SPECIAL_TOKEN_KEYS}
    reads = [read for read, _ in changed.values()]
    swaps = {
        read: (token, declared[name])
        for name, (read, token) in changed.items()
        if read not in still and reads.count(read) == 1  # one read as two: which one is meant is unknown
    }
    if state is not None and _swap_template_tokens(state, swaps):
        post = tokenizer._tokenizer.post_processor
        post.__setstate__(json.dumps(state).encode())  # the processor from its JSON (pickle's way)
        tokenizer._tokenizer.post_processor = post


def _swap_template_tokens(state: dict[str, Any], swaps: dict[str, tuple[str, int]]) -> bool:
    """Replace each token of ``swaps`` (read -> (declared, its id)) in a post-processor's JSON, in place,
    recursing into a ``Sequence``; whether anything was replaced."""
    if state.get("type") == "Sequence":
        return any([_swap_template_tokens(sub, swaps) for sub in state.get("processors", [])])
    if state.get("type") != "TemplateProcessing":
        return False
    specials = state.get("special_tokens", {})
    found = [read for read in swaps if read in specials]
    for read in found:
        token, token_id = swaps[read]
        del specials[read]
        specials[token] = {"id": token, "ids": [token_id], "tokens": [token]}
        for key in ("single", "pair"):
            for piece in state.get(key, []):
                if piece.get("SpecialToken", {}).get("id") == read:
                    piece["SpecialToken"]["id"] = token
    return bool(found)


@contextlib.contextmanager
def _no_dequantize_bar() -> Iterator[None]:
    """transformers draws a raw tqdm bar while it dequantizes GGUF tensors (not switched off by its own
    progress-bar setting): replace it with a silent one for the duration."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def read_import_manifest(model_dir: str | Path) -> dict[str, Any] | None:
    """The import manifest of a model folder made by ``import_gguf`` (None for other folders)."""
    p = Path(model_dir) / MANIFEST_NAME
    if not p.is_file():
        return None
    return json.loads(p.read_text(encoding="utf-8"))


def _at_least(package: str, minimum: str) -> bool:
    from packaging.version import Version

    found = _version(package)
    return found is not None and Version(found) >= Version(minimum)


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None
