"""Two serve commands sparkrun rendered, held against each other flag for flag: what the
round-trip tests (and the import's) report as lost.

A command is its serve prefix and model (any of the engine's prefixes: ``vllm serve M`` and
``python -m vllm.entrypoints.openai.api_server --model M`` are one launcher), its parallel
sizes (a profile's layout, compared as sizes), and flag groups (a flag with its values).
A difference is acceptable when it is sparkbuild's by design (``recipe_command.ours``), or
when a note of the import names the flag or the ``defaults`` key sparkrun renders as it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sparkbuild.adapters import EngineAdapter
from sparkbuild.engines.recipe_command import ours
from sparkbuild.engines.recipe_writer import flag_groups
from sparkbuild.engines.sparkrun_flags import sparkrun_flags


@dataclass(frozen=True)
class Serve:
    """One rendered serve command, taken apart."""

    model: str
    sizes: dict[str, str]
    groups: list[tuple[str, ...]]


def serve_of(adapter: type[EngineAdapter], argv: Sequence[str]) -> Serve:
    """``argv`` (sparkrun's ``render``) as the model, parallel sizes and flag groups."""
    facts = adapter.recipes
    prefix = next((p for p in facts.prefixes if tuple(argv[: len(p)]) == p), None)
    assert prefix is not None, f"not a {adapter.name} serve command: {argv[:4]}"
    rest = list(argv[len(prefix) :])
    model = rest.pop(0) if rest and not rest[0].startswith("-") else ""
    sizes: dict[str, str] = {}
    groups: list[tuple[str, ...]] = []
    for flag, *values in flag_groups(rest):
        if flag in facts.model_flags and values:
            model = values[0]
        elif flag in facts.parallel_flags:
            sizes[facts.parallel_flags[flag]] = values[0] if values else "on"
        else:
            groups.append((flag, *values))
    return Serve(model, sizes, groups)


def named(flag: str, notes: Sequence[Mapping[str, str]], engine: str) -> bool:
    """A note names the flag (or the ``defaults`` key sparkrun renders as it)."""
    keys = [k for k, f in sparkrun_flags().engines[engine].flags.items() if f == flag]
    names = [flag, flag.removeprefix("--no-"), *(f"defaults.{k}" for k in keys)]
    return any(n in note["item"] or n in note["detail"] for note in notes for n in names)


def unexplained(
    adapter: type[EngineAdapter],
    before: Sequence[str],
    after: Sequence[str],
    notes: Sequence[Mapping[str, str]],
) -> list[str]:
    """Every difference between two rendered commands (``before`` the import, ``after`` the
    export) that neither ``ours`` nor a note names."""
    first, second = serve_of(adapter, before), serve_of(adapter, after)
    by_design = {o.flag for o in ours(adapter)}
    lost: list[str] = []
    if first.model != second.model:
        lost.append(f"model: {first.model} became {second.model}")
    for size in ("tp", "pp", "ep"):
        was, now = first.sizes.get(size, "1"), second.sizes.get(size, "1")
        if was != now and not named("parallel", notes, adapter.name):
            lost.append(f"{size}: {was} became {now}")
    one, two = Counter(first.groups), Counter(second.groups)
    for side, only in (("lost", one - two), ("added", two - one)):
        lost += [
            f"{side}: {' '.join(group)}"
            for group in only
            if group[0] not in by_design and not named(group[0], notes, adapter.name)
        ]
    return lost
