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

from sparkbuild.engines.sparkrun_flags import engine_flags

#: The serve command's first line, and how each engine spells the parallel sizes there.
SERVE = {
    "vllm": ("vllm serve {model}", "-tp {tensor_parallel}", "-pp {pipeline_parallel}"),
    "sglang": ("python3 -m sglang.launch_server --model-path {model}",
               "--tp-size {tensor_parallel}", "--pp-size {pipeline_parallel}"),
}  # fmt: skip
DEFAULT_PORT = {"vllm": 8000, "sglang": 30000}


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
    metadata: Mapping[str, Any] = field(default_factory=dict)


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
        key = known.key_of(flag)
        spot = _placeholder(key, values[0]) if key and len(values) == 1 else None
        if key and spot and key not in defaults and key not in known.booleans:
            defaults[key] = _scalar(values[0])
            lines.append(f"{flag} {spot}")
        else:
            lines.append(" ".join(shlex.quote(word) for word in (flag, *values)))
    return lines


def recipe_document(spec: RecipeSpec) -> dict[str, Any]:
    """The recipe as a mapping, in sparkrun's export order."""
    serve, tp_line, pp_line = SERVE[spec.engine]
    defaults: dict[str, Any] = {"port": DEFAULT_PORT[spec.engine], "host": "0.0.0.0"}
    lines = [serve, "--host {host}", "--port {port}"]
    if spec.tp > 1:
        defaults["tensor_parallel"] = spec.tp
        lines.append(tp_line)
    if spec.pp > 1:
        defaults["pipeline_parallel"] = spec.pp
        lines.append(pp_line)
    lines += _templated(spec.engine, spec.args, defaults)
    document: dict[str, Any] = {
        "recipe_version": "2",
        "model": spec.model,
        "runtime": spec.runtime,
        **({"container": spec.container} if spec.container else {}),
        "metadata": {"description": spec.description or spec.model, **spec.metadata},
        "defaults": defaults,
        **({"env": dict(spec.env)} if spec.env else {}),
        "command": " \\\n  ".join(lines) + "\n",
    }
    return document


class _RecipeDumper(yaml.SafeDumper):
    """Multi-line strings (the command) as literal blocks, as sparkrun's export writes them."""


def _literal(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_RecipeDumper.add_representer(str, _literal)


def recipe_yaml(document: Mapping[str, Any]) -> str:
    """The recipe file's text (the command as a literal block)."""
    return yaml.dump(
        dict(document), Dumper=_RecipeDumper, sort_keys=False, allow_unicode=True, width=100
    )


def effective_yaml(document: Mapping[str, Any], container: str | None) -> str:
    """The recipe as sparkrun records a run of it (``metadata.recipe.text``, hashed into
    ``effective_hash``): plain YAML in the same key order, with the container that ran
    (null for none, last when the recipe names none)."""
    return yaml.safe_dump({**document, "container": container}, sort_keys=False)
