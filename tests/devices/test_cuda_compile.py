"""CUDA C in the renderer ABI compiles to PTX with nvcc and assembles with ptxas (no GPU needed)."""
from __future__ import annotations

import pytest
from conftest import require_nvcc

from deploycc.runtime.devices import DeviceError, open_device
from deploycc.runtime.devices.cuda import compile_cuda, cuda_include_dir, ptxas_check

# nvcc and ptxas (the CUDA toolkit): skipped without them locally, failed under CI=true
toolkit = pytest.mark.usefixtures("require_toolkit")


@pytest.fixture
def require_toolkit():
    require_nvcc()

KERNELS = r"""
#include <cuda_fp16.h>

extern "C" __global__ void add2d(float* __restrict__ b0, float* __restrict__ b1, float* __restrict__ b2,
                                 int s0, int s1, int s2, int s3) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    int i = blockIdx.y * blockDim.y + threadIdx.y;
    if (i < s0 && j < s1) b2[i * s1 + j] = b0[i * s2 + j] + b1[i * s3 + j];
}

extern "C" __global__ void rowsum_half(half* __restrict__ b0, float* __restrict__ b1, int s0) {
    __shared__ float acc[256];
    int row = blockIdx.x, t = threadIdx.x;
    float s = 0.0f;
    for (int j = t; j < s0; j += blockDim.x) s += __half2float(b0[row * s0 + j]);
    acc[t] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (t < w) acc[t] += acc[t + w];
        __syncthreads();
    }
    if (t == 0) b1[row] = acc[0];
}
"""


@toolkit
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_compile_and_assemble(arch):
    ptx = compile_cuda(KERNELS, arch=arch)
    assert f".target {arch}" in ptx
    assert ".visible .entry add2d(" in ptx and ".visible .entry rowsum_half(" in ptx  # extern "C": unmangled
    usage = ptxas_check(ptx, arch)
    assert set(usage) == {"add2d", "rowsum_half"}
    assert all(u["registers"] > 0 for u in usage.values())
    assert usage["rowsum_half"]["shared_bytes"] == 256 * 4
    assert usage["add2d"]["spill_stores"] == 0


@toolkit
def test_include_dir_found():
    inc = cuda_include_dir()
    assert inc is not None and inc.endswith("include")


@toolkit
def test_syntax_error_is_a_device_error():
    with pytest.raises(DeviceError, match=r"nvcc -arch=sm_90 failed: .*error: expected a \";\"") as e:
        compile_cuda('extern "C" __global__ void f(float* b0) { b0[0] = 1 }')
    assert "\n" not in str(e.value)


@toolkit
def test_bad_ptx_is_a_device_error():
    with pytest.raises(DeviceError, match="ptxas -arch=sm_90 failed: .*syntax error"):
        ptxas_check(".version 9.0\n.target sm_90\n.address_size 64\nnot ptx at all\n", "sm_90")


def test_missing_cupy_names_the_package():
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(DeviceError, match="pip install cupy-cuda12x"):
            open_device("cuda")
    else:
        pytest.skip("CuPy is installed")
