"""Every top-level field sparkrun 0.4.2 reads from a recipe, and what each becomes in a
profile (for :mod:`.recipes`): carried, checked against the profile's layout, or said to be
dropped, by name, never silently.

The keys are sparkrun's own (``core/recipe.py``: ``_KNOWN_KEYS`` and ``Recipe.__init__``,
RECIPES.md "Field Reference"); any other key sparkrun sweeps into ``runtime_config`` for the
runtime. The node range is read as sparkrun reads it for every recipe version: ``mode:
solo`` and ``solo_only`` make it one node, ``cluster_only`` at least two, ``mode: cluster``
only makes sparkrun warn when a launch lands on one host (RECIPES.md, "Topology"). A profile
runs exactly its layout (tp x pp nodes, one GPU per DGX Spark), so a range that layout falls
outside of is refused, naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sparkbuild.engines.recipe_source import Notes
from sparkbuild.errors import UsageError

Scalar = str | bool | int | float | None


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
    mode: str = "auto"
    solo_only: bool = False
    cluster_only: bool = False
    metadata: dict[str, object] = {}
    description: str = ""
    defaults: dict[str, object] = {}  # scalars, or mappings and lists (structured values)
    env: dict[str, Scalar] = {}
    command: str | None = None
    mods: list[str] = []
    pre_exec: list[object] = []
    post_exec: list[object] = []
    post_commands: list[object] = []
    builder: str = ""
    builder_config: dict[str, object] = {}
    build_args: list[str] = []
    executor_config: dict[str, object] = {}
    runtime_config: dict[str, object] = {}
    distribution_config: dict[str, object] | None = None
    benchmark: dict[str, object] | None = None
    # sparkrun 0.4.2's other keys (RECIPES.md): read, and said what becomes of each.
    overrides: list[object] = []
    containers: list[object] = []
    min_sparkrun_version: str | None = None
    runtime_cache: object = None
    executor: str | None = None
    layout: object = None
    readiness: object = None
    stop_after_post: bool = False
    scheduler: str | None = None
    cluster_config: object = None
    capabilities: list[object] = []
    unsupported_capabilities: list[object] = []
    name: object = None
    sparkrun_version: object = None

    @field_validator("recipe_version", mode="before")
    @classmethod
    def _version(cls, value: object) -> object:
        return str(value) if isinstance(value, int | float) else value  # YAML reads 2 as an int

    @field_validator("model")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("blank: a recipe serves a model (a hub id or a path)")
        return value


# --- the node range ------------------------------------------------------------------------

_MODES = ("auto", "solo", "cluster")


@dataclass(frozen=True)
class NodeRange:
    """The hosts sparkrun runs a recipe on: at least ``low``, at most ``high`` (None: no
    limit); ``solo`` forces one; ``said`` names the fields that set it."""

    low: int
    high: int | None
    solo: bool
    said: tuple[str, ...]

    def text(self) -> str:
        if self.solo or self.high == 1:
            return "one node"
        if self.high == self.low:
            return f"{self.low} nodes"
        return f"{self.low} to {self.high} nodes" if self.high else f"{self.low} or more nodes"


def node_range(recipe: RecipeFile, path: Path) -> NodeRange:
    """The node range as sparkrun 0.4.2's ``Recipe`` makes it, for any recipe version."""
    mode, low, high = recipe.mode, recipe.min_nodes, recipe.max_nodes
    if mode not in _MODES:
        raise UsageError(
            f"{path}: mode {mode!r}: sparkrun reads 'auto', 'solo' or 'cluster'",
            "use min_nodes/max_nodes (RECIPES.md, Topology)",
        )
    if mode == "solo":
        low = high = 1
    elif mode == "auto" and low > 1:
        mode = "cluster"
    elif mode == "auto" and high == 1:
        mode = "solo"
    if recipe.cluster_only:
        low, mode = max(low, 2), "cluster"
    if recipe.solo_only:
        high, mode = 1, "solo"
    if high is not None and high < low:
        raise UsageError(f"{path}: max_nodes ({high}) is below min_nodes ({low})")
    said = tuple(
        f"{key} {getattr(recipe, key)}"
        for key in ("mode", "min_nodes", "max_nodes", "solo_only", "cluster_only")
        if key in recipe.model_fields_set
    )
    return NodeRange(low, high, mode == "solo", said)


def check_nodes(span: NodeRange, nodes: int, replicas: int, path: Path, notes: Notes) -> None:
    """The profile's ``nodes`` (tp x pp) held against sparkrun's range: refused where sparkrun
    would run the recipe on other nodes than the profile does; said otherwise. ``replicas``
    is the recipe's data parallel size, which the profile does not carry (said apart)."""
    where = ", ".join(span.said)
    if span.solo and nodes > 1:
        raise UsageError(
            f"{path}: {where}: sparkrun runs the recipe on one host, and its layout is "
            f"{nodes} ranks, one per DGX Spark",
            "drop the solo setting, or the parallel sizes",
        )
    if span.high is not None and nodes > span.high:
        raise UsageError(
            f"{path}: {where}: the layout needs {nodes} nodes, and sparkrun refuses to run "
            f"the recipe on more than {span.high}",
            f"raise max_nodes to {nodes}, or lower the parallel sizes",
        )
    if span.low > nodes * replicas:
        raise UsageError(
            f"{path}: {where}: sparkrun runs the recipe on at least {span.low} nodes, and "
            f"its layout is {nodes} (tp x pp, one rank per DGX Spark): a profile runs "
            "exactly its layout",
            f"make the command's tensor parallel size {span.low} (-o tensor_parallel="
            f"{span.low} where it reads {{tensor_parallel}}), or lower min_nodes",
        )
    if span.said:
        detail = f"sparkrun runs it on {span.text()}; the profile's layout on {nodes}"
        if span.low > nodes:
            detail += f" (sparkrun's {span.low} nodes hold {replicas} data-parallel replicas)"
        notes.add(where, "dropped" if span.low > nodes else "carried", detail)


#: The parallel sizes sparkrun places a recipe by (its config chain, whatever the command).
PLACED = ("tensor_parallel", "pipeline_parallel")


def check_placement(values: Mapping[str, object], sizes: Mapping[str, int], path: Path) -> None:
    """sparkrun places a recipe by its ``tensor_parallel`` and ``pipeline_parallel`` values,
    and the engine runs the sizes its command gives (``sizes``: tp, pp): a recipe whose two
    disagree (a command that leaves ``{tensor_parallel}`` out) runs on other nodes than its
    engine spans, and is refused, naming the key."""
    for key, size in zip(PLACED, ("tp", "pp"), strict=True):
        text = str(values.get(key, "")).strip()
        if text.isdigit() and int(text) != sizes[size]:
            raise UsageError(
                f"{path}: defaults.{key} is {text}, which sparkrun places the recipe by, and "
                f"the serve command runs {size} {sizes[size]}",
                f"give the command the {size} size from {{{key}}}, or set {key} to {sizes[size]}",
            )


def check_layout(
    recipe: RecipeFile,
    values: Mapping[str, object],
    sizes: Mapping[str, str],
    layout: Mapping[str, int],
    path: Path,
    notes: Notes,
) -> None:
    """The profile's layout (nodes, tp, pp) against where sparkrun places the recipe: its
    placement sizes, its node range (``sizes``: the command's, for the data-parallel
    replicas a profile does not carry)."""
    check_placement(values, layout, path)
    replicas = int(sizes["dp"]) if sizes.get("dp", "").isdigit() else 1
    check_nodes(node_range(recipe, path), layout["nodes"], replicas, path, notes)


# --- what a profile does not hold ------------------------------------------------------------

#: sparkrun 0.4.2's keys that concern its own launch, not the engine's flags (RECIPES.md).
SPARKRUN_ONLY = {
    "containers": "per-machine images: a profile runs the one image --image names",
    "distribution_config": "what sparkrun copies to each node (additional models); a "
    "profile's container mounts the model",
    "runtime_cache": "sparkrun's compilation-cache mount",
    "executor": "sparkrun's executor (docker, local, k8s); sparkbuild's target is "
    "--image, --command or --cluster",
    "layout": "sparkrun's host placement; a cluster file places sparkbuild's ranks",
    "scheduler": "sparkrun's host scheduler; a cluster file places sparkbuild's ranks",
    "cluster_config": "sparkrun's internal launch overrides",
    "readiness": "sparkrun's readiness probe; smoke's boot check is its own",
    "stop_after_post": "stops sparkrun's workload after its hooks",
    "min_sparkrun_version": "the sparkrun release the recipe needs",
    "benchmark": "sparkrun benchmark's settings; bench takes its own options or --sweep",
    "capabilities": "what sparkrun's gateway admits; a profile's prompts are its own",
    "unsupported_capabilities": "what sparkrun's gateway refuses",
    "name": "sparkrun ignores it (a recipe's name is its file's); the profile's is --name",
    "sparkrun_version": "an older spelling sparkrun reads only to infer a builder",
}


def not_carried(recipe: RecipeFile, notes: Notes) -> None:
    """Each field a profile cannot hold, said by name."""
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
    building = [k for k in ("builder", "build_args", "builder_config") if getattr(recipe, k)]
    if building:
        notes.add(", ".join(building), "dropped", "sparkbuild builds its images from builds/*.yaml")
    if recipe.model_revision:
        notes.add(
            f"model_revision {recipe.model_revision}",
            "dropped",
            "a profile serves a model id or path; pin the revision in a local path",
        )
    for key, why in SPARKRUN_ONLY.items():
        if getattr(recipe, key) not in (None, [], {}, False):
            notes.add(key, "dropped", why)
    for key in sorted(recipe.model_extra or {}):
        notes.add(
            key,
            "dropped",
            "not a recipe key sparkbuild knows (sparkrun hands it to the "
            "runtime as runtime_config)",
        )
    for key in recipe.runtime_config:
        notes.add(f"runtime_config.{key}", "dropped", "runtime-specific, for sparkrun's runtime")


def container_settings(recipe: RecipeFile, notes: Notes) -> dict[str, object]:
    """The docker settings a profile's ``container`` holds; each other one said."""
    settings: dict[str, object] = {}
    for key, value in recipe.executor_config.items():
        if key in ("gpus", "ipc", "shm_size") and isinstance(value, str):
            settings[key] = value
        else:
            notes.add(f"executor_config.{key}", "dropped", "a docker setting profiles do not hold")
    return settings
