"""The deep checks of one smoke run, in the order the runner calls them: before the smoke's
requests (counters), on the live engine after them (burn-in, long output, long context,
chat, acceptance per position), and once it is stopped (lossless's reference boot)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from sparkbuild.adapters import EngineAdapter, Generation, PositionCounts
from sparkbuild.checks import CheckResult
from sparkbuild.engines.profiles import SmokeProfile
from sparkbuild.engines.prompts import Prompt
from sparkbuild.smoke.deep import lossless as ll
from sparkbuild.smoke.deep import phases
from sparkbuild.smoke.deep.evidence import RequestEvidence
from sparkbuild.smoke.deep.plan import DeepPlan

Progress = Callable[[str], None]


@dataclass
class DeepRun:
    """One run's deep checks: their results and evidence as they come in."""

    plan: DeepPlan
    adapter: EngineAdapter
    profile: SmokeProfile
    progress: Progress
    results: dict[str, CheckResult] = field(default_factory=dict)
    evidence: list[RequestEvidence] = field(default_factory=list)
    image_id: str | None = None  # read from the container that ran (image and cluster runs)
    _positions: PositionCounts | None = None
    _requests: ll.Requests | None = None
    _runs: list[Generation] = field(default_factory=list)

    def request_extra(self, extra: Mapping[str, object]) -> dict[str, object]:
        """The smoke's own requests, with the fixed seed of the checks that replay them."""
        if self.plan.seed is None:
            return dict(extra)
        return {**extra, self.adapter.seed_field: self.plan.seed}

    def before_requests(self, base_url: str) -> None:
        if self.plan.limits.acceptance_per_position is not None:
            self._positions = self.adapter.position_counts(self.adapter.session(), base_url)

    def on_engine(
        self,
        base_url: str,
        prompts: Sequence[Prompt],
        names: Sequence[str],
        generations: Sequence[Generation],
    ) -> None:
        """Every check that needs the engine under test, after the smoke's requests."""
        engine = phases.Engine(self.adapter, base_url, self.profile)
        if self.plan.limits.burn_in is not None:
            self._burn_in(engine, prompts, names, generations)
        self._phases(engine)
        if self.plan.limits.lossless is not None:
            self._lossless_on_engine(engine, prompts, names, generations)

    def _phases(self, engine: phases.Engine) -> None:
        """Long output, long context and chat at the same time (the engine batches them;
        each judges its own answers), then the counters over all of it."""
        limits, seed, progress = self.plan.limits, self.plan.seed or 0, self.progress
        calls: list[Callable[[], phases.PhaseResult]] = []
        if limits.long_output is not None:
            calls.append(partial(phases.long_output, engine, limits.long_output, seed, progress))
        if limits.long_context is not None:
            calls.append(partial(phases.long_context, engine, limits.long_context, seed, progress))
        if limits.chat is not None:
            calls.append(partial(phases.chat, engine, limits.chat, seed, progress))
        if calls:
            with ThreadPoolExecutor(max_workers=len(calls)) as pool:
                for result in [pool.submit(call) for call in calls]:
                    self._add(result.result())
        if limits.acceptance_per_position is not None:
            after = self.adapter.position_counts(self.adapter.session(), engine.base_url)
            self.results["acceptance-per-position"] = phases.acceptance_per_position(
                self.adapter,
                self._positions or PositionCounts(),
                after,
                limits.acceptance_per_position,
                self.profile.expect.speculation,
            )

    def _burn_in(
        self,
        engine: phases.Engine,
        prompts: Sequence[Prompt],
        names: Sequence[str],
        generations: Sequence[Generation],
    ) -> None:
        """Burn-in over the smoke's answered requests (its round 1)."""
        assert self.plan.limits.burn_in is not None
        by_name = {p.name: p for p in prompts}
        first = [(by_name[n], g) for n, g in zip(names, generations, strict=True)]
        if not first:
            why = "nothing to repeat: no smoke request was answered"
            self.results["burn-in"] = CheckResult("burn-in", "skip", why)
            return
        extra = self.request_extra(self.profile.request)
        limits = self.plan.limits.burn_in
        self._add(phases.burn_in(engine, first, extra, limits, self.progress))

    def _add(self, result: phases.PhaseResult) -> None:
        self.results[result.check.name] = result.check
        self.evidence += result.evidence

    def _lossless_on_engine(
        self,
        engine: phases.Engine,
        prompts: Sequence[Prompt],
        names: Sequence[str],
        generations: Sequence[Generation],
    ) -> None:
        """Keep the speculative run; a recorded or running reference is compared now, while
        this engine can decode the divergence's tokens."""
        assert self.plan.limits.lossless is not None
        by_name = {p.name: p.text for p in prompts}
        self._requests = ll.Requests(
            tuple(names),
            tuple(by_name[n] for n in names),
            self.profile.expect.max_tokens,
            self.request_extra(self.profile.request),
            self.plan.limits.lossless.top_logprobs,
        )
        self._runs = list(generations)
        if not generations:  # the plain checks fail on why; there is nothing to replay
            why = "nothing to compare: no smoke request was answered"
            self.results["lossless"] = CheckResult("lossless", "skip", why)
            return
        missing = ll.missing_tokens(generations)
        if missing:
            self.results["lossless"] = CheckResult(
                "lossless", "fail", f"nothing to compare: {missing}"
            )
            return
        source = self.plan.reference
        reference = None
        if self.image_id is not None:
            key = self._requests.key(self.adapter, self.profile, self.image_id)
            reference = ll.recorded(source, self.image_id, key, self._requests, self.progress)
        if reference is None and source.url:
            reference = ll.url_reference(
                self.adapter, source.url, self._requests, self.progress, engine.base_url
            )
        if reference is not None:
            self._judge(reference, engine.texts)

    def after_engine(self) -> None:
        """Lossless's second boot, when no reference was recorded or running."""
        if (
            self.plan.limits.lossless is None
            or "lossless" in self.results
            or self._requests is None
        ):
            return
        reference = ll.boot_reference(
            self.adapter,
            self.profile,
            self.plan.reference,
            self._requests,
            self.progress,
            self._judge,
        )
        self._record(reference)

    def _record(self, reference: ll.Reference) -> None:
        """Keep a booted reference for the next run of the same image."""
        if self.image_id is not None and self._requests is not None:
            key = self._requests.key(self.adapter, self.profile, self.image_id)
            ll.record(self.plan.reference, self.image_id, key, self._requests, reference)

    def _judge(self, reference: ll.Reference, texts: ll.Texts) -> None:
        """Lossless against ``reference``; a recorded one that meets a tie is left for the
        second boot, which can continue past it."""
        assert self.plan.limits.lossless is not None and self._requests is not None
        continues = None
        if reference.base_url:
            continues = ll.resumes(
                self.adapter, reference.base_url, self._requests, self._runs, self.progress
            )
        result = ll.judge_lossless(
            self._runs, reference, self._requests, self.plan.limits.lossless, texts, continues
        )
        if result is None:
            self.progress("deep: lossless: the recorded reference meets a tie; booting one")
            return
        self.evidence += reference.evidence
        self.results["lossless"] = result

    def checks(self, skipped: str = "") -> list[CheckResult]:
        """Every planned check in report order; one that did not run is skipped with
        ``skipped`` (or why it could not)."""
        why = skipped or "the smoke's own requests did not complete"
        return [
            self.results.get(name) or CheckResult(name, "skip", why) for name in self.plan.checks
        ]


__all__ = ["DeepRun"]
