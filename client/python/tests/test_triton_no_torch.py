"""The proof that a Triton kernel runs through gpuexec without torch: in a
fresh interpreter whose imports of torch (and torch.*) fail and are
recorded, Triton compiles a vector add (an ASTSource with its signature and
constexprs, for GPUTarget("cuda", 90, 32)), gpuexec.triton runs it on the
daemon, numpy checks it, and the interpreter ends with no attempt to import
torch and no torch in sys.modules.

Only with Triton installed and a daemon on a real GPU; otherwise skipped.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent('''
    import importlib.abc
    import sys
    import traceback

    ATTEMPTS = []


    class NoTorch(importlib.abc.MetaPathFinder):
        """Fails every import of torch and torch.*, and records it."""

        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                ATTEMPTS.append((name, "".join(traceback.format_stack(limit=15)[:-1])))
                raise ImportError(f"{name} is blocked: this run proves it is not needed")
            return None


    sys.meta_path.insert(0, NoTorch())
    assert "torch" not in sys.modules

    import numpy as np

    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget

    import gpuexec
    from gpuexec import triton as gt


    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, x + y, mask=mask)


    def main(target):
        signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
                     "BLOCK": "constexpr"}
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(3)}
        source = triton.compiler.ASTSource(fn=add_kernel, signature=signature,
                                           constexprs={"BLOCK": 1024}, attrs=attrs)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 4})
        print(f"triton {triton.__version__}: compiled {compiled.metadata.name}")
        n = 1_000_003
        rng = np.random.default_rng(5)
        x = rng.standard_normal(n, dtype=np.float32)
        y = rng.standard_normal(n, dtype=np.float32)
        with gpuexec.connect(target) as client, client.session() as session:
            kernel = gt.load(session, compiled.asm["cubin"], compiled.metadata._asdict())
            xb, yb, out = session.upload(x), session.upload(y), session.alloc(4 * n)
            kernel[(triton.cdiv(n, 1024),)](xb, yb, out, n)
            got = out.read(np.float32)
        np.testing.assert_array_equal(got, x + y)
        print(f"add_kernel ran through gpuexec: {n} elements match numpy")


    main(sys.argv[1])
    for name, stack in ATTEMPTS:
        print(f"attempted to import {name} from:\\n{stack}")
    assert not ATTEMPTS, f"{len(ATTEMPTS)} attempts to import torch"
    assert "torch" not in sys.modules
    print("no torch: no import of it was attempted")
''')


def test_a_triton_kernel_runs_without_torch(daemon, tmp_path):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    if daemon.is_test_double:
        pytest.skip("Triton kernels need a real GPU (the daemon runs the test double)")
    script = tmp_path / "no_torch.py"  # a file: triton.jit reads its kernels' source
    script.write_text(_SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    result = subprocess.run([sys.executable, str(script), daemon.target], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=600, check=False)
    print(result.stdout)
    assert result.returncode == 0, result.stdout[-8000:]
    assert "no torch: no import of it was attempted" in result.stdout
