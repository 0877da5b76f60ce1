"""sparkrun's flag maps, as facts: which recipe ``defaults`` key becomes which engine flag.

sparkrun renders a recipe without a ``command`` from its ``defaults`` through one map per
engine; a recipe with a ``command`` reads the same keys through ``{key}`` placeholders, and
its validator wants the keys it reads itself (ports, lengths, memory, parallel sizes) there
rather than spelled as literal flags. The maps are read from a release of sparkrun, one file
per engine (``data/sparkrun/flags-<version>/<engine>.yaml``, names only, no code; the keys
sparkrun reads itself in ``flags-<version>.yaml``), and the tests hold them against that
release's own.

How a value becomes a flag (RECIPES.md, "Structured values and booleans"): a mapping, a list,
or a string that already holds a JSON object or array is one compact JSON argument; a boolean
is the bare flag when true, and ``--no-<flag>`` when false for the flags the engine turns on
by default (``negatable``), nothing otherwise; anything else is its text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict

from sparkbuild.errors import UsageError

SPARKRUN_VERSION = "0.4.2"
"""The sparkrun release whose maps are shipped (and whose recipe format is written)."""


class EngineFlags(BaseModel):
    """One engine's map: ``flags`` in the order sparkrun emits them. Some runtimes render a
    few keys their own way, after the map (``after``): a boolean written as a word
    (``worded``: ``flash_attn: true`` is ``--flash-attn on``, a string as it is), a toggle
    the engine turns on (``inverted``: ``webui: false`` is ``--no-webui``, true nothing).
    ``defaults`` are the values sparkrun supplies when the recipe has none, and ``aliases``
    the keys it reads from another when unset (``ctx_size`` from ``max_model_len``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    flags: dict[str, str]
    booleans: frozenset[str]
    negatable: frozenset[str]
    worded: dict[str, tuple[str, str]] = {}
    inverted: dict[str, str] = {}
    defaults: dict[str, str] = {}
    aliases: dict[str, str] = {}

    @property
    def after(self) -> list[str]:
        """The keys rendered after the map, in sparkrun's order."""
        return [*self.worded, *self.inverted]

    def with_aliases(self, values: Mapping[str, object]) -> dict[str, object]:
        """``values`` with each alias filled from its source where the recipe left it unset
        (sparkrun does this before rendering, with a command or without)."""
        filled = dict(values)
        for key, source in self.aliases.items():
            if filled.get(key) is None and filled.get(source) is not None:
                filled[key] = filled[source]
        return filled

    def key_of(self, flag: str) -> str | None:
        """The defaults key sparkrun renders as ``flag``, if any."""
        return next((key for key, known in self.flags.items() if known == flag), None)

    def words(self, key: str, value: object) -> list[str]:
        """The engine words sparkrun renders for ``key: value`` without a command (unquoted,
        as the shell hands them over); empty when it renders nothing."""
        flag = self.flags.get(key)
        if key in self.inverted:
            return [self.inverted[key]] if value is not None and not is_true(value) else []
        if flag is None or value is None:
            return []
        if key in self.worded:
            on, off = self.worded[key]
            word = (on if value else off) if isinstance(value, bool) else str(value)
            return [flag, word]
        if key in self.booleans:
            if is_true(value):
                return [flag]
            negated = key in self.negatable and flag.startswith("--")
            return ["--no-" + flag[2:]] if negated else []
        return [flag, value_text(value)]


class SparkrunFlags(BaseModel):
    """The release's facts: the keys sparkrun reads itself, and one map per engine shipped
    (``flags-<version>/<engine>.yaml``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sparkrun: str
    engines: dict[str, EngineFlags] = {}
    read_keys: dict[str, list[str]]  # keys sparkrun reads itself, and their flags' spellings
    runtime_display: dict[str, str]  # a resolved runtime as sparkrun's metadata shows it

    def defaults_key(self, engine: str, flag: str) -> str | None:
        """The defaults key a command's ``flag`` stands for: the engine map's, else one of
        the keys sparkrun reads itself (``--tp`` is ``tensor_parallel`` for its validator)."""
        key = engine_flags(engine).key_of(flag)
        return key or next((k for k, flags in self.read_keys.items() if flag in flags), None)


def is_true(value: object) -> bool:
    """A recipe boolean as sparkrun 0.4.2 reads one: a YAML boolean, else any text holding
    ``1``, ``t`` or ``y`` (``true``, ``yes``, ``1``; so ``on`` is false and ``auto`` true),
    empty or ``0`` false."""
    if isinstance(value, bool):
        return value
    text = str(value or "").lower()
    return any(c in text for c in "1ty")


def value_text(value: object) -> str:
    """One flag value as sparkrun passes it to the engine: compact JSON for a mapping or a
    list, a JSON-looking string stripped, anything else its text."""
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, separators=(",", ":"), default=str)
    text = "" if value is None else str(value)
    return text.strip() if text.strip()[:1] in ("{", "[") else text


@cache
def sparkrun_flags() -> SparkrunFlags:
    """The shipped release's facts, with every engine map beside them."""
    folder = resources.files("sparkbuild") / "data" / "sparkrun"
    facts = yaml.safe_load((folder / f"flags-{SPARKRUN_VERSION}.yaml").read_text("utf-8"))
    maps = folder / f"flags-{SPARKRUN_VERSION}"
    facts["engines"] = {
        entry.name.removesuffix(".yaml"): yaml.safe_load(entry.read_text("utf-8"))
        for entry in sorted(maps.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".yaml")
    }
    return SparkrunFlags.model_validate(facts)


def engine_flags(engine: str) -> EngineFlags:
    """sparkrun's map for ``engine``; an engine without one is a UsageError naming the file
    that would hold it."""
    found = sparkrun_flags().engines.get(engine)
    if found is None:
        raise UsageError(
            f"sparkrun {SPARKRUN_VERSION} has no flag map for {engine} shipped "
            f"(data/sparkrun/flags-{SPARKRUN_VERSION}/{engine}.yaml)",
            "recipes of this engine cannot be rendered from defaults; give the recipe a command",
        )
    return found
