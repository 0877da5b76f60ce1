"""A model's shape for the memory estimate (engines/memory_fit): layers and their kinds, KV
heads, hidden and vocabulary sizes, recurrent state and the checkpoint's bytes, read from its
``config.json`` (a local directory or the Hugging Face cache, never the network) or from the
facts shipped for the models the profiles serve (``data/memory/models.yaml``).

A config is input like any other: read bounded (:data:`CONFIG_LIMIT`, regular files only,
strict JSON, an object), and every size a whole number within what a checkpoint has
(:data:`MAX_LAYERS`, :data:`MAX_SIZE`), else an error naming the file and the key: 120 bytes
of ``num_hidden_layers: 10000000000`` once made the estimate eat the host's memory.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from sparkbuild import fileio, jsontext
from sparkbuild.errors import UsageError

GIB = 1 << 30
#: A checkpoint's config.json is a few kilobytes; one far larger is not a config.
CONFIG_LIMIT = 4 * fileio.MIB
#: Bounds no checkpoint reaches (the largest have ~200 layers, hidden and vocab sizes of a
#: few hundred thousand): a config beyond them would make the estimate loop for hours.
MAX_LAYERS = 4096
MAX_SIZE = 1 << 26


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


def _text_config(config: Mapping[str, object]) -> Mapping[str, object]:
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, Mapping) else config


def _layer_kinds(config: Mapping[str, object], layers: int) -> list[str]:
    """Each layer's kind: ``attention``, ``mamba`` (Mamba2), ``linear`` (GatedDeltaNet) or
    ``mlp`` (no cache), from whichever spelling the config uses."""
    listed = config.get("layer_types")
    pattern = config.get("hybrid_override_pattern")
    if isinstance(listed, list):
        names = [str(t) for t in listed[: MAX_LAYERS + 1]]
    elif isinstance(pattern, str):
        code = {"M": "mamba", "*": "attention", "-": "mlp", "E": "mlp"}
        names = [code.get(c, "mlp") for c in pattern[: MAX_LAYERS + 1]]
    elif config.get("full_attention_interval"):
        every = _count(config, "full_attention_interval", maximum=layers)
        names = [
            "full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)
        ]
    else:
        names = ["attention"] * layers
    if len(names) > MAX_LAYERS:
        raise ValueError(f"more than {MAX_LAYERS} layer kinds listed")
    kinds = {"linear_attention": "linear", "mamba": "mamba", "mlp": "mlp", "moe": "mlp"}
    return [kinds.get(n, "attention") for n in names]


def _state_bytes(config: Mapping[str, object], kinds: Sequence[str]) -> int:
    """Recurrent state of one sequence over every recurrent layer (see the docstring)."""
    total = 0

    def size(key: str, default: int = 0) -> int:
        return _count(config, key, default=default, minimum=0)

    if "mamba" in kinds:
        heads, dim = size("mamba_num_heads"), size("mamba_head_dim")
        state, groups = size("ssm_state_size"), size("n_groups")
        kernel = _count(config, "conv_kernel", default=4)
        per = heads * dim * state * 4 + (heads * dim + 2 * groups * state) * (kernel - 1) * 2
        total += per * kinds.count("mamba")
    if "linear" in kinds:
        k_heads, v_heads = size("linear_num_key_heads"), size("linear_num_value_heads")
        k_dim, v_dim = size("linear_key_head_dim"), size("linear_value_head_dim")
        kernel = _count(config, "linear_conv_kernel_dim", default=4)
        per = (
            v_heads * k_dim * v_dim * 4 + (2 * k_heads * k_dim + v_heads * v_dim) * (kernel - 1) * 2
        )
        total += per * kinds.count("linear")
    return total


def _count(
    config: Mapping[str, object],
    key: str,
    *,
    default: int | None = None,
    minimum: int = 1,
    maximum: int = MAX_SIZE,
) -> int:
    """A whole number of ``config`` between ``minimum`` and ``maximum`` (a config's sizes are
    JSON integers; ``default`` when the key is absent or null, a KeyError without one)."""
    value = config.get(key)
    if value is None:
        if default is None:
            raise KeyError(key)
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} is {value!r}, not a number")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ValueError(f"{key} is {value!r}, not a whole number")
    number = int(value)
    if not minimum <= number <= maximum:
        raise ValueError(f"{key} is {number}, outside {minimum}..{maximum}")
    return number


def shape_from_config(
    name: str, config: Mapping[str, object], weight_bytes: int, source: str
) -> ModelShape:
    """A model's shape from its ``config.json`` (nested ``text_config`` read too); every
    size a positive whole number within what any checkpoint has (:data:`MAX_SIZE`,
    :data:`MAX_LAYERS`), else a UsageError naming the file and the key."""
    try:
        text = _text_config(config)
        layers = _count(text, "num_hidden_layers", maximum=MAX_LAYERS)
        heads = _count(text, "num_attention_heads")
        hidden = _count(text, "hidden_size")
        kinds = _layer_kinds(text, layers)
        shape = ModelShape(
            name=name,
            layers=layers,
            kv_layers=kinds.count("attention"),
            kv_heads=_count(text, "num_key_value_heads", default=heads),
            head_dim=_count(text, "head_dim", default=max(hidden // heads, 1)),
            hidden=hidden,
            vocab=_count(text, "vocab_size"),
            weight_bytes=weight_bytes,
            mtp_layers=_count(
                text, "num_nextn_predict_layers", default=0, minimum=0, maximum=MAX_LAYERS
            )
            or _count(text, "mtp_num_hidden_layers", default=0, minimum=0, maximum=MAX_LAYERS),
            state_bytes=_state_bytes(text, kinds),
            max_context=_count(text, "max_position_embeddings", default=0, minimum=0) or None,
            source=source,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageError(
            f"{source}: the model config lacks what the memory estimate reads, or holds "
            f"what no checkpoint has ({exc})",
            "fix the config, or pass --force to boot without the estimate",
        ) from None
    return shape


def _read_config(config_file: Path) -> Mapping[str, object]:
    """``config.json``, bounded (:data:`CONFIG_LIMIT`), strict JSON, an object."""
    try:
        config = jsontext.loads(fileio.read_bytes(config_file, limit=CONFIG_LIMIT))
    except OSError as exc:
        raise UsageError(
            f"cannot read {config_file}: {fileio.reason(exc)}",
            "point --model at a checkpoint directory whose config.json is a small JSON file",
        ) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UsageError(f"{config_file} is not JSON: {exc}") from None
    if not isinstance(config, Mapping):
        raise UsageError(f"{config_file} is not a JSON object")
    return config


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


def _present(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def model_shape(model: str) -> ModelShape | None:
    """The shape of ``model``: a local directory, the HF cache, or the facts shipped in
    ``data/memory/models.yaml``; None when none of them knows it."""
    directory = Path(model).expanduser()
    if not _present(directory / "config.json"):
        directory = _hub_snapshot(model) or directory
    config_file = directory / "config.json"
    if _present(config_file):  # a FIFO or device there is refused by the read, not skipped
        config = _read_config(config_file)
        return shape_from_config(model, config, _weights_on_disk(directory), str(config_file))
    known = dict(_known().get(model) or {})
    if not known:
        return None
    weights = int(float(known.pop("weights_gib")) * GIB)
    source = str(known.pop("source"))
    return shape_from_config(model, known, weights, f"data/memory/models.yaml ({source})")


__all__ = [
    "CONFIG_LIMIT",
    "MAX_LAYERS",
    "MAX_SIZE",
    "ModelShape",
    "model_shape",
    "shape_from_config",
]
