"""A sparkrun recipe read as sparkrun 0.4.2 reads it, before it becomes a profile.

The rules are RECIPES.md's (the sdist of sparkrun 0.4.2), each implemented here on its own:

* ``include:`` names one base, a sibling file (``base`` or ``base.yaml``, no path
  separators, inside the recipe's own directory after symlinks) or a registry recipe
  (``@registry/name``). The chain is at most 8 deep and may not loop; version 1 recipes take
  no part. The outer recipe merges over its base: mappings key by key, the values inside
  ``defaults`` and ``env`` replaced whole, scalars and lists replaced, ``overrides:``
  appended, an explicit ``null`` deleting the inherited key. A registry base needs
  sparkrun's registries (the network), so it is refused, naming it.
* Version 1 (eugr's format, which sparkrun migrates on load): doubled braces collapse; its
  ``build_args`` and ``mods`` build a container sparkbuild does not use (said by the
  import); ``mode``, ``solo_only`` and ``cluster_only`` make the node range in every
  version (engines/recipe_fields).
* Doubled braces ``{{``/``}}`` (v1's escape, deprecated in v2): in a command template whose
  text holds ``{{``, each ``{{``/``}}`` is one literal brace and never part of a
  placeholder; in a ``defaults`` value holding ``{{``, they collapse.
* ``env`` templates: ``{config.NAME}`` from the effective defaults (a scalar),
  ``{launch.NAME}`` from the launch (num_nodes, node_rank on one node, model_revision);
  ``{{...}}`` passes a literal token. What only a running sparkrun knows (node_rank across
  nodes, model_path, runtime_cache_dir, node_host, cluster_id) is refused, never copied.
* ``overrides:``: an entry applies when every ``when:`` selector holds for the profile's
  layout on a DGX Spark (nodes, tp, pp, dp, ep, runtime, platform ``dgx-spark``,
  accelerator ``gb10``, arch ``sm_121``, ...); its ``defaults`` and ``env`` layer over the
  recipe's in order. A selector only a launch can answer makes the entry not apply.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

from sparkbuild.errors import SpecError, UsageError
from sparkbuild.yamlfile import read_yaml

MAX_INCLUDE_DEPTH = 8
_SIBLING = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*\Z")
_SUFFIXES = (".yaml", ".yml")
_LEFT, _RIGHT = "\x00<", "\x00>"  # stand-ins for an escaped brace while placeholders fill


# replaced: the recipe's value is not kept, sparkbuild sets its own (the launcher's --host)
Status = Literal["carried", "changed", "replaced", "dropped"]


class Notes(Protocol):
    """Where the import says what became of each item (``recipes.CarryNote``)."""

    def add(self, item: str, status: Status, detail: str) -> None: ...


# --- include: -------------------------------------------------------------------------------


def merge(base: Mapping[str, Any], outer: Mapping[str, Any]) -> dict[str, object]:
    """``outer`` over ``base`` by RECIPES.md's include rules (neither is changed)."""
    merged = copy.deepcopy(dict(base))
    merged.pop("include", None)
    for key, value in outer.items():
        if key == "include":
            continue
        if value is None:
            merged.pop(key, None)
        elif key == "overrides" and isinstance(value, list):
            merged[key] = [*(merged.get(key) or []), *copy.deepcopy(value)]
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge_mapping(merged[key], value, whole=key in ("defaults", "env"))
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _merge_mapping(
    base: Mapping[str, Any], outer: Mapping[str, Any], *, whole: bool
) -> dict[str, object]:
    result = dict(base)
    for key, value in outer.items():
        if value is None:
            result.pop(key, None)
        elif not whole and isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = _merge_mapping(result[key], value, whole=False)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _sibling(path: Path, name: str) -> Path:
    """The file a sibling include names, inside ``path``'s directory."""
    if name.startswith("@"):
        raise UsageError(
            f"{path}: include {name!r} is a registry recipe: only sparkrun's registries (the "
            "network) can give its base, and sparkbuild reads files",
            f"flatten it where sparkrun runs (`sparkrun export recipe {path.name} > "
            "flat.yaml`) and import that file",
        )
    if not _SIBLING.match(name) or ".." in name:
        raise UsageError(
            f"{path}: include {name!r} is not a sibling file name (no path separators, no "
            "'..', starting with a letter, digit or '_')"
        )
    folder = path.resolve().parent
    names = [name] if name.endswith(_SUFFIXES) else [name + s for s in _SUFFIXES]
    for candidate in names:
        found = (folder / candidate).resolve()
        if found.parent == folder and found.is_file():
            return found
    raise UsageError(
        f"{path}: include {name!r}: no {' or '.join(names)} beside it in {folder}",
        "put the base recipe next to the one that includes it",
    )


def read_recipe(path: Path, notes: Notes) -> dict[str, object]:
    """The recipe at ``path`` with its include chain merged, as sparkrun loads it."""
    chain: list[Path] = [path.resolve()]
    data = _mapping(path)
    layers = [data]
    while "include" in layers[-1]:
        name = layers[-1]["include"]
        if not isinstance(name, str):
            raise UsageError(f"{chain[-1]}: include must be one recipe name, not {name!r}")
        base = _sibling(chain[-1], name)
        if base in chain:
            raise UsageError(
                f"{path}: include loops: {' -> '.join(p.name for p in chain)} -> {base.name}"
            )
        if len(chain) > MAX_INCLUDE_DEPTH:
            raise UsageError(f"{path}: include chain deeper than {MAX_INCLUDE_DEPTH} recipes")
        chain.append(base)
        layers.append(_mapping(base))
    if len(layers) > 1:
        if any(str(layer.get("recipe_version", "2")) == "1" for layer in layers):
            raise UsageError(
                f"{path}: a version 1 recipe in its include chain: sparkrun lets v1 recipes "
                "take no part in include:",
                "convert the v1 recipe to version 2 first",
            )
        notes.add(
            "include",
            "changed",
            "merged over " + " -> ".join(p.name for p in chain[1:]) + " (RECIPES.md rules)",
        )
    merged: dict[str, object] = {}
    for layer in reversed(layers):
        merged = merge(merged, layer)
    return merged


def _mapping(path: Path) -> dict[str, object]:
    data, _lines = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a recipe is a YAML mapping", "see docs/smoke.md")
    return data


# --- version 1 ------------------------------------------------------------------------------


def convert_v1(data: dict[str, Any], notes: Notes) -> dict[str, object]:
    """A version 1 recipe as sparkrun migrates it on load; its braces collapse where they
    are read, and its node range (``mode``, ``solo_only``, ``cluster_only``) is read as a
    version 2 recipe's is (engines/recipe_fields)."""
    if str(data.get("recipe_version", "2")) != "1":
        return data
    notes.add(
        "recipe_version 1",
        "changed",
        "converted as sparkrun 0.4.2 migrates it on load (eugr's format: doubled braces collapse)",
    )
    return {**data, "recipe_version": "2"}


# --- braces and placeholders -----------------------------------------------------------------


def _mask(text: str) -> str:
    return text.replace("{{", _LEFT).replace("}}", _RIGHT)


def _unmask(text: str) -> str:
    return text.replace(_LEFT, "{").replace(_RIGHT, "}")


def render_escaped(template: str, fill: Callable[[str], str], notes: Notes, where: str) -> str:
    """``fill`` (the placeholder renderer) over ``template``; with ``{{`` in it, every
    ``{{``/``}}`` is one literal brace, never part of a placeholder (sparkrun's escape mode,
    read off the template)."""
    if "{{" not in template:
        return fill(template)
    notes.add(
        where,
        "changed",
        "doubled braces {{ }} collapsed to single ones, as sparkrun does (deprecated in "
        "version 2 recipes; sparkrun recipe validate reports it)",
    )
    return _unmask(fill(_mask(template)))


def collapse_default(value: object) -> object:
    """A ``defaults`` value with v1's doubled braces collapsed (text values only)."""
    if isinstance(value, str) and "{{" in value:
        return value.replace("{{", "{").replace("}}", "}")
    return value


# --- env templates --------------------------------------------------------------------------

_ENV_TOKEN = re.compile(r"\{(config|launch)\.([A-Za-z_][A-Za-z0-9_]*)\}")
_LAUNCH_ONLY = {
    "model_path": "the prepared model directory sparkrun resolves on each node at launch",
    "runtime_cache_dir": "sparkrun's own compilation-cache mount",
    "node_host": "the host sparkrun's scheduler places each rank on",
    "cluster_id": "the id of a sparkrun launch",
}


def fill_env_value(
    name: str, value: str, values: Mapping[str, object], nodes: int, revision: str | None
) -> str:
    """One env value with its ``{config.*}``/``{launch.*}`` tokens filled, or an error
    naming the token only a running sparkrun knows."""

    def one(match: re.Match[str]) -> str:
        space, key = match[1], match[2]
        if space == "config":
            found = values.get(key)
            if found is None or isinstance(found, Mapping | list):
                raise UsageError(
                    f"env {name}: {match[0]} needs a scalar defaults.{key}, and the recipe "
                    "has " + ("none" if found is None else "a mapping or list there"),
                    f"add defaults.{key}, or pass -o {key}=VALUE",
                )
            return str(found).lower() if isinstance(found, bool) else str(found)
        if key == "num_nodes":
            return str(nodes)
        if key == "node_rank" and nodes == 1:
            return "0"
        if key == "model_revision":
            return revision or ""
        why = _LAUNCH_ONLY.get(key, "not a launch field sparkrun 0.4.2 has")
        if key == "node_rank":
            why = f"each of the {nodes} nodes has its own, and a profile's env is every node's"
        raise UsageError(
            f"env {name}: {match[0]} is {why}: a profile holds one literal value",
            "set the variable in the profile by hand after the import",
        )

    return _unmask(_ENV_TOKEN.sub(one, _mask(value)))


# --- overrides: ------------------------------------------------------------------------------

#: What a DGX Spark answers to sparkrun's hardware selectors (RECIPES.md, "Conditional
#: Overrides"): one GB10 per node.
SPARK_FACTS: dict[str, object] = {
    "platform": "dgx-spark",
    "vendor": "nvidia",
    "accelerator": "gb10",
    "arch": "sm_121",
    "capability": ["unified-memory"],
    "gpus_per_node": 1,
}
_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "in": lambda a, b: a in b,
    "not_in": lambda a, b: a not in b,
    "gt": lambda a, b: a > b,
    "gte": lambda a, b: a >= b,
    "lt": lambda a, b: a < b,
    "lte": lambda a, b: a <= b,
}


def _holds(actual: object, wanted: object) -> bool:
    if isinstance(actual, list):  # capability: any of the node's tags
        return any(_holds(a, wanted) for a in actual)
    if isinstance(wanted, Mapping):
        try:
            return all(_OPERATORS[op](actual, arg) for op, arg in wanted.items())
        except (KeyError, TypeError):
            return False
    if isinstance(wanted, list):
        return actual in wanted
    if isinstance(wanted, str) and wanted.startswith("sm_"):
        return str(actual) == wanted.rstrip("a")
    return bool(actual == wanted)


def matching_overrides(
    overrides: Any, facts: Mapping[str, Any], declared: Mapping[str, Any], notes: Notes
) -> list[Mapping[str, Any]]:
    """The ``overrides:`` entries whose ``when:`` holds for ``facts`` (and ``declared``
    defaults for ``config:``), each said in a note."""
    matched: list[Mapping[str, object]] = []
    for at, entry in enumerate(overrides or []):
        if not isinstance(entry, Mapping):
            raise UsageError(f"overrides[{at}] is not a mapping")
        when = entry.get("when") or {}
        unknown = [k for k in when if k != "config" and k not in facts]
        config = when.get("config") or {}
        holds = not unknown and all(_holds(facts[k], v) for k, v in when.items() if k != "config")
        holds = holds and all(_holds(declared.get(k), v) for k, v in config.items())
        detail = ", ".join(f"{k}: {v}" for k, v in when.items())
        if unknown:
            notes.add(
                f"overrides[{at}]",
                "dropped",
                f"when {detail}: {', '.join(unknown)} only a sparkrun launch knows",
            )
        elif holds:
            matched.append(entry)
            applied = [
                f"{layer}.{k}={v}"
                for layer in ("defaults", "env")
                for k, v in (entry.get(layer) or {}).items()
            ]
            if entry.get("container"):
                applied.append("container (not carried: --image names the image)")
            notes.add(
                f"overrides[{at}]",
                "changed",
                f"when {detail} holds on a DGX Spark with this layout (sparkrun decides "
                f"it at launch): {', '.join(applied)}",
            )
        else:
            notes.add(
                f"overrides[{at}]",
                "dropped",
                f"when {detail} does not hold on a DGX Spark with this layout",
            )
    return matched
