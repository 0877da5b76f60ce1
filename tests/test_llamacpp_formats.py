"""llama.cpp's formats, as its server answers them (recorded from a CPU build of b11434,
tests/support/llamacpp_cpu.py) and as its tree writes them: the adapter's readings, its
acceptance from per-response counts, the launch facts, and the bounded GGUF header reader.
The live engine is tests/test_llamacpp_cpu.py."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from sparkbuild.adapters import adapter_for, adapter_type
from sparkbuild.adapters.llamacpp import LlamacppAdapter
from sparkbuild.adapters.values import Counters
from sparkbuild.engines.recipes import import_recipe
from sparkbuild.engines.signatures import Evidence, diagnose
from sparkbuild.preflight.gguf import MAX_KEYS, GGUFError, read_header

# A /v1/completions answer with logprobs 2: the first token scored by the target, the next
# three accepted from the draft (logprob 0, no alternatives: the server's TODO).
COMPLETION: dict[str, Any] = {
    "choices": [
        {
            "text": " nin nin four",
            "index": 0,
            "finish_reason": "length",
            "logprobs": {
                "content": [
                    {"id": 359, "token": " nin", "logprob": -0.07, "top_logprobs": [
                        {"id": 359, "token": " nin", "logprob": -0.07},
                        {"id": 422, "token": " seven", "logprob": -2.9}]},
                    {"id": 359, "token": " nin", "logprob": 0.0, "top_logprobs": []},
                    {"id": 391, "token": " four", "logprob": 0.0, "top_logprobs": []},
                    {"id": 5, "token": "&", "logprob": 0.0, "top_logprobs": []},
                ]
            },
        }
    ],
    "usage": {"completion_tokens": 4, "prompt_tokens": 5, "total_tokens": 9},
    "timings": {"predicted_n": 4, "draft_n": 3, "draft_n_accepted": 3},
}  # fmt: skip


def test_a_completion_keeps_every_id_and_only_the_engines_logprobs() -> None:
    generation = LlamacppAdapter.generation_from_response("p", COMPLETION)
    assert generation.token_ids == (359, 359, 391, 5)
    assert generation.logprobs == (-0.07,)  # the 0.0 of a drafted token is not the engine's
    assert generation.top_logprobs[0] == {359: -0.07, 422: -2.9}
    assert generation.top_logprobs[1] == {}  # no alternatives there: a tie cannot be judged
    assert generation.completion_tokens == 4


def test_acceptance_from_each_responses_draft_counts() -> None:
    """1 + accepted / decode steps, a response's decode steps being predicted - 1 - accepted:
    the server's own "mean len = 4.70" for 48 tokens, 37 drafts accepted."""
    adapter = adapter_for("llamacpp")
    timings = {"predicted_n": 48, "draft_n": 37, "draft_n_accepted": 37}
    accept = adapter.acceptance_from_responses([{"timings": timings}, {"timings": timings}])
    assert accept is not None and accept.active and accept.source == "per-response counts"
    assert round(accept.accept_len or 0, 2) == 4.7
    assert adapter.acceptance_from_responses([{"timings": {"predicted_n": 48}}]) is None
    nothing = Counters({})
    assert adapter.acceptance(nothing, nothing, responses=[{"timings": timings}]).active


@pytest.mark.parametrize(
    ("timings", "why"),
    [
        ({"predicted_n": 10, "draft_n": 3, "draft_n_accepted": 4}, "4 draft tokens accepted of 3"),
        ({"predicted_n": 3, "draft_n": 9, "draft_n_accepted": 5}, "accepted in 3 generated"),
        ({"predicted_n": 9, "draft_n": -1, "draft_n_accepted": 0}, "draft_n is -1"),
    ],
)
def test_counts_that_cannot_be_true_void_the_measurement(timings: dict[str, int], why: str) -> None:
    accept = adapter_for("llamacpp").acceptance_from_responses([{"timings": timings}])
    assert accept is not None and not accept.active
    assert why in accept.impossible


def test_counters_the_same_way_as_the_servers_mean_len() -> None:
    adapter = LlamacppAdapter()
    before = Counters({adapter.DRAFTS: 2, adapter.ACCEPTED: 4, adapter.DRAFT_TOKENS: 8})
    after = Counters({adapter.DRAFTS: 12, adapter.ACCEPTED: 41, adapter.DRAFT_TOKENS: 48})
    accept = adapter.acceptance(before, after)
    assert (accept.source, accept.accept_len) == ("counters", 1 + 37 / 10)
    lying = Counters({adapter.DRAFTS: 12, adapter.ACCEPTED: 60, adapter.DRAFT_TOKENS: 48})
    assert "56 tokens accepted" in adapter.acceptance_from_delta(before, lying).impossible


def test_its_own_request_and_answer_shapes() -> None:
    adapter = adapter_for("llamacpp")
    session = adapter.session()
    assert adapter.tokenize_body(session, "http://x", "hi") == {
        "content": "hi",
        "add_special": True,
    }
    assert adapter.token_count_of({"tokens": [0, 261, 77]}).count == 3
    with pytest.raises(ValueError, match="no token list"):
        adapter.token_count_of({"count": 3})  # vLLM's shape is not llama.cpp's
    assert adapter.detokenize_body(session, "http://x", [1, 2]) == {"tokens": [1, 2]}
    entry = {
        "id": "tiny.gguf",
        "owned_by": "llamacpp",
        "meta": {"n_ctx": 1024, "n_ctx_train": 4096},
    }
    served = adapter.served_model_of(entry)
    assert (served.id, served.max_model_len) == ("tiny.gguf", 1024)  # what it serves, not trains
    assert adapter.owns(entry) and not adapter_for("vllm").owns(entry)
    body = adapter.stream_body("m", "p", 8, {"ignore_eos": True})
    assert body["stream"] is True and body["stream_options"] == {
        "include_usage": True, "continuous_usage_stats": True
    }  # fmt: skip


@pytest.mark.parametrize(
    ("output", "build"),
    [
        ("version: 0.6.0-dev (build 11434, commit pypi-sdist)\nbuilt with GNU 12.2.0", "11434"),
        ("version: 6767 (5acd45546)\nbuilt with cc for aarch64-linux-gnu", "6767"),
    ],
)
def test_both_forms_of_its_version(output: str, build: str) -> None:
    facts = LlamacppAdapter.preflight
    assert not isinstance(facts, type(adapter_type("vllm").preflight))
    match = facts.version.search(output)
    assert match is not None and match.group("version") == build


def test_release_tags_are_build_numbers() -> None:
    tags = adapter_type("llamacpp").release_tags
    assert tags.version_of("b11434") == Version("11434")
    assert tags.version_of("v0.5.13") is None and tags.version_of("b11434\n") is None
    assert tags.tag_of(Version("11500")) == "b11500"
    assert adapter_type("sglang").release_tags.version_of("v0.5.13") == Version("0.5.13")
    assert adapter_type("sglang").release_tags.version_of("b11434") is None


@pytest.mark.parametrize(
    ("args", "length"),
    [
        (["--ctx-size", "2048"], 2048),
        (["-c", "8k"], 8000),
        (["--ctx-size", "2048", "--parallel", "2", "--no-kv-unified"], 1024),
        (["--ctx-size", "2048", "--parallel", "2", "--kv-unified"], 2048),
        (["--ctx-size", "2048", "--parallel", "2"], 1024),  # explicit slots: split
        ([], None),
    ],
)
def test_the_longest_request_is_per_slot(args: list[str], length: int | None) -> None:
    assert adapter_for("llamacpp").declared_max_len(args) == length


def test_speculation_off_drops_every_draft_and_spec_flag() -> None:
    args = ["--ctx-size", "1024", "-md", "d.gguf", "--spec-type", "draft-simple",
            "--spec-draft-n-max=4", "--spec-draft-n-min", "1", "--jinja", "--spec-default",
            "-ngld", "99", "--threads", "1"]  # fmt: skip
    adapter = adapter_for("llamacpp")
    assert adapter.without_speculation(args) == ["--ctx-size", "1024", "--jinja", "--threads", "1"]
    assert adapter.draft_model(args) == "d.gguf"
    assert adapter.speculative_method(args) == "draft-simple"
    assert adapter.speculative_method(["-md", "d.gguf"]) == "draft"
    assert adapter.speculative_method(["--ctx-size", "1"]) is None


def test_its_signatures_name_the_flag_that_fixes_it() -> None:
    refused = 'error while handling argument "--draft-max": the argument has been removed. use x'
    (found,) = diagnose([refused], "llamacpp")
    assert found.id == "llamacpp-removed-draft-flags" and "--spec-draft-n-max" in found.remedy
    silent = Evidence(checks={"accept_len": "speculation inactive: no drafts during the requests"})
    (found,) = diagnose([], "llamacpp", evidence=silent)
    assert "--spec-type draft-simple" in found.remedy
    assert diagnose([refused], "vllm") == []  # another engine's log is not llama.cpp's


# --- the GGUF header, read as hostile input --------------------------------------------------


def _gguf(*pairs: tuple[str, int, bytes], version: int = 3, keys: int | None = None) -> bytes:
    def text(value: str) -> bytes:
        return struct.pack("<Q", len(value)) + value.encode()

    head = b"GGUF" + struct.pack("<IQQ", version, 5, len(pairs) if keys is None else keys)
    return head + b"".join(text(k) + struct.pack("<I", kind) + v for k, kind, v in pairs)


def _string(value: str) -> bytes:
    return struct.pack("<Q", len(value)) + value.encode()


def test_a_header_names_its_architecture_and_context(tmp_path: Path) -> None:
    tokens = struct.pack("<IQ", 8, 2) + _string("a") + _string("bc")  # an array of strings
    data = _gguf(
        ("general.architecture", 8, _string("llama")),
        ("tokenizer.ggml.tokens", 9, tokens),
        ("llama.context_length", 4, struct.pack("<I", 1024)),
    )
    path = tmp_path / "m.gguf"
    path.write_bytes(data)
    header = read_header(path)
    assert (header.version, header.tensors, header.architecture) == (3, 5, "llama")
    assert header.context_length() == 1024 and header.values["tokenizer.ggml.tokens"] == 2


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"GGML" + bytes(20), "not a GGUF file"),
        (_gguf(version=9), "GGUF version 9"),
        (_gguf(keys=MAX_KEYS + 1), "more than any model holds"),
        (_gguf(("k", 8, struct.pack("<Q", 1 << 40))), "runs past the end of the file"),
        (_gguf(("k", 42, b"")), "value type 42"),
        (_gguf(("k", 4, b"\x01")), "truncated"),
        (_gguf(("k", 9, struct.pack("<IQ", 4, 1 << 60))), "runs past the end of the file"),
    ],
)
def test_a_broken_header_is_named(tmp_path: Path, data: bytes, why: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFError, match=why):
        read_header(path)


def test_a_recipe_without_a_runtime_is_llama_cpp_by_its_command(tmp_path: Path) -> None:
    """sparkrun (RECIPES.md, "Runtime Resolution"): a command that starts with llama-server
    is the llama-cpp runtime, sparkrun's name for it, which the adapter answers to."""
    recipe = tmp_path / "gguf.yaml"
    recipe.write_text(
        "model: unsloth/Qwen3-8B-GGUF:Q4_K_M\n"
        "command: llama-server -hf {model} --ctx-size 4096 --jinja\n"
    )
    imported = import_recipe(recipe)
    assert imported.profile["engine"] == "llamacpp" and imported.source.runtime == "llama-cpp"
    assert imported.profile["args"] == ["--ctx-size", "4096", "--jinja"]
    assert imported.profile["expect"]["speculation"] is False
