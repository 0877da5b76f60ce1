"""Hostile input, third round: no secret printed or recorded, templates that reach only named
strings, terminal-safe output, bump writing only what the spec accepts, inputs refused that
were accepted, messages that say what happened.

Every case runs the real command line against real parts: local git repositories, a local
registry with htpasswd auth (``docker_env.start_registry``) and a small OpenAI-compatible
server on loopback (``openai_stub``) standing in for an engine, since what is tested is
sparkbuild's own output, not the engine.
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkbuild import console, lockfile
from sparkbuild.redact import redact, strip_userinfo
from tests.support.cli import CliResult, RunCli, run_cli
from tests.support.docker_env import LocalRegistry, start_registry
from tests.support.gitrepos import Upstream, git, make_patch, make_upstream
from tests.support.oci_push import Pushed, push_image, tag_manifest
from tests.support.openai_stub import StubEngine, stub_engine
from tests.support.source_project import ONE_BUILD_SPEC, SourceProject

ESC = "\x1b"
RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE
TREE = "c0ffee" + "0" * 34  # the tree a publish test's image pins (its tags are rendered from it)

SPEC = ONE_BUILD_SPEC

PROFILE = (
    "engine: vllm\nmodel: stub-model\nprompts: [prose]\n"
    "expect: {max_tokens: 4, speculation: false, finish: length, repetition: null}\n"
)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return make_upstream(tmp_path_factory.mktemp("upstream"))


@pytest.fixture(scope="module")
def engine() -> Iterator[StubEngine]:
    with stub_engine("0.11.0") as running:
        yield running


@functools.cache
def _local_fix(work: Path) -> str:
    """The project's one patch (made once per upstream: making it clones)."""
    edit = {"python/pkg/alpha.py": ("alpha line 20\n", "alpha line 20 (ours)\n")}
    return make_patch(work, "v1.1.0", edit, header="What: a local fix.\n")


@dataclass
class Project(SourceProject):
    """The test upstream's one-build project, with a smoke profile; commands run without
    --quiet (progress lines are output too) and with ``env``."""

    env: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def create(cls, tmp_path: Path, upstream: Upstream, repo: str | None = None) -> Project:
        project = super().create(tmp_path, upstream)
        (project.root / "smoke").mkdir()
        (project.root / "smoke" / "vllm-stub.yaml").write_text(PROFILE)
        (project.patches / "applies.patch").write_text(_local_fix(upstream.work))
        project.spec_with(repo)
        return project

    def spec_with(self, repo: str | None = None, text: str = SPEC) -> Path:
        """The spec with ``repo`` quoted (a URL may hold ':', '?', '#')."""
        return self.write_spec(text, json.dumps(repo or self.upstream.url))

    def run(self, *args: str, input: str | None = None) -> CliResult:
        return run_cli(
            "--project", str(self.root), "--cache-dir", str(self.cache), *args,
            input=input, env=self.env,
        )  # fmt: skip

    @property
    def lock_path(self) -> Path:
        return self.root / "images.lock"

    def pin_image(self, image_id: str, tree: str = TREE) -> None:
        """The lock's image section, as `sparkbuild build` writes it (ids from a real push)."""
        section = lockfile.ImageSection(
            mode="overlay", platform="linux/arm64", tree=tree, image_id=image_id, tags=[]
        )
        lockfile.set_section(self.lock_path, "new", section)


@pytest.fixture
def project(tmp_path: Path, upstream: Upstream) -> Project:
    return Project.create(tmp_path, upstream)


# -- the sweep: a secret in every input, none in any output or record ----------------------


class Secrets:
    """One distinct secret per input that can carry one, and where each may not appear."""

    def __init__(self, **named: str) -> None:
        self.named = named

    def forms(self, secret: str) -> set[str]:
        return {
            secret,
            urllib.parse.quote(secret, safe=""),
            base64.b64encode(secret.encode()).decode(),
        }

    def leaks(self, text: str) -> list[str]:
        return [
            name
            for name, secret in self.named.items()
            if any(f in text for f in self.forms(secret))
        ]

    def assert_clean(self, where: str, text: str) -> None:
        leaked = self.leaks(text)
        assert not leaked, f"{where} shows the {leaked} secret(s):\n{text[-3000:]}"

    def assert_output_clean(self, command: str, result: CliResult) -> None:
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            f"{command}: {result.exception!r}\n{result.output}"
        )
        assert "Traceback" not in result.output, f"{command}\n{result.output}"
        self.assert_clean(f"`{command}` stdout", result.stdout)
        self.assert_clean(f"`{command}` stderr", result.stderr)

    def assert_files_clean(self, *roots: Path) -> None:
        """Every record and file written: the lock, reports, logs, the cache (and its paths);
        not the specs, which are the input."""
        for root in roots:
            for path in root.rglob("*"):
                if path.parent.name == "builds":
                    continue
                self.assert_clean(f"path {path}", str(path))
                if path.is_file() and not path.is_symlink() and ".git/objects" not in str(path):
                    self.assert_clean(str(path), path.read_bytes().decode(errors="replace"))


def _sweep(
    project: Project, secrets: Secrets, commands: list[list[str]], *, input: str | None = None
) -> dict[str, CliResult]:
    results = {}
    for args in commands:
        command = "sparkbuild " + " ".join(args)
        result = project.run(*args, input=input)
        secrets.assert_output_clean(command, result)
        results[command] = result
    return results


def test_sweep_source_commands(tmp_path: Path, upstream: Upstream) -> None:
    """Spec repo URLs and --repo URLs with userinfo and query tokens: every source command,
    table, JSON, the lock, errors and hints, mirrors in the cache."""
    secrets = Secrets(
        spec="specpw-Mv51x",
        repo="repopw-K3d9q",
        query="qtok-Z81mw",
        cache_ref="cachepw-B4n7",
    )
    unreachable = (
        f"https://alice:{secrets.named['spec']}@127.0.0.1:9/org/x.git"
        f"?access_token={secrets.named['query']}"
    )
    working = f"file://alice:{secrets.named['spec']}@localhost{upstream.url}"
    repo_option = [
        "--repo",
        f"sglang=https://bob:{secrets.named['repo']}@127.0.0.1:9/x?Token={secrets.named['query']}",
    ]
    project = Project.create(tmp_path, upstream, repo=working)
    project.env = {"DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"}  # preflight: no image
    out = tmp_path / "out"
    commands = [
        ["patches"],
        ["patches", "--json"],
        ["lock"],
        ["lock", "--check"],
        ["patches", "--locked", "--json"],
        ["prepare", "new", "--out", str(out)],
        ["prepare", "new", "--json", "--out", str(out), "--force"],
        ["releases", "sglang"],
        ["releases", "sglang", "--json"],
        ["bump", "sglang", "--to", "v9.9.9"],
        ["bump", "sglang", "--to", "v9.9.9", "--json"],
        ["build", "new", "--cache-from", f"u:{secrets.named['cache_ref']}@h/c,type=local"],
        ["preflight", "new", "--image", "sparkbuild-tests/absent:1", "--json"],
        [*repo_option, "patches"],
        [*repo_option, "patches", "--json"],
        [*repo_option, "lock"],
        [*repo_option, "prepare", "new"],
        ["--repo", f"sglang=file://bob:{secrets.named['repo']}@localhost{upstream.url}", "lock"],
    ]
    results = _sweep(project, secrets, commands)
    assert results["sparkbuild lock"].exit_code == 0, results["sparkbuild lock"].output
    assert results["sparkbuild lock --check"].exit_code == 0
    assert results["sparkbuild " + " ".join([*repo_option, "patches"])].exit_code == 1
    preflight = results["sparkbuild preflight new --image sparkbuild-tests/absent:1 --json"]
    assert "Docker did not answer" in preflight.stderr, preflight.output
    lock = yaml.safe_load(project.lock_path.read_text())
    assert lock["builds"]["new"]["source"]["repo"] == f"file://localhost{upstream.url}"
    project.spec_with(unreachable)
    broken = _sweep(
        project, secrets, [["patches"], ["patches", "--json"], ["lock"], ["preflight", "new"]]
    )
    assert all(r.exit_code in (1, 2) for r in broken.values())
    assert "https://***@127.0.0.1:9/org/x.git" in broken["sparkbuild preflight new"].stderr
    assert (
        "https://***@127.0.0.1:9/org/x.git?access_token=***" in broken["sparkbuild patches"].stderr
    )
    secrets.assert_files_clean(project.root, project.cache)


def test_sweep_smoke_and_bench(tmp_path: Path, project: Project, engine: StubEngine) -> None:
    """smoke and bench --url with userinfo and query tokens, a --label carrying a URL: the
    table, --json, --json-file, Markdown, CSV, the lock's records, compare, errors."""
    secrets = Secrets(url="urlpw-Q7x2k", query="qtok-H3s9p", label="labelpw-W2c8z")
    url = engine.url.replace("http://", f"http://alice:{secrets.named['url']}@")
    queried = f"{engine.url}/?sig={secrets.named['query']}"
    label = f"run at https://carol:{secrets.named['label']}@example.invalid/x"
    project.pin_image("sha256:" + "ab" * 32)
    files = tmp_path / "reports"
    files.mkdir()
    sweep = ["--pp", "16", "--tg", "4", "--concurrency", "1", "--runs", "1", "--no-warmup"]
    bench = ["bench", "--url", url, *sweep]
    profile = ["--profile", "vllm-stub"]
    commands = [
        ["smoke", "--url", url, *profile, "--json-file", str(files / "s.json"), "--record", "new"],
        ["smoke", "--url", url, *profile, "--json"],
        ["smoke", "--url", queried, *profile],
        # no profile: the label is the URL (table, Markdown, CSV, JSON)
        [*bench, "--engine", "vllm", "--json-file", str(files / "a.json"),
         "--markdown", str(files / "a.md"), "--csv", str(files / "a.csv")],
        [*bench, *profile, "--json", "--record", "new"],
        [*bench, *profile, "--label", label, "--json-file", str(files / "b.json"),
         "--table-style", "llama-benchy", "--markdown", str(files / "b.md")],
        ["bench", "--url", queried, "--engine", "vllm", *sweep],
        ["bench", "compare", str(files / "a.json"), str(files / "b.json")],
        ["bench", "compare", str(files / "a.json"), str(files / "b.json"), "--json"],
        ["bench", "compare", str(files / "a.json"), str(files / "b.json"),
         "--markdown", str(files / "c.md"), "--json-file", str(files / "c.json")],
    ]  # fmt: skip
    results = _sweep(project, secrets, commands)
    for command, result in results.items():
        expected = 2 if queried in command else 0  # a query is refused (UrlTarget)
        assert result.exit_code == expected, f"{command}\n{result.output}"
    smoke = lockfile.load(project.lock_path).builds["new"].smoke or {}
    (target,) = (r.target for runs in smoke.values() for r in runs.values())
    assert target == f"url:{engine.url.replace('http://', 'http://***@')}"
    masked = target.removeprefix("url:")
    assert json.loads((files / "a.json").read_text())["label"] == masked
    assert f"| {masked} |" in (files / "a.md").read_text() or masked in (files / "a.md").read_text()
    assert masked in results["sparkbuild " + " ".join(commands[3])].stdout
    assert json.loads((files / "b.json").read_text())["label"].endswith("***@example.invalid/x")
    assert "https://***@example.invalid/x" in (files / "c.md").read_text()
    secrets.assert_files_clean(project.root, project.cache, files)


@dataclass
class Registry:
    server: LocalRegistry
    images: dict[str, Pushed]

    @property
    def creds(self) -> dict[str, str | None]:
        assert self.server.auth is not None
        user, password = self.server.auth
        return {"SPARKBUILD_REGISTRY_USER": user, "SPARKBUILD_REGISTRY_PASSWORD": password}

    def url_with(self, password: str) -> str:
        return f"http://sparkbuild:{password}@{self.server.address}"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry behind htpasswd auth holding two arm64 images of build `new`, the first
    already under its immutable tag (so publishing it moves no layer through a daemon)."""
    with start_registry(tmp_path_factory.mktemp("registry"), auth=True) as server:
        images = {
            name: push_image(server, "sparkbuild/sglang", "linux/arm64", f"image {name}")
            for name in ("a", "b")
        }
        yield Registry(server, images)


def _tag_for_publish(registry: Registry, image: Pushed, tree: str) -> None:
    tag_manifest(registry.server, "sparkbuild/sglang", f"1.1.0-sm121-{tree[:12]}", image)


@pytest.mark.docker
def test_sweep_publish_and_rollback(
    tmp_path: Path, project: Project, registry: Registry, run_cli: RunCli
) -> None:
    """--registry with userinfo, the password in the environment and on stdin: publish and
    rollback output (table and JSON), their errors, and the lock's publish key."""
    password = registry.creds["SPARKBUILD_REGISTRY_PASSWORD"]
    assert password is not None
    secrets = Secrets(env=password, url="regurl-P9s4v", wrong="wrongpw-T6y1")
    project.env = {**registry.creds, "DOCKER_CONFIG": str(tmp_path / "docker")}
    at = registry.url_with(secrets.named["url"])
    second_tree = "d00d" + "0" * 36
    _tag_for_publish(registry, registry.images["a"], TREE)
    _tag_for_publish(registry, registry.images["b"], second_tree)
    project.pin_image(str(registry.images["a"].config_digest))
    first = _sweep(project, secrets, [["publish", "new", "--registry", at, "--force"]])
    project.pin_image(str(registry.images["b"].config_digest), second_tree)
    second = _sweep(project, secrets, [["publish", "new", "--registry", at, "--force", "--json"]])
    back = ["rollback", "new", "--registry", at, "--to", registry.images["a"].digest, "--force"]
    rolled = _sweep(project, secrets, [back])
    again = _sweep(project, secrets, [["rollback", "new", "--registry", at, "--json"]])
    for result in (*first.values(), *second.values(), *rolled.values()):
        assert result.exit_code == 0, result.output
    assert next(iter(again.values())).exit_code in (0, 1)
    key = f"{registry.server.address}/sparkbuild/sglang"
    assert list(lockfile.load(project.lock_path).builds["new"].publish or {}) == [key]
    assert f"http://***@{registry.server.address}" in next(iter(first.values())).stderr
    # the wrong password, from the environment and from stdin: refused, never shown
    project.env["SPARKBUILD_REGISTRY_PASSWORD"] = secrets.named["wrong"]
    denied = _sweep(project, secrets, [["publish", "new", "--registry", at, "--force"]])
    project.env["SPARKBUILD_REGISTRY_PASSWORD"] = None
    piped = _sweep(
        project,
        secrets,
        [[*back, "--username", "sparkbuild", "--password-stdin"]],
        input=secrets.named["wrong"],
    )
    for result in (*denied.values(), *piped.values()):
        assert result.exit_code == 1, result.output
        assert "rejected the credentials" in result.stderr
    secrets.assert_files_clean(project.root, project.cache)


# -- one redaction: beyond the sweep's shapes -----------------------------------------------


def _publication(project: Project, key: str, digests: list[str]) -> None:
    """A publish history in the lock, as two `sparkbuild publish` runs leave it."""
    history = [
        lockfile.Publication(digest=d, image_id="sha256:" + "ab" * 32, tag=f"t{i}", verified=True)
        for i, d in enumerate(digests)
    ]
    record = lockfile.PublishRecord(
        tag=history[-1].tag, digest=digests[-1], verified=True, aliases=["1.1.0-sm121"],
        history=history,
    )  # fmt: skip

    def change(entry: lockfile.BuildEntry) -> None:
        entry.publish = {key: record}

    lockfile.update_entry(project.lock_path, "new", change)


def test_userinfo_without_a_scheme_is_masked_and_never_a_key(project: Project) -> None:
    project.pin_image("sha256:" + "ab" * 32)
    _publication(project, "ghcr.io/acme/sparkbuild/sglang", ["sha256:" + "1" * 64])
    for registry in ("alice:Zx9pw-noscheme@127.0.0.1:9/team", "bob:Zx9pw-noscheme@ghcr.io/other"):
        result = project.run("rollback", "new", "--registry", registry)
        assert result.exit_code == 2, result.output
        assert "Zx9pw-noscheme" not in result.output
        assert "***@" in result.stderr  # the warning names what was ignored, masked
        assert "was never published there" in result.stderr
    assert "Zx9pw-noscheme" not in project.lock_path.read_text()


def test_query_tokens_are_masked_whatever_their_case(project: Project, engine: StubEngine) -> None:
    """A URL with a query is refused before any request (the engine's paths would land
    inside the query), and the refusal shows it with its tokens masked."""
    url = f"{engine.url}/v1?Access_Token=qTok-aa11&X-Amz-Signature=qSig-bb22&model=m"
    for command in (["smoke", "--profile", "vllm-stub"], ["bench", "--engine", "vllm"]):
        result = project.run(*command, "--url", url)
        assert result.exit_code == 2, result.output
        assert "has a query or fragment" in result.output
        assert "qTok-aa11" not in result.output and "qSig-bb22" not in result.output
        assert "Access_Token=***" in result.output and "X-Amz-Signature=***" in result.output
        assert "model=m" in result.output  # an ordinary parameter is left alone


def test_known_secrets_are_masked_in_any_text(
    project: Project, run_cli: RunCli, tmp_path: Path
) -> None:
    """The registry password from the environment, wherever it shows up (here in a path an
    error names), and a repository URL's token in the lock's records."""
    secret = "EnvPw-77c1d"
    result = run_cli(
        "--project", str(project.root), "--cache-dir", str(project.cache), "bench", "compare",
        str(tmp_path / f"run-{secret}.json"), str(tmp_path / "b.json"),
        env={"SPARKBUILD_REGISTRY_PASSWORD": secret},
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert secret not in result.output and "run-***.json" in result.stderr
    assert strip_userinfo(f"https://u:{secret}@h/x?token=t0k3n") == "https://h/x?token=***"
    assert redact(f"git@github.com:o/r sglang:1@sha256:{'a' * 64}") == (
        f"git@github.com:o/r sglang:1@sha256:{'a' * 64}"  # a login and a digest are no secret
    )


# -- templates: named strings only -----------------------------------------------------------


@pytest.mark.parametrize(
    "option, template, named",
    [
        ("--alias", "{version.__init__.__globals__}", "{version.__init__.__globals__}"),
        ("--alias", "x-{engine!r}", "{engine!r}"),
        ("--repository", "{build.nope}", "{build.nope}"),
        ("--repository", "acme/{}", "{}"),
        ("--alias", "{tree_short:{build.__class__}}", "{tree_short:{build.__class__}}"),
    ],
)
def test_publish_templates_expand_named_fields_only(
    project: Project, tmp_path: Path, option: str, template: str, named: str
) -> None:
    project.pin_image("sha256:" + "ab" * 32)
    project.env = {
        "SPARKBUILD_REGISTRY_PASSWORD": None,
        "DOCKER_CONFIG": str(tmp_path / "docker"),
        "SPARKBUILD_TEST_SECRET": "TemplPw-5d2e",
    }
    result = project.run("publish", "new", "--registry", "127.0.0.1:9", option, template)
    assert result.exit_code == 2, result.output
    assert f"{named} is not a placeholder" in result.stderr
    assert "placeholders: {engine}, {version}, {tree_short}, {build}" in result.stderr
    assert "AttributeError" not in result.output and "TemplPw" not in result.output


@pytest.mark.parametrize(
    "args, named",
    [
        (["rollback", "new", "--registry", "127.0.0.1:9", "--repository", "{engine[0]}"],
         "{engine[0]}"),
    ],
)  # fmt: skip
def test_every_template_is_refused_naming_the_field(
    project: Project, args: list[str], named: str
) -> None:
    result = project.run(*args)
    assert result.exit_code == 2, result.output
    assert f"{named} is not a placeholder" in result.stderr
    assert "Traceback" not in result.output and "internal error" not in result.output


# -- terminal output: data is shown escaped, never acted on ----------------------------------


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 32 and c not in "\n\t") or c in (RLO, "\u2066", "\x9b")]


def test_engine_text_and_labels_are_shown_escaped(project: Project, tmp_path: Path) -> None:
    hostile = f"0.11{ESC}]0;owned{chr(7)}{RLO}lave"
    label = f"run {ESC}[2J{ESC}[31mred {RLO}txt"
    with stub_engine(hostile) as engine:
        sweep = ["--pp", "16", "--tg", "2", "--concurrency", "1", "--runs", "1", "--no-warmup"]
        ran = project.run(
            "bench", "--url", engine.url, "--engine", "vllm", *sweep, "--label", label,
            "--json-file", str(tmp_path / "a.json"),
        )  # fmt: skip
    assert ran.exit_code == 0, ran.output
    assert not _raw_controls(ran.output), repr(ran.output)
    assert "0.11\\x1b]0;owned" in ran.stdout and "\\u202elave" in ran.stdout
    assert "run \\x1b[2J\\x1b[31mred \\u202etxt" in ran.stdout
    compared = project.run("bench", "compare", str(tmp_path / "a.json"), str(tmp_path / "a.json"))
    assert compared.exit_code == 0, compared.output
    assert not _raw_controls(compared.output), repr(compared.output)
    assert "\\x1b[2J" in compared.output
    # JSON keeps the text exactly, escaped by JSON itself
    assert json.loads((tmp_path / "a.json").read_text())["label"] == label


def test_file_names_are_shown_escaped(project: Project, run_cli: RunCli) -> None:
    # a bidi override is a legal file name character: the table shows it escaped
    bidi = f"patches/pkg/fix{RLO}hctap.patch"
    (project.root / bidi).write_bytes((project.root / "patches/pkg/applies.patch").read_bytes())
    project.spec_with(project.upstream.url, SPEC.replace("patches/pkg/applies.patch", bidi))
    table = project.run("patches")
    assert table.exit_code == 0, table.output
    assert not _raw_controls(table.output), repr(table.output)
    assert "fix\\u202ehctap.patch" in table.stdout
    # an escape sequence is refused in a patch path; the error shows it escaped too
    hidden = f"patches/pkg/{ESC}[8mhidden{RLO}.patch"
    project.spec_with(
        project.upstream.url, SPEC.replace("patches/pkg/applies.patch", json.dumps(hidden))
    )
    refused = project.run("patches")
    assert refused.exit_code == 2, refused.output
    assert not _raw_controls(refused.output), repr(refused.output)
    assert "\\x1b[8mhidden\\u202e.patch" in refused.stderr
    unknown = run_cli("--project", str(project.root), f"pat{RLO}{ESC}]0;t{chr(7)}ches")
    assert unknown.exit_code == 2  # click's own usage error, through the same escaping
    assert not _raw_controls(unknown.output), repr(unknown.output)
    assert "pat\\u202e\\x1b]0;t" in unknown.output


@pytest.mark.parametrize("where", ["build", "option"])
def test_a_huge_argument_is_echoed_cut_with_its_length(project: Project, where: str) -> None:
    huge = "A" * 120_000
    args = ["prepare", huge] if where == "build" else ["bench", "--url", huge, "--engine", "vllm"]
    result = project.run(*args)
    assert result.exit_code == 2, result.output[:500]
    assert "[120000 characters]" in result.stderr
    assert len(result.output) < 3_000
    assert "A" * 200 in result.stderr and "A" * 1_000 not in result.stderr


def test_the_console_escapes_what_any_printer_gives_it() -> None:
    from io import StringIO

    from rich.table import Table
    from rich.text import Text

    out = console.SafeConsole(file=StringIO(), width=120)
    table = Table("name", "detail")
    table.add_row(f"a{ESC}[1mb", Text.assemble(("ok ", "green"), f"c{RLO}d https://u:Pw1x@h/"))
    out.print(table)
    out.print(Text(f"{chr(0x9B)}31m csi"), f"x{chr(0)}y")
    shown = out.file.getvalue()  # type: ignore[attr-defined]
    assert not _raw_controls(shown), repr(shown)
    assert "a\\x1b[1mb" in shown and "c\\u202ed" in shown and "\\x9b31m" in shown
    assert "x\\x00y" in shown and "Pw1x" not in shown


# -- bump writes only what the spec accepts --------------------------------------------------


@pytest.fixture(scope="module")
def tagged(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    """The test upstream with two release tags no spec can hold as they are: a local version
    and an epoch (both on v1.1.0's commit, so every item carries)."""
    up = make_upstream(tmp_path_factory.mktemp("tagged"))
    for tag in ("v1.3.0+spark.2", "v1!1.4.0"):
        git(up.work, "tag", tag, "v1.1.0")
    up.push_main()
    return up


def test_bump_normalises_a_local_version_into_a_valid_build_name(
    tmp_path: Path, tagged: Upstream
) -> None:
    project = Project.create(tmp_path, tagged)
    spec = project.root / "builds" / "pkg.yaml"
    preview = project.run("bump", "sglang", "--from", "new", "--to", "v1.3.0+spark.2")
    assert "'new-1.3.0+spark.2' is not a valid build name" in preview.stderr, preview.output
    assert "named 'new-1.3.0-spark.2' instead" in preview.stderr
    written = project.run("bump", "sglang", "--from", "new", "--to", "v1.3.0+spark.2", "--write")
    assert written.exit_code == 0, written.output
    builds = yaml.safe_load(spec.read_text())["builds"]
    assert builds["new-1.3.0-spark.2"]["ref"] == "v1.3.0+spark.2"
    # The tag is a release tag as the engine writes them, so it names the version whole
    # (the ref alone once read as 1.3.0, and needed an explicit version).
    assert builds["new-1.3.0-spark.2"].get("version", "1.3.0+spark.2") == "1.3.0+spark.2"
    after = project.run("patches", "new-1.3.0-spark.2", "--json")
    assert after.exit_code == 0, after.output  # every command still reads the spec
    assert json.loads(after.stdout)["builds"][0]["version"] == "1.3.0+spark.2"


def test_bump_refuses_a_tag_that_cannot_be_a_ref(tmp_path: Path, tagged: Upstream) -> None:
    project = Project.create(tmp_path, tagged)
    spec = project.root / "builds" / "pkg.yaml"
    before = spec.read_text()
    for args in ([], ["--write"], ["--json"]):
        result = project.run("bump", "sglang", "--to", "v1!1.4.0", *args)
        assert result.exit_code == 2, result.output
        assert "its tag 'v1!1.4.0' cannot be a spec's ref" in result.stderr
        assert 'version: "1!1.4.0"' in result.stderr  # the way to add it by hand
    assert spec.read_text() == before
    assert sorted(p.name for p in (project.root / "patches" / "pkg").iterdir()) == ["applies.patch"]


# -- inputs refused that were accepted -------------------------------------------------------


@pytest.mark.parametrize("number", ["true", "false", '"103"', "103.0"])
def test_a_pr_number_must_be_an_integer(project: Project, number: str) -> None:
    spec = project.spec_with(project.upstream.url, SPEC.replace("103", number, 1))
    result = project.run("patches")
    assert result.exit_code == 2, result.output
    assert f"{spec}:6: prs[0].number" in result.stderr
    assert "#1 " not in result.output


@pytest.mark.parametrize("package_dir", ['"python/pkg\\0evil"', "../../outside", "/abs/pkg"])
def test_package_dir_stays_a_plain_path_in_the_repository(
    project: Project, package_dir: str
) -> None:
    spec = project.spec_with(
        project.upstream.url, SPEC.replace("package_dir: python/pkg", f"package_dir: {package_dir}")
    )
    result = project.run("patches")
    assert result.exit_code == 2, result.output
    assert f"{spec}:4: package_dir" in result.stderr


@pytest.mark.parametrize(
    "diff",
    [
        b"diff --git a/python/pkg/alpha.py b/python/pkg/alpha.py\n"
        b"--- a/python/pkg/alpha.py\n+++ b/python/pkg/alpha.py\n",
        b"diff --git a/python/pkg/alpha.py b/python/pkg/alpha.py\nindex 1111111..2222222 100644\n",
    ],
)
def test_a_header_only_diff_is_invalid_not_a_conflict(project: Project, diff: bytes) -> None:
    (project.root / "patches" / "pkg" / "applies.patch").write_bytes(b"What: cut short.\n\n" + diff)
    result = project.run("patches", "--json")
    assert result.exit_code == 1, result.output
    items = {i["id"]: i for i in json.loads(result.stdout)["builds"][0]["items"]}
    patch = items["patches/pkg/applies.patch"]
    assert patch["status"] == "invalid", patch
    assert "python/pkg/alpha.py has a file header but no hunk" in patch["detail"]


def test_a_mode_change_without_hunks_is_still_a_diff(project: Project) -> None:
    mode = (
        b"diff --git a/python/pkg/alpha.py b/python/pkg/alpha.py\n"
        b"old mode 100644\nnew mode 100755\n"
    )
    (project.root / "patches" / "pkg" / "applies.patch").write_bytes(mode)
    result = project.run("patches", "--json")
    items = {i["id"]: i for i in json.loads(result.stdout)["builds"][0]["items"]}
    assert items["patches/pkg/applies.patch"]["status"] != "invalid", result.output


@pytest.mark.parametrize(
    "field, value",
    [
        ("sha256", "z" * 64),
        ("sha256", "ABCDEF" + "0" * 58),
        ("filename", "../../../../tmp/evil.whl"),
        ("filename", "sub/dir/pkg-1.0-py3-none-any.whl"),
    ],
)
def test_a_lock_requirement_entry_is_checked_on_read(
    project: Project, field: str, value: str
) -> None:
    assert project.run("lock").exit_code == 0
    wheel = {
        "requirement": "pkg==1.0", "name": "pkg", "version": "1.0",
        "filename": "pkg-1.0-py3-none-any.whl", "sha256": "0" * 64, field: value,
    }  # fmt: skip
    data = yaml.safe_load(project.lock_path.read_text())
    data["builds"]["new"]["requirements"] = [wheel]
    project.lock_path.write_text(yaml.safe_dump(data))
    result = project.run("lock", "--check")
    assert result.exit_code == 1, result.output
    assert "images.lock is damaged" in result.stderr
    assert f"images.lock:{4 if field == 'filename' else 7}: builds.new.requirements[0].{field}" in (
        result.stderr
    )


@pytest.fixture(scope="module")
def bench_report(tmp_path_factory: pytest.TempPathFactory, engine: StubEngine) -> Path:
    """A real `bench --json-file` report of the stub engine."""
    folder = tmp_path_factory.mktemp("report")
    report = folder / "a.json"
    sweep = ["--pp", "16", "--tg", "2", "--concurrency", "1", "--runs", "1", "--no-warmup"]
    ran = run_cli("--project", str(folder), "bench", "--url", engine.url, "--engine", "vllm",
                  *sweep, "--json-file", str(report))  # fmt: skip
    assert ran.exit_code == 0, ran.output
    return report


@pytest.mark.parametrize("version", [2, "1", None])
def test_a_report_of_another_layout_is_not_compared(
    project: Project, tmp_path: Path, bench_report: Path, version: Any
) -> None:
    other = tmp_path / "other.json"
    data = json.loads(bench_report.read_text())
    data["schema_version"] = version
    other.write_text(json.dumps(data))
    result = project.run("bench", "compare", str(bench_report), str(other))
    assert result.exit_code == 2, result.output
    assert f"{other}: bench report schema_version {version!r}" in result.stderr
    assert "not compared" in result.stderr
    same = project.run("bench", "compare", str(bench_report), str(bench_report))
    assert same.exit_code == 0, same.output  # the layout this sparkbuild writes is compared


# -- messages that say what happened ---------------------------------------------------------


def test_no_daemon_is_not_called_a_missing_image(project: Project, tmp_path: Path) -> None:
    project.env = {"DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"}
    result = project.run("preflight", "new", "--image", "sparkbuild-tests/absent:1")
    assert result.exit_code == 1, result.output
    assert "not in the local Docker store" not in result.stderr
    assert "Docker did not answer" in result.stderr
    assert "setup-host.sh" in result.stderr


@pytest.mark.parametrize(
    "option, value",
    [("--cache-from", "ghcr.io/a/c:x,mode=max"), ("--cache-to", "type=local,dest=/etc")],
)
def test_a_bad_cache_reference_is_a_usage_error(project: Project, option: str, value: str) -> None:
    result = project.run("build", "new", option, value)
    assert result.exit_code == 2, result.output
    assert f"{option} '{value}' is not an image reference" in result.stderr


class _GarbageRegistry(http.server.BaseHTTPRequestHandler):
    """A "registry" whose token service or manifests answer with an HTML page."""

    bearer = False

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, kind: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        host = self.headers["Host"]
        if self.path == "/v2/" and self.bearer and "Authorization" not in self.headers:
            challenge = f'Bearer realm="http://{host}/token",service="stub"'
            self._send(401, b"{}", "application/json", **{"WWW-Authenticate": challenge})
        elif self.path == "/v2/":
            self._send(200, b"{}", "application/json")
        elif "/manifests/sparkbuild-access-check" in self.path:
            self._send(404, b'{"errors": []}', "application/json")
        else:  # the token service and every manifest: a login page
            self._send(200, b"<html><body>Please log in</body></html>", "text/html")

    def do_HEAD(self) -> None:
        self.do_GET()


@pytest.mark.parametrize("bearer", [True, False])
def test_registry_garbage_is_named_not_parsed_aloud(
    project: Project, tmp_path: Path, bearer: bool
) -> None:
    handler = type("Handler", (_GarbageRegistry,), {"bearer": bearer})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    project.env = {"DOCKER_CONFIG": str(tmp_path / "docker"), "SPARKBUILD_REGISTRY_USER": None}
    try:
        if bearer:  # the token service answers a login page
            project.pin_image("sha256:" + "ab" * 32)
            result = project.run("publish", "new", "--registry", address, "--force")
            expected = f"token service http://{address}/token returned not a JSON object"
        else:  # a manifest fetched for rollback is a login page
            digest = "sha256:" + "1" * 64
            _publication(project, f"{address}/sparkbuild/sglang", [digest, "sha256:" + "2" * 64])
            result = project.run("rollback", "new", "--to", digest, "--force")
            # the page is not the manifest the digest names: refused before it is parsed
            expected = f"served sparkbuild/sglang@{digest}"
    finally:
        server.shutdown()
        server.server_close()
    assert result.exit_code == 1, result.output
    assert expected in result.stderr
    if bearer:
        assert "'<html><body>Please log in</body></html>'" in result.stderr
    assert "JSONDecodeError" not in result.output and "Expecting value" not in result.output
