"""vLLM: launch flags, the OpenAI completions API, and its Prometheus counters.

* ``/v1/completions`` with ``logprobs`` (the model name comes from ``/v1/models``);
* counters ``vllm:spec_decode_num_drafts_total`` and
  ``vllm:spec_decode_num_accepted_tokens_total`` (mean acceptance length =
  1 + Δaccepted / Δdrafts); ``vllm:corrupted_requests_total`` with
  ``VLLM_COMPUTE_NANS_IN_LOGITS=1``;
* log ``SpecDecoding metrics: Mean acceptance length: 2.31``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import requests
from packaging.version import Version

from sparkbuild import jsontext, net
from sparkbuild.engines import versions
from sparkbuild.engines.adapters.base import (
    Acceptance,
    Counters,
    EngineAdapter,
    Generation,
    RankCommand,
    RankPlace,
    first_model,
    optional_float,
    parse_or_fail,
    whole_number,
)
from sparkbuild.errors import EngineHTTPError, UsageError

if TYPE_CHECKING:
    from sparkbuild.engines.profiles import Parallel


class VllmAdapter(EngineAdapter):
    name = "vllm"
    default_port = 8000
    default_launcher = ("python3", "-m", "vllm.entrypoints.openai.api_server")
    ready_line = re.compile(r"Starting vLLM (API |)server on|Application startup complete")
    nan_line = re.compile(r"\bNaNs? (?:detected|found|in (?:the )?(?:logits|logprobs))", re.I)
    error_line = re.compile(
        r"(?:^|[\s)])ERROR\b|Traceback \(most recent call last\)|EngineDeadError"
    )
    accept_line = re.compile(r"Mean acceptance length:\s*([0-9.]+)")
    max_len_flag = "--max-model-len"

    DRAFTS = "vllm:spec_decode_num_drafts_total"
    DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
    ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
    CORRUPTED = "vllm:corrupted_requests_total"

    # `--headless` is honoured by `vllm serve` only (the api_server module accepts and
    # ignores it), so every rank of a cluster runs `vllm serve`.
    cluster_launcher = ("vllm", "serve")
    parallel_flags = (
        "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
        "--distributed-executor-backend", "--nnodes", "--node-rank", "--master-addr",
        "--master-port", "--headless", "--enable-expert-parallel",
    )  # fmt: skip
    # parallel_state.py: "world_size=2 rank=1 local_rank=0 distributed_init_method=..."
    rank_line = re.compile(r"\bworld_size=(?P<world>\d+) rank=(?P<rank>\d+)\b")
    RAY_HEAD_WAIT_S = 600

    def __init__(self, request_timeout_s: float = 300.0, version: Version | None = None) -> None:
        super().__init__(request_timeout_s, version)
        self._served_model: str | None = None

    def rank_command(
        self,
        launcher: Sequence[str],
        serve: Sequence[str],
        parallel: Parallel,
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
                "--distributed-executor-backend", "mp", "--nnodes", str(place.nodes),
                "--node-rank", str(place.rank), "--master-addr", place.leader_address,
                "--master-port", str(place.port),
            ]  # fmt: skip
            headless = [] if place.leader else ["--headless"]
            return RankCommand(
                words[:1], [*words[1:], *sizes, *rendezvous, *headless], place.leader
            )
        return self._ray_rank(words, sizes, place)

    def _ray_rank(self, words: list[str], sizes: list[str], place: RankPlace) -> RankCommand:
        if not place.leader:
            join = ["ray", "start", "--block", f"--address={place.leader_address}:{place.port}",
                    f"--node-ip-address={place.address}"]  # fmt: skip
            return RankCommand(join[:1], join[1:], serves_http=False)
        head = shlex.join(["ray", "start", "--head", f"--port={place.port}",
                           f"--node-ip-address={place.address}"])  # fmt: skip
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

    def nan_switch(self) -> versions.NanSwitch:
        return versions.VLLM_NAN_SWITCH

    def serve_args(self, model: str, host: str, port: int, args: Sequence[str]) -> list[str]:
        return ["--model", model, "--host", host, "--port", str(port), *args]

    def served_model(self, session: net.Session, base_url: str) -> str:
        """The name requests must use (``--served-model-name`` or the model path)."""
        if self._served_model is None:
            try:
                response = session.get(base_url + "/v1/models", timeout=10)
                response.raise_for_status()
                self._served_model = str(first_model(jsontext.loads(response.content))["id"])
            except requests.RequestException as exc:
                raise EngineHTTPError.answered(f"GET {base_url}/v1/models", None, str(exc)) from exc
            except ValueError as exc:  # not JSON, or JSON of the wrong shape
                raise EngineHTTPError.answered(
                    f"GET {base_url}/v1/models", 200, f"malformed response: {exc}"
                ) from exc
        return self._served_model

    def generate(
        self,
        session: net.Session,
        base_url: str,
        prompt: str,
        max_tokens: int,
        extra: Mapping[str, Any] | None = None,
    ) -> Generation:
        body: dict[str, Any] = {
            "model": self.served_model(session, base_url),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": 1,
            **(extra or {}),
        }
        url = base_url + "/v1/completions"
        payload, seconds = self._post(session, url, body)
        return parse_or_fail(
            f"POST {url}", lambda: self.generation_from_response(prompt, payload, seconds)
        )

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


def _with_positional_model(launcher: list[str], serve: list[str]) -> list[str]:
    """``vllm serve MODEL ...``: the serve command takes the model as its first argument
    (``--model`` there is deprecated); the api_server module still takes ``--model``."""
    if launcher[-1:] == ["serve"] and serve[:1] == ["--model"] and len(serve) > 1:
        return [*launcher, serve[1], *serve[2:]]
    return [*launcher, *serve]
