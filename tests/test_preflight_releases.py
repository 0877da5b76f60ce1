"""Preflight against the real SGLang release files (0.5.11, 0.5.12, 0.5.17, 0.5.23).

Each of the four problems shipped before preflight existed fails preflight with a message
naming the cause and the fix, and passes with the content fix:

1. the Gemma-4 drafter's config (model type ``gemma4_assistant``) does not load with the
   release's ``transformers==5.6.0`` (0.5.12), and loads with the build's pin;
2. ``SGLANG_ENABLE_NAN_LOGITS_CHECK`` is read only by 0.5.23 (the env check names the switch
   each release reads);
3. ``sglang:spec_verify_calls_total`` is absent before 0.5.13 (signals check);
4. with the speculative counts unset, the reserved-token patch alone leaves 0.5.12's
   FROZEN_KV_MTP settings None (config check), and the speculative-defaults patch fills them.

Plus a PR stand-in whose new module imports a name 0.5.12 lacks (imports check).

The source stage prepares each build from a local git repository of the real releases; the
probe runs in a venv with each release's own dependencies (tests/support/preflight_env.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkbuild.adapters.sglang import SglangAdapter
from sparkbuild.preflight import PreflightReport
from tests.support.preflight_env import Project

pytestmark = pytest.mark.upstream

# The Gemma-4 MTP profile as it shipped before preflight: it names the NaN switch itself.
GEMMA_AS_SHIPPED = """\
engine: sglang
model: google/gemma-4-31B-it
args: [--speculative-algorithm, NEXTN, --speculative-draft-model-path,
       google/gemma-4-31B-it-assistant, --speculative-num-steps, "3",
       --speculative-eagle-topk, "1", --speculative-num-draft-tokens, "4",
       --attention-backend, triton, --mem-fraction-static, "0.85", --enable-metrics]
env: {SGLANG_ENABLE_NAN_LOGITS_CHECK: "1"}
expect: {nan_switch: false}
"""
# The content fix: no variable in the profile; the smoke stage adds what the version reads.
GEMMA_FIXED = GEMMA_AS_SHIPPED.replace(
    'env: {SGLANG_ENABLE_NAN_LOGITS_CHECK: "1"}\nexpect: {nan_switch: false}\n', ""
)
# The same launch with the speculative counts left to the engine.
GEMMA_NO_COUNTS = """\
engine: sglang
model: google/gemma-4-31B-it
args: [--speculative-algorithm, NEXTN, --speculative-draft-model-path,
       google/gemma-4-31B-it-assistant, --attention-backend, triton]
"""
TM_FIX = "patches/sglang/reserved-tokens-none-tokenizer-manager-0.5.12.patch"
DEFAULTS_FIX = "patches/sglang/speculative-defaults-frozen-kv-mtp-server-args-0.5.12.patch"
TRANSFORMERS_PIN = {"req": "transformers==5.8.1", "override": True}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("preflight-cache")  # one mirror for the module's projects


@pytest.fixture
def project(tmp_path: Path, cache: Path) -> Project:
    project = Project(tmp_path / "project", cache)
    project.write_profile("gemma-as-shipped", GEMMA_AS_SHIPPED)
    project.write_profile("gemma-fixed", GEMMA_FIXED)
    project.write_profile("gemma-no-counts", GEMMA_NO_COUNTS)
    return project


def _check(report: PreflightReport, profile: str | None, name: str) -> tuple[str, str]:
    if profile is None:
        found = next(c for c in report.package_checks if c.name == name)
    else:
        found = next(
            c for p in report.profiles if p.profile == profile for c in p.checks if c.name == name
        )
    return found.status, found.detail


@pytest.mark.parametrize(
    ("version", "reads"),
    [
        ("0.5.11", "SGLANG_SPEC_NAN_DETECTION"),
        ("0.5.12", "SGLANG_SPEC_NAN_DETECTION"),
        ("0.5.17", "SGLANG_SANITIZE_NAN_LOGITS"),
        ("0.5.23", None),
    ],
)
def test_nan_switch_is_checked_against_what_each_release_reads(
    project: Project, version: str, reads: str | None
) -> None:
    project.write_builds({"b": {"ref": f"v{version}"}})
    report = project.preflight(
        "b", ["gemma-as-shipped", "gemma-fixed"], venv=False, checks=("env",)
    )
    status, detail = _check(report, "gemma-as-shipped", "env")
    if reads is None:
        assert status == "pass", detail
    else:
        assert status == "fail"
        assert "SGLANG_ENABLE_NAN_LOGITS_CHECK is never read by this version" in detail
        assert f"it reads {reads}" in detail and "set the switch this version reads" in detail
    # The fix: the smoke stage sets the variable this version reads, and preflight sees it.
    fixed_status, fixed_detail = _check(report, "gemma-fixed", "env")
    assert fixed_status == "pass", fixed_detail


@pytest.mark.parametrize(("version", "present"), [("0.5.12", False), ("0.5.17", True)])
def test_verify_counter_is_a_signal_only_where_the_release_has_it(
    project: Project, version: str, present: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    project.write_builds({"b": {"ref": f"v{version}"}})
    # As shipped, the adapter relied on its counter constants for every version.
    monkeypatch.delattr(SglangAdapter, "preflight_signals", raising=False)
    status, detail = _check(
        project.preflight("b", [], venv=False, checks=("signals",)), None, "signals"
    )
    if present:
        assert status == "pass", detail
    else:
        assert status == "fail"
        assert "metric sglang:spec_verify_calls_total" in detail and "fix:" in detail
    monkeypatch.undo()
    # The content fix: the adapter declares per version what it relies on.
    status, detail = _check(
        project.preflight("b", [], venv=False, checks=("signals",)), None, "signals"
    )
    assert status == "pass", detail


@pytest.mark.engine  # the probe runs in the release's venv
@pytest.mark.parametrize("version", ["0.5.11", "0.5.12"])
def test_gemma4_drafter_cannot_load_with_the_release_transformers(
    project: Project, version: str
) -> None:
    project.write_builds({"release-pins": {"ref": f"v{version}"}})
    report = project.preflight("release-pins", ["gemma-fixed"], checks=("config",))
    status, detail = _check(report, "gemma-fixed", "config")
    assert report.versions["transformers"] == "5.6.0"
    assert status == "fail"
    assert "model type 'gemma4_assistant'" in detail and "transformers 5.6.0" in detail
    assert "fix: pin transformers>=5.8.0" in detail and "requirements" in detail


@pytest.mark.engine  # the probe runs in the release's venv
def test_gemma4_drafter_needs_a_newer_transformers_than_0_5_12_pins(project: Project) -> None:
    project.write_builds(
        {"release-pins": {"ref": "v0.5.12"}, "pinned": {"ref": "v0.5.12"}},
    )
    report = project.preflight("release-pins", ["gemma-fixed"], checks=("config",))
    status, detail = _check(report, "gemma-fixed", "config")
    assert report.versions["transformers"] == "5.6.0"
    assert status == "fail"
    assert "model type 'gemma4_assistant'" in detail and "transformers 5.6.0" in detail
    assert "fix: pin transformers>=5.8.0" in detail and "requirements" in detail
    # The content fix: the build pins transformers 5.8.1 on top of the release's pins.
    project.write_builds(
        {"pinned": {"ref": "v0.5.12", "patches": [{"file": TM_FIX}, {"file": DEFAULTS_FIX}]}},
        requirements=[TRANSFORMERS_PIN],
    )
    fixed = project.preflight("pinned", ["gemma-fixed"], checks=("config",))
    status, detail = _check(fixed, "gemma-fixed", "config")
    assert fixed.versions["transformers"] == "5.8.1"
    assert status == "pass", detail


@pytest.mark.engine  # the probe runs in the release's venv
def test_reserved_token_fix_alone_only_moves_the_crash_on_0_5_12(project: Project) -> None:
    project.write_builds(
        {"tm-fix-only": {"ref": "v0.5.12", "patches": [{"file": TM_FIX}]}},
        requirements=[TRANSFORMERS_PIN],
    )
    report = project.preflight("tm-fix-only", ["gemma-no-counts"], checks=("config",))
    status, detail = _check(report, "gemma-no-counts", "config")
    assert status == "fail"
    assert "FROZEN_KV_MTP leaves" in detail and "speculative_num_draft_tokens=None" in detail
    assert (
        "srt/managers/tokenizer_manager.py" in detail
        and "speculative_num_draft_tokens - 1" in detail
    )
    assert "srt/speculative/frozen_kv_mtp_worker.py" in detail and "* self.topk" in detail
    assert "fix: fill the defaults" in detail
    # The content fix: the speculative-defaults patch fills them where FROZEN_KV_MTP is set up.
    project.write_builds(
        {"fixed": {"ref": "v0.5.12", "patches": [{"file": TM_FIX}, {"file": DEFAULTS_FIX}]}},
        requirements=[TRANSFORMERS_PIN],
    )
    fixed = project.preflight("fixed", ["gemma-no-counts"], checks=("config",))
    status, detail = _check(fixed, "gemma-no-counts", "config")
    assert status == "pass", detail
    assert "speculative_eagle_topk': 1" in str(fixed.to_json())


NEW_MODULE = "python/sglang/srt/speculative/reserved_budget.py"
STANDIN_PATCH = f"""\
A PR stand-in: a new module that needs a helper first released in 0.5.17.
diff --git a/{NEW_MODULE} b/{NEW_MODULE}
new file mode 100644
--- /dev/null
+++ b/{NEW_MODULE}
@@ -0,0 +1,5 @@
+from sglang.srt.managers.utils import compute_num_reserved_tokens
+
+
+def reserved_budget(server_args):
+    return compute_num_reserved_tokens(server_args)
"""


@pytest.mark.engine  # the probe runs in the release's venv
def test_pr_standin_needing_a_newer_helper_fails_imports(project: Project) -> None:
    patch = project.patch("reserved-budget.patch", STANDIN_PATCH)
    project.write_builds({"standin": {"ref": "v0.5.12", "patches": [{"file": patch}]}})
    report = project.preflight("standin", [], checks=("compile", "imports"))
    assert _check(report, None, "compile")[0] == "pass"
    status, detail = _check(report, None, "imports")
    assert status == "fail"
    assert "sglang.srt.speculative.reserved_budget" in detail
    assert "'compute_num_reserved_tokens'" in detail and "sglang.srt.managers.utils" in detail


# The seed's launch line starts `--tp 1`: argparse's abbreviation of --tp-size, which
# SGLang's own launch parser (prepare_server_args) accepts; `--speculative-algo` likewise.
ABBREVIATED = """\
engine: sglang
model: Qwen/Qwen3.6-27B-FP8
args: [--tp, "1", --speculative-algo, NEXTN, --mem-fraction-static, "0.82", --trust-remote-code]
"""
MISSPELT = """\
engine: sglang
model: Qwen/Qwen3.6-27B-FP8
args: [--tp-sise, "1", --trust-remote-code]
"""
BAD_CHOICE = """\
engine: sglang
model: Qwen/Qwen3.6-27B-FP8
args: [--attention-backend, tritonn]
"""


@pytest.mark.engine  # the release's own parser, in the release's venv
def test_flags_are_judged_by_the_engines_launch_parser(project: Project) -> None:
    project.write_profile("abbreviated", ABBREVIATED)
    project.write_profile("misspelt", MISSPELT)
    project.write_profile("bad-choice", BAD_CHOICE)
    project.write_builds({"b": {"ref": "v0.5.12"}})
    report = project.preflight("b", ["abbreviated", "misspelt", "bad-choice"], checks=("flags",))
    status, detail = _check(report, "abbreviated", "flags")
    assert status == "pass", detail
    assert "note: --tp is accepted as --tp-size" in detail
    assert "note: --speculative-algo is accepted as --speculative-algorithm" in detail
    # A flag the engine rejects fails with the engine's own message, and our nearest names.
    status, detail = _check(report, "misspelt", "flags")
    assert status == "fail"
    assert "sglang serve: error: unrecognized arguments: --tp-sise" in detail
    assert "--tp-sise: nearest --tp-size" in detail
    status, detail = _check(report, "bad-choice", "flags")
    assert status == "fail"
    assert "argument --attention-backend: invalid choice: 'tritonn'" in detail
