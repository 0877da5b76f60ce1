"""The project the hostile-input tests run the command line on: a spec with one open PR and
one patch over a test upstream (:func:`tests.support.gitrepos.make_upstream`), and the check
every one of them makes: one screen, no traceback."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import CliResult
from tests.support.gitrepos import Upstream, make_patch
from tests.support.source_project import ONE_BUILD_SPEC, SourceProject

SPEC = ONE_BUILD_SPEC


class Project(SourceProject):
    def run(self, *args: str, input: str | None = None) -> CliResult:
        result = super().run(*args, input=input)
        assert_one_screen(result)
        return result


def assert_one_screen(result: CliResult) -> None:
    """No traceback; a failure exits 1 or 2 with an ``error:`` line on stderr."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"traceback: {result.exception!r}\n{result.output}")
    assert "Traceback" not in result.output
    assert "internal error" not in result.output, result.output
    if result.exit_code != 0:
        assert result.exit_code in (1, 2), result.output
        assert result.stderr.strip(), "a failure must say why on stderr"
        assert len(result.stderr.splitlines()) < 40, result.stderr


def local_patch(upstream: Upstream) -> str:
    """The project's own patch: one line of ``alpha.py`` as v1.1.0 has it."""
    return make_patch(
        upstream.work,
        "v1.1.0",
        {"python/pkg/alpha.py": ("alpha line 20\n", "alpha line 20 (ours)\n")},
        header="What: a local fix.\n",
    )


def hostile_project(tmp_path: Path, upstream: Upstream, patch: str | None = None) -> Project:
    """A project in ``tmp_path`` building ``new`` (v1.1.0 + PR #103 + a local patch);
    ``patch`` is :func:`local_patch`'s text when the caller made it once already."""
    proj = Project.create(tmp_path, upstream)
    (proj.patches / "applies.patch").write_text(patch or local_patch(upstream))
    proj.write_spec(SPEC)
    return proj
