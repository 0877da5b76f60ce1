"""One shape for stage results: frozen dataclasses, serialised one way (``to_json``, from
their fields through ``jsontext.plain`` where the JSON is the fields), their JSON unchanged."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pydantic import BaseModel

from sparkbuild.bench.claims_report import Difference
from sparkbuild.bump.items import BumpPlan, Decision
from sparkbuild.engines.recipes import CarryNote
from sparkbuild.image.build import ImageResult
from sparkbuild.jsontext import JSON, Fields, plain
from sparkbuild.preflight.report import PreflightReport
from sparkbuild.publish.push import PublishResult
from sparkbuild.publish.rollback import RollbackResult
from sparkbuild.report.site import Page, ReportResult
from sparkbuild.requirements import RequirementReport
from sparkbuild.smoke.runner import SmokeResult
from sparkbuild.source.items import PreparedSource

STAGE_RESULTS = [
    PreparedSource,
    RequirementReport,
    ImageResult,
    PreflightReport,
    SmokeResult,
    PublishResult,
    RollbackResult,
    ReportResult,
    BumpPlan,
]


@pytest.mark.parametrize("result", STAGE_RESULTS, ids=lambda cls: cls.__name__)
def test_every_stage_result_is_a_frozen_dataclass(result: type) -> None:
    assert dataclasses.is_dataclass(result)
    assert result.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_a_smoke_and_a_publish_result_cannot_change() -> None:
    published = PublishResult("b", "reg/x", "t", "sha256:" + "a" * 64, "sha256:i", True, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        published.pushed = False  # type: ignore[misc]
    smoke = SmokeResult("pass", "p", "vllm", "m", "url", "http://x", None, None, [])
    with pytest.raises(dataclasses.FrozenInstanceError):
        smoke.verdict = "fail"  # type: ignore[misc]


def test_results_whose_json_is_their_fields_keep_their_shape() -> None:
    rollback = RollbackResult("b", "reg/x", "sha256:new", "sha256:old", ["latest"])
    assert rollback.to_json() == {
        "build": "b",
        "repository": "reg/x",
        "from": "sha256:new",
        "to": "sha256:old",
        "aliases": ["latest"],
    }
    assert list(Page("build", "b.html", "b").to_json()) == ["kind", "path", "build"]
    assert CarryNote("--x", "dropped", "why").to_json() == {
        "item": "--x",
        "status": "dropped",
        "detail": "why",
    }
    assert Difference("tp", "2", "1").to_json() == {"setting": "tp", "claim": "2", "run": "1"}
    decision = Decision("pr", "#1", "spec", 0, "applied", "applied", "keep", "applies")
    assert decision.to_json() == {
        f.name: getattr(decision, f.name) for f in dataclasses.fields(decision)
    }


class _Model(BaseModel):
    where: Path


@dataclasses.dataclass(frozen=True)
class _Probe(Fields):
    name: str
    path: Path
    items: tuple[_Model, ...]
    renamed: int = dataclasses.field(default=1, metadata={JSON: "as"})
    hidden: bytes = dataclasses.field(default=b"x", metadata={JSON: None})


def test_plain_is_the_one_way_a_result_becomes_json() -> None:
    probe = _Probe("n", Path("/a/b"), (_Model(where=Path("/c")),))
    assert probe.to_json() == {"name": "n", "path": "/a/b", "items": [{"where": "/c"}], "as": 1}
    assert plain({"k": (probe.path,)}) == {"k": ["/a/b"]}
    with pytest.raises(AssertionError, match="is not a dataclass"):
        type("NotADataclass", (Fields,), {})().to_json()
