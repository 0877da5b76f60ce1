"""The source stage: a build's upstream commit plus its PRs and patches, as a git tree.

For each item, in spec order (PRs, then patches), exactly one status:

- ``applied``: it changed the tree;
- ``upstream``: its change is already there (PR head contained in the base, a reverse apply
  succeeds, or applying changes nothing): the rebase-helper rule, not an error;
- ``out-of-range``: its ``when`` excludes this build's version;
- ``conflict``: it does not apply exactly; the failing files and hunks are listed;
- ``missing``: the patch file or the PR ref does not exist;
- ``invalid``: the patch file is not a diff (an HTML page, empty, truncated, binary junk).

A PR's change is its own commits, from where it left the base branch to its head, never the
unrelated commits between the build's tag and the PR's base.
"""

from sparkbuild.source.checkout import (
    before_branch,
    checkout,
    conflict_patch_name,
    default_checkout_dir,
)
from sparkbuild.source.items import FAILING, ChangedFile, ItemResult, PreparedSource, Status
from sparkbuild.source.pins import require_locked_source, staleness
from sparkbuild.source.prepare import prepare_source
from sparkbuild.source.record import record

__all__ = [
    "FAILING",
    "ChangedFile",
    "ItemResult",
    "PreparedSource",
    "Status",
    "before_branch",
    "checkout",
    "conflict_patch_name",
    "default_checkout_dir",
    "prepare_source",
    "record",
    "require_locked_source",
    "staleness",
]
