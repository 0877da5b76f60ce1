"""A Docker endpoint that is not Docker, and launch options that cannot apply (issue 46).

The endpoint is a real HTTP server on loopback (tests/support/hostile_http.py) answering as a
web service at a Docker address would: docker-py's version and ping requests get Docker's
answers, everything else 404. The docker SDK, the CLI and its error path are sparkbuild's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkbuild import dockerhost
from sparkbuild.attest import keys
from sparkbuild.errors import DockerAPIError
from tests.support.cli import RunCli
from tests.support.hostile_http import HostileServer, Reply

ROOT = Path(__file__).resolve().parents[1]
API = "/v1.43"
IMAGE = "sparkbuild-tests/none:v1"


@pytest.fixture
def not_docker() -> Iterator[HostileServer]:
    """Answers docker-py's version check, its ping and one image's inspect; 404 to /info."""
    with HostileServer() as server:
        server.route("/version", Reply(body=json.dumps({"ApiVersion": "1.43"}).encode()))
        server.route(f"{API}/_ping", Reply(body=b"OK", content_type="text/plain"))
        inspect = {"Id": "sha256:" + "a" * 64, "RepoTags": [IMAGE], "RepoDigests": [],
                   "Config": {"Labels": {}}, "Architecture": "arm64", "Os": "linux"}  # fmt: skip
        server.route(f"{API}/images/{IMAGE}/json", Reply(body=json.dumps(inspect).encode()))
        yield server


def _endpoint(server: HostileServer) -> str:
    return server.url.replace("http://", "tcp://")


def test_an_endpoint_answering_404_to_info_is_not_a_docker_api(not_docker: HostileServer) -> None:
    with pytest.raises(DockerAPIError, match=r"answered 404 to /info: it is not a Docker Engine"):
        dockerhost.info(dockerhost.client(endpoint=_endpoint(not_docker)))


def test_smoke_names_the_endpoint_not_a_file_operation(
    run_cli: RunCli, not_docker: HostileServer
) -> None:
    """`smoke --image` on a DGX Spark check reads the daemon's /info: a 404 there was
    reported as "a file operation" with a disk-space hint."""
    result = run_cli("--project", str(ROOT), "smoke", "--image", IMAGE,
                     "--profile", "cpu-reference", "--model", str(ROOT),
                     env={"DOCKER_HOST": _endpoint(not_docker)})  # fmt: skip
    assert result.exit_code == 1, result.output
    endpoint = _endpoint(not_docker)
    assert f"error: {endpoint} answered 404 to /info: it is not a Docker Engine API" in (
        result.stderr
    )
    assert f"`docker --host {endpoint} info`" in result.stderr
    assert "file operation" not in result.stderr and "disk" not in result.stderr


def test_any_other_docker_refusal_names_the_request(
    run_cli: RunCli, not_docker: HostileServer
) -> None:
    result = run_cli("--project", str(ROOT), "smoke", "--image", "sparkbuild-tests/other:v1",
                     "--profile", "cpu-reference", "--model", str(ROOT),
                     env={"DOCKER_HOST": _endpoint(not_docker)})  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "answered 404 to GET /images/sparkbuild-tests/other:v1/json" in result.stderr
    assert "file operation" not in result.stderr


@pytest.mark.parametrize("command", ["smoke", "bench"])
def test_drop_caches_with_url_is_refused_by_name(run_cli: RunCli, command: str) -> None:
    """--drop-caches with --url was ignored without a word: nothing is started there."""
    result = run_cli("--project", str(ROOT), command, "--url", "http://127.0.0.1:9",
                     "--profile", "cpu-reference", "--drop-caches")  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--drop-caches with --url: sparkbuild starts no engine there" in result.stderr
    quiet = run_cli("--project", str(ROOT), command, "--url", "http://127.0.0.1:9",
                    "--profile", "cpu-reference", "--no-drop-caches")  # fmt: skip
    assert "--drop-caches" not in quiet.stderr


def test_a_registrys_thousand_errors_are_quoted_bounded(run_cli: RunCli, tmp_path: Path) -> None:
    """What a registry says about a failure reaches a finding and the JSON: a registry
    answering with thousands of error entries made a message of hundreds of kilobytes."""
    digest = "sha256:" + "ab" * 32
    errors = [{"code": "DENIED", "message": "m" * 120} for _ in range(2000)]
    (tmp_path / "cosign.pub").write_bytes(keys.generate(b"passphrase")[1])
    with HostileServer() as registry:
        registry.route("/v2/", Reply(body=b"{}"))
        registry.route(
            f"/v2/acme/x/manifests/{digest.replace(':', '-')}.sig",
            Reply(403, json.dumps({"errors": errors}).encode()),
        )
        result = run_cli("--project", str(ROOT), "verify", f"{registry.address}/acme/x@{digest}",
                         "--key", str(tmp_path / "cosign.pub"), "--json")  # fmt: skip
    assert result.exit_code == 1, result.output
    findings = {f["name"]: f for f in json.loads(result.stdout)["findings"]}
    detail = findings["signature"]["detail"]
    assert "DENIED: mmm" in detail and "characters]" in detail and len(detail) < 1000
