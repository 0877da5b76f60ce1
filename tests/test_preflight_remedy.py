"""A profile the engine refuses names the flags that fix it, after the engine's own words.

The refusal is SGLang 0.5.12's own text, read from its wheel (server_args.py): speculative
decoding on a hybrid (GDN) model with the radix cache on and the no_buffer mamba strategy.
"""

from __future__ import annotations

import re
import zipfile

import pytest

from sparkbuild.checks import CheckResult
from sparkbuild.preflight.stage import with_remedy
from tests.support.cache import shared_test_cache
from tests.support.sglang_releases import download_wheel

pytestmark = pytest.mark.upstream


def _refusal() -> str:
    wheel = download_wheel("0.5.12", shared_test_cache())
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read("sglang/srt/server_args.py").decode()
    found = re.search(
        r'f"(Speculative decoding for \{model_arch\} is not compatible with radix[^"]+)"', text
    )
    assert found, "0.5.12 server_args.py changed shape"
    return found.group(1).replace("{model_arch}", "Qwen3_5ForConditionalGeneration")


def test_engine_refusal_names_the_flags_that_fix_it() -> None:
    engine_words = (
        f"building the server config from the profile flags does not load: ValueError: {_refusal()}"
    )
    checked = with_remedy(CheckResult("config", "fail", engine_words), "sglang")
    assert checked.detail.startswith(engine_words)  # the engine's own message first
    assert "fix: pass --disable-radix-cache" in checked.detail
    assert "--mamba-scheduler-strategy extra_buffer with SGLANG_ENABLE_SPEC_V2=1" in checked.detail
    # A pass, or a failure with its own fix, is left as it is.
    assert with_remedy(CheckResult("config", "pass", engine_words), "sglang").detail == engine_words
    own = f"{engine_words}; fix: something else"
    assert with_remedy(CheckResult("config", "fail", own), "sglang").detail == own
