"""Version-true NaN switches and signals, checked against every real SGLang release.

The table in sparkbuild/adapters/sglang.py is checked against each release's own
``srt/environ.py``, ``srt/server_args.py`` and metrics collector from its PyPI wheel.
The profiles as shipped before (``SGLANG_ENABLE_NAN_LOGITS_CHECK`` for every build) set a
variable 0.5.11 and 0.5.12 ignore, and the smoke stage counted on a metric those releases
lack; the tests show both are refused or avoided now, for every shipped build and profile.
"""

from __future__ import annotations

import dataclasses
import io
import re
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version
from rich.console import Console

from sparkbuild.adapters import Counters, sglang, versions
from sparkbuild.adapters.sglang import SglangAdapter
from sparkbuild.checks import CheckResult
from sparkbuild.engines.launch import with_nan_switch
from sparkbuild.engines.profiles import load_profile
from sparkbuild.errors import UsageError
from sparkbuild.settings import Settings
from sparkbuild.smoke import report
from sparkbuild.smoke.record import smoke_record
from sparkbuild.smoke.runner import SmokeResult
from sparkbuild.spec import load_builds
from tests.support.sglang_releases import ALL_RELEASES, download_wheel

ROOT = Path(__file__).resolve().parent.parent
AS_SHIPPED_BEFORE = {"SGLANG_ENABLE_NAN_LOGITS_CHECK": "1"}


def _release_text(test_cache: Path, version: str, suffix: str) -> str:
    with zipfile.ZipFile(download_wheel(version, test_cache)) as wheel:
        names = [n for n in wheel.namelist() if n.endswith(suffix)]
        return "".join(wheel.read(n).decode() for n in names)


def _reads(environ: str, name: str) -> bool:
    return re.search(rf"^\s+{name}\s*=\s*Env", environ, re.MULTILINE) is not None


@pytest.mark.upstream
@pytest.mark.parametrize("version", ALL_RELEASES)
def test_nan_switch_and_variables_match_the_release(test_cache: Path, version: str) -> None:
    environ = _release_text(test_cache, version, "sglang/srt/environ.py")
    server_args = _release_text(test_cache, version, "sglang/srt/server_args.py")
    switch = sglang.nan_switch_of(Version(version))
    for name in switch.env:
        assert _reads(environ, name), f"{version} does not read {name}"
    for flag in switch.args:
        assert f'"{flag}"' in server_args, f"{version} has no {flag}"
    for name in sglang.NAN_VARIABLES:
        ignored = sglang.ignored_variables_of(Version(version), {name: "1"})
        assert (ignored == []) == _reads(environ, name), (version, name)


@pytest.mark.upstream
@pytest.mark.parametrize("version", ALL_RELEASES)
def test_signals_exist_in_the_release(test_cache: Path, version: str) -> None:
    source = _release_text(test_cache, version, ".py")
    has_counter = f'"{SglangAdapter.VERIFY_CALLS}"' in source
    assert sglang.has_verify_counter(Version(version)) == has_counter, version
    for signal in SglangAdapter.preflight_signals(version):
        assert f'"{signal["name"]}"' in source, (version, signal)


@pytest.mark.upstream
def test_profiles_set_only_what_each_shipped_build_reads(test_cache: Path, tmp_path: Path) -> None:
    settings = Settings(project_dir=ROOT, cache_dir=tmp_path)
    old_ignored = set()
    for build in load_builds(settings).values():
        if build.engine != "sglang":
            continue
        version = str(build.version)
        environ = _release_text(test_cache, version, "sglang/srt/environ.py")
        server_args = _release_text(test_cache, version, "sglang/srt/server_args.py")
        adapter = SglangAdapter(version=build.version)
        if not _reads(environ, "SGLANG_ENABLE_NAN_LOGITS_CHECK"):
            old_ignored.add(version)  # the profiles as shipped before set it anyway
            assert adapter.ignored_variables(AS_SHIPPED_BEFORE) == list(AS_SHIPPED_BEFORE)
        for name in build.smoke_profiles:
            _, profile = load_profile(settings, name, model="/models/x")
            assert not set(profile.env) & sglang.NAN_VARIABLES, name
            if adapter.ignored_variables(AS_SHIPPED_BEFORE):
                before = profile.model_copy(update={"env": AS_SHIPPED_BEFORE})
                with pytest.raises(UsageError, match="does not read"):
                    with_nan_switch(before, adapter)
            launched = with_nan_switch(profile, adapter)
            assert launched.env, f"{build.name}/{name}: no NaN switch set"
            for variable in launched.env:
                assert _reads(environ, variable), (build.name, name, variable)
            for flag in set(launched.args) - set(profile.args):
                assert f'"{flag}"' in server_args, (build.name, name, flag)
    assert old_ignored == {"0.5.11", "0.5.12"}


def test_adapter_never_relies_on_the_verify_counter_before_0_5_13() -> None:
    counters = Counters({"sglang:generation_tokens_total": 100.0})
    before = Counters({"sglang:generation_tokens_total": 0.0})
    old = SglangAdapter(version=Version("0.5.12")).acceptance_from_delta(before, counters)
    assert not old.active and "first in 0.5.13" in old.detail
    names = {s["name"] for s in SglangAdapter.preflight_signals("0.5.12")}
    assert SglangAdapter.VERIFY_CALLS not in names
    assert SglangAdapter.VERIFY_CALLS in {
        s["name"] for s in SglangAdapter.preflight_signals("0.5.13")
    }


def test_smoke_report_says_which_nan_signal_was_active() -> None:
    adapter = SglangAdapter(version=Version("0.5.12"))
    signal = adapter.nan_switch().describe()
    result = SmokeResult(
        verdict="pass",
        profile="p",
        engine="sglang",
        model="m",
        target_kind="image",
        target="img",
        boot_seconds=1.0,
        accept_len=2.0,
        checks=[CheckResult("nan", "pass", "no NaN", value=0)],
        engine_version="0.5.12",
        nan_signal=signal,
    )
    assert "SGLANG_SPEC_NAN_DETECTION=1" in result.to_json()["nan_signal"]
    assert smoke_record(result).nan_signal == signal
    out = io.StringIO()
    report.render(result, Console(file=out, width=200))
    assert "NaN signal (sglang 0.5.12): SGLANG_SPEC_NAN_DETECTION=1" in out.getvalue()


def test_engine_version_option_is_validated() -> None:
    from sparkbuild.smoke.stage import engine_version as _engine_version

    assert _engine_version("v0.5.12.post1", None) == Version("0.5.12.post1")
    assert _engine_version(None, None) is None
    with pytest.raises(UsageError, match="not a version"):
        _engine_version("latest", None)
    assert sglang.nan_switch_of(None) is versions.UNKNOWN_VERSION
    assert not versions.UNKNOWN_VERSION.active


@pytest.mark.parametrize(
    ("declared", "served", "apart"),
    [
        ("0.33.0", "0.32.0", True),  # the offline demo: labelled 0.33.0, vLLM 0.32.0 answered
        ("0.5.12", "0.5.12.post1", True),
        ("0.32.0", "0.32.0+cpu", False),  # a local tag is the same release
        ("v0.5.12", "0.5.12", False),
        ("0.32.0", None, False),  # nothing to compare
        ("nightly", "0.32.0", True),  # an unparsable label still differs
    ],
)
def test_declared_and_served_versions_are_compared_by_release(
    declared: str, served: str | None, apart: bool
) -> None:
    assert versions.disagree(declared, served) is apart


def test_a_disagreeing_server_version_is_kept_beside_the_label_and_flagged() -> None:
    result = SmokeResult(
        verdict="pass",
        profile="p",
        engine="vllm",
        model="m",
        target_kind="image",
        target="img",
        boot_seconds=1.0,
        accept_len=2.0,
        checks=[],
        engine_version="0.33.0",
        served_version="0.32.0",
    )
    record = smoke_record(result)
    assert (record.engine_version, record.served_version) == ("0.33.0", "0.32.0")
    assert record.versions_disagree and result.to_json()["versions_disagree"] is True
    out = io.StringIO()
    report.render(result, Console(file=out, width=200))
    assert "the image says 0.33.0, the engine that answered reported 0.32.0" in out.getvalue()
    agreeing = dataclasses.replace(result, served_version="0.33.0")
    out = io.StringIO()
    report.render(agreeing, Console(file=out, width=200))
    assert "answered reported" not in out.getvalue()
