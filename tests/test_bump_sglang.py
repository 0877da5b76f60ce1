"""`sparkbuild bump` across real SGLang releases: 0.5.12 -> 0.5.13 -> 0.5.17 -> 0.5.18 -> 0.5.23.

The upstream is the repository built from the PyPI release files (one commit and tag per
release, tests/support/sglang_releases.py) plus the PR #24436 stand-in. The project starts
with only a 0.5.12 build carrying the 0.5.12 forms of the shipped patches:
reserved-tokens-none-tokenizer-manager-0.5.12.patch (range left open, so that bump must
find out where it stops fitting) and draft-memory-before-kv-pool.patch (with the shipped
range), and PR #24436 without a range.

For every shipped variant the test either finds a variant bump wrote (or kept) that makes
the same patched tree on every release the shipped variant covers, or a conflict that bump
reported with its reason; the tally is printed and pinned below.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.support.bump_repos import sglang_upstream_with_pr_24436
from tests.support.cli import run_cli
from tests.support.gitrepos import commit_all, git
from tests.support.sglang_releases import ALL_RELEASES, patch_when, sglang_release_repo

pytestmark = pytest.mark.upstream

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "patches" / "sglang"
TM12 = "reserved-tokens-none-tokenizer-manager-0.5.12.patch"
DRAFT = "draft-memory-before-kv-pool.patch"
SD12 = "speculative-defaults-frozen-kv-mtp-server-args-0.5.12.patch"
# Families of shipped variants, by file-name prefix. A family with no 0.5.12 form has nothing
# for bump to carry from the start of the chain (the code it patches appears later).
FAMILIES = ("reserved-tokens-none", "draft-memory", "speculative-defaults")
NO_0_5_12_FORM = ("draft-kv-nextn-without-draft-path",)
STEPS = ["0.5.13", "0.5.17", "0.5.18", "0.5.23"]
START_SPEC = f"""# SGLang for DGX Spark, as it stood at 0.5.12 (the start of the bump chain).
engine: sglang
repo: https://github.com/sgl-project/sglang.git
base_branch: main
package_dir: python/sglang
mode: overlay
platform: linux/arm64

prs:
  # Gemma-4 MTP: merged after v0.5.11, first released in 0.5.12.
  - {{number: 24436}}

patches:
  # The reserved-token TypeError, in its 0.5.12 form; where it stops fitting is bump's job.
  - {{file: patches/sglang/{TM12}, when: ">=0.5.12"}}
  # Draft memory before the KV pool; upstream reworked the order in 0.5.14.
  - {{file: patches/sglang/{DRAFT}, when: ">=0.5.11,<0.5.14"}}

builds:
  sglang-0.5.12-spark:
    description: v0.5.12 + reserved-token None fix + draft memory accounting
    ref: v0.5.12
    base_image: lmsysorg/sglang:v0.5.12-cu130
    smoke: [qwen3.6-27b-fp8-nextn-sglang, gemma4-31b-mtp-sglang]
"""


class Chain:
    def __init__(self, project: Path, upstream: Path) -> None:
        self.project = project
        self.upstream = upstream
        self.payloads: dict[str, dict[str, Any]] = {}

    def run(self, *args: str) -> Any:
        return run_cli(
            "--project",
            str(self.project),
            "--cache-dir",
            str(self.project.parent / "cache"),
            "--quiet",
            "--repo",
            f"sglang={self.upstream}",
            *args,
        )

    def spec(self) -> dict[str, Any]:
        data: dict[str, Any] = yaml.safe_load((self.project / "builds/sglang.yaml").read_text())
        return data


def _bump_chain(
    test_cache: Path, root: Path, patches: tuple[str, ...], spec: str, steps: list[str]
) -> Chain:
    """A project holding ``patches`` and ``spec``, locked, committed, then bumped through
    ``steps`` with --write, one commit per step."""
    upstream = sglang_upstream_with_pr_24436(sglang_release_repo(test_cache, ALL_RELEASES), root)
    project = root / "project"
    (project / "builds").mkdir(parents=True)
    (project / "patches" / "sglang").mkdir(parents=True)
    for name in patches:
        shutil.copy(SHIPPED / name, project / "patches" / "sglang" / name)
    (project / "builds" / "sglang.yaml").write_text(spec)
    chain = Chain(project, upstream)
    locked = chain.run("lock")
    assert locked.exit_code == 0, locked.output
    git(project, "init", "-q", "-b", "main")
    commit_all(project, "0.5.12 only")
    for version in steps:
        result = chain.run("bump", "sglang", "--to", f"v{version}", "--write", "--json")
        assert result.exit_code in (0, 1), result.output
        chain.payloads[version] = json.loads(result.stdout)
        commit_all(project, f"bump to {version}")
    return chain


@pytest.fixture(scope="module")
def chain(test_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Chain:
    root = tmp_path_factory.mktemp("bump-sglang")
    return _bump_chain(test_cache, root, (TM12, DRAFT), START_SPEC, STEPS)


@pytest.fixture(scope="module")
def defaults_chain(test_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Chain:
    """The FROZEN_KV_MTP speculative-defaults fix, carried alone from its 0.5.12 form."""
    root = tmp_path_factory.mktemp("bump-sglang-defaults")
    spec = START_SPEC.split("patches:\n", maxsplit=1)[0] + (
        f'patches:\n  - {{file: patches/sglang/{SD12}, when: ">=0.5.12"}}\n\nbuilds:'
        + START_SPEC.split("builds:", 1)[1]
    )
    return _bump_chain(test_cache, root, (SD12,), spec, ["0.5.13"])


def _items(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {Path(i["id"]).name if i["kind"] == "patch" else i["id"]: i for i in payload["items"]}


def _patched_tree(repo: Path, version: str, patch: Path) -> str | None:
    """The release's tree after `git apply` of ``patch``: equal trees, equal patched files."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        base = ["git", f"--git-dir={repo}"]
        subprocess.run([*base, "read-tree", f"v{version}"], env=env, check=True)
        applied = subprocess.run(
            [*base, "apply", "--cached", str(patch)], env=env, capture_output=True, check=False
        )
        if applied.returncode != 0:
            return None
        tree = subprocess.run(
            [*base, "write-tree"], env=env, capture_output=True, text=True, check=True
        )
        return tree.stdout.strip()


def _variants_at(spec: dict[str, Any], version: str, family: str) -> list[str]:
    return [
        p["file"]
        for p in spec["patches"]
        if family in p["file"] and Version(version) in SpecifierSet(p.get("when") or "")
    ]


def test_pr_24436_is_upstream_from_0_5_12(chain: Chain) -> None:
    pr = _items(chain.payloads["0.5.13"])["#24436"]
    assert pr["status_from"] == "upstream"  # on 0.5.12 itself
    assert pr["action"] == "upstream" and "already upstream in v0.5.12" in pr["detail"]
    spec_pr = chain.spec()["prs"][0]
    assert spec_pr == {"number": 24436, "when": "<0.5.13"}  # the shipped spec's range


def test_draft_memory_leaves_from_0_5_14_as_the_spec_says(chain: Chain) -> None:
    assert _items(chain.payloads["0.5.13"])[DRAFT]["action"] == "keep"
    preview = chain.run(
        "bump", "sglang", "--to", "v0.5.14", "--from", "sglang-0.5.13-spark", "--json"
    )
    draft = _items(json.loads(preview.stdout))[DRAFT]
    assert draft["status_from"] == "applied"
    assert draft["status_to"] == "out-of-range" and draft["action"] == "follow-range"
    assert "it no longer applies to v0.5.14 either" in draft["detail"]  # upstream reworked it
    assert _items(chain.payloads["0.5.17"])[DRAFT]["status_to"] == "out-of-range"
    assert "sglang-0.5.14-spark" not in chain.spec()["builds"]  # a preview writes nothing


def test_every_step_is_ready_locked_and_one_variant_per_release(chain: Chain) -> None:
    lock = yaml.safe_load((chain.project / "images.lock").read_text())
    for version in STEPS:
        payload = chain.payloads[version]
        assert payload["ready"], (version, payload["items"], payload["notes"])
        assert f"sglang-{version}-spark" in payload["locked"]
        assert lock["builds"][f"sglang-{version}-spark"]["source"]["ref"] == f"v{version}"
    check = chain.run("lock", "--check")
    assert check.exit_code == 0, check.output
    spec = chain.spec()
    for version in ALL_RELEASES:
        if Version(version) >= Version("0.5.12"):
            assert len(_variants_at(spec, version, "reserved-tokens-none")) == 1, version
    assert (chain.project / "builds/sglang.yaml").read_text().startswith("# SGLang for DGX")


def test_regenerated_variants_are_named_after_the_file_they_patch(chain: Chain) -> None:
    """0.5.17 moved the reserved-token expression from tokenizer_manager.py to
    managers/utils.py: bump's variants then carry the shipped names, and the moved one says
    that its description was written for the old file."""
    regenerated = {
        version: d["variant_file"]
        for version, payload in chain.payloads.items()
        for d in payload["items"]
        if d["action"] == "regenerated" and "reserved-tokens-none" in d["id"]
    }
    assert regenerated == {
        "0.5.13": "patches/sglang/reserved-tokens-none-tokenizer-manager-0.5.13.patch",
        "0.5.17": "patches/sglang/reserved-tokens-none-utils-0.5.17.patch",
        "0.5.18": "patches/sglang/reserved-tokens-none-utils-0.5.18.patch",
    }
    for name in regenerated.values():
        assert (SHIPPED / Path(name).name).exists(), f"{name} is not a shipped name"
    moved = (chain.project / regenerated["0.5.17"]).read_text()
    note = (
        "Now patches python/sglang/srt/managers/utils.py: carried by sparkbuild bump from "
        "patches/sglang/reserved-tokens-none-tokenizer-manager-0.5.13.patch "
        "(python/sglang/srt/managers/tokenizer_manager.py); re-read the description above."
    )
    assert note in moved and moved.index(note) < moved.index("diff --git")
    # Same file as the variant it came from: no new note, and the name keeps its file part.
    same_file = (chain.project / regenerated["0.5.13"]).read_text()
    assert "Now patches" not in same_file


def test_the_defaults_fix_is_reported_as_a_conflict_with_its_reason(
    defaults_chain: Chain,
) -> None:
    """Its 0.5.13 form lives in a new function (`_handle_frozen_kv_mtp`): no strategy can carry
    a pure insertion into code that moved, so bump must say so and leave the build not ready."""
    payload = defaults_chain.payloads["0.5.13"]
    item = _items(payload)[SD12]
    assert item["action"] == "conflict" and not payload["ready"]
    assert "a pure insertion has no old lines to find" in item["detail"]
    reports = list((defaults_chain.project / "patches/sglang/conflicts").rglob("*.md"))
    assert reports and "git apply --3way" in reports[0].read_text()


def test_every_shipped_variant_is_regenerated_or_reported(
    chain: Chain, defaults_chain: Chain, test_cache: Path
) -> None:
    repo = sglang_release_repo(test_cache, ALL_RELEASES)
    chains = [chain, defaults_chain]
    regenerated = {
        d["variant_file"]: (version, d["strategy"])
        for c in chains
        for version, payload in c.payloads.items()
        for d in payload["items"]
        if d["action"] == "regenerated"
    }
    conflicts = [
        (version, d["id"], d["detail"])
        for c in chains
        for version, payload in c.payloads.items()
        for d in payload["items"]
        if d["action"] == "conflict"
    ]
    tally: dict[str, list[str]] = {"equivalent": [], "conflict": []}
    shipped_variants = sorted(SHIPPED.glob("*.patch"))
    unknown = [p.name for p in shipped_variants if not p.name.startswith(FAMILIES + NO_0_5_12_FORM)]
    assert not unknown, f"shipped patches of no known family: {unknown}"
    for shipped in shipped_variants:
        if shipped.name.startswith(NO_0_5_12_FORM):
            continue
        family = next(f for f in FAMILIES if shipped.name.startswith(f))
        versions = [
            v
            for v in ALL_RELEASES
            if Version(v) >= Version("0.5.12") and Version(v) in patch_when(shipped)
        ]
        carrier = defaults_chain if family == "speculative-defaults" else chain
        spec = carrier.spec()
        same = True
        for version in versions:
            ours_at = _variants_at(spec, version, family)
            if not ours_at:  # bump reported a conflict before this release
                same = False
                break
            (ours,) = ours_at
            expected = _patched_tree(repo, version, shipped)
            assert expected is not None, (shipped.name, version)
            same &= _patched_tree(repo, version, carrier.project / ours) == expected
        if same:
            tally["equivalent"].append(shipped.name)
        else:
            # the family's conflict, reported at or before this variant's first release
            reported = [
                c for c in conflicts if family in c[1] and Version(c[0]) <= Version(versions[0])
            ]
            assert reported and all(c[2] for c in reported), (shipped.name, versions)
            tally["conflict"].append(shipped.name)
    print("bump chain tally:", json.dumps(tally), "regenerated:", json.dumps(regenerated))
    # Pinned: the reserved-token and draft-memory families carry over (5 variants, 3 of them
    # regenerated); the speculative-defaults fix moved into a new function at 0.5.13, which bump
    # reports as a conflict with its reason (its 0.5.12 form is the starting point).
    assert [c[1] for c in conflicts] == [f"patches/sglang/{SD12}"], conflicts
    assert len(tally["equivalent"]) == 6, tally
    assert sorted(tally["conflict"]) == [
        "speculative-defaults-frozen-kv-mtp-hook-0.5.13.patch",
        "speculative-defaults-frozen-kv-mtp-hook-0.5.14.patch",
        "speculative-defaults-frozen-kv-mtp-hook-0.5.19.patch",
    ], tally
    strategies = sorted(strategy for _, strategy in regenerated.values())
    assert strategies == ["moved code", "token merge", "token merge"], regenerated
