"""A third engine, defined only here, goes through every stage that lists engines.

What adding an engine takes (CONTRIBUTING, "A new engine"): its adapter module, its
Dockerfile, its build spec and its profiles, nothing else. Here the adapter is
:class:`ToyAdapter` below (registered as an engine module would be), the Dockerfile and the
spec and profile are files of a project on disk, and the source is a real git repository.
Spec validation, the lock, profile loading, preflight's plan, the source build's arguments
and smoke's command lines are sparkbuild's own code, unmocked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkbuild import net
from sparkbuild.adapters import (
    Acceptance,
    Counters,
    EngineAdapter,
    Generation,
    Moved,
    PreflightFacts,
    ProbeFacts,
    RecipeFacts,
    SourceBuild,
    adapter_for,
    adapter_type,
    engine_names,
    register,
    unregister,
)
from sparkbuild.engines.launch import TargetChoice, make_target
from sparkbuild.engines.profiles import load_profile
from sparkbuild.engines.targets import ContainerTarget, ProcessTarget
from sparkbuild.image import context, source_args
from sparkbuild.preflight.plan import load_profile_plan
from sparkbuild.preflight.stage import probe_plan
from sparkbuild.settings import Settings, parse_repo_overrides
from sparkbuild.spec import load_builds
from tests.support.gitrepos import Upstream, make_upstream
from tests.support.source_project import SourceProject


class ToyAdapter(EngineAdapter):
    """An engine that serves ``toy-serve --checkpoint MODEL --bind HOST --listen PORT``."""

    name = "toy"
    display_name = "Toy"
    default_port = 7000
    default_launcher = ("toy-serve",)
    ready_line = re.compile(r"toy is ready")
    nan_line = re.compile(r"toy saw NaN")
    error_line = re.compile(r"toy failed")
    accept_line = re.compile(r"toy accept ([0-9.]+)")
    max_len_flag = "--window"
    relied_metrics = (("toy:drafts_total", "acceptance from counters"),)
    relied_fields = (("toy_steps", "per-request acceptance"),)
    parallel_launchers = ("toyrun",)
    source_build = SourceBuild(
        base_image="toyorg/toy:v{version}-cu130",
        moves=(Moved("TOY_KERNELS", "<1.1", "kernels"), Moved("TOY_KERNELS", ">=1.1", "csrc")),
    )
    preflight = PreflightFacts(
        registry_dir="models",
        spark_gpu=False,
        probe=ProbeFacts(
            parser="arg_parser",
            prog="toy-serve",
            model_flag="--checkpoint",
            distributions=("toy", "toy-cpu"),
            env_prefixes=("TOY_",),
            env_module="env.py",
            config_registry="configs",
            signals_source="tests/test_engine_toy.py",
        ),
    )
    recipes = RecipeFacts(
        runtimes={"toy": "toyrun"},
        prefixes=(("toy-serve",),),
        model_flags=("--checkpoint",),
        rendered_keys={"port": "--listen"},
        toggles=frozenset(),
        parallel_flags={"--shards": "tp"},
        speculative_flags=("--draft",),
        export_command="toy-serve --checkpoint {model}",
    )

    @classmethod
    def draft_model(cls, args: Sequence[str]) -> str | None:
        words = list(args)
        return words[words.index("--draft") + 1] if "--draft" in words[:-1] else None

    def serve_args(self, model: str, host: str, port: int, args: Sequence[str]) -> list[str]:
        return ["--checkpoint", model, "--bind", host, "--listen", str(port), *args]

    def generate(
        self,
        session: net.Session,
        base_url: str,
        prompt: str,
        max_tokens: int,
        extra: Mapping[str, Any] | None = None,
        *,
        ranked: int = 0,
    ) -> Generation:
        raise NotImplementedError("the toy engine never runs here")

    def without_speculation(self, args: Sequence[str]) -> list[str]:
        words = list(args)
        if "--draft" not in words[:-1]:
            return words
        at = words.index("--draft")
        return words[:at] + words[at + 2 :]

    def acceptance_over(self, before: Counters, after: Counters) -> Acceptance:
        return Acceptance(False, None, "counters")


@pytest.fixture
def toy() -> Iterator[type[ToyAdapter]]:
    register(ToyAdapter)
    yield ToyAdapter
    unregister(ToyAdapter.name)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return make_upstream(tmp_path_factory.mktemp("upstream"))


TOY_SPEC = """\
    engine: toy
    repo: REPO
    base_branch: main
    package_dir: python/pkg
    builds:
      toy-1.1:
        ref: v1.1.0
        mode: source
        smoke: [toy-draft]
"""
TOY_PROFILE = {
    "engine": "toy",
    "model": "acme/toy-7b",
    "args": ["--shards", "1", "--draft", "acme/toy-draft"],
    "env": {"TOY_FAST": "1"},
}


@pytest.fixture
def project(tmp_path: Path, upstream: Upstream) -> SourceProject:
    """A project with the toy engine's spec, profile and Dockerfile: what adding it takes."""
    project = SourceProject.create(tmp_path, upstream)
    project.write_spec(TOY_SPEC, name="toy.yaml")
    (project.root / "smoke").mkdir()
    (project.root / "smoke" / "toy-draft.yaml").write_text(yaml.safe_dump(TOY_PROFILE))
    docker = project.root / "builds" / "docker"
    docker.mkdir()
    (docker / "toy-source.Dockerfile").write_text("ARG TOY_KERNELS\nFROM scratch\n")
    return project


def _settings(project: SourceProject) -> Settings:
    return Settings(project_dir=project.root, cache_dir=project.cache)


def test_an_unregistered_engine_is_refused_by_name(project: SourceProject) -> None:
    """Without its adapter the spec does not validate: the list is the registry's."""
    result = project.run("patches")
    assert result.exit_code == 2
    assert "toy.yaml:1: engine: Input should be 'sglang' or 'vllm'" in result.stderr


def test_spec_validation_and_repo_overrides_take_it(
    toy: type[ToyAdapter], project: SourceProject
) -> None:
    assert engine_names() == ["sglang", "toy", "vllm"]
    (build,) = load_builds(_settings(project)).values()
    assert (build.engine, str(build.version)) == ("toy", "1.1.0")
    assert parse_repo_overrides([f"toy={project.url}"]) == {"toy": project.url}
    project.write_spec(TOY_SPEC.replace("engine: toy", "engine: tensorrt"), name="toy.yaml")
    result = project.run("patches")
    assert result.exit_code == 2
    assert "engine: Input should be 'sglang', 'toy' or 'vllm'" in result.stderr


def test_the_lock_pins_it(toy: type[ToyAdapter], project: SourceProject) -> None:
    result = project.run("lock")
    assert result.exit_code == 0, result.output
    entry = project.lock["builds"]["toy-1.1"]
    assert entry["source"]["commit"] == project.upstream.tags["v1.1.0"]
    assert project.run("lock", "--check").exit_code == 0


def test_the_source_build_reads_its_facts(toy: type[ToyAdapter], project: SourceProject) -> None:
    settings = _settings(project)
    (build,) = load_builds(settings).values()
    assert source_args.default_base(build) == "toyorg/toy:v1.1.0-cu130"
    assert source_args.source_args(build)["TOY_KERNELS"] == "csrc"
    found = context.find_dockerfile(build, settings)
    assert (found.origin, found.path.name) == ("project", "toy-source.Dockerfile")


def test_its_profile_loads_and_preflight_plans_it(
    toy: type[ToyAdapter], project: SourceProject
) -> None:
    settings = _settings(project)
    (build,) = load_builds(settings).values()
    name, profile = load_profile(settings, "toy-draft")
    assert (name, profile.engine) == ("toy-draft", "toy")
    profile_plan = load_profile_plan(settings, "toy-draft", "toy", build.version)
    plan = probe_plan(build, ["models/a.py"], [profile_plan], {}, ("flags", "env", "signals"))
    assert plan["engine"] == "toy" and plan["package"] == "pkg"
    assert plan["engine_facts"] == json.loads(json.dumps(ToyAdapter.preflight.probe.to_json()))
    assert plan["engine_facts"]["model_flag"] == "--checkpoint"
    assert plan["gpu"] is None and plan["registry_dir"] == "models"
    assert [s["name"] for s in plan["signals"]] == ["toy:drafts_total", "toy_steps"]
    (probe_profile,) = plan["profiles"]
    assert probe_profile["args"] == TOY_PROFILE["args"]
    assert probe_profile["env"] == {"TOY_FAST": "1"}
    assert probe_profile["draft"] is None  # acme/toy-draft: no known architecture
    assert toy.draft_model(profile_plan.args) == "acme/toy-draft"


def test_its_multi_node_runtime_is_a_launcher_profiles_take(
    toy: type[ToyAdapter], project: SourceProject
) -> None:
    profile = {**TOY_PROFILE, "parallel": {"nodes": 2, "tp": 2, "launcher": "toyrun"}}
    (project.root / "smoke" / "toy-tp2.yaml").write_text(yaml.safe_dump(profile))
    _, loaded = load_profile(_settings(project), "toy-tp2")
    assert (loaded.parallel.nodes, loaded.parallel.launcher) == (2, "toyrun")


def test_smoke_renders_its_command_lines(toy: type[ToyAdapter], project: SourceProject) -> None:
    _, profile = load_profile(_settings(project), "toy-draft")
    adapter = adapter_for("toy")
    assert type(adapter) is ToyAdapter and adapter_type("toy") is ToyAdapter
    command = make_target(
        TargetChoice(command="toy-serve --quiet"), profile, adapter, None, stage="smoke"
    )
    assert isinstance(command, ProcessTarget)
    assert command.argv == [
        "toy-serve",
        "--quiet",
        "--checkpoint",
        "acme/toy-7b",
        "--bind",
        "127.0.0.1",
        "--listen",
        str(command.port),
        "--shards",
        "1",
        "--draft",
        "acme/toy-draft",
    ]
    assert command.env == {"TOY_FAST": "1"}
    container = make_target(
        TargetChoice(image="toyorg/toy:v1.1.0"), profile, adapter, None, stage="smoke"
    )
    assert isinstance(container, ContainerTarget)
    assert container.entrypoint == ["toy-serve"]
    assert container.args[:6] == [
        "--checkpoint",
        "acme/toy-7b",
        "--bind",
        "0.0.0.0",
        "--listen",
        "7000",
    ]
    assert container.container_port == 7000


def test_registering_a_name_twice_is_refused(toy: type[ToyAdapter]) -> None:
    with pytest.raises(ValueError, match="'toy' is registered already"):
        register(ToyAdapter)
