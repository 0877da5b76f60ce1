"""The report's pages in a real browser: headless Chromium loads each page from the file
system and the test reads what it shows.

The report is built by the real CLI (`sparkbuild report`, `report --diff`) from the lock
tests/support/report_project.py writes: `sparkbuild lock` over a local upstream for the
source; the image, requirements and publish sections as those stages write them (the
models, since building an arm64 image and pushing it take minutes); preflight, smoke and
bench records through each stage's own recorder, from result objects (booting vLLM would
cost a minute). Screenshots of the index and a build page at 1280 and 390 px wide are kept
under pytest's temporary directory; the test prints where.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import chromium, open_page, screenshot
from tests.support.gitrepos import make_upstream
from tests.support.report_project import (
    DECODE_CLIENT,
    DIGEST_1,
    DIGEST_2,
    HOSTILE_ENGINE,
    HOSTILE_LABEL,
    HOSTILE_TAG,
    IMAGE_1,
    IMAGE_2,
    REPOSITORY,
    SECRET,
    make_report_project,
)

pytestmark = pytest.mark.chromium

Cell = tuple[str, str, str | None]  # build, stage, profile or repository
EXPECTED: dict[Cell, tuple[str, str]] = {  # -> (verdict, tone)
    ("pkg-new", "source", None): ("locked", "good"),
    ("pkg-new", "image", None): ("built", "good"),
    ("pkg-new", "preflight", None): ("pass", "good"),
    ("pkg-new", "smoke", "cpu-reference"): ("pass", "good"),
    ("pkg-new", "smoke", "cpu-url"): ("pass", "warn"),
    ("pkg-new", "bench", "cpu-reference"): ("measured", "warn"),
    ("pkg-new", "publish", REPOSITORY): ("published", "good"),
    ("pkg-old", "source", None): ("locked", "good"),
    ("pkg-old", "image", None): ("built", "stale"),
    ("pkg-old", "preflight", None): ("missing", "bad"),
    ("pkg-old", "smoke", "cpu-reference"): ("missing", "bad"),
    ("pkg-old", "bench", None): ("not run", "none"),
    ("pkg-old", "publish", None): ("not published", "none"),
}


@dataclass(frozen=True)
class Site:
    out: Path
    diff: Path  # the `report --diff pkg-new@HEAD~1 pkg-new` page

    def page(self, relative: str) -> Path:
        return self.out / relative


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    root = tmp_path_factory.mktemp("report-browser")
    project = make_report_project(root, make_upstream(root / "upstream"))
    out = root / "site"
    made = project.run("report", "--out", str(out), "--bench-runs", str(project.runs))
    assert made.exit_code == 0, made.output
    diff = project.run("report", "--diff", "pkg-new@HEAD~1", "pkg-new", "--out", str(root))
    assert diff.exit_code == 0, diff.output
    return Site(out, root / "diff" / "pkg-new_HEAD_1--pkg-new.html")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def _by_css(scope: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(scope.find_elements(By.CSS_SELECTOR, selector))


def _load(browser: Any, page: Path, width: int = 1280) -> None:
    errors = open_page(browser, page, width)
    assert errors == [], f"{page.name}: console errors: {errors}"


def check_index(browser: Any, index: Path) -> None:
    """Every expected cell shows its verdict as text; red and stale cells look it."""
    _load(browser, index)
    rows = {r.get_attribute("data-build"): r for r in _by_css(browser, "#matrix tbody tr")}
    assert set(rows) == {"pkg-new", "pkg-old"}
    backgrounds: dict[str, set[str]] = {}
    for (build, stage, label), (verdict, tone) in EXPECTED.items():
        cells = _by_css(rows[build], f'td[data-stage="{stage}"] .cell')
        found = [c for c in cells if c.get_attribute("data-label") == label]
        assert found, f"{build}/{stage}/{label}: no cell"
        shown = found[0].find_element("css selector", ".verdict").text
        assert verdict in shown, f"{build}/{stage}/{label}: shows {shown!r}, not {verdict!r}"
        assert found[0].get_attribute("data-tone") == tone, (build, stage, label)
        backgrounds.setdefault(tone, set()).add(found[0].value_of_css_property("background-color"))
        if tone == "stale":
            assert found[0].value_of_css_property("border-top-style") == "dashed"
            assert "STALE" in found[0].text.upper()
    assert all(len(colours) == 1 for colours in backgrounds.values()), backgrounds
    assert len({next(iter(c)) for c in backgrounds.values()}) == len(backgrounds)  # distinct
    verified = _by_css(rows["pkg-new"], 'td[data-stage="smoke"] .tag-verified')
    assert [v.text.lower() for v in verified] == ["verified"]


def test_the_index_shows_every_build_stage_and_verdict(browser: Any, site: Site) -> None:
    check_index(browser, site.page("index.html"))
    old = _by_css(browser, 'tr[data-build="pkg-old"]')[0]
    assert "stands-out" in (old.get_attribute("class") or "")


def test_the_index_check_fails_when_a_verdict_is_removed(
    browser: Any, site: Site, tmp_path: Path
) -> None:
    html = site.page("index.html").read_text()
    start = html.index('data-label="cpu-reference"')  # pkg-new's row comes first
    cell, rest = html[start:].split("</div>", 1)
    stripped = re.sub(r"(<span class=\"verdict\">.*?</span>) pass</span>", r"\1</span>", cell)
    assert stripped != cell
    broken = tmp_path / "index.html"
    broken.write_text(html[:start] + stripped + "</div>" + rest)
    with pytest.raises(AssertionError, match=r"pkg-new/smoke/cpu-reference: shows '✓', not 'pass'"):
        check_index(browser, broken)


def test_a_build_page_has_source_image_verdicts_and_figures(browser: Any, site: Site) -> None:
    _load(browser, site.page("builds/pkg-new.html"))
    prs = {r.get_attribute("data-pr"): r.text for r in _by_css(browser, "#prs tbody tr")}
    assert set(prs) == {"101", "103", "104"} and "upstream" in prs["101"]
    links = [a.get_attribute("href") for a in _by_css(browser, "#prs a")]
    assert links == []  # a local upstream has no web page: numbers, not dead links
    patch = _by_css(browser, '#patches tr[data-patch="patches/pkg/alpha.patch"]')[0].text
    assert "keep gamma 9 <em>stable</em> on the Spark" in patch and "any" in patch
    assert "demo-kernels" in _by_css(browser, "#wheels")[0].text
    assert IMAGE_2 in _by_css(browser, "#image-id")[0].text
    smoke = _by_css(browser, f'article[data-smoke="cpu-reference"][data-image="{IMAGE_2}"]')[0]
    assert "2.24" in smoke.find_element("css selector", ".accept-len").text
    assert "VLLM_COMPUTE_NANS_IN_LOGITS" in smoke.text and "verified" in smoke.text
    bench = _by_css(browser, 'article[data-bench="cpu-reference"]')[0]
    row = _by_css(bench, 'tr[data-cell="pp=64 tg=32 depth=0 c=1"]')[0]
    assert row.find_element("css selector", ".decode-request").text == f"{DECODE_CLIENT:.0f}"
    assert row.find_element("css selector", ".decode-engine").text == "124"
    per_request = _by_css(bench, 'figure[data-chart="Decode tok/s per request"]')[0]
    assert len(_by_css(per_request, "circle")) == 4  # client and engine, c=1 and c=4
    assert len(_by_css(per_request, "circle.hollow")) == 2  # the c=4 cell had a burst run
    assert "engine" in per_request.text and "client" in per_request.text
    assert "burst" in _by_css(bench, ".flags-list")[0].text
    claims = _by_css(bench, "table.claims tbody tr")
    ratios = [c.find_element("css selector", ".ratio").text for c in claims]
    assert ratios == ["0.82\N{MULTIPLICATION SIGN}"]
    assert "harness" in _by_css(bench, ".differences")[0].text  # a setting that differs
    history = [r.text for r in _by_css(browser, "table.history tbody tr")]
    assert DIGEST_2[:23] in history[0] and DIGEST_1[:23] in history[1]


def test_the_diff_pages_show_a_changed_pr_and_a_changed_digest(browser: Any, site: Site) -> None:
    for page in (site.diff, site.page("diff/pkg-new--previous.html")):
        _load(browser, page)
        changes = {
            r.get_attribute("data-item"): r.find_element("css selector", ".how").text
            for r in _by_css(browser, "#pr-changes tbody tr")
        }
        assert changes == {"#101": "turned upstream", "#104": "added"}, page.name
        image_id = _by_css(browser, '#image-fields tr[data-field="image_id"]')[0]
        assert "changed" in (image_id.get_attribute("class") or "")
        assert IMAGE_1 in image_id.text and IMAGE_2 in image_id.text
        digest = _by_css(browser, f'#image-fields tr[data-field="published to {REPOSITORY}"]')
        assert DIGEST_1 in digest[0].text and DIGEST_2 in digest[0].text
        assert "bumped" in _by_css(browser, "#wheel-changes")[0].text


def test_hostile_names_and_engine_strings_are_text(browser: Any, site: Site) -> None:
    for page in ("builds/pkg-new.html", "index.html", "diff/pkg-new--previous.html"):
        _load(browser, site.page(page))
        for tag in ("script", "img", "b", "em", "iframe", "object"):
            assert _by_css(browser, tag) == [], f"{page}: a <{tag}> element was made"
        assert browser.title.endswith("· sparkbuild") and "pwned" not in browser.title
        assert SECRET not in browser.page_source
    _load(browser, site.page("builds/pkg-new.html"))
    text = _by_css(browser, "main")[0].text
    for hostile in (HOSTILE_ENGINE, HOSTILE_LABEL, HOSTILE_TAG):
        assert hostile in text, hostile


@pytest.mark.parametrize("width", [1280, 390])
def test_pages_are_readable_at_desktop_and_phone_widths(
    browser: Any,
    site: Site,
    width: int,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> None:
    """No page is wider than the screen (wide tables scroll in their own box); the text is
    at least 12 px. The screenshots are kept for a person to look at."""
    shots = tmp_path_factory.getbasetemp() / "report-screenshots"
    shots.mkdir(exist_ok=True)
    for name in ("index.html", "builds/pkg-new.html", "builds/pkg-old.html"):
        _load(browser, site.page(name), width)
        page_width = browser.execute_script("return document.documentElement.scrollWidth")
        assert page_width <= width, f"{name} at {width}px is {page_width}px wide"
        body = browser.execute_script(
            "return parseFloat(getComputedStyle(document.querySelector('main')).fontSize)"
        )
        assert body >= 12
        if name != "builds/pkg-old.html":
            screenshot(browser, shots / f"{Path(name).stem}-{width}.png", width)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"report screenshots ({width} px): {shots}")
