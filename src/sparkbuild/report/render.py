"""The Jinja2 environment the pages are rendered with: autoescaped, every value redacted.

Everything a page prints from the lock, an engine or a bench report passes through
``_Finalize`` (Jinja's hook for every ``{{ value }}``): secrets are masked there with the
redaction every other output uses, then autoescaping makes the text inert, so a build label
or an engine's version string that holds markup is shown as text. Pages carry a Content
Security Policy that allows no script at all, as a second wall.
"""

from __future__ import annotations

import jinja2
from markupsafe import Markup

from sparkbuild.bench.claims import METRICS
from sparkbuild.bench.claims_report import figure_text, measured_text, ratio_text, unpublished
from sparkbuild.bench.report import number
from sparkbuild.redact import redact
from sparkbuild.report import view
from sparkbuild.report.hosts import hosts_view


class _Finalize:
    """Jinja's ``finalize``: every printed string redacted. One report prints the same digests,
    names and versions thousands of times, so each distinct string is redacted once (the
    run's secrets do not change while it renders)."""

    def __init__(self) -> None:
        self._shown: dict[str, str] = {}

    def __call__(self, value: object) -> object:
        if isinstance(value, Markup):  # a macro's output, already escaped piece by piece
            return value
        if value is None:
            return ""
        if not isinstance(value, str):
            return value
        shown = self._shown.get(value)
        if shown is None:
            shown = self._shown[value] = redact(value)
        return shown


def _number(value: float | None, digits: int | None = None) -> str:
    return number(value, digits)


def _delta(value: float | None) -> str:
    return "" if value is None else f"{value:+.1f}%"


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("sparkbuild", "data/report"),
        autoescape=True,
        finalize=_Finalize(),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(short=view.short, num=_number, delta=_delta)
    env.globals.update(
        STAGES=view.STAGES,
        METRICS=METRICS,
        pr_link=view.pr_link,
        commit_link=view.commit_link,
        web_base=view.web_base,
        figure_text=figure_text,
        measured_text=measured_text,
        ratio_text=ratio_text,
        unpublished=unpublished,
        hosts_view=hosts_view,
    )
    return env
