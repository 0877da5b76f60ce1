"""A stand-in for SGLang PR #24436 (Gemma-4 MTP), made from the real release files.

The PR itself cannot be fetched here (no GitHub). It was merged after the v0.5.11 tag and
first released in 0.5.12, and touches these files (from the PR's file list):

- new: models/gemma4_mtp.py and speculative/frozen_kv_mtp_{cuda_graph_runner,info,utils,
  worker,worker_v2}.py. The stand-in takes them whole from 0.5.12 (less one later PR's
  names, below).
- changed: models/gemma4_causal.py, models/gemma4_mm.py, server_args.py,
  speculative/spec_info.py, utils/hf_transformers/config.py. Between 0.5.11 and 0.5.12
  these files also carry other PRs' changes (server_args.py alone differs by ~800 lines),
  so the stand-in keeps only the hunks of the 0.5.11 -> 0.5.12 diff (one line of context)
  that mention the feature (FROZEN_KV_MTP, the Gemma-4 assistant drafter); in config.py
  it admits model_type gemma4_assistant where 0.5.11 handles gemma4. The Gemma-4 model files
  have no such marker, so they are taken whole: closer to the PR than leaving them out,
  and what an import check of the stand-in then sees is 0.5.12's Gemma-4 model code.

What this cannot show: the real PR's exact text, and prerequisites it needs from commits
between v0.5.11 and the PR's base (the imports check is what would reveal those).

The 0.5.12 files also carry later PRs' changes. Two of them import names 0.5.11 lacks, so
the stand-in takes them back out, mechanically, where the evidence says the PR had none:

- `speculative/eagle_info.EagleDraftExtendInput` came with PR #24859 ("Split draft-extend
  phase from EagleDraftInput into new EagleDraftExtendInput", V1 path incl.
  frozen_kv_mtp_worker.py). #24436 adds that worker, so it was merged before #24859 edited
  it. A public copy of frozen_kv_mtp_info.py from before that split (found in the public code
  index by its `_to_frozen_kv_mtp_draft_input`) imports only EagleDraftInput /
  EagleVerifyInput / EagleVerifyOutput and converts `output.draft_input`, which is 0.5.11's
  EagleVerifyOutput field. The stand-in drops the tag-only FrozenKVMTPDraftExtendInput class
  and renames the draft-extend names back (`_before_draft_extend_split`); on
  frozen_kv_mtp_info.py that gives the same tokens as that copy. For the worker and utils it is
  only the import-level undo: the 0.5.12 worker also reads later-renamed fields (e.g.
  `num_correct_drafts_per_req_cpu`), which an import check does not see.
- `layers/gemma4_fused_ops.gemma_qkv_rmsnorm` and `gemma_dual_rmsnorm_residual_scalar` are
  used only by 0.5.12's gemma4_causal.py, in attention / MoE-tail norm fusions with no MTP
  part. gemma_qkv_rmsnorm came with PR #24696 ("[Gemma4] Optimize Gemm4 with fused Q/K/V
  RMSNorm + per-expert FP8 ckpt loader", opened after #24436); the dual-norm fusion's PR
  was not found, but its kernel lives in gemma4_fused_ops.py, not in the PR's file list.
  The stand-in reverse-applies the hunks that call them and drops their import
  (`_without_later_fused_norms`). The Gemma-4 model files still carry other later changes
  (Eagle3 aux-hidden capture, #24696's per-expert FP8 loader in gemma4_mm.py).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.support.gitrepos import git

__all__ = [
    "FROZEN_KV_MTP_UTILS",
    "GEMMA4_MTP_CHANGED_FILES",
    "GEMMA4_MTP_NEW_FILES",
    "GEMMA4_MTP_PR",
    "push_gemma4_mtp_pr",
    "push_kernel_import_variant",
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


def _feature_hunks(diff: str, feature: re.Pattern[str] = _FEATURE) -> str:
    """The file header plus only the hunks whose changed lines match `feature`."""
    parts = re.split(r"(?m)^(?=@@ )", diff)
    header, hunks = parts[0], parts[1:]
    kept = [
        hunk
        for hunk in hunks
        if any(
            feature.search(line) for line in hunk.splitlines()[1:] if line.startswith(("+", "-"))
        )
    ]
    return header + "".join(kept) if kept else ""


# PR #24859's names, and the pre-split names #24436's Frozen-KV MTP files used (module docstring).
_DRAFT_EXTEND_RENAMES = (
    ("FrozenKVMTPDraftExtendInput", "FrozenKVMTPDraftInput"),
    ("EagleDraftExtendInput", "EagleDraftInput"),
    ("draft_extend_input", "draft_input"),
)
_DRAFT_EXTEND_IMPORT = re.compile(r"(?m)^    (?:Eagle|FrozenKVMTP)DraftExtendInput,\n")
_DRAFT_EXTEND_CLASS = re.compile(
    r"\n\n\n@dataclass\nclass FrozenKVMTPDraftExtendInput\(.*?(?=\n\n\n)", re.S
)
# Norm fusions 0.5.12's gemma4_causal.py calls that 0.5.11's gemma4_fused_ops.py lacks.
_LATER_FUSED_NORMS = ("gemma_qkv_rmsnorm", "gemma_dual_rmsnorm_residual_scalar")
_FUSED_NORM_CALL = re.compile(r"\b(?:" + "|".join(_LATER_FUSED_NORMS) + r")\(")


def _before_draft_extend_split(text: str) -> str:
    """A frozen_kv_mtp_* module's text with PR #24859's draft-extend split undone."""
    text = _DRAFT_EXTEND_CLASS.sub("", _DRAFT_EXTEND_IMPORT.sub("", text))
    for new, old in _DRAFT_EXTEND_RENAMES:
        text = text.replace(new, old)
    assert "DraftExtendInput" not in text, "a draft-extend name is left in a form not undone"
    return text


def _without_later_fused_norms(work: Path, base: str, head: str) -> None:
    """Reverse-apply the gemma4_causal.py hunks that call the later norm fusions.

    Three lines of context, so the dual-norm hunk includes the line it moved below the MoE
    branch: reversed, that line goes back where 0.5.11 has it.
    """
    path = _SRT + "models/gemma4_causal.py"
    diff = subprocess.run(
        ["git", "diff", "-U3", base, head, "--", path],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    calls = _feature_hunks(diff, _FUSED_NORM_CALL)
    if calls:
        subprocess.run(["git", "apply", "-R", "-"], cwd=work, input=calls, text=True, check=True)
    file = work / path
    text = file.read_text()
    for name in _LATER_FUSED_NORMS:
        text = text.replace(f"    {name},\n", "")
    assert not any(name in text for name in _LATER_FUSED_NORMS), f"{path}: changed shape"
    file.write_text(text)


def push_gemma4_mtp_pr(
    repo: Path, work: Path, *, base: str = "v0.5.11", head: str = "v0.5.12"
) -> str:
    """Commit the stand-in on `base` in a clone at `work`; push it as refs/pull/N/head.

    Returns what was taken from the hunk-filtered files, as text for test logs.
    """
    git(repo.parent, "clone", "-q", "--branch", base, str(repo), str(work))
    git(work, "checkout", "-q", head, "--", *GEMMA4_MTP_NEW_FILES, *GEMMA4_MTP_WHOLE_FILES)
    for path in GEMMA4_MTP_NEW_FILES:
        if "/frozen_kv_mtp_" in path:
            file = work / path
            file.write_text(_before_draft_extend_split(file.read_text()))
    _without_later_fused_norms(work, base, head)
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


FROZEN_KV_MTP_UTILS = _SRT + "speculative/frozen_kv_mtp_utils.py"
_TOPK_IMPORT = "from sglang.srt.speculative.spec_utils import fast_topk\n"


def push_kernel_import_variant(repo: Path, work: Path, number: int, name: str) -> None:
    """The PR stand-in with its Frozen-KV MTP utils taking ``name`` from sgl_kernel itself,
    as SGLang's own modules do on CUDA (``if is_cuda(): from sgl_kernel import ...``),
    committed on the stand-in in ``work`` and pushed as ``refs/pull/<number>/head``."""
    standin = git(repo, "rev-parse", f"refs/pull/{GEMMA4_MTP_PR}/head")
    git(work, "checkout", "-q", "--detach", standin)
    file = work / FROZEN_KV_MTP_UTILS
    text = file.read_text()
    assert text.count(_TOPK_IMPORT) == 1, f"{FROZEN_KV_MTP_UTILS}: changed shape"
    kernel = (
        "from sglang.srt.utils import is_cuda\n\nif is_cuda():\n"
        f"    from sgl_kernel import fast_topk, {name}  # noqa: F401\n"
        "else:\n    " + _TOPK_IMPORT
    )
    file.write_text(text.replace(_TOPK_IMPORT, kernel))
    git(work, "commit", "-q", "-am", f"frozen-KV MTP utils import {name} from sgl_kernel")
    git(work, "push", "-q", str(repo), f"HEAD:refs/pull/{number}/head")
