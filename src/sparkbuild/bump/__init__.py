"""Carrying a build's PRs and patches to a new upstream release (`sparkbuild bump`).

``plan`` is the entry point, ``decide`` takes one decision per PR and patch (``items``: the
decisions, their context and the plan), ``report``
writes the conflict report of an item that could not be carried, ``write`` makes the new
spec text and patch variants and writes them; ``carry`` and ``specedit`` are the plumbing.
"""

from sparkbuild.bump.items import BumpPlan, Decision
from sparkbuild.bump.plan import plan_bump
from sparkbuild.bump.write import write_plan

__all__ = ["BumpPlan", "Decision", "plan_bump", "write_plan"]
