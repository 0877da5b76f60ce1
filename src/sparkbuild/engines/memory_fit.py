"""Will the engine fit a DGX Spark's unified memory? An estimate before the boot.

A GB10 has one pool of memory for CPU and GPU (119 GiB free to a process on an idle box,
``SPARK_MEMORY_GIB``). The engine takes a fixed share of it, its *static budget*: SGLang's
``--mem-fraction-static`` f, vLLM's ``--gpu-memory-utilization`` u, times the memory. Inside
it go the weights, then a KV pool (and, for hybrid models, a pool of recurrent state) filled
with what is left. Everything the engine allocates *outside* the budget must fit in the rest
of the memory, together with the runtime around the engine (its adapter's
``MemoryFacts.reserve_gib``).

Formulas, per node (tensor and pipeline parallel ranks split weights and KV layers):

* weights W = checkpoint bytes / (tp x pp);
* KV per token K = 2 x max(1, kv_heads / tp) x head_dim x kv_bytes x kv_layers / pp, where
  kv_layers counts the layers that keep a per-token cache (a hybrid model's attention layers
  only: ``layer_types``, ``full_attention_interval``, ``hybrid_override_pattern``);
* recurrent state per sequence R = per Mamba2 layer heads x head_dim x state x 4 (float32)
  + (heads x head_dim + 2 x groups x state) x (kernel - 1) x 2, per GatedDeltaNet layer
  v_heads x k_dim x v_dim x 4 + (2 x k_heads x k_dim + v_heads x v_dim) x (kernel - 1) x 2;
* the need of the run: KV = K x context x concurrency, state = R x concurrency;
* the draft (speculative decoding): a separate draft checkpoint's bytes, or the target's
  W x d / layers for d MTP layers inside the checkpoint; its KV pool has as many tokens as
  the target's, on d layers: pool x d / kv_layers; SGLang's NEXTN/MTP draft also loads a bf16
  embed_tokens and lm_head before it shares the target's: 2 x 2 x vocab x hidden / tp;
* the engine's pool P = f x M - W - state pool - (the draft's weights, when counted);
* SGLang up to 0.5.13 (without sparkbuild's draft-memory patch) sizes P before the draft
  loads, so the draft's weights, its KV (P x d / kv_layers) and the transient embed/lm_head
  land outside the budget; from 0.5.14 (and with the patch) they are counted inside it, the
  target's KV cell scaled by (1 + d / kv_layers). vLLM counts the drafter inside u x M.
* fits when f x M + (what lands outside) + reserve <= M, and P holds one sequence of the
  context (engines refuse to start otherwise). P short of context x concurrency is reported,
  not refused: the engine queues requests it has no room for.

The reserve (the runtime outside the budget: CUDA context and graphs, the engine's own
processes, which on unified memory take from the same pool) is one number per engine,
calibrated against the published runs (docs/smoke.md, "Memory fit") and reported with them.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from packaging.version import Version

from sparkbuild.adapters import adapter_type
from sparkbuild.adapters.facts import MemoryFacts
from sparkbuild.adapters.values import flag_value
from sparkbuild.engines.profiles import Parallel, SmokeProfile
from sparkbuild.errors import UsageError
from sparkbuild.jsontext import JsonObject

GIB = 1 << 30
SPARK_MEMORY_GIB = 119.0
# a table: bytes per element of each dtype name, several to a row
_DTYPE_BYTES = {
    "auto": 2.0, "bfloat16": 2.0, "float16": 2.0, "half": 2.0, "float32": 4.0,
    "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp4_e2m1": 0.5, "nvfp4": 0.5,
}  # fmt: skip


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a checkpoint (from its config.json and file sizes)."""

    name: str
    layers: int
    kv_layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    weight_bytes: int
    mtp_layers: int = 0
    state_bytes: int = 0  # recurrent state per sequence, all recurrent layers
    max_context: int | None = None
    source: str = ""


@dataclass(frozen=True)
class Launch:
    """How the engine is asked to run: from the profile's flags and the sweep."""

    engine: str
    facts: MemoryFacts  # the engine's (its adapter's ``memory``)
    version: Version | None
    fraction: float  # f or u
    context: int
    concurrency: int = 1
    kv_bytes: float = 2.0
    tp: int = 1
    pp: int = 1
    speculative: str | None = None  # the algorithm or method; None: off
    draft: ModelShape | None = None  # a separate draft checkpoint
    draft_patched: bool = False  # sparkbuild's draft-memory patch is in the image

    @property
    def draft_counted(self) -> bool:
        """Does the engine count the draft inside its budget before sizing the KV pool?"""
        since = self.facts.draft_counted_from
        if since is None:
            return True
        return self.draft_patched or (self.version is not None and self.version >= since)


@dataclass(frozen=True)
class Item:
    name: str
    gib: float
    formula: str
    inside: bool  # inside the static budget (else allocated beside it)

    def to_json(self) -> JsonObject:
        return {
            "name": self.name,
            "gib": round(self.gib, 2),
            "formula": self.formula,
            "inside": self.inside,
        }


@dataclass(frozen=True)
class Fit:
    """The estimate: what goes where, the peak against the memory, and the verdict."""

    model: str
    memory_gib: float
    budget_gib: float
    reserve_gib: float
    items: tuple[Item, ...]
    pool_gib: float
    pool_tokens: int
    need_tokens: int
    peak_gib: float
    problems: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def fits(self) -> bool:
        return not self.problems

    def to_json(self) -> JsonObject:
        return {
            "model": self.model,
            "fits": self.fits,
            "memory_gib": self.memory_gib,
            "budget_gib": round(self.budget_gib, 2),
            "reserve_gib": self.reserve_gib,
            "peak_gib": round(self.peak_gib, 2),
            "pool_gib": round(self.pool_gib, 2),
            "pool_tokens": self.pool_tokens,
            "need_tokens": self.need_tokens,
            "items": [i.to_json() for i in self.items],
            "problems": list(self.problems),
            "notes": list(self.notes),
        }


# --- the model's shape ----------------------------------------------------------------------


def _text_config(config: Mapping[str, object]) -> Mapping[str, Any]:
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, Mapping) else config


def _layer_kinds(config: Mapping[str, Any], layers: int) -> list[str]:
    """Each layer's kind: ``attention``, ``mamba`` (Mamba2), ``linear`` (GatedDeltaNet) or
    ``mlp`` (no cache), from whichever spelling the config uses."""
    if isinstance(config.get("layer_types"), list):
        names = [str(t) for t in config["layer_types"]]
    elif isinstance(config.get("hybrid_override_pattern"), str):
        code = {"M": "mamba", "*": "attention", "-": "mlp", "E": "mlp"}
        names = [code.get(c, "mlp") for c in config["hybrid_override_pattern"]]
    elif config.get("full_attention_interval"):
        every = int(config["full_attention_interval"])
        names = [
            "full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)
        ]
    else:
        names = ["attention"] * layers
    kinds = {"linear_attention": "linear", "mamba": "mamba", "mlp": "mlp", "moe": "mlp"}
    return [kinds.get(n, "attention") for n in names]


def _state_bytes(config: Mapping[str, Any], kinds: Sequence[str]) -> int:
    """Recurrent state of one sequence over every recurrent layer (see the docstring)."""
    total = 0
    if "mamba" in kinds:
        heads, dim = int(config.get("mamba_num_heads", 0)), int(config.get("mamba_head_dim", 0))
        state, groups = int(config.get("ssm_state_size", 0)), int(config.get("n_groups", 0))
        kernel = int(config.get("conv_kernel", 4))
        per = heads * dim * state * 4 + (heads * dim + 2 * groups * state) * (kernel - 1) * 2
        total += per * kinds.count("mamba")
    if "linear" in kinds:
        k_heads, v_heads = (
            int(config.get("linear_num_key_heads", 0)),
            int(config.get("linear_num_value_heads", 0)),
        )
        k_dim, v_dim = (
            int(config.get("linear_key_head_dim", 0)),
            int(config.get("linear_value_head_dim", 0)),
        )
        kernel = int(config.get("linear_conv_kernel_dim", 4))
        per = (
            v_heads * k_dim * v_dim * 4 + (2 * k_heads * k_dim + v_heads * v_dim) * (kernel - 1) * 2
        )
        total += per * kinds.count("linear")
    return total


def shape_from_config(
    name: str, config: Mapping[str, object], weight_bytes: int, source: str
) -> ModelShape:
    """A model's shape from its ``config.json`` (nested ``text_config`` read too)."""
    text = _text_config(config)
    try:
        layers = int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
        hidden = int(text["hidden_size"])
        kinds = _layer_kinds(text, layers)
        shape = ModelShape(
            name=name,
            layers=layers,
            kv_layers=kinds.count("attention"),
            kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(text.get("head_dim") or hidden // heads),
            hidden=hidden,
            vocab=int(text["vocab_size"]),
            weight_bytes=weight_bytes,
            mtp_layers=int(
                text.get("num_nextn_predict_layers") or text.get("mtp_num_hidden_layers") or 0
            ),
            state_bytes=_state_bytes(text, kinds),
            max_context=int(text["max_position_embeddings"])
            if text.get("max_position_embeddings")
            else None,
            source=source,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(
            f"{source}: the model config lacks what the memory estimate reads ({exc})",
            "fix the config, or pass --force to boot without the estimate",
        ) from None
    return shape


@cache
def _known() -> dict[str, dict[str, Any]]:
    text = (resources.files("sparkbuild") / "data" / "memory" / "models.yaml").read_text("utf-8")
    return {str(k): dict(v) for k, v in (yaml.safe_load(text) or {}).items()}


def _hub_snapshot(model: str) -> Path | None:
    """The newest snapshot of a hub id in the local Hugging Face cache (never the network)."""
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    root = home / "hub" / ("models--" + model.replace("/", "--")) / "snapshots"
    snapshots = sorted(root.glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    return snapshots[-1].parent if snapshots else None


def _weights_on_disk(directory: Path) -> int:
    files = list(directory.glob("*.safetensors")) or list(directory.glob("*.bin"))
    return sum(f.stat().st_size for f in files)  # a cache's symlinks: the blob's size


def model_shape(model: str) -> ModelShape | None:
    """The shape of ``model``: a local directory, the HF cache, or the facts shipped in
    ``data/memory/models.yaml``; None when none of them knows it."""
    directory = Path(model).expanduser()
    if not (directory / "config.json").is_file():
        directory = _hub_snapshot(model) or directory
    config_file = directory / "config.json"
    if config_file.is_file():
        config = json.loads(config_file.read_text(encoding="utf-8"))
        return shape_from_config(model, config, _weights_on_disk(directory), str(config_file))
    known = dict(_known().get(model) or {})
    if not known:
        return None
    weights = int(float(known.pop("weights_gib")) * GIB)
    source = str(known.pop("source"))
    return shape_from_config(model, known, weights, f"data/memory/models.yaml ({source})")


# --- the launch, from a profile's flags ---------------------------------------------------


def _number(args: Sequence[str], names: tuple[str, ...], default: float) -> float:
    text = flag_value(args, *names)
    try:
        return float(text) if text is not None else default
    except ValueError:
        raise UsageError(f"{names[0]} {text!r} is not a number") from None


def launch_of(
    engine: str,
    args: Sequence[str],
    *,
    version: Version | None,
    context: int | None,
    concurrency: int,
    parallel: Parallel,
    max_context: int | None = None,
    draft_patched: bool = False,
) -> tuple[Launch, str | None]:
    """The launch a profile's flags ask for, and the draft checkpoint it names (if any)."""
    adapter = adapter_type(engine)
    facts = adapter.memory
    if facts is None:
        raise UsageError(f"no memory estimate for {adapter.display_name}: it declares no facts")
    fraction = _number(args, (facts.budget_flag,), facts.budget_default)
    length = flag_value(args, facts.context_flag)
    kv = (
        (flag_value(args, facts.kv_dtype_flag) if facts.kv_dtype_flag else None) or "auto"
    ).lower()
    chosen = context or (int(length) if length and length.isdigit() else max_context) or 8192
    launch = Launch(
        engine=engine,
        facts=facts,
        version=version,
        fraction=fraction,
        context=chosen,
        concurrency=concurrency,
        kv_bytes=_DTYPE_BYTES.get(kv, 2.0),
        tp=parallel.tp,
        pp=parallel.pp,
        speculative=adapter.speculative_method(args),
        draft_patched=draft_patched,
    )
    return launch, adapter.draft_model(args)


# --- the estimate ---------------------------------------------------------------------------


def _gib(value: float) -> float:
    return value / GIB


def estimate(shape: ModelShape, launch: Launch, *, memory_gib: float = SPARK_MEMORY_GIB) -> Fit:
    """The fit of ``launch`` on one node of ``memory_gib`` (formulas in the docstring)."""
    ranks = launch.tp * launch.pp
    kv_layers = max(1, math.ceil(shape.kv_layers / launch.pp))
    per_layer = 2 * max(1, shape.kv_heads // launch.tp) * shape.head_dim * launch.kv_bytes
    kv_token = per_layer * kv_layers
    weights = shape.weight_bytes / ranks
    state = shape.state_bytes / launch.pp * launch.concurrency
    budget = launch.fraction * memory_gib * GIB
    items = [
        Item("weights", _gib(weights), "checkpoint bytes / (tp x pp)", True),
        Item("recurrent state", _gib(state), "state per sequence x concurrency", True),
    ]
    outside = 0.0
    draft_layers = 0
    notes: list[str] = []
    draft_w, draft_layers, transient = _draft(shape, launch, notes)
    pool = budget - weights - state
    kv_cell = kv_token
    if draft_w or draft_layers:
        counted = launch.draft_counted
        items.append(
            Item("draft weights", _gib(draft_w), "draft checkpoint, or W x d / layers", counted)
        )
        if counted:
            pool -= draft_w
            kv_cell = kv_token * (1 + draft_layers / kv_layers)
        else:
            draft_kv = pool * draft_layers / kv_layers
            outside += draft_w + draft_kv + transient
            items.append(
                Item(
                    "draft KV",
                    _gib(draft_kv),
                    "pool x d / kv_layers, sized after the target's",
                    False,
                )
            )
            if transient:
                items.append(
                    Item(
                        "draft embed+lm_head",
                        _gib(transient),
                        "2 x 2 x vocab x hidden / tp (bf16, loaded then shared)",
                        False,
                    )
                )
            notes.append(
                f"{launch.engine} {launch.version or '(version unknown)'} sizes the KV pool "
                "before the draft loads: the draft's memory lands outside the budget"
            )
    pool = max(pool, 0.0)
    pool_tokens = int(pool // kv_cell) if kv_cell else 0
    items.append(Item("KV pool", _gib(pool), "f x M - weights - state (- draft, counted)", True))
    reserve = launch.facts.reserve_gib
    peak = _gib(budget + outside) + reserve
    need = launch.context * launch.concurrency
    problems: list[str] = []
    if peak > memory_gib:
        problems.append(
            f"out of memory: the budget {launch.fraction} x {memory_gib:g} GiB = "
            f"{_gib(budget):.1f} GiB, {_gib(outside):.1f} GiB beside it and {reserve:g} GiB "
            f"for the runtime make {peak:.1f} GiB of {memory_gib:g}"
        )
    if pool_tokens < launch.context:
        problems.append(
            f"the KV pool holds {pool_tokens} tokens, less than one sequence of "
            f"{launch.context}: the engine refuses to start"
        )
    elif pool_tokens < need:
        notes.append(
            f"the KV pool holds {pool_tokens} tokens: {pool_tokens // launch.context} of the "
            f"{launch.concurrency} full-length sequences at once (the rest queue)"
        )
    return Fit(
        model=shape.name,
        memory_gib=memory_gib,
        budget_gib=_gib(budget),
        reserve_gib=reserve,
        items=tuple(items),
        pool_gib=_gib(pool),
        pool_tokens=pool_tokens,
        need_tokens=need,
        peak_gib=peak,
        problems=tuple(problems),
        notes=tuple(notes),
    )


def _draft(shape: ModelShape, launch: Launch, notes: list[str]) -> tuple[float, int, float]:
    """(draft weight bytes per rank, draft KV layers, transient bytes) of the launch."""
    ranks = launch.tp * launch.pp
    if not launch.speculative:
        return 0.0, 0, 0.0
    if launch.draft is not None:
        draft = launch.draft
        return draft.weight_bytes / ranks, max(draft.kv_layers, 1), 0.0
    method = (launch.speculative or "").upper()
    if method in ("NGRAM", "NGRAM_SPEC") or method.lower() == "ngram":
        return 0.0, 0, 0.0
    if method == "FROZEN_KV_MTP":
        notes.append("FROZEN_KV_MTP reads the target's KV: no draft pool")
        return 0.0, 0, 0.0
    layers = shape.mtp_layers or 1
    weights = shape.weight_bytes * layers / shape.layers / ranks
    transient = 2 * 2 * shape.vocab * shape.hidden / launch.tp
    transient = transient if launch.facts.draft_head_transient else 0
    return weights, layers, float(transient)


def describe(fit: Fit) -> list[str]:
    """The estimate as lines for the terminal."""
    lines = [
        f"memory fit of {fit.model}: {'fits' if fit.fits else 'does not fit'} "
        f"(peak {fit.peak_gib:.1f} of {fit.memory_gib:g} GiB)"
    ]
    for item in fit.items:
        where = "in budget" if item.inside else "beside it"
        lines.append(f"  {item.name:20} {item.gib:7.2f} GiB  {where:9}  {item.formula}")
    lines.append(f"  KV pool holds {fit.pool_tokens} tokens; the run needs {fit.need_tokens}")
    lines += [f"  note: {n}" for n in fit.notes]
    lines += [f"  problem: {p}" for p in fit.problems]
    return lines


def parse_size(text: str) -> int:
    """``32768``, ``32k``, ``128K``: a token count."""
    match = re.fullmatch(r"(\d+)([kK]?)", text.strip())
    if match is None:
        raise UsageError(f"{text!r} is not a token count (e.g. 32768 or 32k)")
    return int(match[1]) * (1024 if match[2] else 1)


def profile_fit(
    profile: SmokeProfile,
    *,
    version: Version | None,
    context: int | None = None,
    concurrency: int = 1,
    draft_patched: bool = False,
    memory_gib: float = SPARK_MEMORY_GIB,
) -> Fit | str:
    """The fit of a profile's launch, or why there is no estimate (an engine that declares
    no memory facts, a model whose shape is neither on disk nor shipped)."""
    adapter = adapter_type(profile.engine)
    if adapter.memory is None:
        return f"no memory estimate: {adapter.display_name} declares no memory facts"
    shape = model_shape(profile.model)
    if shape is None:
        return (
            f"no memory estimate: {profile.model} has no config.json here (a local directory or "
            "the Hugging Face cache) and is not in data/memory/models.yaml"
        )
    launch, draft = launch_of(
        profile.engine,
        profile.args,
        version=version,
        context=context,
        concurrency=concurrency,
        parallel=profile.parallel,
        max_context=shape.max_context,
        draft_patched=draft_patched,
    )
    if draft is not None:
        draft_shape = model_shape(draft)
        if draft_shape is None:
            return f"no memory estimate: the draft {draft} has no config.json here"
        launch = replace(launch, draft=draft_shape)
    return estimate(shape, launch, memory_gib=memory_gib)
