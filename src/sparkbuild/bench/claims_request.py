"""Holding a bench run against claims files (``--claims``): the request, loaded and checked
before any engine boots, and showing the comparison once the run is in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sparkbuild import console
from sparkbuild.bench import claims_report
from sparkbuild.bench.claims import LoadedClaim, load_claim_files
from sparkbuild.bench.results import BenchReport
from sparkbuild.errors import UsageError
from sparkbuild.outputs import emit_json
from sparkbuild.settings import Settings


@dataclass(frozen=True)
class ClaimsRequest:
    """Claims loaded and validated before any engine boots."""

    claims: list[LoadedClaim]
    setups: tuple[str, ...]
    json_path: str | None
    markdown_path: Path | None
    stdout_taken: bool = False  # the bench report's JSON goes to stdout: no table there
    json_option: str = "--claims-json"  # where json_path came from, for errors

    def show(self, report: BenchReport, *, append_markdown: bool) -> None:
        result = claims_report.compare_claims(report, self.claims, self.setups)
        if self.json_path:
            emit_json(result.to_json(), self.json_path, option=self.json_option)
        if self.markdown_path:
            claims_report.write_markdown(result, self.markdown_path, append=append_markdown)
        if self.json_path != "-" and not self.stdout_taken:
            claims_report.render(result, console.out)


def claims_request(
    settings: Settings,
    files: tuple[str, ...],
    setups: tuple[str, ...],
    json_path: str | None = None,
    markdown_path: Path | None = None,
    *,
    stdout_taken: bool = False,
    json_option: str = "--claims-json",
) -> ClaimsRequest | None:
    """The claims of ``files`` (``--claims``), with the chosen setups checked against them;
    None when no claims file was given."""
    if not files:
        if setups:
            raise UsageError("--claims-setup needs --claims FILE")
        return None
    claims = load_claim_files(settings, files)
    known = {claim.setup_name for claim in claims}
    unknown = [name for name in setups if name not in known]
    if unknown:
        raise UsageError(
            f"--claims-setup {', '.join(unknown)}: no such setup in {', '.join(files)}",
            f"known setups: {', '.join(sorted(known))}",
        )
    if stdout_taken and json_path == "-":
        raise UsageError("--json and --claims-json - cannot both write to stdout")
    return ClaimsRequest(claims, setups, json_path, markdown_path, stdout_taken, json_option)
