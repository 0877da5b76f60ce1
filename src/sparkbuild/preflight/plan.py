"""The host's half of preflight: what the probe should check for a build and its profiles.

Profiles become plain dicts for the probe: flags, environment, and the model architectures
(from ``data/preflight/models.yaml``) that the probe turns into config-only model directories.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import yaml
from packaging.version import Version

from sparkbuild.adapters import adapter_for, adapter_type
from sparkbuild.engines.profiles import SmokeProfile, load_profile
from sparkbuild.errors import SpecError
from sparkbuild.settings import Settings

MODELS_FILE = "data/preflight/models.yaml"
# Import name -> the distribution we leave out of the local venv, so a module that needs it
# is reported as a skip naming the package (see deps.CUDA_ONLY).
UNAVAILABLE_MODULES = {
    "torchvision": "torchvision",
    "torchaudio": "torchaudio",
    "torchcodec": "torchcodec",
    "torchao": "torchao",
    "cuda": "cuda-python",
    "flashinfer": "flashinfer-python",
    "cutlass": "nvidia-cutlass-dsl",
    "sgl_kernel": "sglang-kernel",
    "sglang_kernel": "sglang-kernel",
    "deep_gemm": "sgl-deep-gemm",
    "deep_ep": "sgl-deep-ep",
    "flash_mla": "sgl-flash-mla",
    "flash_attn": "flash-attn-4",
    "tilelang": "tilelang",
    "tvm_ffi": "apache-tvm-ffi",
    "tokenspeed_mla": "tokenspeed-mla",
    "torch_memory_saver": "torch-memory-saver",
    "quack": "quack-kernels",
    "humming": "humming-kernels",
    "helion": "helion",
    "nvshmem": "nvshmem4py-cu13",
}


# The GPU the engine's platform checks are answered with (native.PlatformStandin) when its
# adapter says so (``preflight.spark_gpu``): one DGX Spark's GB10 as torch reports it (SM
# 12.1, 48 SMs, ~119 GiB of unified memory shared with the CPU, CUDA 13). An engine that
# imports its kernel packages and picks its backends only on a CUDA platform then takes the
# Spark's import paths on the CPU.
SPARK_GPU: dict[str, object] = {
    "name": "NVIDIA GB10",
    "capability": [12, 1],
    "sms": 48,
    "memory_bytes": 119 * 1024**3,
    "integrated": True,
    "cuda": "13.0",
    "count": 1,
}


@cache
def known_models() -> dict[str, dict[str, object]]:
    text = resources.files("sparkbuild").joinpath(MODELS_FILE).read_text(encoding="utf-8")
    data = yaml.safe_load(text) or {}
    return {str(k): dict(v) for k, v in data.items()}


def model_entry(model: str) -> dict[str, object] | None:
    """How to stand in for ``model``: a local directory as is, else the known architecture."""
    local = Path(model).expanduser()
    if (local / "config.json").is_file():
        return {"id": model, "path": str(local.resolve())}
    known = known_models().get(model)
    return {"id": model, **known} if known else None


@dataclass(frozen=True)
class ProfilePlan:
    name: str
    engine: str
    model: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]

    def to_probe(self) -> dict[str, object]:
        draft = adapter_type(self.engine).draft_model(self.args)
        target = model_entry(self.model)
        return {
            "name": self.name,
            "model": self.model,
            "model_dir": target.get("path") if target else None,
            "args": list(self.args),
            "env": dict(self.env),
            "target": target,
            "draft": model_entry(draft) if draft else None,
        }


def _as_run(profile: SmokeProfile, version: Version) -> tuple[list[str], dict[str, str]]:
    """Flags and environment as the smoke stage will run them on this engine version: the
    profile's own plus the version's NaN switch (``expect.nan_switch``)."""
    args, env = list(profile.args), {**profile.env, **profile.container.env}
    if profile.expect.nan_switch:
        switch = adapter_for(profile.engine, version=version).nan_switch()
        env = {**env, **switch.env}
        args += [a for a in switch.args if a not in args]
    return args, env


def load_profile_plan(settings: Settings, name: str, engine: str, version: Version) -> ProfilePlan:
    profile_name, profile = load_profile(settings, name, need_model=False)
    if profile.engine != engine:
        raise SpecError(
            f"profile {profile_name!r} is for {profile.engine}, not {engine}",
            "list it under a build of that engine",
        )
    args, env = _as_run(profile, version)
    return ProfilePlan(
        name=profile_name,
        engine=profile.engine,
        model=profile.model,
        args=tuple(args),
        env=tuple(sorted(env.items())),
    )


__all__ = [
    "SPARK_GPU",
    "UNAVAILABLE_MODULES",
    "ProfilePlan",
    "known_models",
    "load_profile_plan",
    "model_entry",
]
