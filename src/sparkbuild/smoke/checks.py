"""The smoke checks: each turns measurements into ``pass``/``fail``/``skip``, a value, a reason."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sparkbuild.adapters import Acceptance, Generation, non_finite
from sparkbuild.checks import CheckResult
from sparkbuild.engines.profiles import Expectations, RepetitionLimits
from sparkbuild.engines.signatures import Diagnosis
from sparkbuild.engines.targets import Readiness
from sparkbuild.errors import EngineHTTPError

CHECK_NAMES = ("boot", "accept_len", "nan", "output", "errors")
SPECULATION_INACTIVE = "speculation inactive"


def check_boot(
    readiness: Readiness | None,
    timeout_s: float,
    last_lines: Sequence[str],
    diagnoses: Sequence[Diagnosis],
    describe_exit: Callable[[int], str] | None = None,
) -> CheckResult:
    if readiness is None:
        return CheckResult("boot", "skip", "engine started elsewhere (--url): no boot check")
    seconds = round(readiness.seconds, 1)
    if readiness.ready:
        note = "" if readiness.ready_line_seen else " (ready log line not seen)"
        return CheckResult("boot", "pass", f"ready after {seconds:.1f} s{note}", value=seconds)
    if readiness.outcome == "exited":
        code = readiness.exit_code if readiness.exit_code is not None else -1
        how = describe_exit(code) if describe_exit else f"engine exited with status {code}"
        reason = f"{how} before it was ready"
    else:
        reason = f"not ready within {timeout_s:g} s"
    if last_lines:
        reason += f"; last log line: {last_lines[-1].strip()[:300]}"
    if diagnoses:
        reason += "; " + "; ".join(f"known failure {d.id}: {d.diagnosis}" for d in diagnoses)
    return CheckResult("boot", "fail", reason, value=seconds)


def check_ranks(
    expected: int, world: int | None, ranks: set[int], nodes: Sequence[str]
) -> CheckResult:
    """Every rank of a multi-node engine joined its world, as the engine's own log says.
    ``nodes`` are in rank order when each node runs one rank (a rank that never joined is
    named with its node)."""
    where = f"over {len(nodes)} nodes ({', '.join(nodes)})"
    if world is None:
        return CheckResult(
            "ranks",
            "fail",
            f"no rank logged joining the engine's world {where}; expected {expected}",
            value=0,
        )
    missing = sorted(set(range(expected)) - ranks)
    if world != expected or missing:
        detail = f"world size {world}, expected {expected}"
        if missing:
            named = [f"{r} ({nodes[r]})" if len(nodes) == expected else str(r) for r in missing]
            detail += f"; rank(s) {', '.join(named)} never joined"
        return CheckResult("ranks", "fail", detail + f" {where}", value=len(ranks))
    return CheckResult(
        "ranks", "pass", f"{len(ranks)} of {expected} ranks joined {where}", value=len(ranks)
    )


def check_accept_len(acceptance: Acceptance | None, expect: Expectations) -> CheckResult:
    if not expect.speculation:
        return CheckResult("accept_len", "skip", "profile expects no speculation")
    if acceptance is None:
        return CheckResult("accept_len", "skip", "no requests were served")
    if acceptance.impossible:
        return CheckResult("accept_len", "fail", f"not measurable: {acceptance.impossible}")
    if not acceptance.active or acceptance.accept_len is None:
        detail = SPECULATION_INACTIVE + (f": {acceptance.detail}" if acceptance.detail else "")
        return CheckResult("accept_len", "fail", detail)
    value = round(acceptance.accept_len, 3)
    source = f"from {acceptance.source}"
    if expect.min_accept_len is None:
        ok, rule = acceptance.accept_len > 1.0, "> 1.0"
    else:
        ok, rule = acceptance.accept_len >= expect.min_accept_len, f">= {expect.min_accept_len:g}"
    if ok:
        return CheckResult("accept_len", "pass", f"{value:.2f} {rule} ({source})", value=value)
    why = " (no draft token accepted)" if acceptance.accept_len <= 1.0 else ""
    return CheckResult(
        "accept_len", "fail", f"{value:.2f}, expected {rule}{why} ({source})", value=value
    )


def check_nan(
    generations: Sequence[Generation],
    engine_nan_count: float | None,
    nan_lines: Sequence[str],
    nan_responses: Sequence[EngineHTTPError] = (),
) -> CheckResult:
    """NaN/null/inf logprobs, the engine's NaN counter, NaN log lines, or responses the engine
    could not serialize because they held NaN (vLLM answers HTTP 400 "Out of range float
    values are not JSON compliant")."""
    if not generations and not nan_lines and not engine_nan_count and not nan_responses:
        return CheckResult("nan", "skip", "no completions to inspect")
    bad = sum(non_finite(g.logprobs) for g in generations)
    total = sum(len(g.logprobs) for g in generations)
    missing = [g for g in generations if g.completion_tokens and not g.logprobs]
    problems = []
    if bad:
        problems.append(f"{bad} of {total} logprobs are NaN, null or infinite")
    if nan_responses:
        problems.append(
            f"{len(nan_responses)} response(s) held NaN/inf logprobs: {nan_responses[0].message}"
        )
    if engine_nan_count:
        problems.append(f"engine NaN counter rose by {engine_nan_count:g}")
    if nan_lines:
        problems.append(f"NaN log line: {nan_lines[0].strip()}")
    if problems:
        return CheckResult("nan", "fail", "; ".join(problems), value=bad + len(nan_responses))
    if missing or not total:
        return CheckResult(
            "nan",
            "fail",
            f"the engine returned no logprobs to inspect ({len(generations)} completion(s), "
            f"{total} logprobs): a check of nothing is no pass",
        )
    return CheckResult("nan", "pass", f"{total} logprobs finite", value=0)


def repeated_fraction(tokens: Sequence[str], n: int) -> float:
    """Share of n-grams that repeat an earlier n-gram: ~0 for prose, ~1 for a loop."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def check_output(
    generations: Sequence[Generation],
    names: Sequence[str],
    exempt: Sequence[bool],
    expect: Expectations,
    request_errors: int,
    nan_responses: int = 0,
) -> CheckResult:
    if not generations:
        if request_errors and request_errors == nan_responses:  # one cause, judged by nan
            detail = "no completion to judge: every response held NaN (see nan)"
            return CheckResult("output", "skip", detail, value=0)
        detail = "no completion returned" if request_errors else "no requests were served"
        return CheckResult("output", "fail", detail, value=0)
    problems: list[str] = []
    empty = [n for n, g in zip(names, generations, strict=True) if not g.text.strip()]
    if empty:
        problems.append(f"{len(empty)} empty completion(s) ({', '.join(empty)})")
    if expect.finish != "any":
        wrong = [
            (n, g.finish_reason)
            for n, g in zip(names, generations, strict=True)
            if g.finish_reason != expect.finish
        ]
        if wrong:
            name, reason = wrong[0]
            problems.append(f"finish reason {reason!r} for {name}, expected {expect.finish!r}")
    worst = 0.0
    if expect.repetition is not None:
        worst, degenerate = _worst_repetition(generations, names, exempt, expect.repetition)
        if degenerate:
            problems.append(degenerate)
    value = {"completions": len(generations), "max_repeated_fraction": round(worst, 3)}
    if problems:
        return CheckResult("output", "fail", "; ".join(problems), value=value)
    tokens = sum(g.completion_tokens for g in generations)
    return CheckResult(
        "output", "pass", f"{len(generations)} completions, {tokens} tokens", value=value
    )


def _worst_repetition(
    generations: Sequence[Generation],
    names: Sequence[str],
    exempt: Sequence[bool],
    limits: RepetitionLimits,
) -> tuple[float, str]:
    worst, message = 0.0, ""
    for generation, name, skip in zip(generations, names, exempt, strict=True):
        units = generation.tokens or tuple(generation.text.split())
        if skip or len(units) < limits.min_tokens:
            continue
        fraction = repeated_fraction(units, limits.ngram)
        worst = max(worst, fraction)
        if fraction > limits.max_repeated_fraction and not message:
            message = (
                f"degenerate repetition in {name}: {fraction:.0%} of {limits.ngram}-grams "
                f"repeat (limit {limits.max_repeated_fraction:.0%})"
            )
    return worst, message


def check_errors(
    http_errors: Sequence[EngineHTTPError],
    error_lines: Sequence[str],
    max_error_lines: int,
    nan_responses: Sequence[EngineHTTPError] = (),
) -> CheckResult:
    """HTTP errors and engine error lines; responses that failed because they held NaN are
    the nan check's (one cause, one failed check)."""
    others = [e for e in http_errors if e not in nan_responses]
    value = {"http": len(others), "log": len(error_lines)}
    problems = []
    if others:
        problems.append(f"{len(others)} failed request(s): {others[0].message}")
    if len(error_lines) > max_error_lines:
        problems.append(f"{len(error_lines)} engine error line(s): {error_lines[0].strip()}")
    if problems:
        return CheckResult("errors", "fail", "; ".join(problems), value=value)
    counted = f" ({len(nan_responses)} NaN response(s) judged by nan)" if nan_responses else ""
    detail = f"no HTTP errors or engine error lines{counted}"
    return CheckResult("errors", "pass", detail, value=value)
