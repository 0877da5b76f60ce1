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
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from packaging.version import Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sparkbuild.engines.adapters import ADAPTERS, EngineAdapter, adapter_type
from sparkbuild.engines.profiles import RecipeSource, SmokeProfile
from sparkbuild.errors import SpecError, UsageError
from sparkbuild.redact import strip_userinfo
from sparkbuild.yamlfile import load_model

Scalar = str | bool | int | float | None
Status = Literal["carried", "changed", "dropped"]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SHELL = ("&&", "||", ";", "|", "&", ">", ">>", "<", "2>", "2>&1")
MAX_PASSES = 10  # a template that still changes after this many fills refers to itself


class RecipeFile(BaseModel):
    """The recipe keys sparkrun reads (RECIPES.md); any other top-level key is kept in
    ``model_extra`` (sparkrun hands those to the runtime as ``runtime_config``)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    recipe_version: str = "2"
    model: str = Field(min_length=1)
    model_revision: str | None = None
    runtime: str = ""
    runtime_version: str = ""
    container: str = ""
    min_nodes: int = Field(default=1, ge=1)
    max_nodes: int | None = Field(default=None, ge=1)
    metadata: dict[str, Any] = {}
    description: str = ""
    defaults: dict[str, Scalar] = {}
    env: dict[str, Scalar] = {}
    command: str | None = None
    mods: list[str] = []
    pre_exec: list[Any] = []
    post_exec: list[Any] = []
    post_commands: list[Any] = []
    builder: str = ""
    builder_config: dict[str, Any] = {}
    build_args: list[str] = []
    executor_config: dict[str, Any] = {}
    runtime_config: dict[str, Any] = {}
    distribution_config: dict[str, Any] | None = None
    benchmark: dict[str, Any] | None = None

    @field_validator("recipe_version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) else value  # YAML reads 2 as an int


@dataclass(frozen=True)
class CarryNote:
    """One item of a recipe and what became of it in the profile."""

    item: str
    status: Status
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"item": self.item, "status": self.status, "detail": self.detail}


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
        """The profile file: a header naming the recipe and what was not carried, then YAML."""
        lines = [
            "# Imported by `sparkbuild profile import` from the Spark Arena recipe "
            f"{self.source.file}",
            f"# (sha256 {self.source.sha256[:16]}, runtime {self.source.runtime}, container "
            f"{self.source.container or '(none given)'}).",
        ]
        for note in self.dropped:
            lines.append(f"# Not carried: {note.item}: {note.detail}")
        data = dict(self.profile)
        if self.parallel is not None:
            data["parallel"] = self.parallel
        body = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
        return "\n".join(lines) + "\n" + body

    def to_json(self) -> dict[str, Any]:
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
            return adapter.name
    if command.startswith("llama-server"):
        return "llama-cpp"
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


def _launched() -> str:
    """The engines a recipe may name, sparkrun's default first: ``vLLM and SGLang``."""
    adapters = sorted(ADAPTERS.values(), key=lambda a: (not a.recipes.default, a.name))
    names = [a.display_name for a in adapters]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


# --- the command template ------------------------------------------------------------------


def _scalar_text(value: Scalar) -> str:
    return "" if value is None else str(value)


def render_command(template: str, values: Mapping[str, Scalar]) -> str:
    """``{key}`` placeholders filled from ``values`` until nothing changes (a value may hold
    another placeholder); unknown ones are left as they are, as sparkrun leaves them."""
    text = template.strip()
    for _ in range(MAX_PASSES):
        filled = _PLACEHOLDER.sub(
            lambda m: _scalar_text(values[m[1]]) if m[1] in values else m[0], text
        )
        if filled == text:
            return re.sub(r"\\[ \t]+\n", "\\\n", text)
        text = filled
    raise UsageError(
        f"the command template still changes after {MAX_PASSES} fills: a defaults value "
        "refers to itself",
        "fix the recipe's defaults",
    )


def _flags_from_defaults(
    adapter: type[EngineAdapter], values: Mapping[str, Scalar], notes: _Notes
) -> list[str]:
    """The flags sparkrun renders from ``defaults`` when a recipe has no ``command`` (RECIPES.md
    "Common Defaults Keys"; the engine's ``recipes.rendered_keys`` and ``toggles``)."""
    words: list[str] = []
    known = adapter.recipes.rendered_keys
    for key, value in values.items():
        if key == "model":
            continue
        flag = known.get(key)
        if flag is None:
            notes.add(
                f"defaults.{key}",
                "dropped",
                "the recipe has no command, and sparkrun renders only its known keys",
            )
        elif key in adapter.recipes.toggles:
            if value is True or str(value).lower() in ("1", "true", "yes"):
                words.append(flag)
        elif value is not None:
            words += [flag, _scalar_text(value)]
    return words


def command_words(text: str) -> list[str]:
    """The serve command's words: continuation lines joined, quotes honoured; anything a
    shell would run besides one command is refused."""
    joined = re.sub(r"\\\n", " ", text)
    if any(line.strip() for line in joined.splitlines()[1:]):
        raise UsageError(
            "the recipe's command has several lines without '\\' continuations: several "
            "shell commands, which a profile cannot hold",
            "keep the serve command on one line (or continue it with '\\')",
        )
    try:
        words = shlex.split(joined)
    except ValueError as exc:
        raise UsageError(f"the recipe's command does not parse as shell words: {exc}") from exc
    for word in words:
        if word in _SHELL or "$(" in word or "`" in word or re.search(r"\$\{?[A-Za-z_]", word):
            raise UsageError(
                f"the recipe's command uses the shell ({word!r}): a profile holds one "
                "engine command with literal arguments",
                "render the command by hand and write the profile's args",
            )
    return words


# --- the serve command: engine, model, flags -----------------------------------------------

_LAUNCHER_FLAGS = ("--host", "--port")


def _split_flags(words: Sequence[str]) -> Iterator[tuple[str, list[str]]]:
    """``(flag, values)`` groups; a word before any flag is a positional (flag ``""``)."""
    flag: str = ""
    values: list[str] = []
    for word in words:
        if re.match(r"^--?[A-Za-z]", word):
            if flag or values:
                yield flag, values
            name, eq, value = word.partition("=")
            flag, values = (name, [value]) if eq and name.startswith("--") else (word, [])
        else:
            values.append(word)
    if flag or values:
        yield flag, values


@dataclass
class _Serve:
    engine: str
    model: str
    args: list[str]
    sizes: dict[str, str]
    env: dict[str, str]


def _strip_prefix(
    adapter: type[EngineAdapter], words: list[str]
) -> tuple[list[str], dict[str, str]]:
    env: dict[str, str] = {}
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    prefixes = adapter.recipes.prefixes
    for prefix in prefixes:
        if tuple(words[: len(prefix)]) == prefix:
            return words[len(prefix) :], env
    raise UsageError(
        f"the recipe's command does not start a {adapter.name} server "
        f"({' '.join(words[:3])!r}; expected e.g. {' '.join(prefixes[0])!r})",
        "a profile launches the engine's own server; write its args by hand",
    )


def _serve(adapter: type[EngineAdapter], words: list[str], recipe: RecipeFile, notes: _Notes,
           base: Path, version: Version | None) -> _Serve:  # fmt: skip
    rest, env = _strip_prefix(adapter, words)
    facts = adapter.recipes
    model = recipe.model
    args: list[str] = []
    sizes: dict[str, str] = {}
    for flag, values in _split_flags(rest):
        if not flag:  # vllm serve MODEL
            model, extra = values[0], values[1:]
            if extra:
                raise UsageError(f"the recipe's command has stray words {' '.join(extra)!r}")
        elif flag in facts.model_flags and values:
            model = values[0]
        elif flag in _LAUNCHER_FLAGS:
            notes.add(f"{flag} {' '.join(values)}", "changed", "sparkbuild's launcher sets it")
        elif flag in facts.parallel_flags:
            sizes[facts.parallel_flags[flag]] = values[0] if values else "true"
            if facts.parallel_flags[flag] == "rank":
                notes.add(flag, "changed", "set per node by the multi-node launcher")
        elif flag == "--chat-template" and values and not _chat_template_kept(values[0], base):
            notes.add(
                f"{flag} {values[0]}",
                "dropped",
                "a file beside neither the recipe nor the engine: the recipe's mods "
                "put it in the container",
            )
        elif flag == "--load-format" and values:
            if _load_format_kept(adapter, values[0], version, notes):
                args += [flag, *values]
        else:
            args += [flag, *values]
    if model != recipe.model:
        notes.add(
            "model", "changed", f"the command serves {model}, the recipe names {recipe.model}"
        )
    return _Serve(adapter.name, model, args, sizes, env)


def _chat_template_kept(value: str, base: Path) -> bool:
    if "{{" in value or "{%" in value or Path(value).is_absolute():
        return True  # an inline template, or a path where the engine runs
    return (base / value).is_file()


def _load_format_kept(
    adapter: type[EngineAdapter], name: str, version: Version | None, notes: _Notes
) -> bool:
    fact = adapter.load_format(version, name)
    if fact is None:  # the engine has no facts on its load formats
        return True
    if fact.known is False:
        notes.add(
            f"--load-format {name}",
            "dropped",
            f"{fact.detail}; {adapter.display_name} would fail loading the weights, so 'auto' "
            "is used",
        )
        return False
    if fact.known is None:
        notes.add(f"--load-format {name}", "carried", f"not checked: {fact.detail}")
    return True


# --- the parallel layout -------------------------------------------------------------------


def parallel_layout(engine: str, runtime: str, sizes: Mapping[str, str], notes: _Notes
                    ) -> dict[str, Any] | None:  # fmt: skip
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
            f"--nnodes {sizes['nodes']}",
            "changed",
            f"one rank per Spark: {tp * pp} nodes for tp {tp} x pp {pp}",
        )
    if tp * pp == 1 and ep == 1:
        return None
    launcher = facts.runtimes[runtime]
    if sizes.get("launcher") not in (None, *adapter.parallel_launchers):
        notes.add(
            f"--distributed-executor-backend {sizes['launcher']}",
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


# --- everything else of the recipe -------------------------------------------------------


def _env(recipe: RecipeFile, extra: Mapping[str, str], notes: _Notes) -> dict[str, str]:
    env: dict[str, str] = {}
    for name, value in {**recipe.env, **extra}.items():
        text = _scalar_text(value)
        if not _ENV_NAME.match(name):
            raise UsageError(f"the recipe's env has a name that is not a variable: {name!r}")
        if re.search(r"\$\{?[A-Za-z_]", text):
            notes.add(
                f"env {name}",
                "dropped",
                "refers to the shell's environment, which sparkrun expands at launch; "
                "a profile holds literal values (set it in the profile by hand)",
            )
            continue
        env[name] = text
    return env


def _not_carried(recipe: RecipeFile, notes: _Notes) -> None:
    if recipe.mods:
        notes.add(
            f"mods: {', '.join(recipe.mods)}",
            "dropped",
            "mods patch the container at launch; sparkbuild carries changes as patches "
            "in its own images (builds/, patches/)",
        )
    for hook in ("pre_exec", "post_exec", "post_commands"):
        if getattr(recipe, hook):
            notes.add(hook, "dropped", "launch hooks run shell commands a profile does not hold")
    if recipe.builder or recipe.build_args or recipe.builder_config:
        notes.add("builder", "dropped", "sparkbuild builds its images from builds/*.yaml")
    if recipe.model_revision:
        notes.add(
            f"model_revision {recipe.model_revision}",
            "dropped",
            "a profile serves a model id or path; pin the revision in a local path",
        )
    for key in sorted(recipe.model_extra or {}):
        notes.add(
            key,
            "dropped",
            "not a recipe key sparkbuild knows (sparkrun hands it to the "
            "runtime as runtime_config)",
        )
    for key in recipe.runtime_config:
        notes.add(f"runtime_config.{key}", "dropped", "runtime-specific, for sparkrun's runtime")


def _container(recipe: RecipeFile, notes: _Notes) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for key, value in recipe.executor_config.items():
        if key in ("gpus", "ipc", "shm_size") and isinstance(value, str):
            settings[key] = value
        else:
            notes.add(f"executor_config.{key}", "dropped", "a docker setting profiles do not hold")
    return settings


# --- the whole import ----------------------------------------------------------------------


def _speculative(adapter: type[EngineAdapter], args: Sequence[str]) -> bool:
    flags = adapter.recipes.speculative_flags
    return any(word.split("=", 1)[0] in flags for word in args)


def load_recipe(path: Path) -> tuple[RecipeFile, bytes]:
    recipe = load_model(path, RecipeFile)
    if recipe.recipe_version != "2":
        raise SpecError(
            f"{path}: recipe_version {recipe.recipe_version!r}: sparkbuild reads version 2 "
            "recipes (version 1 is the eugr format, which builds its own container)",
            "convert it with sparkrun (`sparkrun recipe export`) or write the profile by hand",
        )
    return recipe, path.read_bytes()


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
    recipe, raw = load_recipe(path)
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
    notes = _Notes()
    values: dict[str, Scalar] = {**recipe.defaults, **(overrides or {})}
    values.setdefault("model", recipe.model)
    if recipe.command:
        rendered = render_command(recipe.command, values)
        unknown = sorted(set(_PLACEHOLDER.findall(rendered)))
        if unknown:
            raise UsageError(
                f"{path}: command placeholders with no value: "
                + ", ".join("{" + u + "}" for u in unknown),
                f"add them under defaults: or pass -o {unknown[0]}=VALUE",
            )
        words = command_words(rendered)
    else:
        prefix = adapter.recipes.prefixes[0]
        words = [*prefix, recipe.model, *_flags_from_defaults(adapter, values, notes)]
    serve = _serve(adapter, words, recipe, notes, path.parent, engine_version)
    layout = parallel_layout(engine, runtime, serve.sizes, notes)
    env = _env(recipe, serve.env, notes)
    container = _container(recipe, notes)
    _not_carried(recipe, notes)
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
    profile: dict[str, Any] = {
        "engine": engine,
        "model": model or serve.model,
        "description": f"{description or recipe.model} (Spark Arena recipe {path.stem})",
        "args": serve.args,
        "env": env,
        "expect": {"speculation": _speculative(adapter, serve.args)},
    }
    if container:
        profile["container"] = container
    profile["recipe"] = source.model_dump(mode="json", exclude_none=True)
    _validate(profile, layout, path)
    return ImportedRecipe(profile_name, profile, tuple(notes.items), source, layout)


def problems_of(error: ValidationError) -> str:
    """A validation error of data made here (no file lines to name): each field and why."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors())


def _validate(profile: Mapping[str, Any], layout: dict[str, Any] | None, path: Path) -> None:
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
