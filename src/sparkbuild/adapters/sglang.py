"""SGLang: everything sparkbuild knows about it, behind :class:`EngineAdapter`.

Serving:

* ``/generate`` with ``return_logprob``; ``meta_info.spec_verify_ct`` (all versions) and
  ``spec_accept_length`` = completion_tokens / spec_verify_ct; 0.5.10 adds
  ``spec_accept_token_num``/``spec_draft_token_num``; ``spec_num_correct_drafts`` is there
  from 0.5.12 (``managers/tokenizer_manager.py`` sets it in ``meta_info``);
* with ``--enable-metrics`` (always added): counter ``sglang:generation_tokens_total`` and
  gauge ``sglang:spec_accept_length``; ``sglang:spec_verify_calls_total`` only from 0.5.13,
  so an adapter for an older version never relies on it;
* decode log ``accept len: 2.83``;
* ``/server_info`` ``internal_states[*].avg_spec_accept_length`` (a lifetime average, so
  only a hint) and ``version``.

What each release reads differs (its NaN switch, its signals), so profiles never set a
variable the engine under test ignores, and smoke never relies on a metric that version
lacks. Read from each release's ``srt/environ.py``, ``srt/server_args.py`` and
``srt/observability/metrics_collector.py`` in the PyPI wheels, every release from 0.5.10 to
0.5.23 (post releases included):

* 0.5.10 to 0.5.12.post1: ``SGLANG_SPEC_NAN_DETECTION`` (``speculative/spec_utils.py``
  ``maybe_detect_nan``: an async assert on the speculative paths) and the deprecated
  ``--enable-nan-detection``, which sets that variable and also turns on the sampler's own
  check (``layers/sampler.py``: "Detected errors during sampling! NaN in the logits.").
  Both are set. The argument is gone from 0.5.13.
* 0.5.13 to 0.5.13.post1: no NaN-specific switch. (``SGLANG_ENABLE_ASYNC_ASSERT`` asserts every
  invariant probe, NaN among them: a CI switch, not set by profiles.)
* 0.5.14 to 0.5.21: ``SGLANG_SANITIZE_NAN_LOGITS`` (``utils/async_probe.py``
  ``sanitize_nan_logits``): NaN logits are replaced before sampling and logged once as
  "NaN detected in ...; values were sanitized". The output stays finite, so the log line is
  the signal.
* 0.5.22 to 0.5.23: ``SGLANG_ENABLE_NAN_LOGITS_CHECK`` (``async_probe.maybe_detect_nan``: the engine
  asserts, "NaN detected!").
* ``sglang:spec_verify_calls_total`` first appears in 0.5.13.

Source builds (read from the release wheels on PyPI, 0.5.10-0.5.23):

* every release from 0.5.10 requires ``sglang-kernel`` (wheel ``sglang_kernel-*.whl``,
  imported as ``sgl_kernel``); older trees build ``sgl_kernel-*.whl``;
* 0.5.17 reorganised the kernels (``sglang/jit_kernel`` became ``sglang/kernels``); the AOT
  kernel tree moved from ``sgl-kernel/`` to ``python/sglang/kernels/aot`` with it (the AOT
  sources are not in the wheels: checked in the tree, not here).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import requests
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sparkbuild import jsontext, net
from sparkbuild.adapters.base import EngineAdapter
from sparkbuild.adapters.facts import (
    BenchCounters,
    MemoryFacts,
    Moved,
    PreflightFacts,
    ProbeFacts,
    RecipeFacts,
    SourceBuild,
)
from sparkbuild.adapters.values import (
    Acceptance,
    Counters,
    Generation,
    Layout,
    RankCommand,
    RankPlace,
    flag_value,
    optional_float,
    parse_or_fail,
    whole_number,
)
from sparkbuild.adapters.versions import UNKNOWN_VERSION, NanSwitch, parse_version

_NAN: list[tuple[SpecifierSet, NanSwitch]] = [
    (
        SpecifierSet("<0.5.13"),
        NanSwitch(
            env={"SGLANG_SPEC_NAN_DETECTION": "1"},
            args=("--enable-nan-detection",),
            signal="sampler logs NaN logits, speculative paths assert ('NaN detected!')",
        ),
    ),
    (
        SpecifierSet(">=0.5.13,<0.5.14"),
        NanSwitch(signal="no NaN switch in this version: logprobs and the output only"),
    ),
    (
        SpecifierSet(">=0.5.14,<0.5.22"),
        NanSwitch(
            env={"SGLANG_SANITIZE_NAN_LOGITS": "1"},
            signal="NaN logits sanitized and logged once ('NaN detected in ...')",
        ),
    ),
    (
        SpecifierSet(">=0.5.22"),
        NanSwitch(
            env={"SGLANG_ENABLE_NAN_LOGITS_CHECK": "1"},
            signal="the engine asserts no NaN in the logits ('NaN detected!')",
        ),
    ),
]
#: Every SGLang NaN variable any release reads; one a version does not read is refused.
NAN_VARIABLES = frozenset(
    {"SGLANG_SPEC_NAN_DETECTION", "SGLANG_SANITIZE_NAN_LOGITS", "SGLANG_ENABLE_NAN_LOGITS_CHECK"}
)
_READS: dict[str, SpecifierSet] = {
    "SGLANG_SPEC_NAN_DETECTION": SpecifierSet("<0.5.13"),
    "SGLANG_SANITIZE_NAN_LOGITS": SpecifierSet(">=0.5.14"),
    "SGLANG_ENABLE_NAN_LOGITS_CHECK": SpecifierSet(">=0.5.22"),
}
VERIFY_COUNTER_SINCE = Version("0.5.13")


def nan_switch_of(version: Version | None) -> NanSwitch:
    """The NaN detection SGLang ``version`` reads."""
    if version is None:
        return UNKNOWN_VERSION
    for when, switch in _NAN:
        if when.contains(version, prereleases=True):
            return switch
    return UNKNOWN_VERSION


def ignored_variables_of(version: Version, env: Mapping[str, str]) -> list[str]:
    """NaN variables in ``env`` that SGLang ``version`` does not read."""
    return sorted(
        name
        for name in env
        if name in _READS and not _READS[name].contains(version, prereleases=True)
    )


def has_verify_counter(version: Version | None) -> bool:
    return version is None or version >= VERIFY_COUNTER_SINCE


class SglangAdapter(EngineAdapter):
    name = "sglang"
    default_port = 30000
    default_launcher = ("python3", "-m", "sglang.launch_server")
    ready_line = re.compile(r"The server is fired up and ready to roll")
    # ModelRunner's lines (0.5.10 to 0.5.23): each worker (target, then draft) loads its
    # weights, sizes and allocates its pools, then captures its graphs.
    boot_phases = (
        ("loading", re.compile(r"Load weight begin")),
        ("kv cache", re.compile(r"Load weight end|KV Cache is allocated|Memory pool end")),
        ("graph capture", re.compile(r"Capture .*graph begin", re.IGNORECASE)),
    )
    nan_line = re.compile(r"NaN detected|NaN in the logits|Detected errors during sampling", re.I)
    error_line = re.compile(
        r"hit an exception|Traceback \(most recent call last\)|\bERROR\b|CUDA error"
    )
    accept_line = re.compile(r"\baccept len:\s*([0-9.]+)")
    max_len_flag = "--context-length"

    VERIFY_CALLS = "sglang:spec_verify_calls_total"
    GENERATED = "sglang:generation_tokens_total"
    ACCEPT_GAUGE = "sglang:spec_accept_length"
    bench_counters = BenchCounters(generated=GENERATED, timing_prefix="sglang:")
    # What smoke and bench read; preflight_signals below keeps those each version has.
    relied_metrics = (
        (VERIFY_CALLS, "smoke acceptance fallback (counters)"),
        (GENERATED, "smoke/bench acceptance from counters"),
        (ACCEPT_GAUGE, "bench acceptance gauge"),
    )
    relied_fields = (
        ("spec_verify_ct", "per-request acceptance (meta_info)"),
        ("spec_accept_length", "per-request acceptance (meta_info)"),
        ("completion_tokens", "per-request token count (meta_info)"),
        ("avg_spec_accept_length", "/server_info lifetime acceptance"),
    )

    display_name = "SGLang"
    source_build = SourceBuild(
        # The release image: a CUDA 13 devel image with torch (pinned by digest when locked).
        base_image="lmsysorg/sglang:v{version}-cu130",
        args={"TORCH_CUDA_ARCH_LIST": "12.1a"},
        moves=(
            Moved("SGL_KERNEL_DIR", "<0.5.17", "sgl-kernel"),
            Moved("SGL_KERNEL_DIR", ">=0.5.17", "python/sglang/kernels/aot"),
            Moved("SGL_KERNEL_WHEEL", "<0.5.10", "sgl_kernel"),
            Moved("SGL_KERNEL_WHEEL", ">=0.5.10", "sglang_kernel"),
        ),
    )
    preflight = PreflightFacts(
        registry_dir="srt/models",
        spark_gpu=True,
        probe=ProbeFacts(
            parser="server_args",
            prog="sglang.launch_server",
            model_flag="--model-path",
            distributions=("sglang",),
            env_prefixes=("SGLANG_", "SGL_"),
            env_module="srt/environ.py",
            config_registry="srt.utils.hf_transformers.common",
            config_args=("--device", "cpu"),
            signals_source="adapters/sglang.py preflight_signals",
        ),
    )
    memory = MemoryFacts(
        budget_flag="--mem-fraction-static",
        budget_default=0.88,
        context_flag="--context-length",
        draft_counted_from=Version("0.5.14"),  # PRs #23862, #28855, #29616
        draft_head_transient=True,
        draft_patch="draft-memory-before-kv-pool.patch",
    )
    # a table: sparkrun's recipe keys and flag maps, several pairs to a row
    recipes = RecipeFacts(
        runtimes={"sglang": "native"},
        command=re.compile(r"^(?:sglang\s+serve|python3?\s+-m\s+sglang\.launch_server)\b"),
        prefixes=(("sglang", "serve"), ("python", "-m", "sglang.launch_server"),
                  ("python3", "-m", "sglang.launch_server")),
        model_flags=("--model-path", "--model"),
        rendered_keys={
            "port": "--port", "host": "--host", "tensor_parallel": "--tp-size",
            "pipeline_parallel": "--pp-size", "ep_size": "--ep-size",
            "gpu_memory_utilization": "--mem-fraction-static", "max_model_len": "--context-length",
            "served_model_name": "--served-model-name", "dtype": "--dtype",
            "quantization": "--quantization", "trust_remote_code": "--trust-remote-code",
            "kv_cache_dtype": "--kv-cache-dtype",
        },
        parallel_flags={"--tp-size": "tp", "--tp": "tp", "--pp-size": "pp", "--ep-size": "ep",
                        "--ep": "ep", "--dp-size": "dp", "--dp": "dp", "--nnodes": "nodes",
                        "--node-rank": "rank", "--dist-init-addr": "rank"},
        toggles=frozenset({"trust_remote_code"}),
        speculative_flags=("--speculative-algorithm",),
        speculative_key="speculative_algorithm",
        export_runtimes={"native": "sglang"},
        expert_parallel_args=("--ep-size", "{ep}"),
        export_command="python3 -m sglang.launch_server --model-path {model}",
    )  # fmt: skip

    def nan_switch(self) -> NanSwitch:
        return nan_switch_of(self.version)

    @classmethod
    def preflight_signals(cls, version: Version | str | None) -> list[dict[str, str]]:
        """Every metric and response field this adapter relies on for SGLang ``version``."""
        parsed = parse_version(str(version)) if version is not None else None
        fields = ("completion_tokens", "spec_verify_ct", "spec_accept_length")
        signals = [
            {"name": f, "kind": "field", "used_for": "acceptance per request"} for f in fields
        ]
        if has_verify_counter(parsed):
            signals += [
                {
                    "name": cls.VERIFY_CALLS,
                    "kind": "metric",
                    "used_for": "acceptance from counters",
                },
                {"name": cls.GENERATED, "kind": "metric", "used_for": "acceptance from counters"},
            ]
        return signals

    @classmethod
    def draft_model(cls, args: Sequence[str]) -> str | None:
        return flag_value(args, "--speculative-draft-model-path") or None

    @classmethod
    def speculative_method(cls, args: Sequence[str]) -> str | None:
        return flag_value(args, "--speculative-algorithm") or None

    def ignored_variables(self, env: Mapping[str, str]) -> list[str]:
        if self.version is None:
            return []
        return ignored_variables_of(self.version, env)

    @classmethod
    def launcher_flags(cls, args: Sequence[str]) -> list[str]:
        # The counters smoke and bench read (/metrics) are served only with it.
        return [] if "--enable-metrics" in args else ["--enable-metrics"]

    def serve_args(self, model: str, host: str, port: int, args: Sequence[str]) -> list[str]:
        extra = self.launcher_flags(args)
        return ["--model-path", model, "--host", host, "--port", str(port), *extra, *args]

    cluster_launcher = default_launcher
    parallel_launchers = ("native",)
    parallel_flags = (
        "--tp-size",
        "--tp",
        "--tensor-parallel-size",
        "--ep-size",
        "--ep",
        "--expert-parallel-size",
        "--pp-size",
        "--pipeline-parallel-size",
        "--nnodes",
        "--node-rank",
        "--dist-init-addr",
        "--nccl-init-addr",
    )
    # distributed/parallel_state.py (0.5.10-0.5.23), on every rank:
    # "Created global TCPStore at 10.0.0.1:29500 (rank=1, world_size=4)"
    rank_line = re.compile(
        r"Created global TCPStore at \S+ \(rank=(?P<rank>\d+), world_size=(?P<world>\d+)\)"
    )

    def rank_command(
        self,
        launcher: Sequence[str],
        serve: Sequence[str],
        parallel: Layout,
        place: RankPlace,
    ) -> RankCommand:
        """SGLang across nodes: every rank runs the server with ``--nnodes --node-rank
        --dist-init-addr``; only rank 0 serves HTTP (torch.distributed over NCCL)."""
        sizes = ["--tp-size", str(parallel.tp)]
        if parallel.ep > 1:
            sizes += ["--ep-size", str(parallel.ep)]
        if parallel.pp > 1:
            sizes += ["--pp-size", str(parallel.pp)]
        rendezvous = [
            "--nnodes",
            str(place.nodes),
            "--node-rank",
            place.rank_arg,
            "--dist-init-addr",
            f"{place.leader_address}:{place.port}",
        ]
        return RankCommand(
            list(launcher[:1]),
            [*launcher[1:], *serve, *sizes, *rendezvous],
            serves_http=place.leader,
        )

    def generate(
        self,
        session: net.Session,
        base_url: str,
        prompt: str,
        max_tokens: int,
        extra: Mapping[str, object] | None = None,
        *,
        ranked: int = 0,
    ) -> Generation:
        return self._generate(
            session, base_url, {"text": prompt}, prompt, max_tokens, extra, ranked
        )

    def generate_ids(
        self,
        session: net.Session,
        base_url: str,
        prompt_ids: Sequence[int],
        max_tokens: int,
        extra: Mapping[str, object] | None = None,
        *,
        ranked: int = 0,
    ) -> Generation:
        """``/generate`` takes a prompt of token ids as ``input_ids`` (0.5.10 to 0.5.23
        ``GenerateReqInput``)."""
        prompt = {"input_ids": list(prompt_ids)}
        shown = f"<{len(prompt_ids)} token ids>"
        return self._generate(session, base_url, prompt, shown, max_tokens, extra, ranked)

    def _generate(
        self,
        session: net.Session,
        base_url: str,
        prompt: Mapping[str, object],
        shown: str,
        max_tokens: int,
        extra: Mapping[str, object] | None,
        ranked: int,
    ) -> Generation:
        body: dict[str, object] = {
            **prompt,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0, **(extra or {})},
            "return_logprob": True,
        }
        if ranked:
            body.update(top_logprobs_num=ranked, return_text_in_logprobs=True)
        url = base_url + "/generate"
        payload, seconds = self.post_json(session, url, body)
        parse = self.ranked_from_response if ranked else self.generation_from_response
        return parse_or_fail(f"POST {url}", lambda: parse(shown, payload, seconds))

    @classmethod
    def ranked_from_response(
        cls, prompt: str, payload: Mapping[str, Any], seconds: float = 0.0
    ) -> Generation:
        """A /generate response with ``top_logprobs_num`` and ``return_text_in_logprobs``:
        ``output_token_logprobs`` [logprob, id, text] and ``output_top_logprobs``, per
        position a list of the same triples (0.5.10 to 0.5.23)."""
        plain = cls.generation_from_response(prompt, payload, seconds)
        meta = payload.get("meta_info") or {}
        entries = meta.get("output_token_logprobs") or []
        top = meta.get("output_top_logprobs") or []
        return replace(
            plain,
            token_ids=tuple(whole_number(e[1], "token id", 1 << 31) for e in entries),
            token_texts=tuple(str(e[2]) if len(e) > 2 else "" for e in entries),
            top_logprobs=tuple(
                {whole_number(a[1], "token id", 1 << 31): _logprob(a[0]) for a in alternatives}
                for alternatives in top
            ),
        )

    #: ``sampling_params.sampling_seed`` (0.5.10 to 0.5.23 ``sampling/sampling_params.py``).
    seed_field = "sampling_seed"

    #: SGLang (0.5.11-0.5.23 read) exports ``sglang:spec_accept_length`` and
    #: ``sglang:spec_accept_rate``, gauges over every position, and no per-position series.
    per_position_missing = (
        "SGLang exports no per-position acceptance (sglang:spec_accept_length and "
        "sglang:spec_accept_rate are gauges over every position; 0.5.11-0.5.23)"
    )

    def without_speculation(self, args: Sequence[str]) -> list[str]:
        """SGLang speculates with ``--speculative-algorithm``; every other ``--speculative-*``
        flag (and ``--enable-multi-layer-eagle``) needs it, so all go, with their values
        (0.5.23 ``arg_groups/fields/spec.py``: the boolean ones take none)."""
        kept: list[str] = []
        dropping = False
        for word in args:
            name = word.partition("=")[0]
            if _speculation_flag(name):
                dropping = "=" not in word
                continue
            if dropping and not word.startswith("--"):
                dropping = False
                continue
            dropping = False
            kept.append(word)
        return kept

    @staticmethod
    def generation_from_response(
        prompt: str, payload: Mapping[str, Any], seconds: float = 0.0
    ) -> Generation:
        """A /generate response (any version from 0.5.10 on) as a Generation."""
        meta = payload.get("meta_info") or {}
        finish = meta.get("finish_reason")
        reason = finish.get("type") if isinstance(finish, Mapping) else finish
        entries = meta.get("output_token_logprobs") or []
        verify = meta.get("spec_verify_ct")
        length = meta.get("spec_accept_length")
        completion_tokens = whole_number(meta.get("completion_tokens"), "completion_tokens")
        steps = whole_number(verify, "spec_verify_ct") if verify is not None else None
        if steps is not None and steps > completion_tokens:  # each verify step emits a token
            raise ValueError(
                f"spec_verify_ct is {steps}, more than the {completion_tokens} completion_tokens"
            )
        accept_length = optional_float(length) if length is not None else None
        if accept_length is not None and not 0 <= accept_length <= completion_tokens + 1:
            raise ValueError(f"spec_accept_length is {accept_length:g}, not a possible length")
        return Generation(
            prompt=prompt,
            text=str(payload.get("text") or ""),
            finish_reason=reason,
            completion_tokens=completion_tokens,
            tokens=tuple(str(e[1]) for e in entries if len(e) > 1),
            logprobs=tuple(optional_float(e[0]) for e in entries if e),
            seconds=seconds,
            spec_verify_ct=steps,
            spec_accept_length=accept_length,
            raw=payload,
        )

    def acceptance_from_generations(self, generations: Sequence[Generation]) -> Acceptance | None:
        """Σ completion_tokens / Σ spec_verify_ct over the requests that report speculation.

        Falls back to completion_tokens / spec_accept_length for a response that has the
        length but not the verify count.
        """
        tokens = steps = 0.0
        for generation in generations:
            if generation.spec_verify_ct:
                steps += generation.spec_verify_ct
                tokens += generation.completion_tokens
            elif generation.spec_accept_length:
                steps += generation.completion_tokens / generation.spec_accept_length
                tokens += generation.completion_tokens
        if steps <= 0:
            return None
        return Acceptance(True, tokens / steps, "per-request fields", steps, tokens)

    def impossible_counts(self, before: Counters, after: Counters) -> str:
        verify = after.delta(before, self.VERIFY_CALLS)
        generated = after.delta(before, self.GENERATED)
        if verify is not None and generated is not None and verify > generated:
            return (  # every verify step emits at least one token
                f"{verify:g} verify steps ({self.VERIFY_CALLS}) but only {generated:g} tokens "
                f"generated ({self.GENERATED})"
            )
        return ""

    def acceptance_over(self, before: Counters, after: Counters) -> Acceptance:
        if not after.available:
            return Acceptance(
                False,
                None,
                "counters",
                detail=after.problem or "/metrics not readable (start with --enable-metrics)",
            )
        if not has_verify_counter(self.version):
            return Acceptance(
                False,
                None,
                "counters",
                detail=f"SGLang {self.version} has no {self.VERIFY_CALLS} (first in "
                f"{VERIFY_COUNTER_SINCE}); per-request fields only",
            )
        verify = after.delta(before, self.VERIFY_CALLS)
        generated = after.delta(before, self.GENERATED)
        if verify is None or generated is None or verify <= 0:
            return Acceptance(
                False, None, "counters", detail="no speculative verify steps during the requests"
            )
        return Acceptance(True, generated / verify, "counters", verify, generated)

    @staticmethod
    def server_info_accept_length(server_info: Mapping[str, object]) -> float | None:
        """``internal_states[*].avg_spec_accept_length`` (lifetime average; mean over DP ranks)."""
        states = server_info.get("internal_states") or []
        if not isinstance(states, list):
            return None
        found = [
            optional_float(state.get("avg_spec_accept_length"))
            for state in states
            if isinstance(state, Mapping)
        ]
        values = [v for v in found if v is not None and math.isfinite(v)]
        return sum(values) / len(values) if values else None

    def fetch_server_info(self, session: net.Session, base_url: str) -> Mapping[str, object] | None:
        for path in ("/server_info", "/get_server_info"):
            try:
                response = session.get(base_url + path, timeout=10)
            except requests.RequestException:
                return None
            if response.status_code == 200:
                try:
                    data = jsontext.loads(response.content)
                except ValueError:  # a hint only: a garbled one is no hint
                    return None
                return data if isinstance(data, dict) else None
        return None


ADAPTER = SglangAdapter


def _speculation_flag(name: str) -> bool:
    bare = name.removeprefix("--no-").removeprefix("--")
    return bare.startswith("speculative-") or bare == "enable-multi-layer-eagle"


def _logprob(value: object) -> float:
    number = optional_float(value)
    return number if number is not None else math.nan
