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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from sparkbuild import cachetrust
from sparkbuild.adapters import EngineAdapter, Generation, answers
from sparkbuild.checks import CheckResult
from sparkbuild.engines.profiles import LosslessLimits, SmokeProfile
from sparkbuild.engines.targets import Target, wait_ready
from sparkbuild.errors import EngineHTTPError, UntrustedCacheError
from sparkbuild.smoke.deep.compare import (
    CONTINUATION_TOKENS,
    SHOWN_TIES,
    Comparison,
    Resume,
    compare_across_ties,
    missing_ids,
)
from sparkbuild.smoke.deep.evidence import RequestEvidence, kept
from sparkbuild.smoke.deep.plan import ReferenceSource, same_engine

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


#: Per request (its index), how the reference continues past a tie in it.
Resumes = Callable[[int], Resume]


@dataclass
class Reference:
    generations: list[Generation]
    source: str  # "second boot", "--reference-url URL", "recorded <time>"
    evidence: list[RequestEvidence]
    failure: str = ""  # why there is none
    base_url: str = ""  # the engine it came from while it is up ("": recorded)


def resumes(
    adapter: EngineAdapter,
    base_url: str,
    requests: Requests,
    runs: Sequence[Generation],
    progress: Progress,
) -> Resumes:
    """Continuations on the reference engine at ``base_url``: request i's prompt as token
    ids, then the speculative run's first n token ids, greedy for a part of at most
    ``CONTINUATION_TOKENS`` (the comparison asks for the next where one ends)."""
    session = adapter.session()

    def for_request(index: int) -> Resume:
        asked: list[list[int] | None] = []  # the prompt's ids, asked once per request

        def resume(n: int) -> Generation | str:
            name, run = requests.names[index], runs[index]
            if not asked:
                text = requests.prompts[index]
                asked.append(answers.prompt_ids(adapter, session, base_url, text))
            prompt = asked[0]
            if prompt is None:
                return "the reference engine does not say the prompt's token ids (/tokenize)"
            progress(f"deep: lossless reference {name}, past a tie: from token {n}")
            if not isinstance(adapter, answers.IdPrompts):
                return f"{adapter.name} takes no prompt of token ids"
            try:
                ids = [*prompt, *run.token_ids[:n]]
                rest = min(requests.max_tokens - n, CONTINUATION_TOKENS)
                return adapter.generate_ids(
                    session, base_url, ids, rest, requests.extra, ranked=requests.ranked
                )
            except EngineHTTPError as exc:
                return f"the reference engine failed to continue: {exc.message}"

        return resume

    return for_request


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
    evidence = _evidence(requests, generations)
    reference = Reference(generations, how, evidence, "", target.base_url)
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
    continues: Resumes | None = None,
) -> CheckResult | None:
    """Every request's tokens against the reference's, under the tie rule, each over its
    whole length: at a tie the reference continues from the run's tokens (``continues``,
    while the reference engine is up). None when a tie needs a live reference and there is
    none (a recorded one: the caller boots one)."""
    if reference.failure:
        return CheckResult("lossless", "fail", f"no reference: {reference.failure}")
    if len(runs) != len(reference.generations):
        return CheckResult(
            "lossless",
            "fail",
            f"{len(runs)} answers to compare with {len(reference.generations)} reference answers",
        )
    compared: list[Comparison] = []
    for index, (name, ours, theirs) in enumerate(
        zip(requests.names, runs, reference.generations, strict=True)
    ):
        missing = missing_ids(name, ours, theirs)
        if missing:
            value = _value(requests, compared, reference)
            return CheckResult("lossless", "fail", missing, value=value)
        resume = continues(index) if continues else None
        found = compare_across_ties(name, ours, theirs, limits.tie_epsilon, texts, resume)
        if found.stopped and resume is None:
            return None
        compared.append(found)
        problem = _problem(found, ours, theirs)
        if problem:
            value = _value(requests, compared, reference)
            detail = (
                f"{problem} (tie epsilon {limits.tie_epsilon:g}; reference: {reference.source})"
            )
            return CheckResult("lossless", "fail", detail, value=value)
    if not sum(len(g.token_ids) for g in runs):
        return CheckResult("lossless", "fail", "no answer to compare with the reference")
    return CheckResult(
        "lossless",
        "pass",
        _passed(runs, compared, reference),
        value=_value(requests, compared, reference),
    )


def _problem(found: Comparison, ours: Generation, theirs: Generation) -> str:
    """Why one compared request fails lossless, or empty."""
    crossed = f" after {len(found.ties)} tie(s) crossed" if found.ties else ""
    if found.divergence is not None:
        return f"speculation changed the text of {found.divergence.describe()}{crossed}"
    if found.stopped:
        tie = found.ties[-1]
        return (
            f"{found.request}: not compared past the tie at token {tie.position}: {found.stopped}"
        )
    expected = found.tail.text if found.tail is not None else theirs.text
    same = ours.text.endswith(expected) if found.tail is not None else ours.text == expected
    if same:
        return ""
    return (
        f"{found.request}: the same token ids as the reference{crossed}, but other text "
        f"({kept(ours.text, 120)!r} against the reference's {kept(expected, 120)!r})"
    )


def _passed(
    runs: Sequence[Generation], compared: Sequence[Comparison], reference: Reference
) -> str:
    identical = sum(1 for c in compared if not c.ties)
    tokens = sum(len(g.token_ids) for g in runs)
    ties = [t for c in compared for t in c.ties]
    crossed = ""
    if ties:
        where = ", ".join(f"{t.request} at {t.position}" for t in ties[:5])
        more = f" and {len(ties) - 5} more" if len(ties) > 5 else ""
        crossed = (
            f"; {len(ties)} numerical tie(s) crossed ({where}{more}), every answer compared "
            "to its end"
        )
    return (
        f"{identical} of {len(runs)} answers identical token by token ({tokens} tokens) "
        f"to the reference ({reference.source}){crossed}"
    )


def _value(
    requests: Requests, compared: Sequence[Comparison], reference: Reference
) -> dict[str, object]:
    ties = [t for c in compared for t in c.ties]
    divergence = next((c.divergence for c in compared if c.divergence is not None), None)
    return {
        "requests": len(requests.names),
        "identical": sum(1 for c in compared if not c.ties and c.divergence is None),
        "ties": len(ties),
        "tie_positions": [t.numbers() for t in ties[:SHOWN_TIES]],
        "crossed": [{"request": t.request, "position": t.position} for t in ties[:20]],
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
    source: ReferenceSource, image_id: str, key: str, requests: Requests, progress: Progress
) -> Reference | None:
    """A reference recorded earlier for this key; None when there is none. A reference is a
    verdict's input, so it is trusted as preflight's caches are (``cachetrust``): the folder
    and every folder above it the user's or root's and written by no one else, the file the
    user's own, no symlink, not writable by group or others, and its digest of itself
    intact. One that fails any of it is said and not used (the reference is booted again);
    one that does not validate is rebuilt, never trusted."""
    if source.store is None:
        return None
    path = source.store / f"{key}.json"
    if not os.path.lexists(path):
        return None
    why = _untrusted(source.store, path)
    if why:
        progress(f"deep: lossless: the recorded reference {path} is not used: {why}")
        return None
    try:
        stored = _StoredReference.model_validate(cachetrust.read_manifest(path))
    except ValidationError:
        progress(f"deep: lossless: the recorded reference {path} is not used: its digest or shape")
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


def _untrusted(store: Path, path: Path) -> str:
    """Why a recorded reference at ``path`` in ``store`` is not trusted, or empty."""
    if path.is_symlink():
        return "it is a symlink"
    folder = cachetrust.chain_problem(store)
    if folder is not None:
        return f"its folder {folder}"
    return cachetrust.path_problem(path) or ""


def record(
    source: ReferenceSource, image_id: str, key: str, requests: Requests, reference: Reference
) -> None:
    """Keep a second boot's reference for the next run of the same image (image runs only:
    a command or URL run cannot show which image it was), in a folder of the user's own
    (0700), with its digest of itself."""
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
    try:  # a cache: a full disk or a folder not ours costs the next run a boot, nothing more
        cachetrust.private_dir(source.store, "the smoke references folder")
        if path.is_symlink() or (path.exists() and cachetrust.path_problem(path)):
            path.unlink()  # the link or the file someone else left, never what it points to
        cachetrust.write_manifest(path, stored.model_dump(mode="json"))
    except (OSError, UntrustedCacheError):
        return


def url_reference(
    adapter: EngineAdapter, url: str, requests: Requests, progress: Progress, under_test: str
) -> Reference:
    """The requests on an engine somebody started without speculation: never the engine
    under test (``under_test``), and one whose counters show no speculation meanwhile."""
    if same_engine(url, under_test):
        why = (
            f"--reference-url {url} is the engine under test ({under_test}): pass an engine "
            "of the same image and model running without speculation"
        )
        return Reference([], "", [], why)
    session = adapter.session()
    before = adapter.snapshot_counters(session, url)
    try:
        generations = replay(adapter, url, requests, progress)
    except EngineHTTPError as exc:
        return Reference([], "", [], f"the reference at {url} failed: {exc.message}")
    drafted = adapter.acceptance(before, adapter.snapshot_counters(session, url), generations)
    if drafted.active and (drafted.accept_len or 0.0) > 1.0:
        why = (
            f"the engine at --reference-url {url} speculates (accept_len "
            f"{drafted.accept_len:.2f} during the reference's requests): it cannot be the "
            "reference"
        )
        return Reference([], "", [], why)
    evidence = _evidence(requests, generations)
    return Reference(generations, f"--reference-url {url}", evidence, "", url)


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
    "resumes",
    "url_reference",
]
