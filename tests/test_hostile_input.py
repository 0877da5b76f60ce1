"""Hostile and broken input: nothing executes, nothing leaves the project, nothing is
misreported, and every error is one screen without a traceback.

Every case runs the real command line against real git repositories (a local bare upstream
with tags and refs/pull/N/head).
"""

from __future__ import annotations

import asyncio
import http.server
import json
import stat
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from sparkbuild import validate
from sparkbuild.adapters import engine_names
from sparkbuild.bench.client import StreamResult, make_client, stream_completion
from sparkbuild.cli import main
from sparkbuild.engines.recipes import import_recipe
from sparkbuild.errors import RegistryError, SparkbuildError, UsageError
from sparkbuild.preflight.runner import ImageTarget
from sparkbuild.preflight.where import image_id_of
from sparkbuild.redact import redact, strip_userinfo
from sparkbuild.registry.address import Registry
from sparkbuild.registry.client import RegistryClient
from sparkbuild.registry.credentials import Credentials
from sparkbuild.report.site import diff_page, page_file
from tests.support.cli import run_cli
from tests.support.docker_env import docker_cli
from tests.support.dollar_anchors import dollar_anchored, scan
from tests.support.gitrepos import Upstream, make_upstream
from tests.support.hostile_project import SPEC, Project, assert_one_screen, hostile_project


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return make_upstream(tmp_path_factory.mktemp("upstream"))


@pytest.fixture
def project(tmp_path: Path, upstream: Upstream) -> Project:
    return hostile_project(tmp_path, upstream)


# -- critical: nothing a URL or ref says is ever executed -------------------------------


def _injections(marker: Path) -> list[str]:
    cmd = f"touch {marker}"
    return [
        f"--upload-pack={cmd}",
        f"--upload-pack={cmd};",
        f"-u{cmd}",
        f"--config=core.sshCommand={cmd}",
        f"ext::sh -c {cmd.replace(' ', '% ')}",
        f"ext::{cmd}",
        f"  --upload-pack={cmd}",
        f"\t-u{cmd}",
        f"fd::3,{cmd}",
        f"ssh://-oProxyCommand={cmd.replace(' ', '%20')}/x",
    ]


@pytest.mark.parametrize("index", range(10))
def test_spec_repo_never_runs_a_command(project: Project, tmp_path: Path, index: int) -> None:
    marker = tmp_path / "pwned"
    url = _injections(marker)[index]
    spec = project.write_spec(SPEC, repo=json.dumps(url))
    for command in (["patches"], ["lock"], ["prepare", "new"]):
        result = project.run(*command)
        assert not marker.exists(), f"{command} ran {url!r}"
        assert result.exit_code == 2, result.output
        assert f"{spec}:2: repo:" in result.stderr
    assert not (project.root / "images.lock").exists()


@pytest.mark.parametrize("index", range(10))
def test_repo_option_never_runs_a_command(project: Project, tmp_path: Path, index: int) -> None:
    marker = tmp_path / "pwned"
    url = _injections(marker)[index]
    result = project.run("--repo", f"sglang={url}", "patches")
    assert not marker.exists(), url
    assert result.exit_code == 2
    assert "--repo" in result.stderr


@pytest.mark.parametrize(
    "field, value",
    [
        ("ref", "--upload-pack=touch {marker}"),
        ("ref", "-u touch {marker}"),
        ("ref", "v1.1.0:refs/heads/evil"),
        ("ref", "../../v1.1.0"),
        ("base_branch", "--upload-pack=touch {marker}"),
        ("base_branch", "main:refs/heads/x"),
    ],
)
def test_refs_never_become_options(
    project: Project, tmp_path: Path, field: str, value: str
) -> None:
    marker = tmp_path / "pwned"
    text = SPEC.replace("ref: v1.1.0", f"ref: {json.dumps(value.format(marker=marker))}")
    if field == "base_branch":
        text = SPEC.replace("base_branch: main", f"base_branch: {json.dumps(value)}")
        text = text.replace("{marker}", str(marker))
    project.write_spec(text)
    result = project.run("patches")
    assert result.exit_code == 2
    assert f"{field}:" in result.stderr and "git ref" in result.stderr
    assert not marker.exists()


def test_allowed_url_forms_still_work(project: Project) -> None:
    """A plain path, file:// and a file:// with userinfo all fetch; only the form is checked."""
    for url in (project.url, f"file://{project.url}"):
        project.write_spec(SPEC, repo=url)
        result = project.run("patches", "--json")
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        assert {i["id"]: i["status"] for i in report["builds"][0]["items"]} == {
            "#103": "applied",
            "patches/pkg/applies.patch": "applied",
        }


def test_unknown_engine_in_repo_option_is_refused(project: Project) -> None:
    result = project.run("--repo", f"vlm={project.url}", "patches")
    assert result.exit_code == 2
    assert "unknown engine 'vlm'" in result.stderr
    assert ", ".join(engine_names()) in result.stderr  # every registered engine, listed


def _lock(project: Project) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(project.lock_text)
    return data


# -- high: a patch that is not a diff is `invalid`, never "upstream", never locked --------


def _truncated(project: Project) -> bytes:
    good = (project.root / "patches" / "pkg" / "applies.patch").read_bytes()
    cut = good.index(b"@@")
    return good[: cut + 20]  # the hunk header is cut in half


@pytest.mark.parametrize("kind", ["html", "empty", "truncated", "random", "blank-lines"])
def test_a_non_diff_patch_is_invalid(project: Project, kind: str) -> None:
    bodies = {
        "html": b"<!DOCTYPE html>\n<html><body><h1>404 Not Found</h1></body></html>\n",
        "empty": b"",
        "truncated": _truncated(project),
        "random": bytes((i * 97 + 13) % 256 for i in range(2048)),
        "blank-lines": b"\n\n   \n",
    }
    (project.root / "patches" / "pkg" / "applies.patch").write_bytes(bodies[kind])
    result = project.run("patches", "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    items = {i["id"]: i for i in report["builds"][0]["items"]}
    assert items["patches/pkg/applies.patch"]["status"] == "invalid"
    assert items["#103"]["status"] == "applied"
    locked = project.run("lock")
    assert locked.exit_code == 1
    assert "not locked" in locked.stderr
    assert not (project.root / "images.lock").exists()


@pytest.mark.parametrize(
    "file",
    ["/etc/passwd", "../../../../../../etc/passwd", "patches/../../outside.patch", "LINK"],
)
def test_patch_paths_stay_inside_the_project(project: Project, tmp_path: Path, file: str) -> None:
    outside = tmp_path / "outside.patch"
    outside.write_bytes((project.root / "patches" / "pkg" / "applies.patch").read_bytes())
    if file == "LINK":
        (project.root / "patches" / "link.patch").symlink_to(outside)
        file = "patches/link.patch"
    spec = project.write_spec(SPEC.replace("patches/pkg/applies.patch", file))
    for command in (["patches"], ["lock"], ["lock", "--check"]):
        result = project.run(*command)
        assert result.exit_code == 2, result.output
        assert f"{spec}:8: patches[0].file: patch file" in result.stderr
        assert "outside the project" in result.stderr
    assert not (project.root / "images.lock").exists()


@pytest.mark.parametrize("file", ["/etc/passwd", "../../Dockerfile"])
def test_dockerfile_stays_inside_the_project(project: Project, file: str) -> None:
    spec = project.write_spec(
        SPEC.replace("ref: v1.1.0", f"ref: v1.1.0\n        dockerfile: {file}")
    )
    result = project.run("build", "new")
    assert result.exit_code == 2
    assert f"{spec}:12: builds.new.dockerfile: dockerfile {file!r} is outside the project" in (
        result.stderr
    )


@pytest.mark.parametrize(
    "url",
    [
        "git@github.com:sgl-project/sglang.git",
        "ssh://git@github.com/sgl-project/sglang.git",
        "https://github.com/sgl-project/sglang.git",
        "git://example.org/x.git",
        "/srv/mirrors/sglang.git",
        "../mirrors/sglang.git",
    ],
)
def test_ordinary_urls_are_accepted(url: str) -> None:
    assert validate.repo_url(url) == url


def test_a_patch_path_that_is_a_directory(project: Project) -> None:
    project.write_spec(SPEC.replace("patches/pkg/applies.patch", "patches/pkg"))
    result = project.run("patches", "--json")
    assert result.exit_code == 1
    (item,) = [i for i in json.loads(result.stdout)["builds"][0]["items"] if i["kind"] == "patch"]
    assert item["status"] == "invalid"
    assert "is a directory" in item["detail"]


# -- high: credentials in repository URLs are never shown or stored -----------------------


def test_https_token_is_not_shown(project: Project) -> None:
    url = "https://alice:S3CRETTOKEN@127.0.0.1:9/org/repo.git"  # port 9: refused at once
    project.write_spec(SPEC, repo=url)
    for args in (["patches"], ["--repo", f"sglang={url}", "patches"]):
        result = run_cli("--project", str(project.root), "--cache-dir", str(project.cache), *args)
        assert_one_screen(result)
        assert result.exit_code == 1
        assert "S3CRETTOKEN" not in result.output
        assert "https://***@127.0.0.1:9/org/repo.git" in result.stderr


def test_file_url_token_is_not_stored(project: Project) -> None:
    url = f"file://alice:S3CRETTOKEN@localhost{project.url}"
    project.write_spec(SPEC, repo=url)
    result = run_cli("--project", str(project.root), "--cache-dir", str(project.cache), "lock")
    assert_one_screen(result)
    assert result.exit_code == 0, result.output
    assert "S3CRETTOKEN" not in result.output
    assert "S3CRETTOKEN" not in project.lock_text
    assert _lock(project)["builds"]["new"]["source"]["repo"] == f"file://localhost{project.url}"
    patches = project.run("patches", "--json")
    assert "S3CRETTOKEN" not in patches.output
    for config in project.cache.glob("mirrors/*.git/config"):
        assert "S3CRETTOKEN" not in config.read_text()
    assert "S3CRETTOKEN" not in " ".join(str(p) for p in project.cache.rglob("*"))


def test_token_without_a_path_is_not_in_the_cache(project: Project) -> None:
    result = project.run("--repo", "sglang=https://alice:S3CRETTOKEN@127.0.0.1:9", "patches")
    assert result.exit_code == 1
    assert "S3CRETTOKEN" not in result.output
    assert "S3CRETTOKEN" not in " ".join(str(p) for p in project.cache.rglob("*"))


# -- medium: malformed engine responses are failed checks, not tracebacks ------------------


class _Engine(http.server.BaseHTTPRequestHandler):
    """Answers each path with a fixed (status, body); a real socket, real HTTP."""

    bodies: ClassVar[dict[str, tuple[int, bytes]]] = {}
    hang: ClassVar[threading.Event] = threading.Event()
    seen: ClassVar[list[str]] = []

    def _answer(self) -> None:
        path = self.path.split("?", 1)[0]
        self.seen.append(path)
        if path in ("/generate", "/v1/completions") and "hang" in self.bodies:
            self.hang.wait(30)  # a hung server: answers nothing until the test ends
        status, body = self.bodies.get(path, (404, b"not found"))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def log_message(self, format: str, *args: Any) -> None:
        pass


_SEEN: dict[int, list[str]] = {}


@pytest.fixture
def engine() -> Iterator[tuple[str, dict[str, tuple[int, bytes]]]]:
    bodies: dict[str, tuple[int, bytes]] = {}

    class Handler(_Engine):
        pass

    Handler.bodies = bodies
    Handler.hang = threading.Event()
    Handler.seen = []
    handler = Handler
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _SEEN[id(bodies)] = Handler.seen
    yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    handler.hang.set()
    server.shutdown()
    server.server_close()


VLLM_OK = {
    "choices": [
        {
            "text": " a b c d",
            "finish_reason": "length",
            "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.5, -0.25]},
        }
    ],
    "usage": {"completion_tokens": 2},
}
SGLANG_OK = {
    "text": " a b",
    "meta_info": {
        "finish_reason": {"type": "length"},
        "completion_tokens": 2,
        "spec_verify_ct": 1,
        "output_token_logprobs": [[-0.5, 11, None], [-0.25, 12, None]],
    },
}
MODELS = {"data": [{"id": "tiny", "owned_by": "vllm"}]}


def _profile(project: Project, engine_name: str) -> Path:
    path = project.root / "smoke" / f"{engine_name}-test.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(
        f"engine: {engine_name}\nmodel: tiny\nprompts: [prose]\n"
        "expect: {max_tokens: 4, speculation: false, finish: length, repetition: null}\n"
    )
    return path


@pytest.mark.parametrize(
    "engine_name, path, body, expected",
    [
        ("vllm", "/metrics", b"\x00\xff garbage {{{ not prometheus", "/metrics"),
        ("sglang", "/metrics", b"# TYPE x counter\nx{a=} oops\n", "/metrics"),
        ("vllm", "/v1/completions", b"[1, 2, 3]", "not a JSON object"),
        ("sglang", "/generate", b'[{"text": "x"}]', "not a JSON object"),
        ("sglang", "/generate", b'{"text": "x", "meta_info": [1]}', "malformed response"),
        ("vllm", "/v1/completions", b'{"choices": {"0": 1}}', "malformed response"),
        ("vllm", "/v1/completions", b"<html>502</html>", "not JSON"),
        ("vllm", "/v1/models", b'{"data": "oops"}', "'data' is 'oops'"),
        ("vllm", "/v1/completions", b"COMPLETION_LOTS", "completion_tokens is 'lots'"),
        ("sglang", "/generate", b"GENERATE_LOTS", "completion_tokens is 'lots'"),
        ("sglang", "/server_info", b'{"internal_states": "x"}', None),
        ("sglang", "/server_info", b"not json", None),
    ],
)
def test_malformed_engine_answers_fail_a_check(
    project: Project,
    engine: tuple[str, dict[str, tuple[int, bytes]]],
    engine_name: str,
    path: str,
    body: bytes,
    expected: str | None,
) -> None:
    url, bodies = engine
    bodies["/v1/models"] = (200, json.dumps(MODELS).encode())
    bodies["/metrics"] = (200, b"# TYPE x counter\nx_total 1\n")
    bodies["/v1/completions"] = (200, json.dumps(VLLM_OK).encode())
    bodies["/generate"] = (200, json.dumps(SGLANG_OK).encode())
    bodies["/health"] = (200, b"{}")
    if body == b"COMPLETION_LOTS":
        bad: dict[str, Any] = json.loads(json.dumps(VLLM_OK))
        bad["usage"]["completion_tokens"] = "lots"
        body = json.dumps(bad).encode()
    elif body == b"GENERATE_LOTS":
        bad = json.loads(json.dumps(SGLANG_OK))
        bad["meta_info"]["completion_tokens"] = "lots"
        body = json.dumps(bad).encode()
    bodies[path] = (200, body)
    profile = _profile(project, engine_name)
    result = project.run("smoke", "--url", url, "--profile", str(profile), "--json")
    report = json.loads(result.stdout)
    if expected is None:  # a hint endpoint: garbage there changes nothing
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 1, result.output
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert failed, report
    details = " ".join(str(c["detail"]) for c in report["checks"])
    assert expected in details
    assert url in details or path in details


def _healthy(bodies: dict[str, tuple[int, bytes]]) -> None:
    bodies["/v1/models"] = (200, json.dumps(MODELS).encode())
    bodies["/metrics"] = (200, b"# TYPE x counter\nx_total 1\n")
    bodies["/v1/completions"] = (200, json.dumps(VLLM_OK).encode())
    bodies["/generate"] = (200, json.dumps(SGLANG_OK).encode())
    bodies["/health"] = (200, b"{}")


@pytest.mark.parametrize("engine_flag", [[], ["--engine", "vllm"]])
def test_bench_models_of_the_wrong_shape(
    project: Project, engine: tuple[str, dict[str, tuple[int, bytes]]], engine_flag: list[str]
) -> None:
    url, bodies = engine
    _healthy(bodies)
    bodies["/v1/models"] = (200, b'{"data":"oops"}')
    result = project.run("bench", "--url", url, *engine_flag, "--pp", "8", "--tg", "2")
    assert result.exit_code == 1
    assert f"{url}/v1/models" in result.stderr
    assert "'data' is 'oops'" in result.stderr


def test_a_hung_engine_is_bounded_by_request_timeout(
    project: Project, engine: tuple[str, dict[str, tuple[int, bytes]]]
) -> None:
    url, bodies = engine
    _healthy(bodies)
    bodies["hang"] = (0, b"")
    profile = _profile(project, "sglang")
    profile.write_text(profile.read_text().replace("[prose]", "[code, prose, repetitive]"))
    result = project.run(
        "smoke", "--url", url, "--profile", str(profile), "--request-timeout", "1", "--json"
    )
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    errors = next(c for c in report["checks"] if c["name"] == "errors")
    assert errors["status"] == "fail"
    assert "no answer within 1 s" in errors["detail"]
    assert _SEEN[id(bodies)].count("/generate") == 1  # the other prompts were not sent


def test_request_timeout_from_the_profile(
    project: Project, engine: tuple[str, dict[str, tuple[int, bytes]]]
) -> None:
    url, bodies = engine
    _healthy(bodies)
    bodies["hang"] = (0, b"")
    profile = _profile(project, "vllm")
    profile.write_text(
        profile.read_text().replace("max_tokens: 4", "max_tokens: 4, request_timeout_s: 1")
    )
    result = project.run("smoke", "--url", url, "--profile", str(profile), "--json")
    assert result.exit_code == 1
    assert "no answer within 1 s" in result.stdout


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e999", "infinity"])
@pytest.mark.parametrize(
    "command",
    [
        ["smoke", "--url", "http://127.0.0.1:9", "--profile", "p", "--boot-timeout"],
        ["smoke", "--url", "http://127.0.0.1:9", "--profile", "p", "--request-timeout"],
        ["bench", "--url", "http://127.0.0.1:9", "--boot-timeout"],
        ["bench", "--url", "http://127.0.0.1:9", "--request-timeout"],
    ],
)
def test_non_finite_numbers_are_refused(project: Project, command: list[str], value: str) -> None:
    result = project.run(*command, value)
    assert result.exit_code == 2
    assert command[-1] in result.stderr


@pytest.mark.parametrize(
    "field, value",
    [
        ("boot_timeout_s", ".nan"),
        ("boot_timeout_s", ".inf"),
        ("request_timeout_s", ".nan"),
        ("min_accept_len", ".nan"),
        ("min_accept_len", ".inf"),
    ],
)
def test_non_finite_profile_fields_are_refused(project: Project, field: str, value: str) -> None:
    profile = _profile(project, "vllm")
    profile.write_text(
        profile.read_text().replace("max_tokens: 4", f"max_tokens: 4, {field}: {value}")
    )
    result = project.run("smoke", "--url", "http://127.0.0.1:9", "--profile", str(profile))
    assert result.exit_code == 2
    assert f"{profile}:4: expect.{field}" in result.stderr


def test_smoke_json_path_is_checked_before_the_run(
    project: Project, engine: tuple[str, dict[str, tuple[int, bytes]]], tmp_path: Path
) -> None:
    url, bodies = engine
    _healthy(bodies)
    profile = _profile(project, "vllm")
    for bad in (tmp_path / "no" / "such" / "dir.json", tmp_path):
        result = project.run(
            "smoke", "--url", url, "--profile", str(profile), "--json-file", str(bad)
        )
        assert result.exit_code == 2
        assert "--json" in result.stderr
    assert "/v1/completions" not in _SEEN[id(bodies)]  # nothing ran


# -- low ---------------------------------------------------------------------------------


def _plain_diff(old: str, new: str, path: str) -> str:
    """A plain ``diff -u`` patch (no ``diff --git`` header)."""
    lines_old = old.splitlines(keepends=True)
    lines_new = new.splitlines(keepends=True)
    import difflib

    return "".join(difflib.unified_diff(lines_old, lines_new, f"a/{path}", f"b/{path}"))


def test_a_conflicting_plain_diff_is_a_conflict(project: Project, upstream: Upstream) -> None:
    from tests.support.gitrepos import lines

    # alpha.py as the patch author saw it differs from v1.1.0's at line 20: no fit.
    old = lines("alpha").replace("alpha line 20\n", "alpha line 20 (someone else)\n")
    new = old.replace("alpha line 21\n", "alpha line 21 (ours)\n")
    patch = "A fix.\n\n" + _plain_diff(old, new, "python/pkg/alpha.py")
    patch += _plain_diff(
        lines("beta"), lines("beta").replace("beta line 2\n", "x\n"), "python/pkg/beta.py"
    )
    (project.root / "patches" / "pkg" / "applies.patch").write_text(patch)
    result = project.run("patches", "--json")
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith("{"), result.output
    (item,) = [i for i in json.loads(result.stdout)["builds"][0]["items"] if i["kind"] == "patch"]
    assert item["status"] == "conflict"
    assert "python/pkg/alpha.py" in item["detail"]


# -- medium: prepare never throws away local work ------------------------------------------


def test_prepare_refuses_to_discard_local_work(project: Project, tmp_path: Path) -> None:
    out = tmp_path / "tree"
    first = project.run("prepare", "new", "--out", str(out))
    assert first.exit_code == 0, first.output
    (out / "python" / "pkg" / "alpha.py").write_text("my edit\n")
    (out / "notes.txt").write_text("my notes\n")
    (out / "build").mkdir()
    (out / "build" / "cache.o").write_text("x")
    again = project.run("prepare", "new", "--out", str(out))
    assert again.exit_code == 1
    for path in ("python/pkg/alpha.py", "notes.txt", "build/cache.o"):
        assert path in again.stderr
    assert "--force" in again.stderr
    assert (out / "python" / "pkg" / "alpha.py").read_text() == "my edit\n"
    assert (out / "notes.txt").exists()
    forced = project.run("prepare", "new", "--out", str(out), "--force")
    assert forced.exit_code == 0, forced.output
    assert not (out / "notes.txt").exists()
    assert (out / "python" / "pkg" / "alpha.py").read_text() != "my edit\n"
    clean = project.run("prepare", "new", "--out", str(out))  # a clean checkout: no question
    assert clean.exit_code == 0


# -- medium: YAML bombs and broken files ----------------------------------------------------

BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


@pytest.mark.parametrize("shape", ["bomb", "recursive", "merge-key"])
@pytest.mark.parametrize("where", ["spec", "profile", "lock"])
def test_yaml_aliases_are_refused(project: Project, shape: str, where: str) -> None:
    text = {
        "bomb": BOMB,
        "recursive": "extra: &a [*a]\n",
        "merge-key": "base: &b {x: 1}\nother:\n  <<: *b\n",
    }[shape]
    if where == "spec":
        path = project.write_spec(SPEC + textwrap.indent(text, "    "))
        args = ["patches"]
    elif where == "profile":
        path = _profile(project, "vllm")
        path.write_text(path.read_text() + text)
        args = ["smoke", "--url", "http://127.0.0.1:9", "--profile", str(path)]
    else:
        path = project.root / "images.lock"
        path.write_text("schema: 1\nbuilds: {}\n" + text)
        args = ["lock", "--check"]
    result = project.run(*args)
    assert result.exit_code in (1, 2)
    assert f"{path}:" in result.stderr
    assert "aliases (*" in result.stderr


def test_duplicate_build_keys_are_refused(project: Project) -> None:
    spec = project.write_spec(SPEC + "      new:\n        ref: v1.0.0\n")
    result = project.run("patches")
    assert result.exit_code == 2
    assert f"{spec}:12: duplicate key 'new' (first defined on line 10)" in result.stderr


def test_broken_spec_files(project: Project) -> None:
    spec = project.write_spec(SPEC)
    spec.write_bytes(spec.read_bytes().replace(b"base_branch: main", b"base_branch: m\xe4in"))
    result = project.run("patches")
    assert result.exit_code == 2
    assert f"{spec}:3: not UTF-8" in result.stderr
    project.write_spec(SPEC)
    (project.root / "builds" / "zzz.yaml").mkdir()
    result = project.run("patches")
    assert result.exit_code == 2
    assert "zzz.yaml: is a directory" in result.stderr


@pytest.mark.parametrize("name", ["../../escape", "/abs", "a/b", ".hidden", "-x", "sp ace"])
def test_build_names_are_validated(project: Project, tmp_path: Path, name: str) -> None:
    spec = project.write_spec(SPEC.replace("  new:", f"  {json.dumps(name)}:"))
    result = project.run("prepare", "--", name)
    assert result.exit_code == 2
    assert f"{spec}:10: builds: key {name!r}" in result.stderr
    assert "not a valid build name" in result.stderr
    assert not (tmp_path / "escape").exists()
    assert not (project.cache / "trees").exists()


# -- medium: a damaged images.lock is one clear error -------------------------------------


def _good_lock(project: Project) -> bytes:
    project.write_spec(
        SPEC.replace(
            "prs:\n      - {number: 103}", "prs:\n      - {number: 103}\n      - {number: 104}"
        )
    )
    result = project.run("lock")
    assert result.exit_code == 0, result.output
    return (project.root / "images.lock").read_bytes()


def test_a_cut_lock_is_a_clear_error(project: Project) -> None:
    good = _good_lock(project)
    lock = project.root / "images.lock"
    cuts = sorted({*range(60, len(good), max(1, len(good) // 40)), len(good) - 2})
    for cut in cuts:
        lock.write_bytes(good[:cut])
        for args in (["lock", "--check"], ["patches", "--locked"], ["prepare", "new", "--locked"]):
            result = project.run(*args)  # one screen, never a traceback
            if result.exit_code != 0:
                assert "images.lock" in result.stderr, (cut, result.output)


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda t: t.replace("number: 104", "number: many"), "prs[1].number"),
        (lambda t: t.replace("commit: ", "commit: --output=/tmp/x #"), "source.commit"),
        (lambda t: "schema: 1\nbuilds: [x, y]\n", "no 'builds' mapping"),
        (lambda t: t.replace("number: 104", "numbr: 104"), "prs[1].number: Field required"),
        (lambda t: t.replace("tree: ", "tree: [1, 2] #"), "source.tree"),
    ],
)
def test_a_lock_of_the_wrong_shape(project: Project, damage: Any, expected: str) -> None:
    _good_lock(project)
    lock = project.root / "images.lock"
    lock.write_text(damage(lock.read_text()))
    result = project.run("patches", "--locked")
    assert result.exit_code == 1
    assert str(lock) in result.stderr
    assert expected in result.stderr
    assert "git checkout -- images.lock" in result.stderr


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_non_finite_bench_figures_in_a_lock_are_refused(
    project: Project, tmp_path: Path, value: str
) -> None:
    """Issue 34, medium: `lock --check` accepted a bench figure of .inf or .nan, and the
    report crashed on it (OverflowError). Both name the field now."""
    import yaml

    _good_lock(project)
    lock = project.root / "images.lock"
    data = yaml.safe_load(lock.read_text())
    image_id = "sha256:" + "ab" * 32
    data["builds"]["new"]["image"] = {"mode": "overlay", "image_id": image_id}
    cell = {"pp": 8, "tg": 4, "depth": 0, "concurrency": 1, "ttft_s": 0.5, "prefill_tps": 9.0}
    data["builds"]["new"]["bench"] = {image_id: {"p": {"runs": 1, "cells": [cell]}}}
    text = yaml.safe_dump(data, sort_keys=False).replace(
        "prefill_tps: 9.0", f"prefill_tps: {value}"
    )
    lock.write_text(text)

    checked = project.run("lock", "--check")
    report = project.run("report", "--out", str(tmp_path / "site"))

    for result in (checked, report):
        assert result.exit_code == 1, result.output
        said = " ".join(result.stderr.split())
        assert str(lock) in said and "cells[0].prefill_tps" in said, said
        assert "finite" in said, said


def test_a_non_utf8_lock(project: Project) -> None:
    good = _good_lock(project)
    lock = project.root / "images.lock"
    lock.write_bytes(good.replace(b"engine: sglang", b"engine: sgl\xff\xfeang"))
    result = project.run("lock", "--check")
    assert result.exit_code == 1
    line = good[: good.index(b"engine: sglang")].count(b"\n") + 1
    assert f"{lock}:{line}: not UTF-8" in result.stderr
    assert "sparkbuild lock" in result.stderr
    unlocked = project.run("patches")  # an unlocked run still works, with a warning
    assert unlocked.exit_code == 0, unlocked.output
    assert "ignoring images.lock" in unlocked.stderr


def test_lock_keeps_its_mode(project: Project) -> None:
    _good_lock(project)
    lock = project.root / "images.lock"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o644
    lock.chmod(0o664)
    project.write_spec(SPEC.replace("prs:\n      - {number: 103}", "prs: []"))
    assert project.run("lock").exit_code == 0
    assert stat.S_IMODE(lock.stat().st_mode) == 0o664


def test_names_paths_and_hunks_are_not_markup(project: Project) -> None:
    patches = project.root / "patches" / "pkg"
    good = (patches / "applies.patch").read_text()
    (patches / "fix[").mkdir()
    (patches / "fix[" / "x].patch").write_text(good)
    (patches / "[red]warn.patch").write_text(
        good.replace("alpha line 20", "alpha line 2O").replace(  # conflicts: the context is wrong
            "@@ -17,7 +17,7 @@", "@@ -17,7 +17,7 @@ def f(x: list[int]) -> None:"
        )
    )
    spec = SPEC.replace(
        "- {file: patches/pkg/applies.patch}",
        "- {file: 'patches/pkg/fix[/x].patch'}\n      - {file: 'patches/pkg/[red]warn.patch'}",
    )
    project.write_spec(spec)
    result = run_cli(
        "--project",
        str(project.root),
        "--cache-dir",
        str(project.cache),
        "patches",
        env={"COLUMNS": "400"},
    )
    assert_one_screen(result)
    assert result.exit_code == 1
    assert "patches/pkg/fix[/x].patch" in result.stdout
    assert "patches/pkg/[red]warn.patch" in result.stdout
    assert "list[int]" in result.stdout
    assert "[red]warn.patch" in result.stderr


def test_prepare_json_stays_json_on_conflict(project: Project, tmp_path: Path) -> None:
    patch = project.root / "patches" / "pkg" / "applies.patch"
    patch.write_text(patch.read_text().replace("alpha line 19", "alpha line I9"))
    result = project.run("prepare", "new", "--out", str(tmp_path / "t"), "--json")
    assert result.exit_code == 1
    (build,) = json.loads(result.stdout)["builds"]
    assert {i["id"]: i["status"] for i in build["items"]}["patches/pkg/applies.patch"] == "conflict"


def test_patches_json_reports_every_build(project: Project) -> None:
    project.write_spec(SPEC + "      broken:\n        ref: v9.9.9\n")
    result = project.run("patches", "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert [b["build"] for b in report["builds"]] == ["new"]
    assert [f["build"] for f in report["failed"]] == ["broken"]
    assert "v9.9.9" in report["failed"][0]["error"]
    assert "1 build could not be prepared: broken" in result.stderr


@pytest.mark.parametrize(
    "name, value",
    [
        ("SPARKBUILD_NET_ATTEMPTS", "abc"),
        ("SPARKBUILD_NET_ATTEMPTS", "nan"),
        ("SPARKBUILD_NET_BACKOFF", "inf"),
        ("SPARKBUILD_NET_BACKOFF", "-1"),
    ],
)
def test_bad_network_settings(
    project: Project, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    project.write_spec(SPEC, repo="https://127.0.0.1:9/x.git")
    result = project.run("patches")
    assert result.exit_code == 2
    assert f"{name}={value!r}" in result.stderr


def test_stale_lock_shows_hashes_that_differ(project: Project) -> None:
    assert project.run("lock").exit_code == 0
    lock = project.root / "images.lock"
    data = yaml.safe_load(lock.read_text())
    (entry,) = data["builds"]["new"]["source"]["patches"]
    real = entry["sha256"]
    entry["sha256"] = real[:20] + ("0" if real[20] != "0" else "1") + real[21:]
    lock.write_text(yaml.safe_dump(data))
    result = project.run("lock", "--check")
    assert result.exit_code == 1
    assert f"sha256 {real[:28]}, locked {entry['sha256'][:28]}" in result.stderr


def test_unlocked_patches_mentions_a_moved_pr_head(project: Project, upstream: Upstream) -> None:
    assert project.run("lock").exit_code == 0
    old_head = upstream.prs[103]
    locked = _lock(project)["builds"]["new"]["source"]["prs"][0]["head"]
    assert locked == old_head
    from tests.support.gitrepos import commit_all, git, replace_line

    git(upstream.work, "checkout", "-q", "--detach", old_head)
    replace_line(
        upstream.work / "python/pkg/gamma.py", "gamma line 4\n", "gamma line 4 (#103 v2)\n"
    )
    new_head = commit_all(upstream.work, "pr103: v2")
    git(upstream.work, "checkout", "-q", "main")
    upstream.set_pr(103, new_head)
    try:
        result = project.run("patches", "--json")
        (item,) = [i for i in json.loads(result.stdout)["builds"][0]["items"] if i["kind"] == "pr"]
        assert f"images.lock pins head {old_head[:12]}, now {new_head[:12]}" in item["detail"]
        assert "sparkbuild lock new" in item["detail"]
    finally:
        upstream.set_pr(103, old_head)


def test_bench_usage_hint_names_bench(project: Project) -> None:
    result = project.run("bench", "--url", "http://127.0.0.1:9", "--image", "x")
    assert result.exit_code == 2
    assert "sparkbuild bench --image" in result.stderr
    assert "sparkbuild smoke" not in result.stderr


def test_bench_timeout_says_why(engine: tuple[str, dict[str, tuple[int, bytes]]]) -> None:
    url, bodies = engine
    bodies["hang"] = (0, b"")

    async def one() -> StreamResult:
        async with make_client(url, 1, 1.0) as client:
            return await stream_completion(
                client, {"prompt": "x", "max_tokens": 1}, "/v1/completions"
            )

    result = asyncio.run(one())
    assert result.error is not None
    assert result.error == "ReadTimeout: no answer within 1 s (--request-timeout)"


def test_registry_denial_names_what_was_denied(
    engine: tuple[str, dict[str, tuple[int, bytes]]],
) -> None:
    url, bodies = engine
    bodies["/v2/"] = (403, b'{"errors": [{"code": "DENIED", "message": "no"}]}')
    client = RegistryClient(
        Registry.parse(url), Credentials(source="test", username="u", password="secret-pw")
    )
    with pytest.raises(RegistryError) as caught:
        client.check_access("acme/x", push=False)
    assert "None" not in caught.value.message
    assert "may not read this registry" in caught.value.message


# -- the sweep: every command, malformed input, never a traceback --------------------------


def _commands() -> list[str]:
    import click

    return main.list_commands(click.Context(main))


def _broken_projects(project: Project, tmp_path: Path) -> dict[str, list[str]]:
    """Global options that make any command fail before it does real work."""
    marker = tmp_path / "pwned"
    bomb = project.root / "bomb"
    (bomb / "builds").mkdir(parents=True)
    (bomb / "builds" / "x.yaml").write_text(BOMB)
    latin = project.root / "latin"
    (latin / "builds").mkdir(parents=True)
    (latin / "builds" / "x.yaml").write_bytes(b"engine: sgl\xe4ng\n")
    inject = project.root / "inject"
    (inject / "builds").mkdir(parents=True)
    (inject / "builds" / "x.yaml").write_text(
        textwrap.dedent(SPEC).replace("REPO", json.dumps(f"--upload-pack=touch {marker}"))
    )
    dup = project.root / "dup"
    (dup / "builds").mkdir(parents=True)
    (dup / "builds" / "x.yaml").write_text(textwrap.dedent(SPEC) + "  new:\n    ref: v1\n")
    empty = project.root / "empty"
    empty.mkdir()
    cache = ["--cache-dir", str(project.cache)]
    return {
        "bomb": ["--project", str(bomb), *cache],
        "latin": ["--project", str(latin), *cache],
        "inject": ["--project", str(inject), *cache],
        "dup": ["--project", str(dup), *cache],
        "empty": ["--project", str(empty), *cache],
        "repo": ["--project", str(project.root), *cache, "--repo", f"sglang=-u touch {marker}"],
        "repo-ext": [
            "--project",
            str(project.root),
            *cache,
            "--repo",
            f"sglang=ext::touch {marker}",
        ],
        "lock-dir": ["--project", str(project.root), *cache, "--lock-file", str(project.root)],
    }


_ARGS: dict[str, list[list[str]]] = {
    "patches": [[], ["new"], ["--locked"], ["--json"]],
    "prepare": [["new"], ["new", "--force"], ["new", "--locked"]],
    "lock": [[], ["new"], ["--check"]],
    "build": [[], ["new"], ["--locked", "new"]],
    "publish": [["new", "--registry", "127.0.0.1:9"]],
    "rollback": [["new", "--registry", "127.0.0.1:9"]],
    "smoke": [["--url", "http://127.0.0.1:9", "--profile", "PROFILE"]],
    "bench": [["--url", "http://127.0.0.1:9", "--profile", "PROFILE"]],
}


@pytest.mark.parametrize(
    "value",
    ["ho st:5000/x", "host:abc/x", "host:5000:6000/x", "127.0.0.1:99999/x", "-host.com/x",
     "host..com/x", "exa\nmple.com/x", "host:/x", "[::1/x"],
)  # fmt: skip
def test_a_registry_host_is_host_and_port_only(value: str) -> None:
    """The previous round's leftover: --registry's host part was not validated (a space, a
    port that is no port, a second colon all became the registry's host)."""
    with pytest.raises(UsageError, match="is not a registry host") as caught:
        Registry.parse(value)
    assert "HOST[:PORT]" in str(caught.value.hint)


@pytest.mark.parametrize(
    ("value", "host"),
    [("ghcr.io/acme", "ghcr.io"), ("127.0.0.1:5000", "127.0.0.1:5000"),
     ("localhost:5000/a/b", "localhost:5000"), ("[::1]:5000/x", "[::1]:5000"),
     ("registry-1.example.com:443/x", "registry-1.example.com:443")],
)  # fmt: skip
def test_registry_hosts_that_are_hosts_still_parse(value: str, host: str) -> None:
    assert Registry.parse(value).host == host


def test_every_command_with_a_broken_project(project: Project, tmp_path: Path) -> None:
    """Specs, lock and --repo that are hostile or broken: exit 1 or 2, one screen, nothing
    executed. Commands added later get the generic argument sets."""
    profile = _profile(project, "vllm")
    profile.write_text(profile.read_text() + BOMB)  # a broken profile too
    broken = _broken_projects(project, tmp_path)
    for command in _commands():
        for template in _ARGS.get(command, [[], ["new"]]):
            args = [a.replace("PROFILE", str(profile)) for a in template]
            for name, options in broken.items():
                result = run_cli(*options, "--quiet", command, *args)
                where = f"{name}: sparkbuild {command} {' '.join(args)}"
                assert result.exit_code in (1, 2), f"{where}\n{result.output}"
                assert_one_screen(result)
    assert not (tmp_path / "pwned").exists()


MALFORMED_ARGS = [
    ["no-such-build"],
    ["--", "../../escape"],
    ["--", "-rf"],
    ["[red]x[/]"],
    ["new\x00x"],
    ["--json", "/nonexistent/dir/out.json"],
    ["--profile", "../../../../etc/passwd"],
    ["--url", "http://127.0.0.1:9", "--profile", "no-such-profile"],
    ["--url", "not a url", "--profile", "PROFILE"],
    ["--url", "http://127.0.0.1:9", "--profile", "PROFILE", "--boot-timeout", "nan"],
    ["--url", "http://127.0.0.1:9", "--profile", "PROFILE", "--json-file", "/"],
    ["--registry", "UPPER CASE/../x", "new"],
    ["--to", "--upload-pack=x", "new"],
    ["--pp", "nan", "--url", "http://127.0.0.1:9"],
    ["--pp", "-5", "--url", "http://127.0.0.1:9"],
    ["--concurrency", "0,1e9", "--url", "http://127.0.0.1:9"],
    ["compare", "/nonexistent.json", "/etc/hostname"],
    ["compare", "LATIN", "LATIN"],
]


def test_every_command_with_malformed_arguments(project: Project, tmp_path: Path) -> None:
    profile = _profile(project, "vllm")
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"label": "\xff"}')
    (project.root / "images.lock").write_bytes(b"schema: 1\nbuilds:\n  new: {source: \xff}\n")
    for command in _commands():
        for template in MALFORMED_ARGS:
            args = [
                a.replace("PROFILE", str(profile)).replace("LATIN", str(latin)) for a in template
            ]
            result = project.run(command, *args)
            where = f"sparkbuild {command} {' '.join(args)}"
            assert result.exit_code in (1, 2), f"{where}\n{result.output}"
    assert not (tmp_path / "escape").exists()


@pytest.mark.parametrize(
    "number", ['"103; touch pwned"', "-103", "0", "1.5", "'--upload-pack=x'", ".nan"]
)
def test_pr_numbers_are_numbers(project: Project, number: str) -> None:
    spec = project.write_spec(SPEC.replace("{number: 103}", f"{{number: {number}}}"))
    result = project.run("patches")
    assert result.exit_code == 2
    assert f"{spec}:6: prs[0].number" in result.stderr


@pytest.mark.parametrize("name", ["../../x", "--upload-pack=x", "[red]x"])
def test_record_names_are_looked_up_not_used(project: Project, name: str) -> None:
    result = project.run(
        "smoke",
        "--url",
        "http://127.0.0.1:9",
        "--profile",
        str(_profile(project, "vllm")),
        "--record",
        name,
    )
    assert result.exit_code == 1
    assert f"build {name!r} has no image in images.lock" in result.stderr


@pytest.mark.parametrize(
    "url, shown",
    [
        ("https://alice:T0KEN@h/x.git", "https://***@h/x.git"),
        ("https://ghp_T0KEN@h/x.git", "https://***@h/x.git"),  # a token as the user name
        ("file://alice:T0KEN@localhost/x", "file://***@localhost/x"),
        ("ssh://alice:T0KEN@h/x", "ssh://***@h/x"),
        ("ssh://git@h/x", "ssh://git@h/x"),  # a login name is not a secret
    ],
)
def test_redaction_forms(url: str, shown: str) -> None:
    assert redact(f"cannot fetch {url}: failed") == f"cannot fetch {shown}: failed"
    assert "T0KEN" not in strip_userinfo(url)


@pytest.mark.docker
@pytest.mark.parametrize("image", ["--version", "--privileged"])
def test_an_image_name_never_becomes_a_docker_option(image: str) -> None:
    with pytest.raises(SparkbuildError) as run:
        ImageTarget(image, docker=docker_cli()).run({})
    # docker read it as an image reference and refused it (`--version` as an option ran)
    assert "invalid reference format" in run.value.message
    with pytest.raises(SparkbuildError) as inspect:
        image_id_of(image, docker_cli())
    assert f"image {image} is not in the local Docker store" in inspect.value.message


# --- names: the whole value, not a line of it (issue 34, What 8) -----------------------------

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "sparkbuild"


def test_no_name_check_ends_in_a_dollar() -> None:
    """Python's ``$`` matches before a trailing newline: ``^[a-z]+$`` accepts "name\\n".
    Every whole-value check in the package ends in ``\\Z`` instead (a test over the source)."""
    assert scan(PACKAGE) == []
    assert dollar_anchored('import re\nNAME = re.compile(r"^[a-z]+$")\n') == [2]
    assert dollar_anchored('import re\nok = re.match(rf"^{x}$", y)\n') == [2]
    assert dollar_anchored('import re\nNAME = re.compile(r"^[a-z]+\\Z")\n') == []
    assert dollar_anchored('import re\nLINE = re.compile(r"^x: .*$", re.M)\n') == []
    assert dollar_anchored('import re\nCOST = re.compile(r"\\$")\n') == []


@pytest.mark.parametrize(
    "check",
    [
        lambda: validate.build_name("pkg\n"),
        lambda: validate.git_ref("v1.0\n"),
        lambda: validate.identifier("name\n"),
        lambda: validate.repo_url("https://example.com/r.git\n"),
    ],
    ids=["build", "ref", "identifier", "url"],
)
def test_a_trailing_newline_is_not_part_of_a_valid_name(check: Any) -> None:
    with pytest.raises((SparkbuildError, ValueError)):
        check()


def test_a_profile_name_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: m\ncommand: vllm serve {model}\n")
    with pytest.raises(SparkbuildError, match="profile name 'p\\\\n'"):
        import_recipe(recipe, name="p\n")


def test_report_page_names_fit_a_file_name() -> None:
    """Two 128-character build names side by side made a 266-byte file name: refused by
    every file system. Cut to 255 bytes, two long names still make two pages."""
    a, b = "a" * 128 + "@HEAD", "a" * 128 + "@published~1"
    page = diff_page(a, b)
    assert len(page.rsplit("/", 1)[1].encode()) <= 255 and page.startswith("diff/aaaa")
    assert diff_page(a, b) != diff_page(a, "a" * 128 + "@published~2")
    assert page_file("builds", "b" * 128) == f"builds/{'b' * 128}.html"
