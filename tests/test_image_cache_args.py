"""Registry build caches on the build command line: what BuildKit is asked to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkbuild.errors import SparkbuildError
from sparkbuild.image import builder

BUILDX = builder.BuildClient("/usr/bin/docker", "buildx", "28.0.0")
BUILTIN = builder.BuildClient("/usr/bin/docker", "builtin", "20.10.24")


def _request(cache_from: tuple[str, ...], cache_to: str | None) -> builder.BuildRequest:
    return builder.BuildRequest(
        context=Path("/ctx"),
        dockerfile=Path("/ctx/Dockerfile"),
        platform="linux/arm64",
        build_args={},
        labels={},
        tags=(),
        cache_from=cache_from,
        cache_to=cache_to,
    )


def test_buildx_imports_and_exports_a_registry_cache() -> None:
    refs = builder.cache_refs(
        ("ghcr.io/acme/sparkbuild-cache:{build}",), "ghcr.io/acme/sparkbuild-cache:{build}", "b1"
    )
    assert refs == (("ghcr.io/acme/sparkbuild-cache:b1",), "ghcr.io/acme/sparkbuild-cache:b1")
    cmd = builder.build_command(BUILDX, _request(*refs), Path("/tmp/iid"))
    assert (
        cmd[cmd.index("--cache-from") + 1] == "type=registry,ref=ghcr.io/acme/sparkbuild-cache:b1"
    )
    assert cmd[cmd.index("--cache-to") + 1] == (
        "type=registry,ref=ghcr.io/acme/sparkbuild-cache:b1,mode=max"
    )
    assert cmd[-1] == "/ctx"


def test_builtin_buildkit_imports_only() -> None:
    cmd = builder.build_command(BUILTIN, _request(("127.0.0.1:5000/cache:b",), None), Path("/i"))
    assert cmd[cmd.index("--cache-from") + 1] == "127.0.0.1:5000/cache:b"
    with pytest.raises(SparkbuildError, match="--cache-to needs `docker buildx`"):
        builder.build_command(BUILTIN, _request((), "127.0.0.1:5000/cache:b"), Path("/i"))


@pytest.mark.parametrize("bad", ["ghcr.io/a/c:x,mode=max", "type=local,dest=/etc", "-x", ""])
def test_a_cache_reference_cannot_smuggle_options(bad: str) -> None:
    with pytest.raises(SparkbuildError, match="is not an image reference"):
        builder.cache_refs((bad,), None, "b")
