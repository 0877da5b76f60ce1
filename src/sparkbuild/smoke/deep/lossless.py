"""``lossless``: speculative decoding must not change the text.

The speculative run is the smoke's own greedy requests (temperature 0, a fixed seed, top-k
logprobs). The reference is the same requests on the same image and model with speculation
off: the engine booted a second time with the adapter's ``without_speculation`` flags, an
engine already running that way (``--reference-url``), or a reference recorded earlier for
the same image id, model and requests (``.sparkbuild/smoke-references/``). Each request is
compared token by token with the tie rule of :mod:`sparkbuild.smoke.deep.compare`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from sparkbuild import fileio
from sparkbuild.checks import CheckResult
from sparkbuild.engines.adapters import EngineAdapter, Generation, answers
from sparkbuild.engines.profiles import LosslessLimits, SmokeProfile
from sparkbuild.engines.targets import Target, wait_ready
from sparkbuild.errors import EngineHTTPError
from sparkbuild.smoke.deep.compare import Divergence, first_divergence, missing_ids
from sparkbuild.smoke.deep.evidence import RequestEvidence
from sparkbuild.smoke.deep.plan import ReferenceSource

Progress = Callable[[str], None]
Texts = Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class Requests:
    """The greedy requests the speculative run made, to replay on the reference."""

    names: tuple[str, ...]
    prompts: tuple[str, ...]
    max_tokens: int
    extra: dict[str, object]
    ranked: int

    def key(self, adapter: EngineAdapter, profile: SmokeProfile, image_id: str) -> str:
        """What a recorded reference is for: engine, image id, model, the flags without
        speculation, the requests."""
        basis = {
            "engine": adapter.name,
            "image_id": image_id,
            "model": profile.model,
            "args": adapter.without_speculation(profile.args),
            "env": profile.env,
            "prompts": self.prompts,
            "max_tokens": self.max_tokens,
            "extra": self.extra,
            "ranked": self.ranked,
        }
        return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()


@dataclass
class Reference:
    generations: list[Generation]
    source: str  # "second boot", "--reference-url URL", "recorded <time>"
    evidence: list[RequestEvidence]
    failure: str = ""  # why there is none


def replay(
    adapter: EngineAdapter, base_url: str, requests: Requests, progress: Progress
) -> list[Generation]:
    """The requests on a reference engine, one after another as the smoke sent them."""
    session = adapter.session()
    out = []
    for name, prompt in zip(requests.names, requests.prompts, strict=True):
        progress(f"deep: lossless reference {name}")
        out.append(
            adapter.generate(
                session,
                base_url,
                prompt,
                requests.max_tokens,
                requests.extra,
                ranked=requests.ranked,
            )
        )
    return out


def boot_reference(
    adapter: EngineAdapter,
    profile: SmokeProfile,
    source: ReferenceSource,
    requests: Requests,
    progress: Progress,
    judge: Callable[[Reference, Texts], None],
) -> Reference:
    """Boot the engine again without speculation, replay the requests and ``judge`` them
    while it is up (a divergence's tokens are decoded by its tokenizer)."""
    target = reference_target(adapter, profile, source)
    if target is None:
        failed = Reference([], "", [], NO_BOOT)
        judge(failed, _no_texts)
        return failed
    progress(f"deep: lossless: booting {adapter.name} without speculation for the reference")
    with target:
        reference, texts = reference_from(target, adapter, profile, requests, progress)
        judge(reference, texts)
        return reference


NO_BOOT = (
    "an engine started elsewhere (--url) cannot be booted again without speculation: pass "
    "--reference-url URL, the same engine and model running without it"
)


def reference_target(
    adapter: EngineAdapter, profile: SmokeProfile, source: ReferenceSource
) -> Target | None:
    """The reference engine (not started): the run's target again, with the adapter's flags
    without speculation; None for a run that cannot boot one (--url)."""
    if source.boot is None:
        return None
    return source.boot(adapter.without_speculation(profile.args))


def reference_from(
    target: Target,
    adapter: EngineAdapter,
    profile: SmokeProfile,
    requests: Requests,
    progress: Progress,
    how: str = "second boot without speculation",
) -> tuple[Reference, Texts]:
    """Wait for a started reference engine and replay the requests on it; the reference
    and how to decode its tokens while it is up."""
    readiness = wait_ready(target, adapter, profile.expect.boot_timeout_s)
    if not readiness.ready:
        tail = target.logs.tail(1) if target.logs is not None else []
        why = f"the reference engine did not boot ({readiness.outcome})"
        return Reference([], "", [], why + (f": {tail[-1]}" if tail else "")), _no_texts
    try:
        generations = replay(adapter, target.base_url, requests, progress)
    except EngineHTTPError as exc:
        return Reference([], "", [], f"the reference engine failed: {exc.message}"), _no_texts
    reference = Reference(generations, how, _evidence(requests, generations))
    return reference, _texts_of(adapter, target.base_url)


def _texts_of(adapter: EngineAdapter, base_url: str) -> Texts:
    def texts(ids: Sequence[int]) -> str:
        if not ids:
            return ""
        text = answers.detokenize(adapter, adapter.session(), base_url, ids)
        return text if text is not None else f"<ids {list(ids)[:8]}>"

    return texts


def _no_texts(ids: Sequence[int]) -> str:
    return f"<ids {list(ids)[:8]}>" if ids else ""


def _evidence(requests: Requests, generations: Sequence[Generation]) -> list[RequestEvidence]:
    return [
        RequestEvidence.of("lossless", f"reference {n}", g)
        for n, g in zip(requests.names, generations, strict=True)
    ]


def judge_lossless(
    runs: Sequence[Generation],
    reference: Reference,
    requests: Requests,
    limits: LosslessLimits,
    texts: Texts,
) -> CheckResult:
    """Every request's tokens against the reference's, under the tie rule."""
    if reference.failure:
        return CheckResult("lossless", "fail", f"no reference: {reference.failure}")
    if len(runs) != len(reference.generations):
        return CheckResult(
            "lossless",
            "fail",
            f"{len(runs)} answers to compare with {len(reference.generations)} reference answers",
        )
    ties: list[Divergence] = []
    identical = 0
    for name, ours, theirs in zip(requests.names, runs, reference.generations, strict=True):
        missing = missing_ids(name, ours, theirs)
        if missing:
            value = _value(requests, identical, ties, reference)
            return CheckResult("lossless", "fail", missing, value=value)
        found = first_divergence(name, ours, theirs, limits.tie_epsilon, texts)
        if found is None:
            identical += 1
        elif found.tie:
            ties.append(found)
        else:
            value = _value(requests, identical, ties, reference, found)
            detail = (
                f"speculation changed the text of {found.describe()} (tie epsilon "
                f"{limits.tie_epsilon:g}; reference: {reference.source})"
            )
            return CheckResult("lossless", "fail", detail, value=value)
    tokens = sum(len(g.token_ids) for g in runs)
    if not tokens:
        return CheckResult("lossless", "fail", "no answer to compare with the reference")
    noted = f"; {len(ties)} numerical tie(s) noted, first {ties[0].describe()}" if ties else ""
    detail = (
        f"{identical} of {len(runs)} answers identical token by token ({tokens} tokens) "
        f"to the reference ({reference.source}){noted}"
    )
    return CheckResult(
        "lossless", "pass", detail, value=_value(requests, identical, ties, reference)
    )


def _value(
    requests: Requests,
    identical: int,
    ties: Sequence[Divergence],
    reference: Reference,
    divergence: Divergence | None = None,
) -> dict[str, object]:
    return {
        "requests": len(requests.names),
        "identical": identical,
        "ties": len(ties),
        "tie_positions": [t.numbers() for t in ties[:3]],
        "reference": reference.source,
        "divergence": divergence.numbers() if divergence else None,
    }


def missing_tokens(runs: Sequence[Generation]) -> str:
    """Why the speculative run cannot be compared (no token ids), or empty."""
    bare = [g for g in runs if g.completion_tokens and not g.token_ids]
    return f"{len(bare)} answer(s) came without token ids" if bare else ""


# --- recorded references -------------------------------------------------------------------


class _StoredGeneration(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str
    finish_reason: str | None
    completion_tokens: int
    token_ids: list[int]
    top_logprobs: list[dict[int, float]]


class _StoredReference(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = 1
    recorded: str
    image_id: str
    names: list[str]
    generations: list[_StoredGeneration]


def recorded(
    source: ReferenceSource, image_id: str, key: str, requests: Requests
) -> Reference | None:
    """A reference recorded earlier for this key; None when there is none (a file that does
    not validate is none: it is rebuilt, never trusted)."""
    if source.store is None:
        return None
    path = source.store / f"{key}.json"
    try:
        stored = _StoredReference.model_validate_json(fileio.read_bytes(path))
    except (OSError, ValidationError, ValueError):
        return None
    if stored.image_id != image_id or stored.names != list(requests.names):
        return None
    generations = [
        Generation(
            prompt=p,
            text=g.text,
            finish_reason=g.finish_reason,
            completion_tokens=g.completion_tokens,
            tokens=tuple(map(str, g.token_ids)),
            logprobs=(),
            seconds=0.0,
            token_ids=tuple(g.token_ids),
            top_logprobs=tuple(g.top_logprobs),
        )
        for p, g in zip(requests.prompts, stored.generations, strict=True)
    ]
    return Reference(generations, f"recorded {stored.recorded}", _evidence(requests, generations))


def record(
    source: ReferenceSource, image_id: str, key: str, requests: Requests, reference: Reference
) -> None:
    """Keep a second boot's reference for the next run of the same image (image runs only:
    a command or URL run cannot show which image it was)."""
    if source.store is None or reference.failure:
        return
    stored = _StoredReference(
        recorded=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        image_id=image_id,
        names=list(requests.names),
        generations=[
            _StoredGeneration(
                text=g.text,
                finish_reason=g.finish_reason,
                completion_tokens=g.completion_tokens,
                token_ids=list(g.token_ids),
                top_logprobs=[dict(t) for t in g.top_logprobs],
            )
            for g in reference.generations
        ],
    )
    path = source.store / f"{key}.json"
    try:  # a cache: a full disk costs the next run a boot, it fails nothing
        source.store.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=source.store)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(stored.model_dump_json())
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True) if "tmp" in locals() else None


def url_reference(
    adapter: EngineAdapter, url: str, requests: Requests, progress: Progress
) -> Reference:
    """The requests on an engine somebody started without speculation."""
    try:
        generations = replay(adapter, url, requests, progress)
    except EngineHTTPError as exc:
        return Reference([], "", [], f"the reference at {url} failed: {exc.message}")
    return Reference(generations, f"--reference-url {url}", _evidence(requests, generations))


__all__ = [
    "Reference",
    "Requests",
    "boot_reference",
    "judge_lossless",
    "missing_tokens",
    "record",
    "recorded",
    "reference_from",
    "reference_target",
    "url_reference",
]
