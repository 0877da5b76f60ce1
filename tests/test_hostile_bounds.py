"""Hostile servers and hostile disks: every wait, body, file and number is bounded, every record
is backed by the bytes or the sources, and every failure is one screen.

The engines and registries here are real HTTP servers on loopback that misbehave on purpose
(tests/support/hostile_http.py): a slowloris, a body too large, a gzip bomb, a redirect to
another host, counters that cannot be true. The registries behind digest checks are real
(docker-registry, with a blob file overwritten on disk or a proxy that alters what it
forwards). The disks are real too: a read-only bind mount or a full tmpfs when the tests run
as root (as CI does), permissions otherwise. The command line is always the real one.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from sparkbuild.registry import manifests
from sparkbuild.registry.address import Manifest
from sparkbuild.registry.client import MANIFEST_TYPES
from sparkbuild.source.mirror import Mirror
from tests.support.cli import CliResult, installed_entry_point, run_cli
from tests.support.docker_env import LocalRegistry, start_registry
from tests.support.gitrepos import Upstream, make_upstream
from tests.support.hostile_http import HostileServer, Reply, Request, sse
from tests.support.hostile_project import (
    SPEC,
    Project,
    assert_one_screen,
    hostile_project,
    local_patch,
)
from tests.support.oci_push import push_image, push_index, tag_manifest
from tests.support.preflight_lock import record_preflight
from tests.support.publish_env import record_smoke, run_publish_cli, tiny_upstream, write_project

MIB = 1024 * 1024
MODELS = {"data": [{"id": "tiny", "owned_by": "vllm", "max_model_len": 4096}]}
VLLM_COMPLETION = {
    "choices": [
        {
            "text": " a b c d",
            "finish_reason": "length",
            "logprobs": {"tokens": [" a", " b"], "token_logprobs": [-0.5, -0.25]},
        }
    ],
    "usage": {"completion_tokens": 2},
}
SGLANG_GENERATION = {
    "text": " a b",
    "meta_info": {
        "finish_reason": {"type": "length"},
        "completion_tokens": 2,
        "output_token_logprobs": [[-0.5, 11, None], [-0.25, 12, None]],
    },
}


def strict_json(text: str) -> Any:
    """JSON as every other tool reads it: NaN and Infinity are not numbers."""

    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} in JSON output")

    return json.loads(text, parse_constant=refuse)


def said(result: CliResult) -> str:
    """stderr with the terminal's line wrapping undone."""
    return " ".join(result.stderr.split())


def metrics(**counters: float) -> bytes:
    """A Prometheus page of counters as prometheus-client writes them for the engines."""
    lines = []
    for name, value in counters.items():
        sample = name.replace("__", ":") + "_total"
        lines += [f"# TYPE {sample} counter", f"{sample} {value}"]
    return ("\n".join(lines) + "\n").encode()


def changing(first: bytes, then: bytes) -> Callable[[Request], Reply]:
    """The first read of a path answers ``first``, every later one ``then``."""
    return lambda request: Reply(
        body=first if request.count == 0 else then, content_type="text/plain"
    )


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return make_upstream(tmp_path_factory.mktemp("upstream"))


@pytest.fixture(scope="module")
def patch_text(upstream: Upstream) -> str:
    return local_patch(upstream)


@pytest.fixture
def project(tmp_path: Path, upstream: Upstream, patch_text: str) -> Project:
    return hostile_project(tmp_path, upstream, patch_text)


@pytest.fixture
def engine() -> Iterator[HostileServer]:
    """A healthy vLLM- and SGLang-shaped engine; each test makes one path hostile."""
    with HostileServer() as server:
        server.route("/health", Reply(body=b"{}"))
        server.route("/v1/models", Reply(body=json.dumps(MODELS).encode()))
        server.route("/metrics", Reply(body=b"", content_type="text/plain"))
        server.route("/v1/completions", Reply(body=json.dumps(VLLM_COMPLETION).encode()))
        server.route("/generate", Reply(body=json.dumps(SGLANG_GENERATION).encode()))
        yield server


def profile(project: Project, engine_name: str, *, speculation: bool = False) -> Path:
    path = project.root / "smoke" / f"{engine_name}-bounds.yaml"
    path.parent.mkdir(exist_ok=True)
    expect = f"{{max_tokens: 4, speculation: {str(speculation).lower()}, finish: length, "
    path.write_text(
        f"engine: {engine_name}\nmodel: tiny\nprompts: [prose]\n"
        f"expect: {expect}repetition: null}}\n"
    )
    return path


def smoke(project: Project, engine: HostileServer, engine_name: str, *args: str,
          speculation: bool = False) -> tuple[CliResult, dict[str, Any], float]:  # fmt: skip
    """``smoke --url ENGINE --json``: the result, the parsed (strict) JSON and the seconds."""
    path = profile(project, engine_name, speculation=speculation)
    started = time.monotonic()
    result = project.run("smoke", "--url", engine.url, "--profile", str(path), "--json", *args)
    seconds = time.monotonic() - started
    return result, strict_json(result.stdout), seconds


def check(report: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in report["checks"] if c["name"] == name)
    return found


# --- engine numbers: finite and possible -----------------------------------------------------


def test_more_tokens_accepted_than_drafted_fails_errors(
    project: Project, engine: HostileServer
) -> None:
    idle = metrics(vllm__spec_decode_num_drafts=0, vllm__spec_decode_num_draft_tokens=0,
                   vllm__spec_decode_num_accepted_tokens=0)  # fmt: skip
    busy = metrics(vllm__spec_decode_num_drafts=10, vllm__spec_decode_num_draft_tokens=30,
                   vllm__spec_decode_num_accepted_tokens=45)  # fmt: skip
    engine.route("/metrics", changing(idle, busy))

    result, report, _ = smoke(project, engine, "vllm", speculation=True)

    assert result.exit_code == 1
    errors = check(report, "errors")
    assert errors["status"] == "fail"
    assert f"{engine.url}/metrics" in errors["detail"]
    assert "45 tokens accepted" in errors["detail"] and "only 30 drafted" in errors["detail"]
    accept = check(report, "accept_len")
    assert accept["status"] == "fail" and "not measurable" in accept["detail"]
    assert report["accept_len"] is None  # 1 + 45/10 = 5.5 would have passed


def test_a_counter_that_goes_backwards_fails_errors(
    project: Project, engine: HostileServer
) -> None:
    before = metrics(sglang__generation_tokens=1000, sglang__spec_verify_calls=100)
    after = metrics(sglang__generation_tokens=10, sglang__spec_verify_calls=120)
    engine.route("/metrics", changing(before, after))

    result, report, _ = smoke(project, engine, "sglang")

    assert result.exit_code == 1
    errors = check(report, "errors")
    assert errors["status"] == "fail"
    assert "sglang:generation_tokens_total went backwards (1000 -> 10)" in errors["detail"]
    assert f"{engine.url}/metrics" in errors["detail"]


@pytest.mark.parametrize("value", ["NaN", "-3"])
def test_a_counter_that_is_not_a_count_fails_errors(
    project: Project, engine: HostileServer, value: str
) -> None:
    page = (
        f"# TYPE vllm:spec_decode_num_drafts counter\nvllm:spec_decode_num_drafts_total {value}\n"
    )
    engine.route("/metrics", Reply(body=page.encode(), content_type="text/plain"))

    result, report, _ = smoke(project, engine, "vllm")

    assert result.exit_code == 1
    errors = check(report, "errors")
    assert (
        "/metrics" in errors["detail"] and "vllm:spec_decode_num_drafts_total" in errors["detail"]
    )


@pytest.mark.parametrize(
    ("engine_name", "path", "field", "value"),
    [
        ("vllm", "/v1/completions", "completion_tokens", -7),
        ("sglang", "/generate", "completion_tokens", 10**9),
        ("sglang", "/generate", "spec_verify_ct", 3),  # more verify steps than tokens
    ],
)
def test_impossible_token_counts_fail_errors(
    project: Project, engine: HostileServer, engine_name: str, path: str, field: str, value: int
) -> None:
    answer: dict[str, Any] = json.loads(
        json.dumps(VLLM_COMPLETION if engine_name == "vllm" else SGLANG_GENERATION)
    )
    (answer["usage"] if engine_name == "vllm" else answer["meta_info"])[field] = value
    engine.route(path, Reply(body=json.dumps(answer).encode()))

    result, report, _ = smoke(project, engine, engine_name)

    assert result.exit_code == 1
    errors = check(report, "errors")
    assert errors["status"] == "fail"
    assert f"{engine.url}{path}" in errors["detail"] and field in errors["detail"]


# --- bench against a hostile engine ----------------------------------------------------------


def _tokens(request: Request) -> Reply:
    prompt = json.loads(request.body)["prompt"]
    return Reply(body=json.dumps({"count": len(prompt.split())}).encode())


def _stream(
    usage_text: str | None = None, *, dribble_s: float = 0.0, chunks: int = 0, done: bool = True
) -> Callable[[Request], Reply]:
    """An SSE completion of ``max_tokens`` chunks (or ``chunks``), the last usage given as
    ``usage_text`` when set, each chunk ``dribble_s`` apart."""

    def answer(request: Request) -> Reply:
        body = json.loads(request.body)
        total = chunks or int(body["max_tokens"])
        items: list[dict[str, Any] | str] = [
            {"choices": [{"text": " a", "finish_reason": None}],
             "usage": {"prompt_tokens": 8, "completion_tokens": i + 1}}
            for i in range(total)
        ]  # fmt: skip
        lines = list(sse(items))
        if usage_text is not None:  # the last chunk's usage, as text (e.g. 1e400)
            lines.append(
                b'data: {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": '
                + usage_text.encode() + b"}}\n\n"
            )  # fmt: skip
        lines += sse(["[DONE]"]) if done else ()
        return Reply(stream=tuple(lines), dribble_s=dribble_s, content_type="text/event-stream")

    return answer


@pytest.fixture
def bench_engine(engine: HostileServer) -> HostileServer:
    engine.route("/tokenize", _tokens)
    engine.route("/version", Reply(body=b'{"version": "0.0-bounds"}'))
    engine.route("/v1/completions", _stream())
    return engine


def bench(project: Project, engine: HostileServer, *args: str) -> tuple[CliResult, float]:
    started = time.monotonic()
    result = project.run(
        "bench", "--url", engine.url, "--engine", "vllm", "--pp", "8", "--tg", "2", "-c", "1",
        "--runs", "1", "--no-warmup", *args,
    )  # fmt: skip
    return result, time.monotonic() - started


def test_an_infinite_usage_count_is_a_failed_request(
    project: Project, bench_engine: HostileServer
) -> None:
    bench_engine.route("/v1/completions", _stream("1e400"))  # json reads it as infinity

    result, _ = bench(project, bench_engine, "--json")

    assert result.exit_code == 0, result.output
    report = strict_json(result.stdout)
    (cell,) = report["cells"]
    assert cell["errors"] == 1
    assert "usage.completion_tokens" in cell["error_samples"][0]


def test_a_stream_cut_mid_way_is_a_failed_request(
    project: Project, bench_engine: HostileServer
) -> None:
    """The previous round's leftover: a stream that stops after 2 of its 4 tokens, without
    the ``[DONE]`` every OpenAI-style stream ends with, was counted as a normal run."""
    bench_engine.route("/v1/completions", _stream(chunks=2, done=False))

    result, _ = bench(project, bench_engine, "--tg", "4", "--json")

    assert result.exit_code == 0, result.output
    (cell,) = strict_json(result.stdout)["cells"]
    assert cell["errors"] == 1 and cell["decode_tps_request"]["n"] == 0
    assert "ended without [DONE] after 2 chunks" in cell["error_samples"][0]


def test_an_impossible_tokenize_count_stops_bench(
    project: Project, bench_engine: HostileServer
) -> None:
    bench_engine.route("/tokenize", Reply(body=b'{"count": 1000000000000}'))

    result, _ = bench(project, bench_engine)

    assert result.exit_code == 1
    assert f"POST {bench_engine.url}/tokenize" in said(result)
    assert "count is 1000000000000" in said(result)
    assert "/v1/completions" not in bench_engine.seen


def test_an_engine_error_while_counting_by_usage_is_named_in_words(
    project: Project, bench_engine: HostileServer
) -> None:
    """No /tokenize, and the completion that counts by usage fails: the engine's status and
    answer are shown, not httpx's own text (which points at its documentation)."""
    bench_engine.route("/tokenize", Reply(status=404, body=b'{"detail": "Not Found"}'))
    bench_engine.route("/v1/completions", Reply(status=500, body=b'{"error": "engine dead"}'))

    result, _ = bench(project, bench_engine)

    assert result.exit_code == 1, result.output
    text = said(result)
    assert 'through a completion\'s usage: HTTP 500: {"error": "engine dead"}' in text
    assert "developer.mozilla.org" not in text and "Traceback" not in text
    assert "check that the engine still answers" in text


@pytest.mark.parametrize("args", [["--depth", "3000000", "--pp", "2000000"], ["--tg", "8000000"]])
def test_token_counts_beyond_any_engine_are_refused_before_a_request(
    project: Project, bench_engine: HostileServer, args: list[str]
) -> None:
    result = project.run("bench", "--url", bench_engine.url, "--engine", "vllm", *args)

    assert result.exit_code == 2
    assert "4194304" in said(result)
    assert bench_engine.seen == []


def test_a_slowloris_stream_ends_at_the_request_timeout(
    project: Project, bench_engine: HostileServer
) -> None:
    # 200 chunks, one every 0.3 s: each read is quick, the stream would take a minute.
    bench_engine.route("/v1/completions", _stream(dribble_s=0.3, chunks=200))

    result, seconds = bench(project, bench_engine, "--request-timeout", "1", "--json")

    assert result.exit_code == 0, result.output
    (cell,) = strict_json(result.stdout)["cells"]
    assert cell["errors"] == 1
    assert "no answer within 1 s" in cell["error_samples"][0]
    assert seconds < 15


@pytest.mark.parametrize("option", ["--csv", "--claims-json", "--markdown"])
def test_bench_outputs_are_checked_before_the_engine_is_asked(
    project: Project, bench_engine: HostileServer, tmp_path: Path, option: str
) -> None:
    claims = tmp_path / "claims.yaml"
    claims.write_text(
        "source: a test\ndate: 2026\nsetups:\n  s: {engine: vllm, model: tiny, harness: x}\n"
        "claims:\n  - {setup: s, cell: {pp: 8}, decode_tps: 10}\n"
    )
    result = project.run(
        "bench", "--url", bench_engine.url, "--engine", "vllm", "--claims", str(claims),
        option, str(tmp_path / "missing" / "out.file"),
    )  # fmt: skip

    assert result.exit_code == 2
    assert option in said(result) and "does not exist" in said(result)
    assert bench_engine.seen == []


# --- every exchange within its deadline, every body within its cap --------------------------


def test_a_slowloris_completion_ends_at_the_request_timeout(
    project: Project, engine: HostileServer
) -> None:
    body = json.dumps(VLLM_COMPLETION).encode()
    engine.route("/v1/completions", Reply(body=body, dribble_s=0.2))  # a minute, a byte at a time

    result, report, seconds = smoke(project, engine, "vllm", "--request-timeout", "1")

    assert result.exit_code == 1
    assert "no answer within 1 s" in check(report, "errors")["detail"]
    assert seconds < 10


def test_a_slowloris_metrics_page_does_not_hold_the_run(
    project: Project, engine: HostileServer
) -> None:
    # 200 header lines, one every 0.3 s: no socket read ever waits long, the page never ends.
    headers = {f"X-Slow-{i}": "1" for i in range(200)}
    engine.route("/metrics", Reply(body=b"x_total 1\n", headers=headers, header_dribble_s=0.3))

    result, report, seconds = smoke(project, engine, "vllm", "--request-timeout", "1")

    assert result.exit_code == 0, result.output
    assert report["verdict"] == "pass"
    assert seconds < 10  # two /metrics reads of at most 1 s each, not two minutes


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    return gzip.compress(b"\0" * (64 * MIB), compresslevel=1)  # ~300 KB on the wire


@pytest.mark.parametrize("kind", ["large", "bomb"])
def test_bodies_over_the_cap_fail_errors(
    project: Project, engine: HostileServer, gzip_bomb: bytes, kind: str
) -> None:
    if kind == "large":
        path = "/v1/completions"
        engine.route(path, Reply(body=b'{"pad": "' + b"x" * (40 * MIB) + b'"}'))
    else:
        path = "/metrics"
        engine.route(path, Reply(body=gzip_bomb, headers={"Content-Encoding": "gzip"}))

    result, report, _ = smoke(project, engine, "vllm")

    assert result.exit_code == 1
    detail = check(report, "errors")["detail"]
    assert f"{engine.url}{path}" in detail and "larger than 32 MiB" in detail


def test_a_redirect_to_another_host_is_not_followed(
    project: Project, engine: HostileServer
) -> None:
    with HostileServer() as elsewhere:
        elsewhere.route("/v1/models", Reply(body=json.dumps(MODELS).encode()))
        target = f"http://localhost:{elsewhere.address.rsplit(':', 1)[1]}/v1/models"
        engine.route("/v1/models", Reply(302, headers={"Location": target}))

        result, report, _ = smoke(project, engine, "vllm")

        assert result.exit_code == 1
        assert "redirected to another host" in check(report, "errors")["detail"]
        assert elsewhere.seen == []


def test_a_redirect_on_the_same_host_is_followed(project: Project, engine: HostileServer) -> None:
    engine.route("/v1/models", Reply(307, headers={"Location": "/v1/models-here"}))
    engine.route("/v1/models-here", Reply(body=json.dumps(MODELS).encode()))

    result, report, _ = smoke(project, engine, "vllm")

    assert result.exit_code == 0, result.output
    assert report["verdict"] == "pass"
    assert "/v1/models-here" in engine.seen


# --- registries: bounded waits (a fake registry) --------------------------------------------


def _published(project: Project, key: str, digests: list[str], aliases: list[str]) -> Path:
    """A lock whose build `new` was published to ``key`` (HOST/PATH), ``digests`` in order."""
    history = [{"digest": d, "tag": f"t{i}", "verified": True, "image_id": d}
               for i, d in enumerate(digests)]  # fmt: skip
    record = {"tag": history[-1]["tag"], "digest": digests[-1], "image_id": digests[-1],
              "verified": True, "aliases": aliases, "history": history}  # fmt: skip
    lock = project.root / "images.lock"
    lock.write_text(yaml.safe_dump({"schema": 1, "builds": {"new": {"publish": {key: record}}}}))
    return lock


def rollback(project: Project, *args: str, env: dict[str, str] | None = None) -> CliResult:
    cleared: dict[str, str | None] = {
        "SPARKBUILD_REGISTRY_USER": None,
        "SPARKBUILD_REGISTRY_PASSWORD": None,
        "DOCKER_CONFIG": str(project.root / "no-docker-config"),
    }
    result = run_cli(
        "--project", str(project.root), "--cache-dir", str(project.cache), "--quiet",
        "rollback", "new", *args, env={**cleared, **(env or {})},
    )  # fmt: skip
    assert_one_screen(result)
    return result


DIGEST_A, DIGEST_B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


@pytest.mark.parametrize("slow", ["/v2/", "token service"])
def test_a_slowloris_registry_ends_at_its_deadline(project: Project, slow: str) -> None:
    with HostileServer() as registry:
        headers = {f"X-Slow-{i}": "1" for i in range(200)}
        if slow == "/v2/":
            registry.route("/v2/", Reply(body=b"{}", headers=headers, header_dribble_s=0.3))
        else:
            challenge = f'Bearer realm="{registry.url}/token",service="test"'
            registry.route("/v2/", Reply(401, headers={"WWW-Authenticate": challenge}))
            registry.route("/token", Reply(body=b'{"token": "t"}', headers=headers,
                                           header_dribble_s=0.3))  # fmt: skip
        _published(project, f"{registry.address}/sparkbuild/sglang", [DIGEST_A, DIGEST_B],
                   ["0.5.12-sm121"])  # fmt: skip
        before = (project.root / "images.lock").read_bytes()
        started = time.monotonic()

        result = rollback(
            project, env={"SPARKBUILD_NET_TIMEOUT": "1", "SPARKBUILD_NET_ATTEMPTS": "1"}
        )

        assert result.exit_code == 1
        assert "within 1 s" in said(result), result.stderr
        assert time.monotonic() - started < 6  # one attempt of 1 s, not a minute
        assert (project.root / "images.lock").read_bytes() == before


@pytest.mark.parametrize(
    ("where", "body", "named"),
    [
        ("token service", b"<html><h1>Sign in</h1>\x1b[31m", "returned not a JSON object: '<html>"),
        ("manifest", b'["not", "distribution\'s errors"]', "HTTP 400"),
    ],
)
def test_registry_garbage_is_named_not_a_python_exception(
    project: Project, where: str, body: bytes, named: str
) -> None:
    with HostileServer() as registry:
        if where == "token service":
            challenge = f'Bearer realm="{registry.url}/token",service="test"'
            registry.route("/v2/", Reply(401, headers={"WWW-Authenticate": challenge}))
            registry.route("/token", Reply(body=body, content_type="text/html"))
        else:
            registry.route("/v2/", Reply(body=b"{}"))
            for reference in (DIGEST_A, DIGEST_B, "0.5.12-sm121"):
                registry.route(
                    f"/v2/sparkbuild/sglang/manifests/{reference}", Reply(400, body=body)
                )
        _published(project, f"{registry.address}/sparkbuild/sglang", [DIGEST_A, DIGEST_B],
                   ["0.5.12-sm121"])  # fmt: skip
        before = (project.root / "images.lock").read_bytes()

        result = rollback(project)

    assert result.exit_code == 1, result.output
    assert named in said(result), result.stderr
    assert "\x1b" not in result.stderr and "Expecting value" not in result.stderr
    assert (project.root / "images.lock").read_bytes() == before


@pytest.mark.parametrize(
    ("variable", "value"),
    [("SPARKBUILD_NET_ATTEMPTS", "1000000000"), ("SPARKBUILD_NET_BACKOFF", "1e6")],
)
def test_retries_are_capped(project: Project, variable: str, value: str) -> None:
    result = run_cli(
        "--project", str(project.root), "--cache-dir", str(project.cache), "lock",
        env={variable: value},
    )  # fmt: skip

    assert_one_screen(result)
    assert result.exit_code == 2
    assert f"{variable}={value!r} is more than" in said(result)
    assert not (project.root / "images.lock").exists()


# --- publish records are references, checked on read -----------------------------------------


@pytest.mark.parametrize(
    ("key", "digests", "aliases", "named"),
    [
        ("127.0.0.1:9/sparkbuild/sglang", [DIGEST_A, "HEAD"], ["0.5.12-sm121"], "history"),
        ("127.0.0.1:9/sparkbuild/sglang", [DIGEST_A, DIGEST_B], ["x/../../../y"], "aliases"),
        ("127.0.0.1:9/../../victim", [DIGEST_A, DIGEST_B], ["latest"], "key '127.0.0.1:9/.."),
    ],
)
def test_tampered_publish_records_are_refused_on_read(
    project: Project, key: str, digests: list[str], aliases: list[str], named: str
) -> None:
    lock = _published(project, key, digests, aliases)
    before = lock.read_bytes()

    for command in (["rollback", "new"], ["publish", "new", "--registry", "127.0.0.1:9"]):
        result = project.run(*command)
        assert result.exit_code == 1, result.output
        assert "images.lock is damaged" in said(result) and named in said(result)
        assert "is not allowed here" in said(result)
    assert lock.read_bytes() == before


# --- the lock's descriptive fields are proven ---------------------------------------------


def _edit_lock(project: Project, change: Callable[[dict[str, Any]], None]) -> bytes:
    data = project.lock
    change(data["builds"]["new"]["source"])
    (project.root / "images.lock").write_text(yaml.safe_dump(data))
    return (project.root / "images.lock").read_bytes()


def test_locked_runs_prove_each_pr_field(project: Project) -> None:
    assert project.run("lock").exit_code == 0
    pr = project.lock["builds"]["new"]["source"]["prs"][0]

    def tamper(source: dict[str, Any]) -> None:
        source["prs"][0]["status"] = "out-of-range"
        source["prs"][0]["commits"] = [*pr["commits"], "c" * 40]

    before = _edit_lock(project, tamper)

    for command in (["prepare", "--locked", "new"], ["lock", "--check"]):
        result = project.run(*command)
        assert result.exit_code == 1, result.output
        assert "`builds.new.source.prs[0].status`" in said(result)
        assert "`builds.new.source.prs[0].commits`" in said(result)
        assert "'out-of-range' in the lock, 'applied' from the spec and the mirror" in said(result)
    assert (project.root / "images.lock").read_bytes() == before


def test_without_a_mirror_the_spec_fields_are_proven_and_the_rest_named(
    project: Project,
) -> None:
    assert project.run("lock").exit_code == 0
    shutil.rmtree(project.cache / "mirrors")
    clean = run_cli("--project", str(project.root), "--cache-dir", str(project.cache),
                    "lock", "--check")  # fmt: skip
    assert clean.exit_code == 0, clean.output
    assert "not proven offline" in said(clean) and "prs[].commits" in said(clean)

    _edit_lock(project, lambda source: source["patches"][0].update(when=">=1.0"))
    result = project.run("lock", "--check")

    assert result.exit_code == 1
    assert "`builds.new.source.patches[0].when`" in said(result)
    assert "'>=1.0' in the lock, None from the spec" in said(result)


# --- files: regular and bounded --------------------------------------------------------------


# A read that blocks (a FIFO without a writer, /dev/zero) fails its test at the timeout rather
# than hanging the suite.
NEVER_BLOCKS = pytest.mark.timeout(30)


@NEVER_BLOCKS
def test_a_fifo_in_place_of_a_spec_is_refused(project: Project) -> None:
    os.mkfifo(project.root / "builds" / "zz.yaml")

    result = project.run("patches")

    assert result.exit_code == 2
    assert "zz.yaml: cannot read: is a FIFO (named pipe), not a regular file" in said(result)


@NEVER_BLOCKS
def test_a_fifo_in_place_of_a_patch_is_invalid(project: Project) -> None:
    patch = project.patches / "applies.patch"
    patch.unlink()
    os.mkfifo(patch)

    result = project.run("patches", "--json")

    assert result.exit_code == 1
    (item,) = [i for i in json.loads(result.stdout)["builds"][0]["items"] if i["kind"] == "patch"]
    assert item["status"] == "invalid" and "FIFO" in item["detail"]


@NEVER_BLOCKS
def test_report_does_not_block_on_a_fifo_in_place_of_a_patch(
    project: Project, tmp_path: Path
) -> None:
    """Issue 34, medium: `report` opened a FIFO left where a patch file was and waited for
    a writer forever (the build page shows each patch's headline)."""
    assert project.run("lock").exit_code == 0
    patch = project.patches / "applies.patch"
    patch.unlink()
    os.mkfifo(patch)

    result = project.run("report", "--out", str(tmp_path / "site"))

    assert result.exit_code == 0, result.output
    page = (tmp_path / "site" / "builds" / "new.html").read_text(encoding="utf-8")
    assert "applies.patch" in page


@NEVER_BLOCKS
def test_a_device_as_a_profile_is_refused(project: Project, engine: HostileServer) -> None:
    zero = project.root / "smoke" / "zero.yaml"
    zero.parent.mkdir()
    zero.symlink_to("/dev/zero")

    result = project.run("smoke", "--url", engine.url, "--profile", str(zero))

    assert result.exit_code == 2
    assert "is a character device, not a regular file" in said(result)
    assert engine.seen == []


# --- nothing on disk is a traceback -----------------------------------------------------------


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` read-only for real: a read-only bind mount as root (permissions do not stop
    root), its permissions otherwise."""
    if os.geteuid() == 0:
        subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
        try:
            subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
            yield
        finally:
            subprocess.run(["umount", str(path)], check=True)
        return
    mode = path.stat().st_mode
    path.chmod(0o555)
    try:
        yield
    finally:
        path.chmod(mode)


@contextlib.contextmanager
def full_disk(path: Path) -> Iterator[None]:
    """A tiny tmpfs at ``path``, filled up once the test has put its files there."""
    if os.geteuid() != 0:
        pytest.skip("a full disk needs a tmpfs mount (root); CI runs as root")
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


def fill(path: Path) -> None:
    with contextlib.suppress(OSError), (path / "filler").open("wb") as handle:
        while True:
            handle.write(b"\0" * 4096)
            handle.flush()
            os.fsync(handle.fileno())


def test_a_read_only_project_leaves_the_lock_as_it_was(project: Project) -> None:
    assert project.run("lock").exit_code == 0
    lock = project.root / "images.lock"
    lock.write_text("schema: 1\nbuilds: {}\n")  # so the next lock has something to write

    with read_only(project.root):
        result = project.run("lock")

    assert result.exit_code == 1
    assert "images.lock is unchanged" in said(result)
    assert lock.read_text() == "schema: 1\nbuilds: {}\n"


def test_a_full_disk_during_smoke_record_leaves_the_lock_as_it_was(
    project: Project, engine: HostileServer, tmp_path: Path
) -> None:
    disk = tmp_path / "disk"
    with full_disk(disk):
        lock = disk / "images.lock"
        image = {"image_id": "sha256:" + "1" * 64, "tree": "2" * 40}
        lock.write_text(yaml.safe_dump({"schema": 1, "builds": {"new": {"image": image}}}))
        before = lock.read_bytes()
        fill(disk)

        smoke_profile = str(profile(project, "vllm"))
        result = project.run("--lock-file", str(lock), "smoke", "--url", engine.url,
                             "--profile", smoke_profile, "--record", "new")  # fmt: skip

        assert result.exit_code == 1
        assert "No space left on device" in said(result)
        assert "images.lock is unchanged" in said(result)
        assert lock.read_bytes() == before
        assert not [p for p in disk.iterdir() if p.name.endswith(".tmp")]  # no half-written lock


def test_prepare_out_is_checked_before_the_work(project: Project, tmp_path: Path) -> None:
    locked_dir = tmp_path / "ro"
    locked_dir.mkdir()
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with read_only(locked_dir):
        for out, problem in ((locked_dir / "tree", "is not writable"),
                             (a_file / "tree", "is a file, not a directory")):  # fmt: skip
            result = project.run("prepare", "new", "--out", str(out))
            assert result.exit_code == 2
            assert "--out" in said(result) and problem in said(result)
    assert not (project.cache / "mirrors").exists()  # nothing was fetched


def test_prepare_out_on_a_full_disk(project: Project, tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    with full_disk(disk):
        fill(disk)
        result = project.run("prepare", "new", "--out", str(disk / "tree"))

    assert result.exit_code == 1
    assert "cannot write the checkout" in said(result) and "No space left" in said(result)


def test_a_file_where_the_cache_directory_goes(project: Project) -> None:
    project.cache.write_text("not a directory")  # given by the environment, not --cache-dir
    result = run_cli("--project", str(project.root), "patches",
                     env={"SPARKBUILD_CACHE_DIR": str(project.cache)})  # fmt: skip
    assert_one_screen(result)
    assert result.exit_code == 2
    assert f"the cache directory {project.cache} is a file" in said(result)


def test_names_and_links_that_cannot_be_files(project: Project) -> None:
    long_name = "b" * 200
    spec = project.root / "builds" / "pkg.yaml"
    spec.write_text(spec.read_text().replace("  new:", f"  {long_name}:"))
    result = project.run("prepare", long_name)
    assert result.exit_code == 2
    assert "is 200 characters long; use at most 128" in said(result)

    spec.write_text(spec.read_text().replace(f"  {long_name}:", "  new:"))
    (project.patches / "loop-a.patch").symlink_to("loop-b.patch")
    (project.patches / "loop-b.patch").symlink_to("loop-a.patch")
    spec.write_text(spec.read_text().replace("applies.patch", "loop-a.patch"))
    result = project.run("patches")
    assert result.exit_code == 2
    assert "loop-a.patch" in said(result) and "Symlink loop" in said(result)


def test_git_that_is_missing_or_not_git(project: Project, tmp_path: Path) -> None:
    impostor = tmp_path / "bin" / "git"
    impostor.parent.mkdir()
    impostor.write_text("#!/bin/sh\necho 'garbage \\001 out'\n")
    impostor.chmod(0o755)
    base = ("--project", str(project.root), "--cache-dir", str(project.cache), "patches")
    python_dir = str(Path(sys.executable).parent)
    for path, why in (
        (python_dir, "git is not on PATH"),
        (f"{impostor.parent}{os.pathsep}{os.environ['PATH']}", f"{impostor} is not git"),
    ):
        result = run_cli(*base, env={"PATH": path})
        assert_one_screen(result)
        assert result.exit_code == 1
        assert why in said(result) and "install git" in said(result)


def test_preflight_python_that_cannot_run(project: Project, tmp_path: Path) -> None:
    not_python = tmp_path / "python"
    not_python.write_text("not a program\n")  # exists, but is no interpreter

    for python, code, why in ((tmp_path / "nowhere", 2, "does not exist"),
                              (not_python, 1, "cannot run it")):  # fmt: skip
        result = project.run("preflight", "new", "--python", str(python))
        assert result.exit_code == code, result.output
        assert why in said(result)


def test_command_braces_are_the_commands_own(project: Project) -> None:
    result = project.run(
        "smoke", "--command", "sh -c 'exit 3' {port} {} {0}", "--profile",
        str(profile(project, "vllm")), "--boot-timeout", "5",
    )  # fmt: skip

    assert result.exit_code == 1
    assert "exited with status 3" in result.stdout


def test_compare_outputs_and_nested_reports(project: Project, tmp_path: Path) -> None:
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100_000 + "]" * 100_000)
    result = project.run("bench", "compare", str(nested), str(nested))
    assert result.exit_code == 2
    assert "nested too deeply" in said(result)

    nan = tmp_path / "nan.json"
    nan.write_text('{"label": NaN}')
    result = project.run("bench", "compare", str(nan), str(nan))
    assert result.exit_code == 2
    assert "NaN is not a JSON number" in said(result)

    result = project.run("bench", "compare", str(nan), str(nan), "--json-file", str(tmp_path))
    assert result.exit_code == 2
    assert "--json-file" in said(result) and "is a directory" in said(result)


def _benchy_csv(rows: int) -> str:
    from sparkbuild.bench.llama_benchy import CSV_COLUMNS

    lines = [",".join(CSV_COLUMNS)]
    for n in range(rows // 2):
        for kind in ("pp", "tg"):
            lines.append(",".join(["m", f"{kind}{n + 1}", "1.0", *[""] * 13]))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("content", "said_text"),
    [
        # Rows: 20,000 short ones held a cell each, 150 times the file's size for a 64 MiB
        # file (issue 34, high).
        (lambda: _benchy_csv(20_002), "more than 10000 rows (the limit)"),
        (lambda: _benchy_csv(0).strip() + ",x" * 100_000 + "\n", "over 64 (the limit)"),
        (lambda: _benchy_csv(2) + "m,pp9," + "9" * 20_000 + "\n", "over 16384 characters"),
        (lambda: _benchy_csv(2).replace("pp1", "pp\0"), "line 2: a NUL byte"),
        (lambda: _benchy_csv(2) + "m,pp9,1," + "9," * 70 + "\n", "fields, the header has 16"),
        (lambda: _benchy_csv(2).replace("m,pp1", "m\0,pp1"), "line 2: a NUL byte"),
        # Non-finite figures (issue 34, low): compare showed "100 -> nan (+nan%)".
        (lambda: _benchy_csv(2).replace("pp1,1.0", "pp1,inf"), "line 2: t_s_mean 'inf' is not"),
        (lambda: _benchy_csv(2).replace("tg1,1.0", "tg1,NaN"), "line 3: t_s_mean 'NaN' is not"),
    ],
    ids=["rows", "columns", "field", "nul", "fields", "nul-model", "inf", "nan"],
)
def test_a_csv_past_compares_limits_is_refused_naming_the_limit(
    project: Project, tmp_path: Path, content: Callable[[], str], said_text: str
) -> None:
    path = tmp_path / "run.csv"
    path.write_text(content())
    result = project.run("bench", "compare", str(path), str(path))
    assert result.exit_code == 2, said(result)
    assert "is not a sparkbuild bench report or a llama-benchy 0.4 JSON or CSV" in said(result)
    assert said_text in said(result)


def test_claims_refuse_figures_that_are_not_finite(project: Project, tmp_path: Path) -> None:
    claims = tmp_path / "claims.yaml"
    report = tmp_path / "run.json"
    report.write_text("{}")
    for figure in ("[10.0, .inf]", ".NaN"):
        claims.write_text(
            "source: a test\ndate: 2026\nsetups:\n  s: {engine: vllm, model: tiny, harness: x}\n"
            f"claims:\n  - {{setup: s, cell: {{pp: 8}}, decode_tps: {figure}}}\n"
        )
        result = project.run("bench", "compare", str(report), "--claims", str(claims))
        assert result.exit_code == 2
        assert "decode_tps" in said(result) and "finite" in said(result)


# --- inputs that are not what their field means ---------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ("{number: 103}", "{number: true}", "prs[0].number"),
        ("{number: 103}", "{number: '103'}", "prs[0].number"),
        ("package_dir: python/pkg", 'package_dir: "python/\\0pkg"', "package_dir"),
        ("package_dir: python/pkg", "package_dir: python/../../etc", "package_dir"),
    ],
)
def test_spec_values_of_the_wrong_kind_are_refused(
    project: Project, old: str, new: str, named: str
) -> None:
    project.write_spec(SPEC.replace(old, new))

    result = project.run("patches")

    assert result.exit_code == 2
    assert "pkg.yaml" in said(result) and named in said(result)


@pytest.mark.parametrize(
    ("field", "value"),
    [("sha256", "z" * 64), ("filename", "../../escape-1.0-py3-none-any.whl")],
)
def test_a_locked_wheel_that_is_not_a_file_and_a_hash_is_refused(
    project: Project, field: str, value: str
) -> None:
    assert project.run("lock").exit_code == 0
    data = project.lock
    wheel = {
        "requirement": "escape==1.0",
        "name": "escape",
        "version": "1.0",
        "filename": "escape-1.0-py3-none-any.whl",
        "sha256": "a" * 64,
        field: value,
    }
    data["builds"]["new"]["requirements"] = [wheel]
    (project.root / "images.lock").write_text(yaml.safe_dump(data))
    before = (project.root / "images.lock").read_bytes()

    result = project.run("lock", "--check")

    assert result.exit_code == 1, result.output
    assert "images.lock is damaged" in said(result) and field in said(result)
    assert (project.root / "images.lock").read_bytes() == before


def test_a_report_of_another_schema_version_is_not_compared(
    project: Project, bench_engine: HostileServer, tmp_path: Path
) -> None:
    ours = tmp_path / "ours.json"
    result, _ = bench(project, bench_engine, "--json-file", str(ours))
    assert result.exit_code == 0, result.output
    assert project.run("bench", "compare", str(ours), str(ours)).exit_code == 0
    future = tmp_path / "future.json"
    future.write_text(json.dumps({**json.loads(ours.read_text()), "schema_version": 2}))

    result = project.run("bench", "compare", str(ours), str(future))

    assert result.exit_code == 2
    assert "future.json: bench report schema_version 2" in said(result)
    assert "schema_version" in said(result)


@pytest.mark.parametrize("option", ["--cache-from", "--cache-to"])
def test_a_bad_cache_reference_is_a_usage_error_before_any_work(
    project: Project, option: str
) -> None:
    result = project.run("build", "new", option, "reg.example/cache:{build},mode=max")

    assert result.exit_code == 2, result.output
    assert f"{option} 'reg.example/cache:new,mode=max' is not an image reference" in said(result)
    assert not (project.cache / "mirrors").exists()


@pytest.mark.parametrize(
    ("docker_host", "named"),
    [("unix:///nonexistent/docker.sock", "Cannot connect to the Docker daemon"),
     ("tcp://127.0.0.1:9", "Cannot connect to the Docker daemon")],
)  # fmt: skip
def test_no_daemon_is_not_called_a_missing_image(
    project: Project, docker_host: str, named: str
) -> None:
    result = run_cli(
        "--project", str(project.root), "--cache-dir", str(project.cache),
        "preflight", "new", "--image", "sparkbuild/any:tag",
        env={"DOCKER_HOST": docker_host},
    )  # fmt: skip

    assert_one_screen(result)
    assert result.exit_code == 1, result.output
    assert "cannot tell whether image sparkbuild/any:tag is in the local Docker store" in said(
        result
    )
    assert named in said(result) and "not in the local Docker store" not in said(result)


# --- signals: a stopped prepare leaves no half-made mirror -----------------------------------


def test_sigterm_during_prepare_leaves_no_half_made_mirror(
    project: Project, tmp_path: Path
) -> None:
    # A git that pauses in the mirror's `git config`, so the signal lands mid-init.
    real_git = shutil.which("git")
    wrapper = tmp_path / "bin" / "git"
    wrapper.parent.mkdir()
    wrapper.write_text(
        f'#!/bin/sh\ncase "$*" in *remote.origin.url*) sleep 30;; esac\nexec {real_git} "$@"\n'
    )
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}"}
    argv = [installed_entry_point(), "--project", str(project.root),
            "--cache-dir", str(project.cache), "--quiet", "prepare", "new"]  # fmt: skip
    process = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
    mirrors = project.cache / "mirrors"
    deadline = time.monotonic() + 30
    while not list(mirrors.glob("*.init-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(mirrors.glob("*.init-*")), "the mirror's init never started"

    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)

    assert process.returncode == 130, stderr
    assert b"interrupted" in stderr and b"Traceback" not in stderr
    assert list(mirrors.glob("*.init-*")) == []


def test_a_killed_prepares_leftover_is_removed(project: Project) -> None:
    mirror = Mirror(project.cache, project.url)
    leftover = mirror.path.with_name(mirror.path.name + ".init-999999999")
    (leftover / "objects").mkdir(parents=True)

    result = project.run("patches")

    assert result.exit_code == 0, result.output
    assert not leftover.exists()
    assert (mirror.path / "HEAD").exists()


# --- registries: bytes that do not match their digest (a real registry) ----------------------

TREE = "ab" * 20
TAG = f"0.5.12-sm121-{TREE[:12]}"
ALIAS = "0.5.12-sm121"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    with start_registry(tmp_path_factory.mktemp("registry"), auth=False) as running:
        yield running


@pytest.fixture
def tiny_project(tmp_path: Path) -> Path:
    """A one-build SGLang project (`sglang-tiny`), as the publish tests use."""
    repo, _ = tiny_upstream(tmp_path)
    project = tmp_path / "project"
    builds = {"sglang-tiny": {"ref": "v0.5.12", "smoke": ["cpu-reference"]}}
    write_project(project, repo, "127.0.0.1:5000/base:v0.5.12", builds, "first")
    return project


def _blob_file(registry: LocalRegistry, digest: str) -> Path:
    hexa = digest.removeprefix("sha256:")
    return registry.root / "data/docker/registry/v2/blobs/sha256" / hexa[:2] / hexa / "data"


def _same_length_change(data: bytes) -> bytes:
    """Other bytes of the same length that still parse as the same kind of manifest."""
    text = data.decode()
    index = text.index('"size":') + len('"size":')
    digit = text[index]
    return (text[:index] + ("1" if digit != "1" else "2") + text[index + 1 :]).encode()


@pytest.mark.docker
def test_publish_refuses_an_index_whose_child_is_not_its_digest(
    registry: LocalRegistry, tiny_project: Path, tmp_path: Path
) -> None:
    repository = "tampered-child/sglang"
    arm = push_image(registry, repository, "linux/arm64", "child arm64")
    amd = push_image(registry, repository, "linux/amd64", "child amd64")
    push_index(registry, repository, TAG, {"linux/arm64": arm, "linux/amd64": amd})
    stored = _blob_file(registry, arm.digest)
    stored.write_bytes(_same_length_change(stored.read_bytes()))  # the registry serves these
    lock = tmp_path / "pinned.lock"
    image = {"image_id": arm.digest, "tree": TREE, "platform": "linux/arm64"}
    lock.write_text(yaml.safe_dump({"schema": 1, "builds": {"sglang-tiny": {"image": image}}}))
    record_smoke(lock, "sglang-tiny", "cpu-reference")
    record_preflight(lock, "sglang-tiny", "cpu-reference")
    before = lock.read_bytes()

    result = run_publish_cli(
        tiny_project, "--lock-file", str(lock), "publish", "sglang-tiny",
        "--registry", registry.address, "--repository", "tampered-child/{engine}",
        docker_config=tmp_path / "no-docker-config",
    )  # fmt: skip

    assert_one_screen(result)
    assert result.exit_code == 1
    assert f"registry {registry.address} served {repository}@{arm.digest}" in said(result)
    assert "hash to sha256:" in said(result)
    assert lock.read_bytes() == before  # nothing recorded
    assert registry.manifest_digest(repository, ALIAS) is None  # no alias moved


class _Tamperer:
    """A proxy in front of a registry that serves other bytes for one manifest digest, and
    drops the Docker-Content-Digest header that would give it away."""

    def __init__(self, upstream: LocalRegistry, digest: str, instead: bytes) -> None:
        self.upstream, self.digest, self.instead = upstream, digest, instead

    def forward(self, server: HostileServer, paths: list[str]) -> None:
        for path in paths:
            server.route(path, self._answer)

    def _answer(self, request: Request) -> Reply:
        if request.method == "GET" and request.path.endswith(f"/manifests/{self.digest}"):
            kind = "application/vnd.oci.image.manifest.v1+json"
            return Reply(body=self.instead, content_type=kind)
        answer = requests.request(
            request.method, self.upstream.url + request.path, data=request.body or None,
            headers={"Accept": ", ".join(MANIFEST_TYPES),
                     "Content-Type": "application/vnd.oci.image.manifest.v1+json"},
            timeout=30,
        )  # fmt: skip
        headers = {k: v for k, v in answer.headers.items()
                   if k.lower() in ("docker-content-digest", "location")}  # fmt: skip
        content_type = answer.headers.get("Content-Type", "application/json")
        return Reply(answer.status_code, answer.content, headers, content_type=content_type)


@pytest.mark.docker
def test_rollback_refuses_bytes_that_are_not_the_recorded_digest(
    registry: LocalRegistry, project: Project
) -> None:
    repository = "tampered-rollback/sglang"
    old = push_image(registry, repository, "linux/arm64", "the old image")
    new = push_image(registry, repository, "linux/arm64", "the new image")
    other = push_image(registry, repository, "linux/arm64", "what the proxy serves")
    tag_manifest(registry, repository, ALIAS, new)
    served = requests.get(f"{registry.url}/v2/{repository}/manifests/{other.digest}",
                          headers={"Accept": other.media_type}, timeout=30).content  # fmt: skip
    with HostileServer() as proxy:
        paths = [
            "/v2/",
            f"/v2/{repository}/manifests/sparkbuild-access-check",
            f"/v2/{repository}/manifests/{old.digest}",
            f"/v2/{repository}/manifests/{ALIAS}",
        ]
        _Tamperer(registry, old.digest, served).forward(proxy, paths)  # fmt: skip
        lock = _published(project, f"{proxy.address}/{repository}", [old.digest, new.digest],
                          [ALIAS])  # fmt: skip
        before = lock.read_bytes()

        result = rollback(project)

    assert result.exit_code == 1
    assert f"served {repository}@{old.digest} with other bytes" in said(result)
    assert f"hash to {other.digest}" in said(result)
    assert registry.manifest_digest(repository, ALIAS) == new.digest  # the alias did not move
    assert lock.read_bytes() == before  # nothing recorded, `verified` least of all


# --- an index is registry data: any shape is read without an exception ----------------------


@pytest.mark.parametrize(
    "index",
    [
        {"manifests": [{"digest": DIGEST_A, "annotations": ["x"], "platform": "linux/arm64"}]},
        {"manifests": 5},
        {"manifests": [{"digest": 7, "platform": {"os": "linux", "architecture": "arm64"}}]},
    ],
)
def test_an_index_of_any_shape_offers_no_child_and_no_exception(index: dict[str, Any]) -> None:
    kind = "application/vnd.oci.image.index.v1+json"
    manifest = Manifest(json.dumps(index).encode(), kind, DIGEST_B)

    assert manifests.platform_manifests(manifest, "linux/arm64") == []
    assert manifests.describe(manifest).startswith("an index of ")
