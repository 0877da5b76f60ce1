"""Spark Arena / sparkrun recipes made into smoke profiles (``sparkbuild profile import``).

A recipe (``recipe_version: "2"``) names a model, a container, a runtime, ``defaults`` and
``env``, and a serve ``command`` template whose ``{key}`` placeholders are filled from
``defaults`` (and ``model``). The format was read from the real files (never copied):

* spark-arena/recipe-registry ``official-recipes/**`` (commit 3075780014, 2026-06-13), e.g.
  ``official-recipes/qwen3.6/vllm/qwen3.6-27b-fp8-vllm.yaml``;
* spark-arena/sparkrun ``src/sparkrun/core/recipe.py`` (``Recipe``, ``render_command``: the
  template is filled again until nothing changes, unknown placeholders stay as they are, and
  ``\\<space><newline>`` is read as a line continuation), ``RECIPES.md`` (runtime
  resolution; the ``defaults`` keys a runtime renders when a recipe has no ``command``;
  "On DGX Spark (1 GPU per node), ``tensor_parallel: N`` = N hosts"), commit 0041b8f8fc.

Since sparkrun 0.4.2 (PyPI; its RECIPES.md and runtimes, held against in the tests): the
recipe is read as sparkrun reads it (engines/recipe_source: include chains, version 1,
``overrides:``, doubled braces, env templates), a recipe without a command renders through
sparkrun's full flag maps (engines/sparkrun_flags: structured values as JSON, ``false`` as
``--no-<flag>``), and a speculative recipe never imports without its speculation.

A profile holds a launch, not a container build: what it cannot hold is reported item by
item (``CarryNote``), never dropped silently. ``mods`` and hooks change the container at
launch (sparkbuild carries such changes as patches in its own images); host and port are the
launcher's; tensor/pipeline/expert parallel sizes become the profile's ``parallel`` layout
(one function, ``parallel_layout``); a ``--load-format`` the engine release lacks, or a
``--chat-template`` file the recipe's mods would have put in the container, is dropped and
said so.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version
from pydantic import ValidationError

from sparkbuild.adapters import ADAPTERS, EngineAdapter, RecipeFacts, adapter_type
from sparkbuild.engines.profiles import RecipeSource, SmokeProfile
from sparkbuild.engines.recipe_command import (
    PLACEHOLDER,
    command_text,
    command_words,
    flags_from_defaults,
    model_word,
    render_command,
    scalar_text,
    serve_of,
)
from sparkbuild.engines.recipe_fields import (
    RecipeFile,
    Scalar,
    check_layout,
    container_settings,
    not_carried,
)
from sparkbuild.engines.recipe_source import (
    SPARK_FACTS,
    Status,
    collapse_default,
    convert_v1,
    fill_env_value,
    matching_overrides,
    read_recipe,
    render_escaped,
)
from sparkbuild.engines.sparkrun_flags import SPARKRUN_VERSION, engine_flags, sparkrun_flags
from sparkbuild.errors import SpecError, UsageError
from sparkbuild.jsontext import Fields, JsonObject
from sparkbuild.redact import strip_userinfo
from sparkbuild.yamlfile import dump_yaml

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class CarryNote(Fields):
    """One item of a recipe and what became of it in the profile."""

    item: str
    status: Status
    detail: str


@dataclass(frozen=True)
class ImportedRecipe:
    """A recipe made into a profile: the profile's content, validated, and the notes."""

    name: str
    profile: dict[str, Any]
    notes: tuple[CarryNote, ...]
    source: RecipeSource
    parallel: dict[str, Any] | None = None

    @property
    def dropped(self) -> list[CarryNote]:
        return [n for n in self.notes if n.status == "dropped"]

    def yaml_text(self) -> str:
        """The profile file: a comment naming the recipe and what was not carried, then the
        profile. The recipe's words reach the comment only through ``dump_yaml``, which
        writes each line as one comment line whatever it holds."""
        comment = [
            "Imported by `sparkbuild profile import` from the Spark Arena recipe "
            + self.source.file,
            f"(sha256 {self.source.sha256[:16]}, runtime {self.source.runtime}, container "
            f"{self.source.container or '(none given)'}).",
            *(f"Not carried: {note.item}: {note.detail}" for note in self.dropped),
        ]
        data = dict(self.profile)
        if self.parallel is not None:
            data["parallel"] = self.parallel
        return dump_yaml(data, comment=comment)

    def to_json(self) -> JsonObject:
        return {
            "name": self.name,
            "recipe": self.source.model_dump(mode="json"),
            "parallel": self.parallel,
            "notes": [n.to_json() for n in self.notes],
        }


@dataclass
class _Notes:
    items: list[CarryNote] = field(default_factory=list)

    def add(self, item: str, status: Status, detail: str) -> None:
        self.items.append(CarryNote(item, status, detail))


# --- runtime -----------------------------------------------------------------------------
# Each engine's sparkrun names, serve commands and flag maps are its adapter's ``recipes``.


def _runtime_of_command(command: str) -> str:
    """The runtime a recipe's command names when the recipe names none."""
    for adapter in ADAPTERS.values():
        if adapter.recipes.command is not None and adapter.recipes.command.match(command):
            return next(iter(adapter.recipes.runtimes))  # sparkrun's name for it
    if command.startswith(("trtllm-serve", "mpirun")):
        return "trtllm"
    return next((a.name for a in ADAPTERS.values() if a.recipes.default), "")


def resolve_runtime(recipe: RecipeFile) -> str:
    """The runtime as sparkrun resolves it (RECIPES.md, "Runtime Resolution"): an explicit
    ``runtime`` wins, the command names one when it is omitted, and an engine's bare name
    is resolved by its adapter (``vllm``: ``vllm-ray`` with the Ray backend, else
    ``vllm-distributed``)."""
    runtime = recipe.runtime.strip()
    command = (recipe.command or "").strip()
    runtime = runtime or _runtime_of_command(command)
    for adapter in ADAPTERS.values():
        runtime = adapter.recipe_runtime(runtime, recipe.defaults, command)
    return runtime


def document_runtime(document: Mapping[str, object]) -> str:
    """The runtime sparkrun resolves a recipe that sparkbuild wrote to (its ``runtime``,
    ``defaults`` and ``command``; ``vllm`` is ``vllm-distributed``)."""
    read = {k: document[k] for k in ("runtime", "defaults", "command") if k in document}
    return resolve_runtime(RecipeFile.model_validate({"model": "-", **read}))


def _launched() -> str:
    """The engines a recipe may name, sparkrun's default first: ``vLLM and SGLang``."""
    adapters = sorted(ADAPTERS.values(), key=lambda a: (not a.recipes.default, a.name))
    names = [a.display_name for a in adapters]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


# --- the parallel layout -------------------------------------------------------------------


def parallel_layout(
    engine: str, runtime: str, sizes: Mapping[str, str], notes: _Notes
) -> dict[str, Any] | None:
    """The profile's ``parallel`` mapping (nodes, tp, ep, pp, launcher) from the recipe's
    parallel flags; ``None`` for one engine on one Spark. One GPU per DGX Spark, so the
    ranks are the nodes (RECIPES.md). Field names follow the profiles' ``parallel`` layout:
    this is the one place that writes it."""

    def size(key: str) -> int:
        text = sizes.get(key, "1")
        if not text.isdigit() or int(text) < 1:
            raise UsageError(f"the recipe's {key} size {text!r} is not a positive whole number")
        return int(text)

    adapter = adapter_type(engine)
    facts = adapter.recipes
    tp, pp = size("tp"), size("pp")
    ep = tp if facts.ep_is_tp and "ep" in sizes else size("ep") if "ep" in sizes else 1
    if "dp" in sizes and size("dp") > 1:
        notes.add(
            f"data parallel {sizes['dp']}",
            "dropped",
            "a profile's layout is one engine replica (tp x pp ranks)",
        )
    if "nodes" in sizes and size("nodes") != tp * pp:
        notes.add(
            f"{_flag_of(facts, 'nodes')} {sizes['nodes']}",
            "changed",
            f"one rank per Spark: {tp * pp} nodes for tp {tp} x pp {pp}",
        )
    if tp * pp == 1 and ep == 1:
        return None
    launcher = facts.runtimes[runtime]
    if sizes.get("launcher") not in (None, *adapter.parallel_launchers):
        notes.add(
            f"{_flag_of(facts, 'launcher')} {sizes['launcher']}",
            "changed",
            f"the multi-node launcher is {launcher}",
        )
    layout = {"nodes": tp * pp, "tp": tp, "ep": ep, "pp": pp, "launcher": launcher}
    notes.add(
        "parallel",
        "changed",
        f"tp {tp}, pp {pp}, ep {ep} on {tp * pp} nodes ({launcher}) "
        "as the profile's parallel layout",
    )
    return layout


def _flag_of(facts: RecipeFacts, size: str) -> str:
    """The engine's flag that sets ``size`` of the parallel layout (the first it takes)."""
    return next(flag for flag, sets in facts.parallel_flags.items() if sets == size)


# --- everything else of the recipe -------------------------------------------------------


def _env(
    recipe: RecipeFile,
    extra: Mapping[str, str],
    layers: Sequence[Mapping[str, Any]],
    values: Mapping[str, Any],
    nodes: int,
    notes: _Notes,
) -> dict[str, str]:
    """The recipe's env (and its matched overrides'), templates filled (recipe_source)."""
    merged: dict[str, object] = dict(recipe.env)
    for layer in layers:
        merged.update(layer.get("env") or {})
    env: dict[str, str] = {}
    for name, value in {**merged, **extra}.items():
        text = scalar_text(value)
        if not _ENV_NAME.match(name):
            raise UsageError(f"the recipe's env has a name that is not a variable: {name!r}")
        if re.search(r"\$\{?[A-Za-z_]", text):
            notes.add(
                f"env {name}",
                "dropped",
                f"refers to a shell variable: sparkrun {SPARKRUN_VERSION} passes it to the "
                "container literally, never the host's value; a profile holds literal values "
                "(set it in the profile by hand)",
            )
            continue
        env[name] = fill_env_value(name, text, values, nodes, recipe.model_revision)
        if env[name] != text:
            notes.add(f"env {name}", "changed", f"template {text!r} filled: {env[name]!r}")
    return env


# --- the whole import ----------------------------------------------------------------------


def _speculative(
    adapter: type[EngineAdapter],
    args: Sequence[str],
    recipe: RecipeFile,
    values: Mapping[str, object],
    path: Path,
) -> bool:
    """Whether the profile speculates; a recipe that asks for speculation and would import
    without it is refused (its accept_len check would be off for exactly that recipe)."""
    flags = adapter.recipes.speculative_flags
    carried = any(word.split("=", 1)[0] in flags for word in args)
    key = adapter.recipes.speculative_key
    if key is None or not flags:
        return carried
    asked = values.get(key) not in (None, "", False) and (
        not recipe.command or "{" + key + "}" in recipe.command
    )
    asked = asked or any(flag in (recipe.command or "") for flag in flags)
    if asked and not carried:
        raise UsageError(
            f"{path}: the recipe speculates ({key} / {flags[0]}), and its speculation would "
            "not survive the import: a profile without it would pass with speculation off",
            "report the recipe to sparkbuild, or write the profile's args by hand",
        )
    return carried


def _size(values: Mapping[str, object], *keys: str) -> int:
    for key in keys:
        text = str(values.get(key) or "")
        if text.isdigit() and int(text) > 0:
            return int(text)
    return 1


def _facts(
    engine: str,
    runtime: str,
    declared: Mapping[str, object],
    overrides: Mapping[str, object] | None,
) -> dict[str, object]:
    """What sparkrun's ``when:`` selectors read, for this recipe on DGX Sparks."""
    values = {**declared, **(overrides or {})}
    tp = _size(values, "tensor_parallel")
    pp = _size(values, "pipeline_parallel")
    return {
        **SPARK_FACTS,
        "tp": tp,
        "pp": pp,
        "dp": _size(values, "data_parallel"),
        "ep": _size(values, "expert_parallel", "ep_size"),
        "cp": 1,
        "nodes": tp * pp,
        "runtime": runtime,
        "runtime_family": engine,
    }


def load_recipe(path: Path, notes: _Notes) -> tuple[RecipeFile, bytes]:
    """The recipe as sparkrun 0.4.2 loads it: its include chain merged, a version 1
    recipe converted (engines/recipe_source)."""
    data = convert_v1(read_recipe(path, notes), notes)
    version = str(data.get("recipe_version", "2"))
    if version != "2":
        raise SpecError(
            f"{path}: recipe_version {version!r}: sparkrun 0.4.2 reads versions 1 and 2",
            'set recipe_version: "2" if the recipe follows RECIPES.md',
        )
    try:
        recipe = RecipeFile.model_validate(data)
    except ValidationError as exc:
        raise SpecError(
            f"{path}: not a recipe sparkrun reads: {problems_of(exc)}",
            'fix the field named (RECIPES.md, "Field Reference")',
        ) from None
    return recipe, path.read_bytes()


def _chain(
    recipe: RecipeFile,
    engine: str,
    declared: Mapping[str, object],
    layers: Sequence[Mapping[str, Any]],
    overrides: Mapping[str, Scalar] | None,
) -> dict[str, object]:
    """The values the command is filled from, as sparkrun's config chain holds them: the
    defaults, the matched overrides, ``-o`` overrides, the model keys, and the runtime's
    aliases (``ctx_size`` from ``max_model_len`` for llama-cpp's)."""
    values: dict[str, object] = dict(declared)
    for layer in layers:
        values.update(layer.get("defaults") or {})
    values.update(overrides or {})
    values.setdefault("model", recipe.model)
    if recipe.model_revision:
        values.setdefault("model_revision", recipe.model_revision)
    values.setdefault("resolved_model_path", recipe.model)
    if engine in sparkrun_flags().engines:
        values = engine_flags(engine).with_aliases(values)
    return values


def import_recipe(
    path: Path,
    *,
    name: str | None = None,
    overrides: Mapping[str, Scalar] | None = None,
    model: str | None = None,
    engine_version: Version | None = None,
    shown_as: str | None = None,
) -> ImportedRecipe:
    """The profile for the recipe at ``path``: ``overrides`` win over its ``defaults`` (as
    sparkrun's ``-o key=value`` do), ``model`` over the model it serves; ``engine_version``
    is the release the profile will run, for the facts that differ by release."""
    notes = _Notes()
    recipe, raw = load_recipe(path, notes)
    profile_name = name or path.stem
    if not _NAME.match(profile_name):
        raise UsageError(
            f"profile name {profile_name!r}: use letters, digits, '.', '_', '-' (at most 64)",
            "pass --name NAME",
        )
    runtime = resolve_runtime(recipe)
    engine = next((a.name for a in ADAPTERS.values() if runtime in a.recipes.runtimes), None)
    if engine is None:
        runtimes = sorted(r for a in ADAPTERS.values() for r in a.recipes.runtimes)
        raise UsageError(
            f"{path}: runtime {runtime!r}: sparkbuild launches {_launched()} only",
            f"known runtimes: {', '.join(runtimes)}",
        )
    adapter = adapter_type(engine)
    model_word(recipe.model, f"{path}: model")
    declared = {k: collapse_default(v) for k, v in recipe.defaults.items()}
    layers = matching_overrides(
        recipe.overrides, _facts(engine, runtime, declared, overrides), declared, notes
    )
    values = _chain(recipe, engine, declared, layers, overrides)
    if recipe.command:
        rendered = render_escaped(
            recipe.command,
            lambda text: render_command(text, values, lambda v, k: command_text(v, k, notes)),
            notes,
            "command",
        )
        unknown = sorted(set(PLACEHOLDER.findall(rendered)))
        if unknown:
            raise UsageError(
                f"{path}: command placeholders with no value: "
                + ", ".join("{" + u + "}" for u in unknown),
                f"add them under defaults: or pass -o {unknown[0]}=VALUE",
            )
        words = command_words(rendered)
    else:
        flags = flags_from_defaults(adapter, values, recipe.model, recipe.model_revision, notes)
        words = [*adapter.recipe_serve_words(recipe.model), *flags]
    serve = serve_of(adapter, words, recipe.model, notes, path.parent, engine_version)
    model_word(serve.model, f"{path}: the model the command serves,")
    added = adapter.recipes.adds_served_model_flag
    if added and added not in serve.args:
        notes.add(
            added,
            "changed",
            f"sparkrun adds {added} {recipe.model} to {adapter.display_name}'s command; "
            "sparkbuild's launcher names the served model itself",
        )
    layout = parallel_layout(engine, runtime, serve.sizes, notes)
    nodes = int(layout["nodes"]) if layout else 1
    env = _env(recipe, serve.env, layers, values, nodes, notes)
    check_layout(
        recipe, values, serve.sizes, {"nodes": 1, "tp": 1, "pp": 1, **(layout or {})}, path, notes
    )
    container = container_settings(recipe, notes)
    not_carried(recipe, notes)
    if model is not None:
        notes.add("model", "changed", f"{serve.model} replaced by --model {model}")
    source = RecipeSource(
        file=strip_userinfo(shown_as or str(path)),
        name=path.stem,
        sha256=hashlib.sha256(raw).hexdigest(),
        recipe_version=recipe.recipe_version,
        runtime=runtime,
        container=recipe.container or None,
        not_carried=[n.item for n in notes.items if n.status == "dropped"],
    )
    description = recipe.description or str(recipe.metadata.get("description") or "")
    profile: dict[str, object] = {
        "engine": engine,
        "model": model or serve.model,
        "description": f"{description or recipe.model} (Spark Arena recipe {path.stem})",
        "args": serve.args,
        "env": env,
        "expect": {"speculation": _speculative(adapter, serve.args, recipe, values, path)},
    }
    if container:
        profile["container"] = container
    profile["recipe"] = source.model_dump(mode="json", exclude_none=True)
    _validate(profile, layout, path)
    return ImportedRecipe(profile_name, profile, tuple(notes.items), source, layout)


def problems_of(error: ValidationError) -> str:
    """A validation error of data made here (no file lines to name): each field and why."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors())


def _validate(
    profile: Mapping[str, object], layout: Mapping[str, object] | None, path: Path
) -> None:
    """The profile as today's profile model reads it (``parallel`` too where it knows it)."""
    data = dict(profile)
    if layout is not None and "parallel" in SmokeProfile.model_fields:
        data["parallel"] = layout
    try:
        SmokeProfile.model_validate(data)
    except ValidationError as exc:
        raise SpecError(
            f"{path}: the profile made from this recipe does not validate: {problems_of(exc)}",
            "fix the recipe, or pass -o KEY=VALUE for the field named",
        ) from exc
