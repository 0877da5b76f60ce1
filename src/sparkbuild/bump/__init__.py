"""Carrying a build's PRs and patches to a new upstream release (`sparkbuild bump`)."""

from sparkbuild.bump.plan import BumpPlan, Decision, plan_bump, write_plan

__all__ = ["BumpPlan", "Decision", "plan_bump", "write_plan"]
