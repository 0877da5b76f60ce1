"""Publication end to end: a real arm64 image, a real registry with htpasswd auth, the CLI.

One module-scoped setup: an unauthenticated loopback registry serving the arm64 base, a
second one behind htpasswd auth to publish to, and one image built by the image stage
(`build_image`). Smoke verdicts are recorded through the smoke stage's own recorder
(`sparkbuild.smoke.record.record`). Refusal tests work on copies of images.lock
(`--lock-file`), so they do not disturb the main flow's lock.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.support.cli import CliResult
from tests.support.docker_env import (
    LocalRegistry,
    docker_cli,
    docker_login,
)
from tests.support.image_project import load_lock
from tests.support.preflight_lock import record_preflight
from tests.support.publish_env import (
    BUILD,
    PROFILE,
    PublishEnv,
    build_into,
    publish_env,
    record_smoke,
    run_publish_cli,
    write_project,
)

pytestmark = [pytest.mark.docker]


Env = PublishEnv


def _build(env: Env, greeting: str) -> dict[str, Any]:
    return build_into(env, greeting)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with publish_env(tmp_path_factory.mktemp("publish")) as state:
        yield state


def _output(result: CliResult) -> str:
    return result.stdout + result.stderr


def _manifest(registry: LocalRegistry, repository: str, reference: str) -> dict[str, Any]:
    response = requests.get(
        f"{registry.url}/v2/{repository}/manifests/{reference}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
        auth=registry.auth,
        timeout=30,
    )
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


REPOSITORY = "sparkbuild/sglang"


def test_publish_is_refused_without_a_passing_smoke_verdict(env: Env) -> None:
    image_id = env.image_section()["image_id"]
    never_ran = env.lock_copy("never-ran")
    result = env.publish(lock=never_ran, env=env.creds_env())
    assert result.exit_code == 1, _output(result)
    assert "no passing smoke verdict" in result.stderr and f"{PROFILE}: missing" in result.stderr
    assert f"--record {BUILD}" in result.stderr

    failed = env.lock_copy("failed")
    record_smoke(failed, BUILD, PROFILE, verdict="fail")
    result = env.publish(lock=failed, env=env.creds_env())
    assert result.exit_code == 1 and f"{PROFILE}: fail" in result.stderr, _output(result)

    # A verdict for another image id does not count.
    other = yaml.safe_load(failed.read_text())
    other["builds"][BUILD]["smoke"] = {
        "sha256:" + "0" * 64: {PROFILE: {"verdict": "pass"}},
        image_id: {PROFILE: {"verdict": "fail"}},
    }
    failed.write_text(yaml.safe_dump(other))
    result = env.publish(lock=failed, env=env.creds_env())
    assert result.exit_code == 1 and "no passing smoke verdict" in result.stderr
    assert env.registry.manifest_digest(REPOSITORY, "0.5.12-sm121") is None


def test_a_build_without_smoke_profiles_needs_force(env: Env) -> None:
    project = env.work / "no-profiles"
    write_project(project, env.repo, env.base_ref, {BUILD: {"ref": "v0.5.12"}}, "first")
    shutil.copyfile(env.lock, project / "images.lock")
    result = run_publish_cli(
        project, "publish", BUILD, "--registry", env.registry.address, env=env.creds_env()
    )
    assert result.exit_code == 1, _output(result)
    assert "lists no smoke profiles" in result.stderr and "--force" in result.stderr


def test_wrong_credentials_fail_without_showing_them(env: Env) -> None:
    passing = env.lock_copy("creds")
    record_smoke(passing, BUILD, PROFILE)
    record_preflight(passing, BUILD, PROFILE)
    assert env.registry.auth is not None
    user = env.registry.auth[0]
    wrong = "Wr0ng-" + env.registry.auth[1][::-1]
    result = env.publish(
        lock=passing,
        env={"SPARKBUILD_REGISTRY_USER": user, "SPARKBUILD_REGISTRY_PASSWORD": wrong},
    )
    assert result.exit_code == 1, _output(result)
    assert "rejected the credentials" in result.stderr
    assert wrong not in _output(result)
    assert "Traceback" not in result.stderr

    piped = env.publish("--username", user, "--password-stdin", lock=passing, stdin=wrong + "\n")
    assert piped.exit_code == 1 and "rejected the credentials" in piped.stderr
    assert wrong not in _output(piped)

    anonymous = env.publish(lock=passing)
    assert anonymous.exit_code == 1 and "requires credentials" in anonymous.stderr
    assert "publish" not in yaml.safe_load(passing.read_text())["builds"][BUILD]


def _publish_to(env: Env, lock: Path, registry: str) -> CliResult:
    return run_publish_cli(
        env.project,
        "--lock-file",
        str(lock),
        "publish",
        BUILD,
        "--registry",
        registry,
        env={**env.creds_env(), "SPARKBUILD_NET_ATTEMPTS": "3", "SPARKBUILD_NET_BACKOFF": "0"},
        docker_config=env.empty_docker_config,
    )


def test_refused_registry_is_named_at_once_without_retries(env: Env) -> None:
    passing = env.lock_copy("refused")
    record_smoke(passing, BUILD, PROFILE)
    record_preflight(passing, BUILD, PROFILE)
    closed = "127.0.0.1:9"  # discard port: nothing listens
    result = _publish_to(env, passing, closed)
    assert result.exit_code == 1, _output(result)
    assert "registry unreachable" in result.stderr
    assert f"http://{closed}/v2/" in result.stderr and "refused the connection" in result.stderr
    assert "not retried" in result.stderr and "times" not in result.stderr


@contextlib.contextmanager
def _dropping_server() -> Iterator[tuple[str, list[int]]]:
    """A TCP port that accepts every connection and closes it unanswered: a registry that is
    up but failing, which is worth retrying (unlike a refused connection)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}", accepted
    finally:
        listener.close()


def test_dropping_registry_is_retried_then_named(env: Env) -> None:
    passing = env.lock_copy("dropping")
    record_smoke(passing, BUILD, PROFILE)
    record_preflight(passing, BUILD, PROFILE)
    with _dropping_server() as (address, accepted):
        result = _publish_to(env, passing, address)
    assert result.exit_code == 1, _output(result)
    assert "registry unreachable" in result.stderr
    assert f"http://{address}/v2/" in result.stderr and "3 times" in result.stderr
    assert len(accepted) >= 3  # each attempt reached the server
    assert "publish" not in yaml.safe_load(passing.read_text())["builds"][BUILD]


def test_lock_and_local_image_must_agree(env: Env) -> None:
    section = env.image_section()
    stale = env.lock_copy("stale")
    data = yaml.safe_load(stale.read_text())
    missing_id = "sha256:" + "1" * 64
    data["builds"][BUILD]["image"]["image_id"] = missing_id
    verified = {"verdict": "pass", "verified": True, "image_id": missing_id, "target": "image:x"}
    data["builds"][BUILD]["smoke"] = {missing_id: {PROFILE: verified}}
    stale.write_text(yaml.safe_dump(data))
    record_preflight(stale, BUILD, PROFILE)
    result = env.publish(lock=stale, env=env.creds_env())
    assert result.exit_code == 1, _output(result)
    assert "images.lock pins" in result.stderr and missing_id[:19] in result.stderr
    assert section["image_id"][:19] in result.stderr  # the local tag's real id
    assert env.registry.manifest_digest(REPOSITORY, "0.5.12-sm121") is None


def test_an_immutable_tag_holding_other_content_is_never_moved(env: Env) -> None:
    passing = env.lock_copy("conflict")
    record_smoke(passing, BUILD, PROFILE)
    record_preflight(passing, BUILD, PROFILE)
    tag = f"0.5.12-sm121-{env.image_section()['tree'][:12]}"
    squatter = f"{env.registry.address}/conflict/sglang:{tag}"
    subprocess.run([docker_cli(), "tag", env.base_ref, squatter], check=True)
    env.images.append(squatter)
    login = docker_login(env.registry, env.work / "docker-config-conflict")
    push = subprocess.run(
        [docker_cli(), "push", squatter], env=login, capture_output=True, text=True, check=False
    )
    assert push.returncode == 0, push.stderr
    held = env.registry.manifest_digest("conflict/sglang", tag)
    result = env.publish("--repository", "conflict/{engine}", lock=passing, env=env.creds_env())
    assert result.exit_code == 1, _output(result)
    assert "immutable tags never move" in result.stderr and str(held) in result.stderr
    assert env.registry.manifest_digest("conflict/sglang", tag) == held
    assert env.registry.manifest_digest("conflict/sglang", "0.5.12-sm121") is None


def test_publish_pull_and_rollback(env: Env) -> None:
    first = env.image_section()
    record_smoke(env.lock, BUILD, PROFILE)
    record_preflight(env.lock, BUILD, PROFILE)
    tag_a = f"0.5.12-sm121-{first['tree'][:12]}"

    result = env.publish("--alias", "{version}-sm121", "--alias", "latest", env=env.creds_env())
    assert result.exit_code == 0, _output(result)
    assert env.registry.auth is not None
    assert env.registry.auth[1] not in _output(result)
    record = load_lock(env.project)["builds"][BUILD]["publish"][
        f"{env.registry.address}/{REPOSITORY}"
    ]
    digest_a = record["digest"]
    assert record["tag"] == tag_a and record["verified"] is True
    assert record["image_id"] == first["image_id"]
    assert env.registry.manifest_digest(REPOSITORY, tag_a) == digest_a
    assert env.registry.manifest_digest(REPOSITORY, "0.5.12-sm121") == digest_a
    assert env.registry.manifest_digest(REPOSITORY, "latest") == digest_a
    assert _manifest(env.registry, REPOSITORY, digest_a)["config"]["digest"] == first["image_id"]
    assert env.registry.auth[1] not in env.lock.read_text()

    # Pulling by digest gives the very image the lock pins.
    login = docker_login(env.registry, env.work / "docker-config-login")
    by_digest = f"{env.registry.address}/{REPOSITORY}@{digest_a}"
    pull = subprocess.run(
        [docker_cli(), "pull", by_digest], env=login, capture_output=True, text=True, check=False
    )
    assert pull.returncode == 0, pull.stderr
    inspect = subprocess.run(
        [docker_cli(), "image", "inspect", "--format", "{{.Id}}", by_digest],
        capture_output=True,
        text=True,
        check=True,
    )
    assert inspect.stdout.strip() == first["image_id"]

    # Publishing the same digest again is a no-op, including for the lock file.
    before = env.lock.read_bytes()
    again = env.publish(
        "--alias", "{version}-sm121", "--alias", "latest", "--json", env=env.creds_env()
    )
    assert again.exit_code == 0, _output(again)
    (payload,) = json.loads(again.stdout)["results"]
    assert payload["pushed"] is False and payload["digest"] == digest_a
    assert env.lock.read_bytes() == before

    # A second image. Its tag reaches the registry but the run "dies" before the aliases and
    # the lock (a plain docker push of the immutable tag): re-running publish completes it.
    second = _build(env, "second")
    assert second["image_id"] != first["image_id"]
    record_smoke(env.lock, BUILD, PROFILE)
    record_preflight(env.lock, BUILD, PROFILE)
    tag_b = f"0.5.12-sm121-{second['tree'][:12]}"
    partial = f"{env.registry.address}/{REPOSITORY}:{tag_b}"
    subprocess.run([docker_cli(), "tag", second["image_id"], partial], check=True)
    env.images.append(partial)
    push = subprocess.run(
        [docker_cli(), "push", partial], env=login, capture_output=True, text=True, check=False
    )
    assert push.returncode == 0, push.stderr
    assert env.registry.manifest_digest(REPOSITORY, "latest") == digest_a
    # Credentials from docker's own store this time (the `docker login` config).
    done = env.publish(
        "--alias",
        "{version}-sm121",
        "--alias",
        "latest",
        "--json",
        docker_config=Path(login["DOCKER_CONFIG"]),
    )
    assert done.exit_code == 0, _output(done)
    (payload,) = json.loads(done.stdout)["results"]
    digest_b = payload["digest"]
    assert payload["pushed"] is False and payload["aliases"]["latest"]["from"] == digest_a
    assert env.registry.manifest_digest(REPOSITORY, "latest") == digest_b
    assert env.registry.manifest_digest(REPOSITORY, "0.5.12-sm121") == digest_b
    assert env.registry.manifest_digest(REPOSITORY, tag_a) == digest_a  # never moves

    # Rollback: aliases back to the previous passing digest; immutable tags untouched.
    back = run_publish_cli(
        env.project, "rollback", BUILD, env=env.creds_env(), docker_config=env.empty_docker_config
    )
    assert back.exit_code == 0, _output(back)
    assert f"from {digest_b}" in back.stdout and f"to   {digest_a}" in back.stdout
    assert env.registry.manifest_digest(REPOSITORY, "latest") == digest_a
    assert env.registry.manifest_digest(REPOSITORY, "0.5.12-sm121") == digest_a
    assert env.registry.manifest_digest(REPOSITORY, tag_a) == digest_a
    assert env.registry.manifest_digest(REPOSITORY, tag_b) == digest_b
    record = load_lock(env.project)["builds"][BUILD]["publish"][
        f"{env.registry.address}/{REPOSITORY}"
    ]
    assert record["digest"] == digest_a
    assert [h["digest"] for h in record["history"]] == [digest_a, digest_b]
    assert record["history"][1]["rolled_back"] is True

    # The rolled-back image is not silently re-published, and nothing older is left.
    republish = env.publish("--alias", "latest", env=env.creds_env())
    assert republish.exit_code == 1 and "was rolled back" in republish.stderr
    assert env.registry.manifest_digest(REPOSITORY, "latest") == digest_a
    further = run_publish_cli(
        env.project, "rollback", BUILD, env=env.creds_env(), docker_config=env.empty_docker_config
    )
    assert further.exit_code == 1 and "no earlier published digest" in further.stderr

    # An explicit --to moves them forward again.
    forward = run_publish_cli(
        env.project,
        "rollback",
        BUILD,
        "--to",
        digest_b,
        "--json",
        env=env.creds_env(),
        docker_config=env.empty_docker_config,
    )
    assert forward.exit_code == 0, _output(forward)
    assert json.loads(forward.stdout) == {
        "build": BUILD,
        "repository": f"{env.registry.address}/{REPOSITORY}",
        "from": digest_a,
        "to": digest_b,
        "aliases": ["0.5.12-sm121", "latest"],
    }
    assert env.registry.manifest_digest(REPOSITORY, "latest") == digest_b
