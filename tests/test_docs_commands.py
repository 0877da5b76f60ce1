"""Every command in README.md, CONTRIBUTING.md and docs/ is run or checked, so a doc that
drifts fails CI.

The commands are read from the fenced ``bash``/``sh``/``shell``/``console`` blocks. Each
one matches exactly one rule below (a command no rule knows fails the test: a new documented
command needs a decision here):

- README's quick start runs once, as written, in a clone-like directory with a fresh
  sparkbuild cache (it boots the CPU engine twice: smoke, then bench);
- ``bench compare`` and the claims commands of docs/bench.md run on the quick start's report;
- docs/source.md's offline path runs as written: a local mirror, a lock and a report (no
  Docker), then the whole block again with a built tiny image, a recorded smoke in a
  container of it (one CPU engine boot) and a report;
- docs/cluster.md's two-node demo over ssh:// runs as written (the suite's one passing
  two-node boot: tests/test_cluster_docker.py runs only the failures);
- the source commands (docs/source.md) and ``releases`` run on local upstream repositories;
- everything else needs a DGX Spark, GitHub, Docker or a registry. It is skipped with its
  reason, after the checks that need none of those: the command and every option exist, the
  profile, claims file and build it names exist, and a nox session it names exists.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from sparkbuild.cli import main
from sparkbuild.settings import Settings
from tests.support import offline_env
from tests.support.cache import shared_test_cache
from tests.support.cli import CliResult, run_cli
from tests.support.docker_env import docker_client, remove_images
from tests.support.gitrepos import git, make_upstream, tagged_repo
from tests.support.nox_sessions import nox_sessions

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_FENCES = {"bash", "sh", "shell", "console"}
QUICK_START = "## Quick start without a GPU"
OFFLINE = ("docs/source.md", "### Working offline")
OFFLINE_IMAGE = "offline-image"
CLUSTER = ("docs/cluster.md", "### Try it on this machine: two nodes, one over `ssh://`")
CLUSTER_DEMO = "cluster-demo"


@dataclass(frozen=True)
class DocCommand:
    doc: str
    line: int
    text: str
    quick_start: bool
    section: str = ""

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _commands_in(path: Path) -> Iterator[DocCommand]:
    lines = path.read_text(encoding="utf-8").splitlines()
    fence: str | None = None
    section = ""
    pending: list[str] = []
    start = 0
    for number, line in enumerate(lines, 1):
        if fence is None:
            if line.startswith("#"):
                section = line.strip()
            if line.startswith("```"):
                fence = line[3:].strip()
            continue
        if line.startswith("```"):
            fence = None
            continue
        if fence not in SHELL_FENCES:
            continue
        text = line
        if fence == "console" and not pending:
            if not line.startswith("$ "):
                continue  # the output shown under a command
            text = line[2:]
        if not pending:
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            start = number
        words = re.sub(r"\s+#\s.*$", "", text.rstrip())  # a trailing comment
        pending.append(words.removesuffix("\\").strip())
        if not text.rstrip().endswith("\\"):
            doc = str(path.relative_to(ROOT))
            yield DocCommand(doc, start, " ".join(pending), section == QUICK_START, section)
            pending = []


def documented_commands() -> list[DocCommand]:
    return [command for doc in DOCS for command in _commands_in(doc)]


@dataclass(frozen=True)
class Rule:
    pattern: str
    kind: str  # quick-start | offline | offline-image | cluster-demo | bench-report | source |
    # releases | check
    reason: str = ""


SPARK = "needs a DGX Spark (GPU) and its image"
GITHUB_DOCKER = "builds linux/arm64 images: needs the upstream repository (GitHub) and Docker"
REGISTRY = "needs a registry and its credentials"
SUITE = "runs the test suite itself (CI runs it from a clean clone)"
COPY = (
    "docs/verify.md's copy to another registry: tests/test_publish_signing.py::"
    "test_a_copy_to_another_registry_keeps_its_signature_and_attestations runs the block as "
    "written, between two registries on this machine, and verifies the copy"
)
VENV = "makes a venv and installs into it: this test runs in the venv it was installed in"

# First match wins; a documented command no rule matches fails the test.
RULES = [
    Rule(r"^git clone --mirror /media/usb/vllm\.git ~/mirrors/vllm\.git$", "offline"),
    Rule(r"^sparkbuild --repo vllm=\$HOME/mirrors/vllm\.git (patches|lock) ", "offline"),
    Rule(r"^sparkbuild report --attach vllm-0\.33\.0-spark=benchmarks/", "offline"),
    Rule(r"^python tests/support/offline_env\.py (start|stop) offline-demo\b", OFFLINE_IMAGE),
    Rule(
        r"^sparkbuild --project offline-demo (--repo \S+ )?(build|smoke|report) ", "offline-image"
    ),
    Rule(r"^eval \"\$\(python tests/support/vllm_cpu\.py \|\| echo false\)\"$", "quick-start"),
    Rule(r"^eval \"\$\(python tests/support/(sshd|cluster_env)\.py start ", CLUSTER_DEMO),
    Rule(r"^python tests/support/(sshd|cluster_env)\.py stop ", CLUSTER_DEMO),
    Rule(r"^sparkbuild --project pair-demo smoke --image ", CLUSTER_DEMO),
    Rule(r"^export ENGINE=", "quick-start"),
    Rule(r"^sparkbuild (smoke|bench) --command \"\$ENGINE\"", "quick-start"),
    Rule(r"^sparkbuild bench compare benchmarks/cpu-reference\.json my-run\.json", "quick-start"),
    Rule(r"^sparkbuild bench compare my-run\.json --claims", "quick-start"),
    Rule(r"^python3 -m venv|^\.venv/bin/pip install|pip install -e", "check", VENV),
    Rule(r"^bash scripts/setup-host\.sh", "check", "sets up the host as root (apt, docker)"),
    Rule(r"pre-commit install", "check", "installs git hooks into the clone"),
    Rule(r"^nox -s tests|^\.venv/bin/pytest ", "check", SUITE),
    Rule(r"^nox -s build-sglang", "check", GITHUB_DOCKER),
    Rule(r"^nox -s bench -- --url", "check", "needs an engine serving at the URL"),
    Rule(r"^nox -s bump", "check", "needs SGLang's sources at the new release (GitHub)"),
    Rule(r"^nox -s preflight", "check", "needs the release's dependencies (GitHub, PyPI)"),
    Rule(r"^skopeo copy --all --preserve-digests docker://ghcr\.io/\S+[@:]sha256", "check", COPY),
    Rule(r"^sparkbuild verify registry\.example/mirror/", "check", COPY),
    Rule(
        r"^docker run .* skopeo copy ",
        "check",
        "skopeo in a trixie container against a published image: tests/test_publish_signing.py "
        "runs it so, in the image tests/support/skopeo_env.py builds",
    ),
    Rule(r"^(docker|spark\$|kubectl) ", "check", "needs docker buildx with a Spark or cluster"),
    Rule(r"^export SPARKBUILD_REGISTRY|SPARKBUILD_REGISTRY_USER=", "check", REGISTRY),
    Rule(r"^sparkbuild (publish|rollback|verify) ", "check", REGISTRY),
    Rule(r"^export SPARKBUILD_SIGNING_PASSWORD=", "check", "sets a secret"),
    Rule(
        r"^sparkbuild keys (generate|policy)\b|^git add cosign\.pub",
        "check",
        "writes a key pair or a policy; tests/test_publish_signing.py runs `keys generate` and "
        "tests/test_attest.py validates the policy",
    ),
    Rule(
        r"^(skopeo|podman|cosign) ",
        "check",
        "an independent verifier against a published image (cosign does not install here; "
        "Debian 12's skopeo and podman have sigstore disabled): tests/test_publish_signing.py "
        "runs skopeo copy with a sigstoreSigned policy, with Debian trixie's skopeo",
    ),
    Rule(r"^sparkbuild (smoke|bench) --image ", "check", SPARK),
    Rule(r"^sparkbuild bench --url ", "check", "needs an engine serving at the URL"),
    Rule(
        r"^sparkbuild (smoke|bench) --command ",
        "check",
        "boots the CPU engine: README's quick start runs this command once",
    ),
    Rule(r"^eval \"\$\(python tests/support/vllm_cpu\.py", "check", "as README's quick start"),
    Rule(r"^sparkbuild (--quiet )?build", "check", GITHUB_DOCKER),
    Rule(
        r"^sparkbuild audit ",
        "check",
        "reads an engine image this host does not have; tests/test_image_audit.py runs it on "
        "a linux/arm64 image of real device code",
    ),
    Rule(r"^sparkbuild bump ", "check", "needs SGLang's sources at the new release (GitHub)"),
    Rule(r"^sparkbuild preflight", "check", "needs the release's dependencies (GitHub, PyPI)"),
    Rule(
        r"^(sparkbuild|nox -s) report\b",
        "check",
        "needs a project whose lock has records; tests/test_report.py builds one and runs it",
    ),
    Rule(
        r"^sparkbuild profile import ",
        "check",
        "writes into the project's smoke/; tests/test_recipe_import.py runs it on these recipes",
    ),
    Rule(
        r"^sparkbuild profile export ",
        "check",
        "needs a build published to a registry; tests/test_profile_export.py runs it on a lock",
    ),
    Rule(
        r"^sparkbuild profile fit ",
        "check",
        "tests/test_memory_fit.py runs it on these profiles and checks each verdict",
    ),
    Rule(
        r"^sparkrun ",
        "check",
        "sparkrun (Python >= 3.12, a Spark): tests/support/sparkrun_peer.py asks its own code",
    ),
    Rule(
        r"^sparkbuild bench compare \S+ submission/",
        "check",
        "compares a submission "
        "`bench --arena` wrote; tests/test_bench_arena_engine.py runs this compare",
    ),
    Rule(r"^sparkbuild bench compare ", "bench-report"),
    Rule(r"^sparkbuild (--repo \S+ )?(patches|prepare|lock)\b", "source"),
    Rule(r"^sparkbuild releases ", "releases"),
]


def rule_for(command: DocCommand) -> Rule:
    for rule in RULES:
        if re.search(rule.pattern, command.text):
            if rule.kind == "quick-start" and not command.quick_start:
                continue
            offline = rule.kind in ("offline", "offline-image")
            if offline and (command.doc, command.section) != OFFLINE:
                continue
            if rule.kind == CLUSTER_DEMO and (command.doc, command.section) != CLUSTER:
                continue
            return rule
    raise AssertionError(
        f"{command.id}: `{command.text}` matches no rule in tests/test_docs_commands.py: "
        "say how it is run or why it cannot run here"
    )


COMMANDS = documented_commands()


def test_the_docs_have_the_commands_this_test_expects() -> None:
    kinds = [rule_for(c).kind for c in COMMANDS]
    assert kinds.count("quick-start") == 6, [c.text for c in COMMANDS if c.quick_start]
    offline = [c.text for c in COMMANDS if c.section == OFFLINE[1]]
    assert kinds.count("offline") == 5 and kinds.count("offline-image") == 5, offline
    assert kinds.count(CLUSTER_DEMO) == 5, [c.text for c in COMMANDS if c.section == CLUSTER[1]]
    assert kinds.count("source") >= 4 and kinds.count("bench-report") >= 3
    assert kinds.count("releases") >= 1
    readme = [c.text for c in COMMANDS if c.doc == "README.md"]
    assert readme[:2] == ["nox -s build-sglang", "nox -s tests"]  # the guide's first two


# --- checks that need nothing but this clone ------------------------------------------------


def _words(text: str) -> list[str]:
    """The command's words without placeholders' brackets, alternatives or comments."""
    text = re.sub(r"<[^>]*>", "PLACEHOLDER", text)
    words = shlex.split(text, comments=True)
    cleaned = [w.strip("[]") for w in words]
    return [w for w in cleaned if w and w != "|" and not w.endswith("...")]


def _build_names() -> set[str]:
    names: set[str] = set()
    for spec in (ROOT / "builds").glob("*.yaml"):
        names |= set(yaml.safe_load(spec.read_text())["builds"])
    return names


def _exists(kind: str, name: str) -> bool:
    if name == "PLACEHOLDER" or "$" in name:
        return True
    folder = {"profile": "smoke", "claims": "claims"}[kind]
    return (ROOT / name).is_file() or (ROOT / folder / f"{name}.yaml").is_file()


def check_sparkbuild_words(words: list[str]) -> None:
    """The words parse as the command line would, and what they name exists."""
    context = main.make_context("sparkbuild", list(words))
    context.obj = Settings()
    args = [*context._protected_args, *context.args]
    command: click.Command = main
    while isinstance(command, click.Group) and args:
        found = command.get_command(context, args[0])
        if found is None:
            break
        command, args = found, args[1:]
        context = command.make_context(command.name, list(args), parent=context)
        args = [*getattr(context, "_protected_args", []), *context.args]
    params = context.params
    builds = _build_names()
    # A profile or build in another --project (made by the documented block) is not in this clone.
    elsewhere = Path(str(context.find_root().params.get("project_dir") or ".")) != Path(".")
    if params.get("profile_name") and not elsewhere:
        assert _exists("profile", params["profile_name"]), params["profile_name"]
    for claims in params.get("claims_files") or ():
        assert _exists("claims", claims), claims
    named = [params.get("record_build"), params.get("build"), *(params.get("builds") or ())]
    for build in named:
        if build and build not in ("BUILD", "PLACEHOLDER") and not elsewhere:
            assert build in builds, f"no build {build!r} in builds/"


def check_words(command: DocCommand) -> None:
    words = _words(command.text)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words = words[1:]  # VAR=value before the command
    if words[:2] == ["nox", "-s"]:
        assert words[2] in set(nox_sessions()), f"no nox session {words[2]!r}"
        if words[2] != "tests" and "--" in words:
            session = words[2].removeprefix("build-")
            verb = session if session in ("smoke", "bench", "bump", "preflight") else None
            if verb and "PLACEHOLDER" not in words and "..." not in command.text:
                check_sparkbuild_words([verb, *words[words.index("--") + 1 :]])
    elif words[:1] == ["sparkbuild"]:
        check_sparkbuild_words(words[1:])
    elif words[:1] == [".venv/bin/pytest"]:
        for word in words[1:]:
            if word.startswith("tests/"):
                assert (ROOT / word).exists(), word


# --- the quick start, once ------------------------------------------------------------------


@dataclass
class QuickStart:
    workdir: Path
    outputs: dict[int, tuple[str, str]]
    exit_code: int


def _clone_like(tmp: Path) -> Path:
    """A directory that looks like a fresh clone: the project's files, no outputs."""
    work = tmp / "clone"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name.startswith(".") or entry.name.endswith(".egg-info"):
            continue
        (work / entry.name).symlink_to(entry)
    return work


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory: pytest.TempPathFactory) -> QuickStart:
    tmp = tmp_path_factory.mktemp("quick-start")
    work = _clone_like(tmp)
    run = [c for c in COMMANDS if c.quick_start and rule_for(c).kind == "quick-start"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKBUILD_", "VLLM_"))}
    env["SPARKBUILD_CACHE_DIR"] = str(tmp / "cache")  # a new user's empty cache
    if "SPARKBUILD_TEST_CACHE" in os.environ:
        env["SPARKBUILD_TEST_CACHE"] = os.environ["SPARKBUILD_TEST_CACHE"]
    outputs, exit_code = run_block([c.text for c in run], work, env, timeout=1500)
    return QuickStart(work, {run[n].line: v for n, v in outputs.items()}, exit_code)


def _both_hosts_shown(quick_start: QuickStart, stdout: str, stderr: str) -> None:
    """The user's run against the shipped reference: both hosts before the figures, and a
    warning when they are other machines or under another load."""
    from sparkbuild.bench.report import host_warnings, load_report

    reference = load_report(ROOT / "benchmarks" / "cpu-reference.json")
    mine = load_report(quick_start.workdir / "my-run.json")
    assert stdout.index("hosts") < stdout.index("A → B")
    for host in (reference.host, mine.host):
        assert host.hostname in stdout and str(host.cpu_model) in stdout
    said = " ".join(stderr.split())
    for warning in host_warnings(reference, mine):  # what differs is said, each time
        assert " ".join(warning.split()) in said, said


def run_block(
    commands: list[str], work: Path, env: dict[str, str], *, timeout: float
) -> tuple[dict[int, tuple[str, str]], int]:
    """A documented block as one ``set -e`` bash script in ``work`` (this venv first on
    PATH): each command's (stdout, stderr) by its index, for those that began, and the exit
    status."""
    script = ["set -eu -o pipefail"]
    for number, command in enumerate(commands):
        script += [f"echo '@@@ {number}'", f"echo '@@@ {number}' >&2", command]
    env = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=work, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    out = re.split(r"^@@@ (\d+)\n", done.stdout, flags=re.M)
    err = re.split(r"^@@@ (\d+)\n", done.stderr, flags=re.M)
    outputs = {int(n): (o, e) for n, o, e in zip(out[1::2], out[2::2], err[2::2], strict=False)}
    return outputs, done.returncode


def _outputs_of(run: QuickStart, command: DocCommand, block: str) -> tuple[str, str]:
    """The command's (stdout, stderr) in the block's run; it began and did not stop it."""
    assert command.line in run.outputs, (
        f"{block} stopped before `{command.text}` (exit {run.exit_code}):\n"
        + "\n".join(f"{o}\n{e}" for o, e in run.outputs.values())[-4000:]
    )
    stdout, stderr = run.outputs[command.line]
    later = [line for line in run.outputs if line > command.line]
    assert later or run.exit_code == 0, f"exit {run.exit_code}: {stderr[-3000:]}"
    return stdout, stderr


def _quick_start_command(quick_start: QuickStart, command: DocCommand) -> None:
    stdout, stderr = _outputs_of(quick_start, command, "the quick start")
    text = command.text
    if text.startswith("eval"):
        assert Path(os.environ.get("SPARKBUILD_TEST_CACHE", Path.home())).exists()
    elif text.startswith("sparkbuild smoke"):
        assert "smoke PASS" in stdout, stdout + stderr
    elif text.startswith("sparkbuild bench --command"):
        report = json.loads((quick_start.workdir / "my-run.json").read_text())
        assert report["complete"] and len(report["cells"]) == 2
        # Without a terminal (here, a pipe) every figure is whole: the medians in the table
        # are the report's, digit for digit.
        assert "…" not in stdout
        for cell in report["cells"]:
            assert f"{cell['prefill_tps']['median']:.0f}" in stdout
        assert "waiting for vllm to boot" in stderr  # one plain line per stage, no TTY
    elif "--claims" in text:
        assert "claims against" in stdout and "S2 pp=512 tg=128 depth=0 c=1" in stdout
    elif text.startswith("sparkbuild bench compare"):
        assert "A → B" in stdout and "…" not in stdout
        _both_hosts_shown(quick_start, stdout, stderr)


# --- the offline path: a local mirror, a lock, a report ----------------------------------------


OfflinePath = QuickStart  # the same record: a documented block run in a directory


def _run_offline(tmp: Path, kinds: tuple[str, ...], timeout: float) -> OfflinePath:
    """docs/source.md's offline block (its commands of ``kinds``), as written, in a
    clone-like directory with no lock, a new HOME and cache, and no network but the
    repository standing for the USB copy (and, for the image, registries on 127.0.0.1)."""
    usb = tmp / "usb-copy"
    (usb / "vllm").mkdir(parents=True)
    (usb / "vllm" / "__init__.py").write_text('__version__ = "0.33.0"\n')
    tagged_repo(usb, "v0.33.0", "vLLM 0.33.0, as copied")
    work = tmp / "clone"  # the project's own files, copied: a patch may not lead outside it
    for name in ("builds", "patches", "smoke", "claims", "clusters", "benchmarks"):
        shutil.copytree(ROOT / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    (work / "tests").symlink_to(ROOT / "tests")  # the offline image helper
    (tmp / "home").mkdir()
    run = [c for c in COMMANDS if rule_for(c).kind in kinds]
    texts = [c.text.replace("/media/usb/vllm.git", str(usb)) for c in run]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKBUILD_", "GIT_"))}
    env.update(HOME=str(tmp / "home"), SPARKBUILD_CACHE_DIR=str(tmp / "cache"))
    env.update(SPARKBUILD_NET_ATTEMPTS="1")  # nothing here may need the network
    env.update(SPARKBUILD_TEST_CACHE=str(shared_test_cache()))  # the suite's engine and rootfs
    outputs, exit_code = run_block(texts, work, env, timeout=timeout)
    return OfflinePath(work, {run[n].line: v for n, v in outputs.items()}, exit_code)


@pytest.fixture(scope="module")
def offline_path(tmp_path_factory: pytest.TempPathFactory) -> OfflinePath:
    """The block up to its lock and report: a local mirror, no Docker."""
    return _run_offline(tmp_path_factory.mktemp("offline"), ("offline",), timeout=600)


@pytest.fixture(scope="module")
def offline_image_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflinePath]:
    """The whole block: then a built tiny image, a recorded smoke (one CPU engine boot in a
    container of that image) and a report. The registry and the images go, whatever
    happened."""
    tmp = tmp_path_factory.mktemp("offline-image")
    try:
        yield _run_offline(tmp, ("offline", "offline-image"), timeout=1500)
    finally:
        demo = tmp / "clone" / "offline-demo"
        offline_env.stop(demo)
        lock = demo / "images.lock"
        pinned = yaml.safe_load(lock.read_text()) if lock.is_file() else None
        image = ((pinned or {}).get("builds", {}).get(offline_env.BUILD) or {}).get("image", {})
        remove_images(docker_client(), [offline_env.IMAGE, *filter(None, [image.get("image_id")])])


def _offline_command(offline: OfflinePath, command: DocCommand) -> None:
    stdout, stderr = _outputs_of(offline, command, "the offline path")
    text = command.text
    if text.startswith("git clone"):
        assert (offline.workdir.parent / "home" / "mirrors" / "vllm.git" / "HEAD").is_file()
    elif " patches " in text:
        assert "vllm-0.33.0-spark" in stdout and "(no PRs or patches)" in stdout, stdout
    elif " lock --check " in text:
        assert "images.lock matches the specs (1 build(s))" in stderr, stderr
        assert "not proven offline" not in stderr  # re-derived from the local mirror
    elif " lock " in text:
        assert "locked vllm-0.33.0-spark" in stderr, stderr
        lock = yaml.safe_load((offline.workdir / "images.lock").read_text())
        source = lock["builds"]["vllm-0.33.0-spark"]["source"]
        assert source["repo"] == "https://github.com/vllm-project/vllm.git"  # the spec's URL
    elif text.startswith("sparkbuild report"):
        page = (offline.workdir / "report" / "builds" / "vllm-0.33.0-spark.html").read_text()
        assert "cpu-reference.json" in page and "attached with <code>--attach</code>" in page


def _text_of(page: Path) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", page.read_text()).split())


def _offline_image_command(offline: OfflinePath, command: DocCommand) -> None:
    stdout, stderr = _outputs_of(offline, command, "the offline path's image part")
    demo = offline.workdir / "offline-demo"
    text = command.text
    entry = (
        yaml.safe_load((demo / "images.lock").read_text())["builds"]
        if " start " not in text
        else {}
    )
    image = (entry.get(offline_env.BUILD) or {}).get("image") or {}
    if " start " in text:
        assert "a registry on 127.0.0.1:" in stderr, stderr
        assert (demo / "builds" / "vllm.yaml").is_file() and (
            demo / "smoke" / "cpu-image.yaml"
        ).is_file()
    elif " stop " in text:
        assert not (demo / ".registry").exists()
    elif " build " in text:
        assert f"built {image['image_id'][:19]} linux/arm64" in stdout + stderr, stdout + stderr
        assert image["base_image"].startswith("127.0.0.1:") and image["tags"] == [offline_env.IMAGE]
        assert image["started"] <= image["finished"]
    elif " smoke " in text:
        assert "smoke PASS" in stdout, stdout + stderr
        record = entry[offline_env.BUILD]["smoke"][image["image_id"]]["cpu-image"]
        assert record["verdict"] == "pass" and record["verified"] is True
        assert record["image_id"] == image["image_id"]
        # The demo's mirror says vLLM 0.33.0 (its label); the CPU engine inside is 0.32.0.
        assert (record["engine_version"], record["served_version"]) == ("0.33.0", "0.32.0")
        assert "the image says 0.33.0, the engine that answered reported 0.32.0" in stdout
    elif " report " in text:
        page = _text_of(demo / "report" / "builds" / f"{offline_env.BUILD}.html")
        assert f"built image id {image['image_id']}" in page, page
        assert "Smoke cpu-image ✓ pass" in page and "a container of the image" in page, page
        assert "the engine that answered reported 0.32.0" in page, page


def test_the_offline_helper_leaves_a_running_environment_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second `start` on the same directory is refused with a hint, and stops nothing."""
    state = tmp_path / "offline-demo" / ".registry"
    state.mkdir(parents=True)
    (state / "registry.pid").write_text(str(os.getpid()))  # stands for the running registry
    assert offline_env.main(["start", str(tmp_path / "offline-demo")]) == 1
    said = capsys.readouterr().err
    assert "error: " in said and "already has an offline image environment" in said
    assert "hint: `python tests/support/offline_env.py stop" in said
    assert (state / "registry.pid").is_file()  # not stopped, not removed
    assert offline_env.main(["restart", "x"]) == 2


# --- the two-node demo over ssh:// (docs/cluster.md) ------------------------------------------


@pytest.fixture(scope="module")
def cluster_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuickStart]:
    """docs/cluster.md's demo block as written (the suite's one two-node run): the leader on
    this host's daemon, the worker over ssh:// to the same daemon through a real sshd on
    127.0.0.1, in a directory with the clone's tests/ and the sshd's state in a directory of
    its own instead of /tmp/sb-sshd. The network and sshd go after, whatever happened."""
    from tests.support import cluster_env, sshd

    tmp = tmp_path_factory.mktemp("cluster-demo")
    work = tmp / "clone"
    work.mkdir()
    (work / "tests").symlink_to(ROOT / "tests")
    state = tmp / "sshd-state"
    run = [c for c in COMMANDS if rule_for(c).kind == CLUSTER_DEMO]
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    try:
        texts = [c.text.replace("/tmp/sb-sshd", str(state)) for c in run]
        outputs, exit_code = run_block(texts, work, env, timeout=1500)
        yield QuickStart(work, {run[n].line: v for n, v in outputs.items()}, exit_code)
    finally:
        cluster_env.stop_demo(work / "pair-demo")
        sshd.main(["stop", str(state)])


def _cluster_demo_command(demo: QuickStart, command: DocCommand) -> None:
    from tests.support.cluster_env import cluster_containers
    from tests.support.smoke_cli import SmokeRun

    stdout, stderr = _outputs_of(demo, command, "the two-node demo")
    project = demo.workdir / "pair-demo"
    (cluster_file,) = (project / "clusters").glob("pair-*.yaml")
    nodes = yaml.safe_load(cluster_file.read_text())["nodes"]
    endpoint = nodes[1]["endpoint"]
    text = command.text
    if "sshd.py start" in text:  # the endpoint the cluster file names is its sshd's
        assert endpoint.startswith("ssh://") and "@127.0.0.1:" in endpoint, endpoint
    elif "cluster_env.py start" in text:
        assert [n["endpoint"] for n in nodes] == ["local", endpoint]
    elif " smoke " in text:
        result_file = project / "smoke.json"
        result = json.loads(result_file.read_text()) if result_file.exists() else None
        run = SmokeRun(0, stdout, stderr, result)
        assert run.result is not None and run.result["verdict"] == "pass", run.explain()
        assert run.check("ranks")["status"] == "pass" and run.check("ranks")["value"] == 2
        assert run.check("accept_len")["status"] == "pass" and run.result["accept_len"] > 1.0
        cluster = run.result["cluster"]
        assert cluster["topology"] == {"nodes": 2, "tp": 2, "ep": 1, "pp": 1}
        assert cluster["launcher"] == "mp"
        lock = yaml.safe_load((project / "images.lock").read_text())["builds"]["cpu"]
        image_id = lock["image"]["image_id"]
        assert [(n["name"], n["rank"], n["image_id"]) for n in cluster["nodes"]] == [
            ("node-1", 0, image_id), ("node-2", 1, image_id)]  # fmt: skip
        assert [n["endpoint"] for n in cluster["nodes"]] == ["local", endpoint]
        entry = lock["smoke"][image_id]["cpu-tp2"]
        assert entry["verified"] is True and entry["image_id"] == image_id
        assert entry["topology"] == {"nodes": 2, "tp": 2, "ep": 1, "pp": 1}
        assert [n["image_id"] for n in entry["nodes"]] == [image_id, image_id]
        assert entry["checks"]["ranks"] == "pass"
        # Both nodes' hosts were read (node-2 through its ssh:// endpoint) and guarded.
        host = run.result["host"]
        assert [n["node"] for n in host["nodes"]] == ["node-1", "node-2"]
        assert host["nodes"][1]["facts"]["kernel"] == host["nodes"][0]["facts"]["kernel"]
        assert host["drift"] == [] and run.check("host-memory")["status"] == "pass"
        assert all(n["samples"] > 0 for n in host["memory"]["nodes"]), host["memory"]
        assert [n["node"] for n in entry["hosts"]["nodes"]] == ["node-1", "node-2"]
        # Every line of the kept log says which node printed it; rank 1 ran headless.
        log = Path(run.result["log_file"]).read_text()
        assert "[node-2]" in log and "[node-1]" in log
        assert any(
            "[node-2]" in line and "world_size=2 rank=1" in line for line in log.splitlines()
        )
    elif "cluster_env.py stop" in text:
        assert cluster_containers(cluster_file.stem) == []
        network = yaml.safe_load(cluster_file.read_text())["fabric"]["network"]
        inspect = subprocess.run(
            ["docker", "network", "inspect", network], capture_output=True, check=False
        )
        assert inspect.returncode != 0, f"the network {network} is still there"
    elif "sshd.py stop" in text:
        assert not (demo.workdir.parent / "sshd-state").exists()


# --- the source commands on a local upstream --------------------------------------------------


SOURCE_SPEC = """\
engine: sglang
repo: REPO
base_branch: main
package_dir: python/pkg
prs: [{number: 101}, {number: 102}, {number: 103}]
builds:
  old: {ref: v1.0.0}
"""


@pytest.fixture(scope="module")
def source_project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("doc-source")
    upstream = make_upstream(tmp / "upstream")
    project = tmp / "project"
    (project / "builds").mkdir(parents=True)
    (project / "builds" / "pkg.yaml").write_text(SOURCE_SPEC.replace("REPO", upstream.url))
    env = {"SPARKBUILD_CACHE_DIR": str(tmp / "cache")}
    return project, {"env": json.dumps(env), "upstream": upstream.url, "tmp": str(tmp)}


def _source_words(text: str, upstream: str, tmp: str) -> list[str]:
    text = text.replace("[BUILD...]", "old").replace("BUILD", "old")
    text = text.replace("[--out DIR]", f"--out {tmp}/tree").replace("/srv/sglang.git", upstream)
    return _words(text)[1:]


# --- one test per documented command ---------------------------------------------------------


def _param(command: DocCommand) -> Any:
    """The quick start, the commands on its report and the offline path's image boot the CPU
    engine: marked so (the last builds an image too)."""
    kind = rule_for(command).kind
    boots = ("quick-start", "bench-report", "offline-image", CLUSTER_DEMO)
    marks = [pytest.mark.engine] if kind in boots else []
    marks += [pytest.mark.docker] if kind in ("offline-image", CLUSTER_DEMO) else []
    return pytest.param(command, id=command.id, marks=marks)


@pytest.mark.parametrize("command", [_param(c) for c in COMMANDS])
def test_documented_command(command: DocCommand, request: pytest.FixtureRequest) -> None:
    rule = rule_for(command)
    if rule.kind == "check":
        check_words(command)
        pytest.skip(f"{command.id} `{command.text[:60]}`: {rule.reason}")
    if rule.kind == "quick-start":
        _quick_start_command(request.getfixturevalue("quick_start"), command)
    elif rule.kind == "offline":
        _offline_command(request.getfixturevalue("offline_path"), command)
    elif rule.kind == "offline-image":
        _offline_image_command(request.getfixturevalue("offline_image_path"), command)
    elif rule.kind == CLUSTER_DEMO:
        _cluster_demo_command(request.getfixturevalue("cluster_demo"), command)
    elif rule.kind == "bench-report":
        quick_start: QuickStart = request.getfixturevalue("quick_start")
        result = _bench_report_command(quick_start, command)
        assert result.exit_code == 0, result.output
    elif rule.kind == "source":
        project, facts = request.getfixturevalue("source_project")
        words = _source_words(command.text, facts["upstream"], facts["tmp"])
        if words[:2] == ["lock", "--check"]:
            run_cli("lock", cwd=project, env=json.loads(facts["env"]))
        result = run_cli(*words, cwd=project, env=json.loads(facts["env"]))
        assert result.exit_code == 0, result.output
    elif rule.kind == "releases":
        result = _releases_command(command, request.getfixturevalue("tmp_path"))
        assert result.exit_code == 0, result.output
        assert "v0.5.24" in result.stdout


def _bench_report_command(quick_start: QuickStart, command: DocCommand) -> CliResult:
    run = str(quick_start.workdir / "my-run.json")
    reference = str(ROOT / "benchmarks" / "cpu-reference.json")
    files = {"run.json": run, "before.json": reference, "after.json": run}
    words = [files.get(w, w) for w in _words(command.text)[1:]]
    return run_cli("--project", str(ROOT), *words, cwd=quick_start.workdir)


def _releases_command(command: DocCommand, tmp: Path) -> CliResult:
    upstream = tmp / "sglang"
    upstream.mkdir()
    (upstream / "README").write_text("releases\n")
    tagged_repo(upstream, "v0.5.22", "release")
    for tag in ("v0.5.23", "v0.5.24"):
        git(upstream, "tag", tag)
    words = _words(command.text)[1:]
    settings = ["--project", str(ROOT), "--cache-dir", str(tmp / "cache")]
    return run_cli(*settings, "--repo", f"sglang={upstream}", *words)


def test_every_skipped_command_names_its_reason() -> None:
    reasons: dict[str, list[str]] = {}
    for command in COMMANDS:
        rule = rule_for(command)
        if rule.kind == "check":
            assert rule.reason
            reasons.setdefault(rule.reason, []).append(command.id)
    assert reasons  # listed in the report by pytest -rs as well
    print("\n".join(f"{reason}: {', '.join(ids)}" for reason, ids in reasons.items()))
