"""Kernel-package stand-ins against the real sglang-kernel wheel that SGLang 0.5.12 pins.

The wheel (the Spark's aarch64 build, downloaded at test time and cached) is unpacked as
preflight unpacks it: the Python files as they are, each binary replaced by a placeholder
beside an index read from the real file. The probe's stand-in module then imports the real
``sgl_kernel`` Python under the shared torch venv, on this CPU.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest

from sparkbuild.preflight.deps import TORCH
from sparkbuild.preflight.kernels import KernelStandin, StandinCache, merged_site
from sparkbuild.preflight.native import PLACEHOLDER, SIDECAR
from sparkbuild.preflight.plan import SPARK_GPU
from sparkbuild.preflight.runner import write_native
from sparkbuild.preflight.venv import ensure_torch_base
from tests.support.cache import shared_test_cache
from tests.support.preflight_env import venv_root

pytestmark = pytest.mark.upstream

KERNEL = "sglang-kernel==0.4.2.post2"  # SGLang 0.5.12's pin (wheel METADATA)


@pytest.fixture(scope="module")
def kernel() -> KernelStandin:
    got = StandinCache(shared_test_cache() / "preflight-kernels").get(KERNEL)
    assert isinstance(got, KernelStandin), got
    return got


def test_binaries_are_indexed_from_the_real_wheel_and_not_kept(kernel: KernelStandin) -> None:
    assert (kernel.dist, kernel.version) == ("sglang-kernel", "0.4.2.post2")
    assert "sgl_kernel" in kernel.modules and not kernel.real
    binary = kernel.root / "sgl_kernel/sm100/common_ops.abi3.so"
    assert binary.read_bytes() == PLACEHOLDER  # the 22 MB binary is not kept
    index = json.loads(Path(str(binary) + SIDECAR).read_text())
    assert index["format"] == "elf" and index["machine"] == "aarch64"
    assert "PyInit_common_ops" in index["symbols"]
    # The TORCH_LIBRARY schema the binary registers, as the real file holds it.
    assert (
        "rmsnorm(Tensor! output, Tensor input, Tensor weight, float eps, bool enable_pdl) -> ()"
        in index["schemas"]
    )
    assert "sgl_kernel" in index["names"]
    # Python files are the wheel's own.
    assert (
        "def _load_architecture_specific_ops"
        in (kernel.root / "sgl_kernel/load_utils.py").read_text()
    )


PROBE = """
import json, sys
out = {}
try:
    import sgl_kernel
except ImportError as exc:
    out["before"] = f"{type(exc).__name__}: {exc}"
sys.path.insert(0, sys.argv[1])
import native
hooks = native.install(json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4])
import torch
import sgl_kernel
from sgl_kernel import fast_topk, rmsnorm  # real names of the package's Python API
out["version"] = sgl_kernel.__version__
out["cuda"] = torch.cuda.is_available() and torch.cuda.get_device_capability()
out["schema"] = str(torch.ops.sgl_kernel.rmsnorm.default._schema)
out["unknown_op"] = hasattr(torch.ops.sgl_kernel, "rmsnorm_that_is_not_there")
try:
    from sgl_kernel import fast_topk_that_is_not_there
except ImportError as exc:
    out["missing"] = str(exc)
try:
    sgl_kernel.common_ops.no_such_binding
except AttributeError as exc:
    out["missing_native"] = str(exc)
out["loaded"] = hooks.loaded
print(json.dumps(out))
"""


@pytest.mark.engine  # imports the real sgl_kernel Python under the shared torch venv
def test_real_python_imports_over_stand_in_binaries(kernel: KernelStandin) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text("\n".join(TORCH) + "\n")
        site = ensure_torch_base(venv_root(), constraints)
        python = site.parents[2] / "bin" / "python"
        write_native(Path(tmp), "native")
        Path(tmp, "probe.py").write_text(PROBE)
        folder = merged_site(shared_test_cache() / "preflight-kernels", (kernel,))
        args = [tmp, json.dumps([kernel.to_probe()]), json.dumps(SPARK_GPU), str(folder)]
        done = subprocess.run(
            [str(python), "-I", str(Path(tmp, "probe.py")), *args],
            capture_output=True,
            text=True,
            check=False,
            cwd=tmp,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # Without the stand-in the package is not importable here at all.
    assert out["before"].startswith("ModuleNotFoundError")
    assert out["version"] == "0.4.2.post2"
    assert out["cuda"] == [12, 1]  # the engine's platform questions get the GB10's answers
    assert "float eps, bool enable_pdl" in out["schema"]  # the op, with the binary's schema
    assert out["unknown_op"] is False
    assert "cannot import name 'fast_topk_that_is_not_there' from 'sgl_kernel'" in out["missing"]
    assert "no_such_binding" in out["missing_native"]
    assert "does not define it" in out["missing_native"]
    assert "sglang-kernel 0.4.2.post2" in out["missing_native"]
    assert {"file": "common_ops.abi3.so", "module": "common_ops"} in [
        {k: v for k, v in item.items() if k in ("file", "module")} for item in out["loaded"]
    ]
