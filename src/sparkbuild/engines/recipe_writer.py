"""sparkrun recipes written from what sparkbuild ran: ``bench --arena``'s recipe and
``profile export``.

A recipe here is the engine's command as a template (``recipe_version: "2"``): the serve
prefix, then each flag on its own line. A flag sparkrun's map knows (engines/sparkrun_flags)
and that takes one plain value goes to ``defaults`` and is referenced as ``{key}``, so the
value is visible to sparkrun's config chain and can be changed with ``-o key=VALUE``
(sparkrun's validator asks exactly this of the keys it reads itself: ports, lengths, memory,
parallel sizes). A JSON value is referenced inside single quotes (``'{key}'``), as RECIPES.md
writes JSON flags. Boolean flags, values with several words or shell characters, and flags
sparkrun does not know stay literal, shell-quoted. The key order is sparkrun's own export
order, and the command a literal block, so sparkrun's re-export of the file is the file.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from sparkbuild.adapters import adapter_type
from sparkbuild.engines.profiles import SmokeProfile
from sparkbuild.engines.recipe_command import model_word
from sparkbuild.engines.sparkrun_flags import engine_flags, sparkrun_flags
from sparkbuild.errors import UsageError
from sparkbuild.imageref import REFERENCE
from sparkbuild.yamlfile import OTHER_BREAKS, SafeDumper, dump_yaml, peer_yaml, represent_str


@dataclass(frozen=True)
class RecipeSpec:
    """What a recipe says: the engine's launch and where it came from."""

    engine: str
    runtime: str
    model: str
    args: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    tp: int = 1
    pp: int = 1
    container: str | None = None
    description: str = ""
    metadata: Mapping[str, object] = field(default_factory=dict)
    min_nodes: int = 1
    max_nodes: int | None = None  # None: as many as sparkrun is given


def flag_groups(args: Sequence[str]) -> list[list[str]]:
    """Each flag with the values after it (a leading word without a flag is its own group;
    ``-1`` is a value, not a flag)."""
    groups: list[list[str]] = []
    for word in args:
        if (word.startswith("-") and not re.match(r"^-\d", word)) or not groups:
            groups.append([word])
        else:
            groups[-1].append(word)
    return groups


def _scalar(text: str) -> str | int | float:
    """A value as YAML would hold it, kept text unless the number reads back the same."""
    if re.fullmatch(r"-?(0|[1-9]\d*)", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d+", text) and str(float(text)) == text:
        return float(text)
    return text


def _placeholder(key: str, value: str) -> str | None:
    """``{key}`` (``'{key}'`` for JSON) where the value can stand in the defaults, else
    None (the flag stays literal)."""
    if value.strip()[:1] in ("{", "[") and "'" not in value:
        return "'{" + key + "}'"
    if value and shlex.quote(value) == value and "{" not in value:
        return "{" + key + "}"
    return None


def _templated(engine: str, args: Sequence[str], defaults: dict[str, Any]) -> list[str]:
    """The command lines for ``args``; values moved into ``defaults`` where they can go."""
    known = engine_flags(engine)
    lines: list[str] = []
    for flag, *values in flag_groups(args):
        key = sparkrun_flags().defaults_key(engine, flag)
        spot = _placeholder(key, values[0]) if key and len(values) == 1 else None
        if key and spot and key not in defaults and key not in known.booleans:
            defaults[key] = _scalar(values[0])
            lines.append(f"{flag} {spot}")
        else:
            lines.append(" ".join(shlex.quote(word) for word in (flag, *values)))
    return lines


def recipe_document(spec: RecipeSpec) -> dict[str, object]:
    """The recipe as a mapping, in sparkrun's export order."""
    model_word(spec.model, "the recipe's model")
    adapter = adapter_type(spec.engine)
    facts = adapter.recipes
    defaults: dict[str, object] = {"port": adapter.default_port, "host": "0.0.0.0"}
    lines = [adapter.recipe_export_command(spec.model), "--host {host}", "--port {port}"]
    for key, size in (("tensor_parallel", spec.tp), ("pipeline_parallel", spec.pp)):
        if size > 1:
            defaults[key] = size
            lines.append(f"{facts.rendered_keys[key]} {{{key}}}")
    lines += _templated(spec.engine, spec.args, defaults)
    document: dict[str, object] = {
        "recipe_version": "2",
        "model": spec.model,
        "runtime": spec.runtime,
        **({"min_nodes": spec.min_nodes} if spec.min_nodes > 1 else {}),
        **({"max_nodes": spec.max_nodes} if spec.max_nodes is not None else {}),
        **({"container": spec.container} if spec.container else {}),
        "metadata": {"description": spec.description or spec.model, **spec.metadata},
        "defaults": defaults,
        **({"env": dict(spec.env)} if spec.env else {}),
        "command": " \\\n  ".join(lines) + "\n",
    }
    return document


class _RecipeDumper(SafeDumper):
    """Multi-line strings (the command) as literal blocks, as sparkrun's export writes them."""


def _literal(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    if "\n" in value and not any(b in value for b in OTHER_BREAKS):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return represent_str(dumper, value)


_RecipeDumper.add_representer(str, _literal)


def recipe_yaml(document: Mapping[str, object]) -> str:
    """The recipe file's text (the command as a literal block)."""
    return dump_yaml(dict(document), dumper=_RecipeDumper)


def effective_yaml(document: Mapping[str, object], container: str | None) -> str:
    """The recipe as sparkrun records a run of it (``metadata.recipe.text``, hashed into
    ``effective_hash``): plain YAML in the same key order, with the container that ran
    (null for none, last when the recipe names none)."""
    return peer_yaml({**document, "container": container})


# --- profile export ------------------------------------------------------------------------

#: A hub repository (``org/name``), with the file selector some engines take
#: (``org/name-GGUF:Q4_K_M``).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(?::[\w.-]+)?\Z")
_BY_DIGEST = re.compile(r"^(?P<name>[^@\s]+)@sha256:[0-9a-f]{64}\Z")


def _checked_container(container: str) -> str:
    match = _BY_DIGEST.match(container)
    if match is None or not REFERENCE.match(match["name"]):
        raise UsageError(
            f"image {container!r} is not a reference by digest (REPOSITORY@sha256:<64 hex>)",
            "a recipe runs exactly one image: name it by the digest publish pushed",
        )
    return container


def _shell_free(where: str, value: str) -> None:
    if "${" in value or "$(" in value:
        raise UsageError(
            f"{where} {value!r} refers to the environment, which a recipe cannot: sparkrun "
            "passes recipe values literally",
            "pass the value itself (profile export --model for the model)",
        )


#: What sparkrun 0.4.2 fills in a recipe's command, whatever quotes it stands in: a
#: ``{key}`` span (from the defaults, the model, or a ``-o key=VALUE`` at run time) and, once
#: a ``{{`` is anywhere in the template, every doubled brace (its v1 escape).
_FILLED = re.compile(r"\{[A-Za-z0-9_.-]+\}|\{\{")
#: What sparkrun 0.4.2 fills in a recipe's env value (its env templates).
_ENV_FILLED = re.compile(r"\{+(?:config|launch)\.")


def _unfilled(where: str, value: str, pattern: re.Pattern[str] = _FILLED) -> None:
    """A profile's value that sparkrun would change before the engine sees it is refused:
    the recipe would run another command than the profile does."""
    found = pattern.search(value)
    if found is not None:
        raise UsageError(
            f"{where} {value!r} holds {found[0]!r}, which sparkrun fills when it renders "
            "the recipe: the engine would get another value than the profile's",
            "write the recipe by hand, or change the value in the profile",
        )


def _exported_model(profile: SmokeProfile, model: str | None) -> str:
    served = model_word(model or profile.model, "--model" if model else "the profile's model")
    if not (served.startswith("/") or _HUB_ID.match(served)):
        raise UsageError(
            f"the model {served!r} is neither a hub id (org/name) nor an absolute path, the two "
            "a recipe can name (a path must exist on every node)",
            "pass --model with one of those",
        )
    return served


def _parallel_args(profile: SmokeProfile) -> list[str]:
    """The expert-parallel flag the launcher adds for the profile's layout."""
    ep = profile.parallel.ep
    if ep <= 1:
        return []
    flags = adapter_type(profile.engine).recipes.expert_parallel_args
    return [word.replace("{ep}", str(ep)) for word in flags]


def export_recipe(
    name: str,
    profile: SmokeProfile,
    container: str,
    *,
    model: str | None = None,
    origin: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """The sparkrun recipe that runs ``profile``'s engine from the image ``container`` (by
    digest): its flags (the tunable ones in ``defaults``), env and parallel layout."""
    for key, value in profile.env.items():
        _shell_free(f"env {key}", value)
        _unfilled(f"env {key}", value, _ENV_FILLED)
    adapter = adapter_type(profile.engine)
    served = _exported_model(profile, model)
    args = adapter.profile_args(served, profile.args)  # what the engine's launch fills in
    for word in args:
        _shell_free("the flag value", word)
        _unfilled("the flag value", word)
    parallel = profile.parallel
    runtimes = adapter.recipes.export_runtimes
    runtime = runtimes.get(parallel.launcher or "", next(iter(runtimes.values()), profile.engine))
    spec = RecipeSpec(
        engine=profile.engine,
        runtime=runtime,
        model=served,
        args=[*adapter.launcher_flags(args), *args, *_parallel_args(profile)],
        env=dict(profile.env),
        tp=parallel.tp,
        pp=parallel.pp,
        container=_checked_container(container),
        description=profile.description or name,
        metadata={"sparkbuild": {"profile": name, **(origin or {})}},
        min_nodes=parallel.nodes,
        max_nodes=parallel.nodes,
    )
    return recipe_document(spec)
