"""The report stage: a static site of every build's lock entry and bench runs."""

from sparkbuild.report.site import ReportOptions, ReportResult, write_diff, write_site

__all__ = ["ReportOptions", "ReportResult", "write_diff", "write_site"]
