"""Source steps: edits sparkbuild makes to an upstream file by the shape of what they change.

A step is a spec item like a patch (``steps:`` in ``builds/<engine>.yaml``, with a ``when``
range, one entry per form of the file) and settles on the same statuses, after the PRs and
patches, in the same scratch index, so the lock's tree and ``--locked`` proofs cover it:

- ``applied``: it changed the file;
- ``upstream``: the file already is what the step makes of it (a second run, or upstream);
- ``out-of-range``: its ``when`` excludes the build's version;
- ``conflict``: anchor drift, the file lacks what the step must change (named);
- ``missing``: the file is not in the tree (the sources moved: check ``file:`` and ``when``).

The one step today is ``sm121a-prune`` (:mod:`sparkbuild.source.gencodes`).
"""

from __future__ import annotations

from dataclasses import replace

from sparkbuild.errors import AnchorDriftError
from sparkbuild.source import gencodes
from sparkbuild.source.apply import Applier, out_of_range
from sparkbuild.source.items import ItemResult
from sparkbuild.spec import Step


def prune(step: Step, text: str) -> gencodes.PruneResult:
    """``sm121a-prune`` on ``text`` (the file ``step.file``), with the step's expectations."""
    return gencodes.prune_to_sm121a(
        text,
        step.file,
        flags_var=step.flags_var or gencodes.FLAGS_VAR,
        remove_targets=(
            step.remove_targets if step.remove_targets is not None else gencodes.REMOVE_TARGETS
        ),
        remove_includes=(
            step.remove_includes if step.remove_includes is not None else gencodes.REMOVE_INCLUDES
        ),
    )


def settle_step(applier: Applier, step: Step) -> ItemResult:
    build = applier.build
    item = ItemResult(
        kind="step",
        id=step.id,
        status="missing",
        detail="",
        when=step.when,
        file=step.file,
        step=step.step,
        step_version=gencodes.STEP_VERSIONS.get(step.step),
    )
    if (skipped := out_of_range(build, item)) is not None:
        return skipped
    found = applier.index.read(step.file)
    if found is None:
        return replace(
            item,
            detail=f"no {step.file} in the tree at {build.ref} (did the sources move? check the "
            "step's `file:` and `when:`)",
        )
    mode, data = found
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return replace(item, status="invalid", detail=f"{step.file} is not UTF-8 text")
    try:
        result = prune(step, text)
    except AnchorDriftError as exc:
        return replace(item, status="conflict", detail=exc.message, files=(step.file,))
    if not result.changed:
        return replace(
            item,
            status="upstream",
            detail=f"{step.file} already builds {gencodes.KEEP} only; nothing to change",
            files=(step.file,),
        )
    applier.index.write(step.file, mode, result.text.encode("utf-8"))
    applier.record(f"step {step.id}")
    return replace(item, status="applied", detail=result.summary(), files=(step.file,))
