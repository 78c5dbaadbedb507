"""The context axis: tokens of context placed before each prompt of a variant.

A variant at ``context`` N sends each prompt record after N tokens (counted with the
model's own tokenizer) of what its workload's ``context`` names: earlier turns drawn
from the workload's other records, a shared document, or half each. What a prompt
gets depends only on its place in the workload and N, so the same prompt carries the
same context every night, and pairing by prompt stays valid.

Pure, except :func:`load_tokenizer`, which reads the model's ``tokenizer.json``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from farm.errors import SpecError
from farm.spec import ContextSpec
from farm.workload.formats import Prompt

__all__ = ["ContextBuilder", "RequestContext", "TokenCounter", "load_tokenizer"]


class TokenCounter(Protocol):
    """What building a context needs of a tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class RequestContext:
    """What goes before one prompt record: earlier (user, assistant) turns, then the
    document at the head of its first prompt; ``tokens`` is their count."""

    history: tuple[tuple[str, str], ...] = ()
    document: str = ""
    tokens: int = 0

    def first_prompt(self, prompt: str) -> str:
        return f"{self.document}\n\n{prompt}" if self.document else prompt


class ContextBuilder:
    """Builds the context of each prompt record of one workload at any length."""

    def __init__(
        self,
        spec: ContextSpec,
        prompts: Sequence[Prompt],
        tokenizer: TokenCounter,
        document: str = "",
        turn_overhead: int = 0,
    ) -> None:
        """``turn_overhead``: the tokens the chat template adds around each earlier
        turn (role markers, separators), as the engine counts them."""
        if spec.source != "history" and not document.strip():
            raise SpecError(f"context source {spec.source}: the document is empty")
        self._spec = spec
        self._prompts = tuple(prompts)
        self._tokenizer = tokenizer
        self._turns = [(p.prompt, p.answer or "") for p in self._prompts]
        self._turn_tokens = [
            len(tokenizer.encode(user)) + len(tokenizer.encode(answer)) + turn_overhead
            for user, answer in self._turns
        ]
        self._document_ids = tokenizer.encode(document) if document else []

    def build(self, tokens: int, index: int) -> RequestContext:
        """The context of prompt record ``index`` at ``tokens`` tokens (none at 0)."""
        if tokens <= 0:
            return RequestContext()
        source = self._spec.source
        document_tokens = {"history": 0, "document": tokens, "both": tokens // 2}[source]
        document, counted = self._document(document_tokens)
        history, in_turns = self._history(tokens - counted, index)
        return RequestContext(history=history, document=document, tokens=counted + in_turns)

    def _document(self, tokens: int) -> tuple[str, int]:
        """The document cut (or repeated) to ``tokens`` tokens, and its count."""
        if tokens <= 0:
            return "", 0
        ids = self._document_ids
        repeated = (ids * (tokens // len(ids) + 1))[:tokens]
        text = self._tokenizer.decode(repeated)
        return text, len(self._tokenizer.encode(text))

    def _history(self, tokens: int, index: int) -> tuple[tuple[tuple[str, str], ...], int]:
        """Whole earlier turns from the records after ``index`` (wrapping, itself
        left out unless it is the only one) as long as they fit in ``tokens``: the
        cell's length holds the context on top of a prompt, never more."""
        if tokens <= 0:
            return (), 0
        n = len(self._turns)
        order = [(index + k) % n for k in range(1, n)] or [index]
        if not any(self._turn_tokens[j] for j in order):
            raise SpecError("context source history: the workload's prompts hold no tokens")
        turns: list[tuple[str, str]] = []
        total = 0
        while True:
            for j in order:
                if total + self._turn_tokens[j] > tokens:
                    return tuple(turns), total
                turns.append(self._turns[j])
                total += self._turn_tokens[j]


class _HfTokenizer:
    """A ``tokenizers.Tokenizer`` as a :class:`TokenCounter` (no special tokens: the
    chat template adds its own)."""

    def __init__(self, path: Path) -> None:
        # Imported here: only a variant with context needs it.
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))


def load_tokenizer(model_path: str | Path) -> TokenCounter:
    """The model's tokenizer (its ``tokenizer.json``), read once per file for every
    context variant of a cell. Raises SpecError naming the file when the model has
    none or it cannot be read."""
    path = Path(model_path) / "tokenizer.json"
    if not path.is_file():
        raise SpecError(
            f"{path}: no such file; the context axis counts tokens with the model's "
            "own tokenizer.json"
        )
    return _read_tokenizer(path)


@functools.lru_cache(maxsize=4)
def _read_tokenizer(path: Path) -> TokenCounter:
    try:
        return _HfTokenizer(path)
    except Exception as exc:  # the tokenizers library raises bare Exceptions
        raise SpecError(f"{path}: not a tokenizer the tokenizers library reads ({exc})") from None
