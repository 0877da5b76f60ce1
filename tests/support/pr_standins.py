"""A stand-in for SGLang PR #24436 (Gemma-4 MTP), made from the real release files.

The PR itself cannot be fetched here (no GitHub). It was merged after the v0.5.11 tag and
first released in 0.5.12, and touches these files (from the PR's file list):

- new: models/gemma4_mtp.py and speculative/frozen_kv_mtp_{cuda_graph_runner,info,utils,
  worker,worker_v2}.py. The stand-in takes them whole from 0.5.12.
- changed: models/gemma4_causal.py, models/gemma4_mm.py, server_args.py,
  speculative/spec_info.py, utils/hf_transformers/config.py. Between 0.5.11 and 0.5.12
  these files also carry other PRs' changes (server_args.py alone differs by ~800 lines),
  so the stand-in keeps only the hunks of the 0.5.11 -> 0.5.12 diff (one line of context)
  that mention the feature (FROZEN_KV_MTP, the Gemma-4 assistant drafter); in config.py
  it admits model_type gemma4_assistant where 0.5.11 handles gemma4. The Gemma-4 model files
  have no such marker, so they are taken whole: closer to the PR than leaving them out,
  and what an import check of the stand-in then sees is 0.5.12's Gemma-4 model code.

What this cannot show: the real PR's exact text, and prerequisites it needs from commits
between v0.5.11 and the PR's base (the imports check is what would reveal those). The
0.5.12 files also carry later PRs' changes, and preflight's imports check on the 0.5.11 build
finds two of them: `speculative/eagle_info.EagleDraftExtendInput` (imported by the
frozen_kv_mtp_* modules; introduced by PR #24859, merged after #24436, whose description
says it changed frozen_kv_mtp_worker.py) and `layers/gemma4_fused_ops.
gemma_dual_rmsnorm_residual_scalar` (imported by 0.5.12's Gemma-4 model files; origin not
checked). Failures naming those are artifacts of this stand-in, not of PR #24436.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.support.gitrepos import git

__all__ = [
    "GEMMA4_MTP_CHANGED_FILES",
    "GEMMA4_MTP_NEW_FILES",
    "GEMMA4_MTP_PR",
    "push_gemma4_mtp_pr",
]

GEMMA4_MTP_PR = 24436
_SRT = "python/sglang/srt/"
GEMMA4_MTP_NEW_FILES = [
    _SRT + "models/gemma4_mtp.py",
    *(
        f"{_SRT}speculative/frozen_kv_mtp_{name}.py"
        for name in ("cuda_graph_runner", "info", "utils", "worker", "worker_v2")
    ),
]
GEMMA4_MTP_WHOLE_FILES = [_SRT + "models/gemma4_causal.py", _SRT + "models/gemma4_mm.py"]
GEMMA4_MTP_HUNK_FILES = [_SRT + "server_args.py", _SRT + "speculative/spec_info.py"]
# 0.5.12 moved this file's parsing into a parser class (another PR), so no hunk of that diff
# carries the feature alone; the feature there is the one condition that also admits
# model_type "gemma4_assistant". The stand-in makes that one edit on 0.5.11's text.
GEMMA4_MTP_CONFIG = _SRT + "utils/hf_transformers/config.py"
_GEMMA4_CONDITION = 'config.model_type == "gemma4"'
_GEMMA4_ASSISTANT_CONDITION = 'config.model_type in ("gemma4", "gemma4_assistant")'
GEMMA4_MTP_CHANGED_FILES = [*GEMMA4_MTP_WHOLE_FILES, *GEMMA4_MTP_HUNK_FILES, GEMMA4_MTP_CONFIG]
_FEATURE = re.compile(r"frozen_kv|FROZEN_KV|Frozen-KV|[Aa]ssistant|gemma4_mtp|Gemma4MTP")


def _feature_hunks(diff: str) -> str:
    """The file header plus only the hunks whose changed lines mention the feature."""
    parts = re.split(r"(?m)^(?=@@ )", diff)
    header, hunks = parts[0], parts[1:]
    kept = [
        hunk
        for hunk in hunks
        if any(
            _FEATURE.search(line) for line in hunk.splitlines()[1:] if line.startswith(("+", "-"))
        )
    ]
    return header + "".join(kept) if kept else ""


def push_gemma4_mtp_pr(
    repo: Path, work: Path, *, base: str = "v0.5.11", head: str = "v0.5.12"
) -> str:
    """Commit the stand-in on `base` in a clone at `work`; push it as refs/pull/N/head.

    Returns what was taken from the hunk-filtered files, as text for test logs.
    """
    git(repo.parent, "clone", "-q", "--branch", base, str(repo), str(work))
    git(work, "checkout", "-q", head, "--", *GEMMA4_MTP_NEW_FILES, *GEMMA4_MTP_WHOLE_FILES)
    kept = []
    for path in GEMMA4_MTP_HUNK_FILES:
        diff = subprocess.run(
            ["git", "diff", "-U1", base, head, "--", path],
            cwd=work,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        partial = _feature_hunks(diff)
        kept.append(f"{path}: {partial.count(chr(10) + '@@ ')} hunks")
        if partial:
            subprocess.run(
                ["git", "apply", "--index", "-"], cwd=work, input=partial, text=True, check=True
            )
    config = work / GEMMA4_MTP_CONFIG
    text = config.read_text()
    assert text.count(_GEMMA4_CONDITION) == 1, f"{base}: {GEMMA4_MTP_CONFIG} changed shape"
    if (
        _GEMMA4_ASSISTANT_CONDITION
        in subprocess.run(
            ["git", "show", f"{head}:{GEMMA4_MTP_CONFIG}"],
            cwd=work,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    ):
        config.write_text(text.replace(_GEMMA4_CONDITION, _GEMMA4_ASSISTANT_CONDITION))
        kept.append(f"{GEMMA4_MTP_CONFIG}: gemma4_assistant condition")
    git(work, "add", "--all")
    git(work, "commit", "-q", "-m", f"Gemma-4 MTP (stand-in for PR #{GEMMA4_MTP_PR})")
    git(work, "push", "-q", str(repo), f"HEAD:refs/pull/{GEMMA4_MTP_PR}/head")
    return "; ".join(kept)
