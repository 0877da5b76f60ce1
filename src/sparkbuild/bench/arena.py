"""Spark Arena on its own terms: its official sweep, claims for imported recipes, and
submissions in its layout.

* ``--sweep spark-arena-v2``: the official benchmark profile, described in our own data file
  (``data/bench/spark-arena-v2.yaml``, citing spark-arena/recipe-registry
  ``benchmarking/spark-arena-v2.yaml``): its grid, prefix caching, runs and fixed order.
* ``profile import ... --figure``: a claims file (``claims/``, bench/claims.py) for a
  recipe's published figure, so a run of the imported profile is held against it.
* ``--arena DIR``: the three files ``sparkrun benchmark RECIPE --arena`` uploads, in the
  folders it uploads them to (sparkrun 0.4.2, ``plugins/sparkarena/integration.py``):
  ``recipes/recipe.yaml`` (the recipe as it ran, written by engines/recipe_writer so that
  sparkrun's validator finds nothing in it), ``logs/benchmark.csv`` (llama-benchy's CSV:
  sparkrun makes the same rows from llama-benchy's JSON, ``benchmarking/llama_benchy.py``
  ``json_to_csv``) and ``metadata/metadata.json`` (the keys 0.4.2's
  ``BenchmarkExecution.generate_metadata`` writes, in ``benchmarking/base.py``: recipe with its
  text and hashes, timing, cluster with pseudonymous hosts, benchmark, model, runtime_info,
  sparkrun). Beside them, not uploaded: ``logs/benchmark.json`` (llama-benchy's JSON, which
  its schema validates) and ``logs/sparkbuild-bench.json`` (the whole report, engine figures
  included). The tests hold all of it against sparkrun 0.4.2's own code.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sparkbuild import __version__, fileio, interrupts, jsontext
from sparkbuild.adapters import ADAPTERS, adapter_type
from sparkbuild.bench import llama_benchy
from sparkbuild.bench.claims import METRICS, ClaimsFile, Figure
from sparkbuild.bench.results import TIME_FORMAT, BenchReport, CellResult
from sparkbuild.bench.sweep import Scheduled, Sweep, bounds_summary, out_of_bounds
from sparkbuild.engines.profiles import SmokeProfile
from sparkbuild.engines.recipe_writer import (
    RecipeSpec,
    effective_yaml,
    recipe_document,
    recipe_yaml,
)
from sparkbuild.engines.recipes import ImportedRecipe, document_runtime, problems_of
from sparkbuild.engines.sparkrun_flags import SPARKRUN_VERSION, sparkrun_flags
from sparkbuild.errors import NothingMeasuredError, UsageError
from sparkbuild.redact import redact, secret_args, secret_env, strip_userinfo
from sparkbuild.yamlfile import dump_yaml, load_model

NAMED_SWEEPS = ("spark-arena-v2",)
SUBMISSION_FILES = {
    "recipe": "recipes/recipe.yaml",
    "csv": "logs/benchmark.csv",
    "metadata": "metadata/metadata.json",
    "llama_benchy_json": "logs/benchmark.json",
    "report": "logs/sparkbuild-bench.json",
}
#: Environment names whose values are never written into a submission.


# --- the official sweep ------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Source(_Strict):
    repo: str
    path: str
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")


class _Args(_Strict):
    depth: list[int] = Field(min_length=1)
    pp: list[int] = Field(min_length=1)
    tg: list[int] = Field(min_length=1)
    concurrency: list[int] = Field(min_length=1)
    prefix_caching: bool
    runs: int = Field(ge=1)


class NamedSweep(_Strict):
    """A benchmark profile published by someone else, as sparkbuild runs it."""

    name: str
    description: str
    framework: str
    profile: str  # how sparkrun names it
    source: _Source
    args: _Args
    schedule: list[tuple[int, int]]

    def sweep(self, *, seed: int = 0, warmup: bool = True) -> Sweep:
        return Sweep(
            pp=self.args.pp,
            tg=self.args.tg,
            depth=self.args.depth,
            concurrency=self.args.concurrency,
            runs=self.args.runs,
            seed=seed,
            warmup=warmup,
            name=self.name,
            prefix_caching=self.args.prefix_caching,
            schedule=[Scheduled(depth=d, concurrency=c) for d, c in self.schedule],
        )

    def benchmark_args(self) -> dict[str, object]:
        """The profile's args as sparkrun records them in ``metadata.benchmark.args``."""
        return self.args.model_dump()


def named_sweep(name: str) -> NamedSweep:
    """A published sweep by name (``spark-arena-v2``), or a sweep file in the same format
    (``src/sparkbuild/data/bench/spark-arena-v2.yaml``: a grid, its runs and its order)."""
    if name in NAMED_SWEEPS:
        data = resources.files("sparkbuild") / "data" / "bench" / f"{name}.yaml"
        return NamedSweep.model_validate(yaml.safe_load(data.read_text("utf-8")))
    path = Path(name)
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        raise UsageError(
            f"no named sweep {name!r}",
            f"known: {', '.join(NAMED_SWEEPS)}; or a .yaml sweep file in their format "
            "(src/sparkbuild/data/bench/spark-arena-v2.yaml)",
        )
    named = load_model(path, NamedSweep)
    try:
        sweep = named.sweep()
    except ValueError as exc:  # the schedule must cover the grid once
        raise UsageError(f"{path}: {exc}") from None
    refused = out_of_bounds(sweep)
    if refused:
        raise UsageError(
            f"{path}: {bounds_summary(refused)}", "keep the grid within the flags' bounds"
        )
    return named


def refuse_unfit(sweep: Sweep, max_len: int | None, where: str, flag: str) -> None:
    """Refuse, before the engine boots, cells longer than the engine's context can hold."""
    if max_len is None:
        return
    too_long = [k for k in sweep.cells() if k.prompt_tokens + k.tg > max_len]
    if not too_long:
        return
    need = max(k.prompt_tokens + k.tg for k in too_long)
    shown = ", ".join(f"depth {k.depth} c{k.concurrency}" for k in too_long[:6])
    more = f" and {len(too_long) - 6} more" if len(too_long) > 6 else ""
    named = f"--sweep {sweep.name}" if sweep.name else "the sweep"
    raise UsageError(
        f"{where} serves at most {max_len} tokens, and {len(too_long)} of the "
        f"{sweep.cell_count} cells of {named} need more ({shown}{more}: up to depth+pp+tg "
        f"= {need})",
        f"serve with a context of at least {need} tokens (e.g. {flag} {need})"
        + ("" if sweep.name else ", or lower --pp/--depth/--tg"),
    )


# --- claims for an imported recipe -------------------------------------------------------


def parse_figure(text: str) -> tuple[str, Figure]:
    """``METRIC=VALUE`` or ``METRIC=LOW-HIGH`` (a published range)."""
    metric, sep, value = text.partition("=")
    if not sep or metric not in METRICS:
        raise UsageError(
            f"--figure {text!r} is not METRIC=VALUE",
            f"METRIC is one of {', '.join(METRICS)}; e.g. --figure decode_tps=62.2",
        )
    try:
        low, dash, high = value.partition("-")
        figure: Figure = (float(low), float(high)) if dash else float(value)
    except ValueError:
        raise UsageError(f"--figure {text!r}: {value!r} is not a number or LOW-HIGH") from None
    return metric, figure


def parse_cell(text: str) -> dict[str, int]:
    """``pp=2048,tg=128,depth=0,c=1`` (any of them; c or concurrency)."""
    cell: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = {"c": "concurrency"}.get(key.strip(), key.strip())
        if not sep or key not in ("pp", "tg", "depth", "concurrency") or not value.isdigit():
            raise UsageError(
                f"--cell {text!r}: {part!r} is not pp=N, tg=N, depth=N or c=N",
                "e.g. --cell pp=2048,tg=128,depth=0,c=1",
            )
        cell[key] = int(value)
    return cell


def recipe_claims(
    imported: ImportedRecipe,
    figures: Mapping[str, Figure],
    *,
    cell: Mapping[str, int],
    source: str,
    url: str | None,
    date: str,
    harness: str,
) -> str:
    """A claims file for the figures published with an imported recipe (validated)."""
    profile = imported.profile
    layout = imported.parallel or {}
    nodes, tp, pp = layout.get("nodes", 1), layout.get("tp", 1), layout.get("pp", 1)
    hardware = f"{nodes}x DGX Spark (GB10)" + (f", TP={tp}" if tp > 1 else "")
    hardware += f", PP={pp}" if pp > 1 else ""
    setup = {
        "engine": profile["engine"],
        "image": imported.source.container,
        "model": profile["model"],
        "flags": list(profile["args"]),
        "profile": imported.name,
        "harness": harness,
        "hardware": hardware,
        "note": f"Spark Arena recipe {imported.source.file} (sha256 {imported.source.sha256[:16]})",
    }
    claim: dict[str, object] = {"setup": imported.name, "cell": dict(cell)}
    claim.update({metric: list(v) if isinstance(v, tuple) else v for metric, v in figures.items()})
    data = {
        "source": source,
        "url": strip_userinfo(url) if url else None,
        "date": date,
        "setups": {imported.name: {k: v for k, v in setup.items() if v is not None}},
        "claims": [claim],
    }
    data = {k: v for k, v in data.items() if v is not None}
    try:
        ClaimsFile.model_validate(data)
    except ValidationError as exc:
        raise UsageError(
            f"the claim does not validate: {problems_of(exc)}", "fix --figure/--cell/--claim-date"
        ) from None
    comment = (
        f"Published figures for the Spark Arena recipe {imported.source.file}, imported as",
        f"profile {imported.name} by `sparkbuild profile import`. Reproduce:",
        f"  sparkbuild bench --image IMAGE --profile {imported.name} --claims {imported.name}",
    )
    return dump_yaml(data, comment=comment)


# --- submissions -------------------------------------------------------------------------


@dataclass(frozen=True)
class Submission:
    directory: Path
    files: dict[str, Path]


def check_submission_dir(directory: Path) -> None:
    """Before the run: the directory is new (or empty) and its parent writable; a symlink
    there, a dangling one too, is refused: the submission is never made at its target."""
    if directory.is_symlink():
        raise UsageError(
            f"--arena {directory}: is a symlink; a submission is never written through one",
            "pass a new directory (or the directory the link points to)",
        )
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise UsageError(
            f"--arena {directory}: exists and is not an empty directory",
            "pass a new directory: a submission is written whole, never over another",
        )
    parent = fileio.resolve_parent(directory).parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UsageError(f"--arena {directory}: {parent} is not a writable directory")


def _layout(profile: SmokeProfile) -> dict[str, int]:
    """tp and pp of the profile's parallel layout (1 when it has none)."""
    layout = getattr(profile, "parallel", None)
    return {"tp": int(getattr(layout, "tp", 1)), "pp": int(getattr(layout, "pp", 1))}


def _container(report: BenchReport) -> tuple[str | None, bool]:
    """The image the run used, by digest when the registry gave one: (reference, pinned)."""
    if report.target.kind != "image":
        return None, False
    if report.target.repo_digests:
        return report.target.repo_digests[0], True
    return report.target.value, False


def _launched_args(report: BenchReport, engine: str) -> list[str]:
    """The flags the engine ran with: the launcher's own first (SGLang's --enable-metrics),
    unless bench only reached an engine at a URL, whose launch it never saw."""
    args = list(report.engine.args)
    if report.target.kind == "url":
        return args
    return [*adapter_type(engine).launcher_flags(args), *args]


def effective_recipe(report: BenchReport, name: str, profile: SmokeProfile) -> dict[str, object]:
    """The recipe as the run used it (engine, model, flags and env of the report), written
    as sparkrun wants one (engines/recipe_writer); the imported recipe's provenance in
    ``metadata``."""
    engine = report.engine.name if report.engine.name in ADAPTERS else profile.engine
    layout = _layout(profile)
    origin: dict[str, object] = {"profile": name, "target": report.target.kind}
    if profile.recipe is not None:
        origin["imported_from"] = {
            "file": profile.recipe.file,
            "sha256": profile.recipe.sha256,
            "container": profile.recipe.container,
        }
    spec = RecipeSpec(
        engine=engine,
        runtime=profile.recipe.runtime if profile.recipe else engine,
        model=report.engine.model,
        args=_launched_args(report, engine),
        env=secret_env(report.engine.env),
        tp=layout["tp"],
        pp=layout["pp"],
        container=_container(report)[0],
        description=profile.description or name,
        metadata={"sparkbuild": origin},
    )
    return recipe_document(spec)


def _timing(report: BenchReport) -> dict[str, object]:
    """Start, end and duration of the sweep, the boot left out, from the report: a resumed
    sweep's from its first process's start to its last one's end (each process's span is in
    ``sparkbuild.processes``), its duration the time between, as sparkrun counts it."""
    try:
        end = datetime.strptime(report.created, TIME_FORMAT)
    except ValueError:
        end = datetime.now().astimezone()
    start = end - timedelta(seconds=max(report.seconds - (report.boot_seconds or 0.0), 0.0))
    if report.processes:
        first = report.processes[0]
        try:
            start = datetime.strptime(first.started, TIME_FORMAT)
        except ValueError:
            pass  # another harness's time: the sweep's own length stands
        else:
            start += timedelta(seconds=first.boot_seconds or 0.0)
    seconds = max((end - start).total_seconds(), 0.0)
    return {"start": start.isoformat(), "end": end.isoformat(), "duration": round(seconds, 2)}


def _measured_at(report: BenchReport) -> dict[str, str]:
    """sparkrun's ``measured_at`` and ``completed_at`` of a resumed sweep: its first
    process's start and its last one's end (sparkrun's issue #267: a resumed run's own
    start is not when its figures were measured)."""
    if report.resumed_from is None or not report.processes:
        return {}
    first, last = report.processes[0].started, report.processes[-1].ended
    return {"measured_at": _iso(first), "completed_at": _iso(last)}


def _iso(stamp: str) -> str:
    """A report's time as ISO 8601 (``isoformat``, as sparkrun writes its times)."""
    try:
        return datetime.strptime(stamp, TIME_FORMAT).isoformat()
    except ValueError:
        return stamp


def pseudonyms(hosts: Sequence[str]) -> list[str]:
    """Hosts as sparkrun 0.4.2 publishes them: ``node-`` and the first 8 hex digits of the
    name's sha256, so two rows from one node still match and no address leaves."""
    return ["node-" + hashlib.sha256(h.encode("utf-8")).hexdigest()[:8] for h in hosts]


def _hosts(report: BenchReport) -> list[str]:
    """The machines the engine ran on: a cluster's nodes, a URL's host, else this host."""
    if report.target.nodes:
        return [node.name for node in report.target.nodes]
    if report.target.kind == "url":
        return [urlsplit(report.target.value).hostname or report.target.value]
    return [report.host.hostname]


def _cluster(report: BenchReport, layout: Mapping[str, int]) -> dict[str, object]:
    hosts = _hosts(report)
    run_digest = hashlib.sha256(f"{report.label}|{report.created}".encode()).hexdigest()
    cluster: dict[str, object] = {
        "cluster_id": f"sparkbuild-{run_digest[:12]}",
        "node_count": len(hosts),
        "hosts": pseudonyms(hosts),
        "hosts_redacted": True,
    }
    cluster.update({k: v for k, v in layout.items() if v != 1})
    return cluster


def submission_metadata(
    report: BenchReport, name: str, profile: SmokeProfile, recipe: Mapping[str, object]
) -> dict[str, object]:
    """The keys sparkrun 0.4.2's ``generate_metadata`` writes, filled with what this run
    knows; ``recipe`` is the submission's recipe (``effective_recipe``)."""
    engine = report.engine.name
    container, pinned = _container(report)
    layout = _layout(profile)
    imported = profile.recipe
    runtime = document_runtime(recipe)  # as sparkrun resolves it: vllm is vllm-distributed
    effective = redact(effective_yaml(recipe, container))
    runtime_info: dict[str, object] = {engine: report.engine.version or "unknown"}
    if report.target.image_id:
        runtime_info["image_id"] = report.target.image_id
    sweep = report.sweep
    args: dict[str, object] = {
        "depth": sweep.depth,
        "pp": sweep.pp,
        "tg": sweep.tg,
        "concurrency": sweep.concurrency,
        "prefix_caching": sweep.prefix_caching,
        "runs": sweep.runs,
    }
    profile_name = named_sweep(sweep.name).profile if sweep.name in NAMED_SWEEPS else sweep.name
    return {
        "recipe": {
            "name": imported.name if imported else name,
            "qualified_name": imported.file if imported else f"smoke/{name}.yaml",
            "type": "sparkrun",
            "model": report.engine.model,
            "hf_model": report.engine.model,
            "raw_container": (imported.container if imported else None) or container or "",
            "container": container,
            "container_pinned": pinned,
            "runtime": sparkrun_flags().runtime_display.get(runtime, runtime),
            "runtime_full": runtime,
            "registry": None,
            "registry_git": "",
            "text": effective,
            "hash": hashlib.sha256(redact(recipe_yaml(recipe)).encode("utf-8")).hexdigest(),
            "effective_hash": hashlib.sha256(effective.encode("utf-8")).hexdigest(),
        },
        "timing": _timing(report),
        "cluster": _cluster(report, layout),
        "benchmark": {
            # Not llama-benchy: sparkbuild's own harness, writing llama-benchy's formats.
            "framework": report.harness.name,
            "framework_version": report.harness.version,
            "format": "llama-benchy 0.4",
            "profile": profile_name,
            "args": args,
            "resumed": report.resumed_from is not None,
            # sparkrun's own keys for a resumed run: when its figures were measured.
            **_measured_at(report),
            "category": "performance",
        },
        "model": {},
        "runtime_info": runtime_info,
        # The metadata's layout is sparkrun 0.4.2's; no sparkrun ran, so no version of it.
        "sparkrun": {"version": None, "format": SPARKRUN_VERSION},
        "sparkbuild": {
            "version": __version__,
            "profile": name,
            "label": report.label,
            "processes": [span.model_dump(mode="json") for span in report.processes],
        },
    }


def _measured(cell: CellResult) -> bool:
    figures = [cell.ttft_s, cell.prefill_tps, cell.decode_tps_request, cell.decode_tps_aggregate]
    figures.append(cell.output_tps)
    return any(figure.n for figure in figures)


def refuse_unmeasured(report: BenchReport) -> None:
    """A submission is figures: a sweep with a cell that measured nothing (every request
    failed) is refused, naming the cells and why."""
    empty = [cell for cell in report.cells if not _measured(cell)]
    if not empty and report.cells:
        return
    what = (
        "nothing was measured"
        if len(empty) == len(report.cells)
        else f"{len(empty)} of {len(report.cells)} cells measured nothing"
    )
    listed = "; ".join(
        f"{c.key.label()}: {c.errors} of {c.requests} requests failed"
        + (f" ({c.error_samples[0]})" if c.error_samples else "")
        for c in empty[:3]
    )
    raise NothingMeasuredError(
        f"no Spark Arena submission: {what}" + (f" ({listed})" if listed else ""),
        "see the engine log and the report's errors; run the sweep again once the engine answers",
    )


def write_submission(
    directory: Path, report: BenchReport, name: str, profile: SmokeProfile
) -> Submission:
    """The submission, written whole: into a scratch directory beside ``directory``, then
    renamed into place (a failure leaves nothing half-written)."""
    if not report.complete:
        raise UsageError("an incomplete sweep is not a submission")
    refuse_unmeasured(report)
    check_submission_dir(directory)
    masked = {"env": secret_env(report.engine.env), "args": secret_args(report.engine.args)}
    engine = report.engine.model_copy(update=masked)
    report = report.model_copy(update={"engine": engine})  # no secret leaves in a submission
    recipe = effective_recipe(report, name, profile)
    benchy = llama_benchy.to_json(report)
    metadata = submission_metadata(report, name, profile, recipe)
    contents = {
        "recipe": redact(recipe_yaml(recipe)),
        "csv": llama_benchy.json_to_csv(benchy),
        "metadata": jsontext.dumps(metadata, indent=2) + "\n",
        "llama_benchy_json": jsontext.dumps(benchy, indent=2) + "\n",
        "report": report.model_dump_json(indent=2) + "\n",
    }
    target = fileio.resolve_parent(directory)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        scratch.chmod(0o755)  # mkdtemp's 0700 would follow the rename
        for key, relative in SUBMISSION_FILES.items():
            path = scratch / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(redact(contents[key]).encode("utf-8"))
        with interrupts.deferred():  # the empty directory and the submission: one step
            if target.exists():
                target.rmdir()  # empty (checked above)
            scratch.rename(target)
    except BaseException as exc:  # interrupted too: no half-written scratch is left behind
        shutil.rmtree(scratch, ignore_errors=True)
        if isinstance(exc, OSError):
            raise UsageError(f"--arena {directory}: cannot write: {exc.strerror or exc}") from exc
        raise
    return Submission(target, {k: target / v for k, v in SUBMISSION_FILES.items()})
