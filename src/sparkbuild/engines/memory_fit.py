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

The reserve (what lands outside the budget besides the draft) is one number per engine,
calibrated against the published runs (docs/smoke.md, "Memory fit") and reported with them:
SGLang's static budget leaves its CUDA context, graphs and processes outside (13 GiB); vLLM
counts everything it allocates inside u x M (activations, CUDA graphs, non-torch memory), so
outside it is only what the host keeps (6 GiB). vLLM's ``--kv-cache-memory-bytes`` sizes the
pool in bytes; the budget is then the weights, state, draft and that pool. A model's shape is
read by engines/model_shape.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from packaging.version import Version

from sparkbuild.adapters import adapter_type
from sparkbuild.adapters.facts import MemoryFacts
from sparkbuild.adapters.values import flag_value
from sparkbuild.engines.model_shape import GIB, ModelShape, model_shape, shape_from_config
from sparkbuild.engines.profiles import Parallel, SmokeProfile
from sparkbuild.errors import UsageError
from sparkbuild.jsontext import JsonObject

SPARK_MEMORY_GIB = 119.0
# a table: bytes per element of each dtype name, several to a row
_DTYPE_BYTES = {
    "auto": 2.0, "bfloat16": 2.0, "float16": 2.0, "half": 2.0, "float32": 4.0,
    "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp4_e2m1": 0.5, "nvfp4": 0.5,
}  # fmt: skip


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
    kv_pool_bytes: int | None = None  # the KV pool sized in bytes (vLLM --kv-cache-memory-bytes)

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


# --- the launch, from a profile's flags ---------------------------------------------------


def _fraction(args: Sequence[str], flag: str, default: float) -> float:
    """The budget flag's value: a fraction of the memory, above 0 and at most 1."""
    text = flag_value(args, flag)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 1):
        raise UsageError(
            f"{flag} {text!r} is not a fraction of the memory (above 0, at most 1)",
            f"fix {flag} in the profile's args, e.g. {flag} 0.8",
        )
    return value


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
    fraction = _fraction(args, facts.budget_flag, facts.budget_default)
    length = flag_value(args, facts.context_flag)
    kv = (
        (flag_value(args, facts.kv_dtype_flag) if facts.kv_dtype_flag else None) or "auto"
    ).lower()
    given = int(length) if length and length.isdigit() and len(length) <= 9 else None
    chosen = context or given or max_context or 8192
    kv_flag = facts.kv_bytes_flag
    kv_text = flag_value(args, kv_flag) if kv_flag else None
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
        kv_pool_bytes=_byte_count(kv_flag or "", kv_text) if kv_text is not None else None,
    )
    return launch, adapter.draft_model(args)


_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_SUFFIX = {**_DECIMAL, **{k.upper(): 1 << (10 * n) for n, k in enumerate("kmgt", start=1)}}


def _byte_count(flag: str, text: str) -> int:
    """A byte count as vLLM reads it (``human_readable_int``: ``1k`` is 1000, ``1K`` 1024)."""
    match = re.fullmatch(r"(\d{1,15}(?:\.\d{1,6})?)([kmgtKMGT]?)", text.strip())
    if match is None or ("." in match[1] and match[2].isupper()):
        raise UsageError(
            f"{flag} {text!r} is not a byte count", f"e.g. {flag} 20G (decimal) or 16G"
        )
    count = int(float(match[1]) * _SUFFIX.get(match[2], 1))
    if count <= 0:
        raise UsageError(f"{flag} {text!r} is not a byte count above 0")
    return count


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
    formula = "f x M - weights - state (- draft, counted)"
    sized = f"the budget {launch.fraction} x {memory_gib:g} GiB"
    if launch.kv_pool_bytes is not None:  # the pool is given: the budget is what it holds
        pool = float(launch.kv_pool_bytes)
        budget = weights + state + (draft_w if launch.draft_counted else 0.0) + pool
        formula = f"{launch.facts.kv_bytes_flag} ({launch.facts.budget_flag} not used)"
        sized = "weights, state and the KV pool"
        notes.append(
            f"{launch.facts.kv_bytes_flag} sizes the KV pool: what the engine allocates "
            "beside it (activations, CUDA graphs) is not in the estimate"
        )
    pool_tokens = int(pool // kv_cell) if kv_cell else 0
    items.append(Item("KV pool", _gib(pool), formula, True))
    reserve = launch.facts.reserve_gib
    peak = _gib(budget + outside) + reserve
    need = launch.context * launch.concurrency
    problems: list[str] = []
    if peak > memory_gib:
        problems.append(
            f"out of memory: {sized} = {_gib(budget):.1f} GiB, {_gib(outside):.1f} GiB beside "
            f"it and {reserve:g} GiB for the runtime make {peak:.1f} GiB of {memory_gib:g}"
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
    match = re.fullmatch(r"0*([1-9]\d{0,8})([kK]?)", text.strip())
    if match is None:
        raise UsageError(f"{text!r} is not a token count (e.g. 32768 or 32k; at least 1)")
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


__all__ = [
    "GIB",
    "SPARK_MEMORY_GIB",
    "Fit",
    "Item",
    "Launch",
    "ModelShape",
    "describe",
    "estimate",
    "launch_of",
    "model_shape",
    "parse_size",
    "profile_fit",
    "shape_from_config",
]
