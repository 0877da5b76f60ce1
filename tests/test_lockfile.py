"""The typed lock: one schema for load and `lock --check`, byte-identical round trips, and a
handle that writes each build's entry once, on real files."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sparkbuild import lockfile
from sparkbuild.errors import LockError

COMMIT = "a" * 40
IMAGE = "sha256:" + "b" * 64

# A lock as the stages write it: every section, with keys of their own beside the typed ones.
FULL = textwrap.dedent(
    f"""\
    builds:
      b1:
        bench:
          {IMAGE}:
            cpu:
              cells:
              - accept_len: 1.5
                pp: 128
              label: cpu
        image:
          cuda_code:
            sm_121: true
          image_id: {IMAGE}
          inputs_digest: sha256:{"c" * 64}
          repo_digest: null
          tags:
          - local/b1:tree
          tree: {COMMIT}
        preflight:
          {COMMIT}+sha256:{"d" * 64}:
            image_id: {IMAGE}
            profiles:
              cpu:
                checks:
                  config: pass
                verdict: pass
            where: image
        publish:
          reg.example/b1:
            aliases:
            - latest
            digest: sha256:{"e" * 64}
            history:
            - digest: sha256:{"e" * 64}
              rolled_back: true
              smoke:
                cpu: pass
              verified: true
            verified: true
        requirements:
        - filename: x-1.0-py3-none-any.whl
          name: x
          requirement: x==1.0
          sha256: {"f" * 64}
          version: '1.0'
        smoke:
          {IMAGE}:
            cpu:
              accept_len: 2.5
              verdict: pass
              verified: true
        source:
          commit: {COMMIT}
          engine: sglang
          patches: []
          prs:
          - commits: []
            head: {COMMIT}
            number: 7
            status: applied
          ref: v1.0.0
          repo: https://example.invalid/x.git
          spec_digest: sha256:{"0" * 64}
          tree: {COMMIT}
          version: 1.0.0
    schema: 1
    """
)


@pytest.fixture
def full(tmp_path: Path) -> Path:
    path = tmp_path / "images.lock"
    path.write_text(lockfile.HEADER + FULL)
    return path


def test_every_section_loads_typed_and_dumps_byte_identical(full: Path) -> None:
    lock = lockfile.load(full)
    entry = lock.entry("b1")
    assert entry is not None and entry.source is not None and entry.image is not None
    assert entry.source.pr_heads() == {7: COMMIT}
    assert entry.image.image_id == IMAGE
    assert entry.smoke is not None and entry.smoke[IMAGE]["cpu"].verified is True
    assert entry.publish is not None
    assert [p.rolled_back for p in entry.publish["reg.example/b1"].published()] == [True]
    assert entry.requirements is not None and entry.requirements[0].version == "1.0"
    assert lockfile.dumps(lock) == full.read_text()
    assert lockfile.schema_problems(full) == []


def test_a_handle_writes_each_build_once_and_keeps_other_writers(
    full: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = lockfile.LockHandle.open(full)
    # Another command records a verdict meanwhile: the handle's write must keep it.
    lockfile.set_section(full, "b2", "image", {"image_id": IMAGE})
    handle.set_section("b1", "source", handle.entry("b1").source)  # type: ignore[union-attr]
    handle.set_section("b1", "image", lockfile.ImageSection(image_id=IMAGE, tags=["t"]))
    writes: list[Path] = []
    real = lockfile.write_atomic

    def counted(path: Path, text: str) -> None:
        writes.append(path)
        real(path, text)

    monkeypatch.setattr(lockfile, "write_atomic", counted)
    handle.write()
    assert writes == [full]
    written = lockfile.load(full)
    assert written.builds["b2"].image is not None
    image = written.builds["b1"].image
    assert image is not None and image.tags == ["t"] and image.inputs_digest is None
    assert written.builds["b1"].smoke is not None  # the sections not queued stay


def test_a_change_that_raises_writes_nothing(full: Path) -> None:
    before = full.read_bytes()
    handle = lockfile.LockHandle.open(full)
    handle.set_section("b1", "image", lockfile.ImageSection(image_id="sha256:" + "9" * 64))

    def refuse(entry: lockfile.BuildEntry) -> None:
        raise LockError("the image changed meanwhile")

    handle.change("b1", refuse)
    with pytest.raises(LockError):
        handle.write()
    assert full.read_bytes() == before


def test_typed_fields_are_not_coerced(full: Path) -> None:
    # A hand-edited `verified: 1` must not count as a verified run.
    text = full.read_text()
    smoke = "verdict: pass\n          verified: true\n"
    assert smoke in text
    full.write_text(text.replace(smoke, smoke.replace("true", "1")))
    with pytest.raises(LockError) as raised:
        lockfile.load(full)
    assert "smoke.sha256:" in raised.value.message and "verified" in raised.value.message
    assert "Input should be a valid boolean" in raised.value.message


@pytest.mark.parametrize(
    "damage, problem",
    [
        (("      engine: sglang\n", ""), "`builds.b1.source.engine`: Field required"),
        (("        status: applied\n", ""), "`builds.b1.source.prs.0.status`: Field required"),
        ((f"image_id: {IMAGE}\n      inputs", "image_id: local:1\n      inputs"),
         "`builds.b1.image.image_id`: String should match pattern"),
        (("schema: 1\n", "schema: 1\nextra: x\n"), "`extra`: Extra inputs are not permitted"),
        (("schema: 1\n", ""), "no `schema:` field"),
    ],
)  # fmt: skip
def test_lock_check_holds_a_complete_shape(
    full: Path, damage: tuple[str, str], problem: str
) -> None:
    text = full.read_text()
    assert damage[0] in text
    full.write_text(text.replace(*damage))
    lockfile.load(full)  # every command still reads it
    problems = lockfile.schema_problems(full)
    assert len(problems) == 1 and problems[0].startswith("images.lock: ")
    assert problem in problems[0]
