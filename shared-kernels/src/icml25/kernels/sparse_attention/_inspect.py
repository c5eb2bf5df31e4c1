"""SpargeAttn: Accurate Sparse Attention Accelerating Any Model Inference — ICML 2025, P01: kernel instrumentation.

Tools that look at the Triton kernels of ``triton.py`` from the outside, for tests and benchmarks (the ops
never import this module):

* :func:`record_launches` runs a call and returns the aten ops it dispatched besides the Triton launches and
  the kernels it launched, so a test can show on CPU (``TRITON_INTERPRET=1``) that the hot path reads no
  device value back to the host.
* :func:`compile_for_target` compiles every kernel variant for a GPU target (``sm_80``, ``sm_90``) without a
  GPU and counts telling SASS instructions (tensor-core MMAs, ``cp.async`` copies, register spills).

Both intercept the launcher (``kernel[grid](...)``). :func:`compile_for_target` takes its variants from the
launch wrappers themselves: it calls them on small CPU tensors with the launch captured instead of run, and
builds each kernel's signature from the kernel's own parameter list (names, ``tl.constexpr`` flags) and the
types of the captured arguments, so nothing here repeats a kernel's parameters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from icml25.kernels.sparse_attention import reference
from icml25.kernels.sparse_attention.reference import BlockStats, num_blocks

__all__ = ["SASS_OPCODES", "CompiledVariant", "compile_for_target", "record_launches"]


def _kernels():
    from icml25.kernels.sparse_attention import triton as kernels  # lazy: triton is optional

    return kernels


@contextlib.contextmanager
def _launches_through(hook: Callable[..., object]) -> Iterator[None]:
    """Route every Triton launch ``kernel[grid](*args, **kwargs)`` through
    ``hook(run, kernel, *args, grid=..., warmup=..., **kwargs)``; ``run`` is the launcher's own method (call
    ``run(kernel, ...)`` to really launch)."""
    # InterpretedFunction under TRITON_INTERPRET=1, else JITFunction
    launcher = type(_kernels()._sparge_fwd_kernel)
    original = launcher.run

    def run(self, *args, **kwargs):
        return hook(original, self, *args, **kwargs)

    launcher.run = run
    try:
        yield
    finally:
        launcher.run = original


# ------------------------------------------------------------------------------------- launch recording

# aten ops that only make metadata (views, allocations): no device work, no launch
_METADATA_OPS = frozenset({
    "empty", "empty_strided", "view", "_unsafe_view", "detach", "alias", "expand", "unsqueeze", "squeeze",
    "transpose", "t", "permute", "as_strided", "slice", "select", "lift_fresh",
})  # fmt: skip


def record_launches(fn: Callable[[], object]) -> tuple[list[str], list[str]]:
    """Run ``fn()`` and return ``(torch_ops, triton_kernels)``: the aten ops it dispatched outside Triton
    launches (metadata-only ops left out) and the names of the Triton kernels it launched, in order.

    A host sync shows up as ``_local_scalar_dense`` (``.item()``, ``bool()``, ``.tolist()``) or ``nonzero``
    (a data-dependent size). Works on the real launcher and under ``TRITON_INTERPRET=1``, whose own host
    copies inside a launch are not recorded (they are not the op's work).
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []
            self.paused = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not self.paused:
                self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    launches: list[str] = []
    rec = Recorder()

    def launch(run, kernel, *args, **kwargs):
        rec.paused = True
        launches.append(kernel.fn.__name__)
        try:
            return run(kernel, *args, **kwargs)
        finally:
            rec.paused = False

    with _launches_through(launch), rec:
        fn()
    return [op for op in rec.ops if op not in _METADATA_OPS], launches


# ------------------------------------------------------------------------------ ahead-of-time compilation

# SASS opcodes that tell how a kernel uses the GPU: tensor-core MMAs (INT8 / fp16-bf16, sm_80 ``mma.sync``
# and sm_90 ``wgmma`` forms), ``cp.async`` global->shared copies (the software pipeline of K/V tiles) and
# local-memory traffic (register spills).
SASS_OPCODES = ("IMMA", "HMMA", "IGMMA", "HGMMA", "LDGSTS", "STL", "LDL")

# Integer kernel arguments compiled as multiples of 16 (Triton's launcher infers this from the value): the
# head dimension, for ``D % 16 == 0``. Lengths get no such hint (ragged L).
_ALIGNED_INTS = ("D",)


@dataclass(frozen=True)
class CompiledVariant:
    """One kernel variant compiled for a GPU target by :func:`compile_for_target`.

    ``sass`` counts the :data:`SASS_OPCODES` in the cubin's disassembly (empty when Triton's bundled
    ``cuobjdump`` is missing); ``shared_bytes`` is the static shared memory per program.
    """

    kernel: str
    constants: dict
    num_warps: int
    shared_bytes: int
    sass: dict[str, int]


@dataclass(frozen=True)
class _Launch:
    """One captured launch: the kernel, its arguments by parameter name, and the launch options."""

    kernel: Any  # the @triton.jit function (a JITFunction)
    args: dict[str, Any]
    options: dict[str, Any]


def _capture(calls: Callable[[], object]) -> list[_Launch]:
    """The launches ``calls()`` makes, captured with their arguments instead of run.

    No device is needed: a launch wrapper only allocates its outputs and launches, it never reads them.
    """
    captured: list[_Launch] = []

    def capture(run, kernel, *args, grid, warmup, **kwargs):
        bound = dict(zip(kernel.arg_names, args))
        params = {k: v for k, v in kwargs.items() if k in kernel.arg_names}
        options = {k: v for k, v in kwargs.items() if k not in kernel.arg_names}
        captured.append(_Launch(kernel, {**bound, **params}, options))

    with _launches_through(capture):
        calls()
    return captured


def _variant_calls() -> None:
    """Call each launch wrapper once per kernel variant worth compiling (official tiles 128 x 64).

    The switches the ops set: INT8 Q/K per warp at d = 64 and 128 with K smoothing, statistics only
    (``predict_block_mask``: one Q group per block, no smoothing); stage 1 with every option on (per-head θ
    and τ, causal, sink) and off (float θ, top-k); a causal given mask; the forward pass with INT8 or float
    operands, causal or not, fp16 / bf16 / fp32 values, per-head, float or no λ.
    """
    kernels = _kernels()
    bq, bk, heads, lq, lk = 128, 64, 2, 200, 300  # ragged lengths: partial last blocks
    nq, nk = num_blocks(lq, bq), num_blocks(lk, bk)

    for d, quant, smooth in ((64, True, True), (128, True, True), (64, False, False)):
        q, k = (
            torch.zeros(1, heads, lq, d, dtype=torch.float16),
            torch.zeros(1, 1, lk, d, dtype=torch.float16),
        )
        kernels.qk_block_stats(
            q, k, torch.zeros(1, 1, d) if smooth else None, q_mult=0.18, quantize=quant,
            q_group=reference.q_quant_group("per_warp", bq, d) if quant else bq, block_q=bq, block_k=bk,
        )  # fmt: skip

    d = 128
    q_stats = BlockStats(torch.zeros(1, heads, nq, d), torch.zeros(1, heads, nq), None, None)
    k_stats = BlockStats(torch.zeros(1, 1, nk, d), torch.zeros(1, 1, nk), None, None)
    per_head = torch.full((heads,), 0.5)
    for on in (True, False):
        kernels.select_lut(
            q_stats, k_stats, scale=0.09, sim_threshold=per_head if on else 0.5,
            cdf_threshold=per_head if on else None, topk=None if on else 0.3, is_causal=on, attention_sink=on,
            block_q=bq, block_k=bk,
        )  # fmt: skip

    kernels.mask_to_lut(
        torch.ones(1, heads, nq, nk, dtype=torch.bool), is_causal=True, block_q=bq, block_k=bk
    )

    lut, count = (
        torch.zeros(1, heads, nq, nk, dtype=torch.int32),
        torch.zeros(1, heads, nq, dtype=torch.int32),
    )
    for quant, causal, d, dtype, lam in (
        (True, True, 128, torch.float16, per_head),
        (True, False, 64, torch.bfloat16, 20.0),
        (False, True, 128, torch.float16, per_head),
        (False, False, 64, torch.float32, None),
    ):
        op_dtype = torch.int8 if quant else torch.float32
        q_group = reference.q_quant_group("per_warp", bq, d)
        kernels.sparse_flash_forward(
            torch.zeros(1, heads, nq * bq, d, dtype=op_dtype),
            torch.ones(1, heads, nq * bq // q_group) if quant else None,
            torch.zeros(1, 1, nk * bk, d, dtype=op_dtype),
            torch.ones(1, 1, nk) if quant else None,
            torch.zeros(1, 1, lk, d, dtype=dtype), lut, count,
            lq=lq, lk=lk, is_causal=causal, pv_threshold=lam, block_q=bq, block_k=bk,
        )  # fmt: skip


def _sass_counts(cubin: bytes) -> dict[str, int]:
    import os
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia import compiler as nvidia

    tool = os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")
    if not os.access(tool, os.X_OK):
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
    found = re.findall(r"\b(" + "|".join(SASS_OPCODES) + r")\b", sass)
    return {op: found.count(op) for op in SASS_OPCODES}


def _compile(launch: _Launch, target: Any) -> CompiledVariant:
    """Compile one captured launch for ``target``: signature and constants from the kernel's parameters."""
    import triton
    from triton.compiler import ASTSource
    from triton.runtime.jit import mangle_type

    fn = launch.kernel
    consts = {p.name: launch.args[p.name] for p in fn.params if p.is_constexpr}
    sig = {name: "constexpr" if name in consts else mangle_type(launch.args[name]) for name in fn.arg_names}
    aligned = {
        (fn.arg_names.index(name),): [["tt.divisibility", 16]]
        for name, ty in sig.items()
        if ty.startswith("*") or (name in _ALIGNED_INTS and launch.args[name] % 16 == 0)
    }
    num_warps = launch.options.get("num_warps", 4)
    kernel = triton.compile(
        ASTSource(fn, sig, consts, aligned),
        target=target,
        options={"num_warps": num_warps, "num_stages": launch.options.get("num_stages", 3)},
    )
    return CompiledVariant(
        fn.fn.__name__, consts, num_warps, kernel.metadata.shared, _sass_counts(kernel.asm["cubin"])
    )


def compile_for_target(arch: int = 90, warp_size: int = 32) -> list[CompiledVariant]:
    """Compile every kernel variant the ops launch for ``GPUTarget("cuda", arch, warp_size)`` — no GPU needed.

    Lowers each kernel through TTIR/TTGIR/LLVM/PTX to a cubin with Triton's bundled ``ptxas``, so a CPU
    machine can check that the kernels are valid GPU code (the interpreter accepts some programs the
    compiler rejects) and, from the disassembly, how they will run: tensor-core instructions, pipelined
    ``cp.async`` loads, register spills. The variants, their arguments and launch options are those of the
    launch wrappers (see :func:`_variant_calls`); pointers and the head dimension ``D`` carry the
    16-divisibility that Triton's launcher infers for aligned tensors and ``D % 16 == 0``, lengths get none
    (ragged ``L``). Needs ``TRITON_INTERPRET`` unset when ``triton.py`` was imported.
    """
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import JITFunction

    if not isinstance(_kernels()._sparge_fwd_kernel, JITFunction):
        raise RuntimeError("compile_for_target needs TRITON_INTERPRET unset before triton is imported")
    target = GPUTarget("cuda", arch, warp_size)
    return [_compile(launch, target) for launch in _capture(_variant_calls)]
