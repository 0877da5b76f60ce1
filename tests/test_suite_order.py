"""The suite's own scheduling: tests/conftest.py hands the longest files out first."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests import conftest

TESTS = Path(__file__).parent


def test_every_file_named_longest_first_exists() -> None:
    # A renamed file would silently fall back to collection order.
    missing = [name for name in conftest.LONGEST_FIRST if not (TESTS / name).is_file()]
    assert missing == []
    assert len(set(conftest.LONGEST_FIRST)) == len(conftest.LONGEST_FIRST)


def test_named_files_come_first_in_their_order_and_the_rest_keep_theirs() -> None:
    first, second = conftest.LONGEST_FIRST[:2]
    names = ["test_a.py", second, "test_b.py", first, second, "test_a.py"]
    items = [SimpleNamespace(path=TESTS / name, n=i) for i, name in enumerate(names)]
    conftest._longest_first(cast(list[pytest.Item], items))
    got = [(item.path.name, item.n) for item in cast(list[Any], items)]
    assert got == [(first, 3), (second, 1), (second, 4),
                   ("test_a.py", 0), ("test_b.py", 2), ("test_a.py", 5)]  # fmt: skip
