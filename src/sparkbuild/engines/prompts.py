"""Built-in prompt sets of smoke profiles: short, fixed, no downloads.

``code`` and ``prose`` are ordinary text a model should continue sensibly; ``repetitive``
asks for repetition on purpose so that n-gram and MTP drafters have something to accept
(and is exempt from the degenerate-repetition check).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PromptSetName = Literal["code", "prose", "repetitive"]


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str
    expect_repetition: bool = False


PROMPT_SETS: dict[str, tuple[Prompt, ...]] = {
    "code": (
        Prompt(
            "code/fibonacci",
            "Write a Python function `fibonacci(n)` that returns the n-th Fibonacci number "
            "iteratively, with a docstring and type hints.\n\n```python\n",
        ),
        Prompt(
            "code/http",
            "# A small HTTP client helper with retries.\nimport time\nimport urllib.request\n\n"
            "def fetch(url: str, attempts: int = 3) -> bytes:\n",
        ),
    ),
    "prose": (
        Prompt(
            "prose/memory",
            "Explain in a few paragraphs why unified memory changes how a GPU inference "
            "server should size its KV cache.",
        ),
        Prompt(
            "prose/story",
            "Once upon a time, in a data center at the edge of a quiet town, a small computer",
        ),
    ),
    "repetitive": (
        Prompt(
            "repetitive/count",
            "Continue the list exactly in the same format:\n"
            "item 1: apple\nitem 2: apple\nitem 3: apple\nitem 4: apple\nitem 5:",
            expect_repetition=True,
        ),
        Prompt(
            "repetitive/echo",
            "Repeat the sentence ten times.\nThe quick brown fox jumps over the lazy dog. "
            "The quick brown fox jumps over the lazy dog. "
            "The quick brown fox jumps over the lazy dog.",
            expect_repetition=True,
        ),
    ),
}
