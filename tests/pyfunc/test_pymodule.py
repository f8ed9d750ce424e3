"""Python functions in IR modules: the Relax design example (a matmul tensor program, relu in torch,
a library softmax and an identity graph function calling each other both ways), on the host and on
the device backends; the DLPack hand-off between torch and numpy; call_py_func in the IR (printer,
checker, interpreter) and its compile-time error for the VM."""
import numpy as np
import pytest
import torch
from conftest import require_device

from deploycc import presets
from deploycc.errors import DeployError
from deploycc.interp import Interpreter
from deploycc.ir import BlockBuilder, CallDPSLibrary, CallFunc, CallTIR, Tensor, Var, sym, tir
from deploycc.ir.checker import check, problems
from deploycc.ir.expr import CallPyFunc
from deploycc.ir.module import ExternFunc, PyFunc
from deploycc.pymodule import BasePyModule, py_func, to_numpy, to_torch
from deploycc.vm.lower import lower_vm


def matmul_program() -> tir.TensorProgram:
    """C[i, j] = sum_k A[i, k] * B[k, j], every dimension symbolic."""
    n, k, m = sym.var("n"), sym.var("k"), sym.var("m")
    A_, B_, C_ = tir.Buffer("A", (n, k)), tir.Buffer("B", (k, m)), tir.Buffer("C", (n, m))
    its = tir.iters("i j r", (n, m, k), "SSR")
    i, j, r = (tir.v(x) for x in its)
    body = tir.Block("matmul", its, tir.Store(C_, (i, j), C_[i, j] + A_[i, r] * B_[r, j]),
                     init=tir.Store(C_, (i, j), tir.const(0.0)))
    return tir.TensorProgram("matmul", (A_, B_, C_), body)


def graph_functions():
    """identity(x) and main(x, w) = identity(my_softmax(relu(matmul(x, w)))), relu being Python."""
    n, k, m = sym.var("n"), sym.var("k"), sym.var("m")
    bb = BlockBuilder()
    bb.module.functions["matmul"] = matmul_program()
    bb.module.functions["my_softmax"] = ExternFunc("my_softmax")
    x = Var("x", Tensor((n, m)))
    with bb.function("identity", [x]):
        identity = bb.finish(x)
    x, w = Var("x", Tensor((n, k))), Var("w", Tensor((k, m)))
    with bb.function("main", [x, w]):
        y = bb.emit(CallTIR("matmul", (x, w), Tensor((n, m))), "y")
        z = bb.emit(CallPyFunc("relu", (y,), Tensor((n, m))), "z")
        s = bb.emit(CallDPSLibrary("my_softmax", (z,), Tensor((n, m))), "s")
        main = bb.finish(bb.emit(CallFunc("identity", (s,)), "out"))
    return identity, main


def softmax_lib(x, out):
    e = np.exp(x - x.max(-1, keepdims=True))
    out[...] = e / e.sum(-1, keepdims=True)


_identity, _main = graph_functions()


class RelaxExample(BasePyModule):
    matmul = matmul_program()
    my_softmax = ExternFunc("my_softmax")
    identity = _identity
    main = _main

    @py_func
    def relu(self, x):
        self.relu_input = x  # kept so that tests can look at what crossed the boundary
        return torch.relu(x)

    @py_func
    def forward(self, x, w):
        y = self.call_tir("matmul", [x, w], (x.shape[0], w.shape[1]), "float32")
        z = self.relu(y)
        s = self.call_dps_library("my_softmax", [z], z.shape)
        return self.identity(s)

    @py_func
    def twice(self, x, w):
        return self.main(x, w) * 2


def reference(x, w):
    y = np.maximum(x @ w, 0)
    e = np.exp(y - y.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _inputs(n=5, k=7, m=6):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, k, generator=g) * 0.5, torch.randn(k, m, generator=g) * 0.5


DEVICES = ["host", "opencl", "webgpu"]


def _module(device):
    if device != "host":
        require_device(device)
    return RelaxExample(device=device, library={"my_softmax": softmax_lib})


@pytest.mark.parametrize("device", DEVICES)
def test_relax_example_both_ways(device):
    m = _module(device)
    x, w = _inputs()
    want = reference(x.numpy(), w.numpy())
    # graph -> Python: main calls the Python relu with call_py_func
    got = m.main(x, w)
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    # Python -> tensor program, library and graph function
    np.testing.assert_allclose(m.forward(x, w).numpy(), want, rtol=1e-5, atol=1e-6)
    # Python -> graph -> Python
    np.testing.assert_allclose(m.twice(x, w).numpy(), 2 * want, rtol=1e-5, atol=1e-6)
    # symbolic shapes: the same module at other sizes
    x2, w2 = _inputs(1, 3, 9)
    np.testing.assert_allclose(m.main(x2, w2).numpy(), reference(x2.numpy(), w2.numpy()), rtol=1e-5, atol=1e-6)
    if device != "host":
        assert m.run_program.launches > 0  # the matmul ran as a kernel


def test_ir_module_holds_python_functions():
    mod = RelaxExample.ir_module()
    assert list(mod.functions) == ["matmul", "my_softmax", "identity", "main", "relu", "forward", "twice"]
    relu = mod["relu"]
    assert isinstance(relu, PyFunc) and relu.fn is RelaxExample.relu
    assert relu.source.startswith("def relu(self, x):\n")
    check(mod)
    text = str(mod)
    assert "@py_func\ndef relu(self, x):\n    self.relu_input = x" in text
    assert 'z: Tensor((n, m), "float32") = call_py_func("relu", [y], Tensor((n, m), "float32"))' in text
    assert "@py_func\ndef forward(self, x, w):\n" in text


def test_checker_names_a_missing_python_function():
    _, main = graph_functions()
    bb = BlockBuilder()
    bb.module.functions.update(main=main, matmul=matmul_program(), my_softmax=ExternFunc("my_softmax"),
                               identity=_identity)
    found = problems(bb.module)
    assert any("call_py_func(relu) names an unknown function" in p for p in found), found


def test_interpreter_calls_a_plain_python_function():
    """Without a module instance, the interpreter calls PyFunc.fn itself, with torch tensors."""
    n = sym.var("n")
    bb = BlockBuilder()
    bb.module.functions["double"] = PyFunc("double", "def double(x):\n    return x * 2\n", lambda t: t * 2)
    x = Var("x", Tensor((n,)))
    with bb.function("main", [x]):
        bb.finish(bb.emit(CallPyFunc("double", (x,), Tensor((n,))), "y"))
    out = Interpreter(bb.module).run("main", np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(out, [0, 2, 4])
    bb.module.functions["double"] = PyFunc("double", "", lambda t: t[:2])
    with pytest.raises(ValueError, match="call_py_func"):
        Interpreter(bb.module).run("main", np.arange(3, dtype=np.float32))


@pytest.mark.parametrize("device", ["host", "opencl"])
def test_tensors_cross_without_copies(device):
    """The Python relu receives the very memory that call_tir's output array holds (DLPack); on a device
    that array is itself the download of the kernel's output buffer (a copy KernelRunner makes)."""
    m = _module(device)
    outputs = []
    run = m.run_program

    def recording(prog, arrays, sym_args):
        run(prog, arrays, sym_args)
        outputs.append(arrays[-1])

    m.run_program = recording
    x, w = _inputs()
    m.main(x, w)
    (out,) = outputs
    assert m.relu_input.data_ptr() == out.ctypes.data
    assert np.shares_memory(to_numpy(m.relu_input), out)


def test_dlpack_choice():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    a = to_numpy(t)
    assert np.shares_memory(a, t.numpy()) and a.ctypes.data == t.data_ptr()  # contiguous: shared
    back = to_torch(a)
    assert back.data_ptr() == t.data_ptr()
    tt = t.t()  # non-contiguous: copied into a dense row-major array
    b = to_numpy(tt)
    assert not np.shares_memory(b, t.numpy()) and b.flags.c_contiguous
    np.testing.assert_array_equal(b, tt.numpy())
    g = torch.ones(3, requires_grad=True)  # a tensor that requires grad crosses detached, still shared
    assert to_numpy(g).ctypes.data == g.data_ptr()
    ro = np.ones(4, np.float32)
    ro.setflags(write=False)  # DLPack cannot say read-only: copied rather than exposed writable
    assert to_torch(ro).data_ptr() != ro.ctypes.data
    nested = to_torch((np.zeros(2, np.float32), [np.ones(1, np.int32)], 3))
    assert isinstance(nested[0], torch.Tensor) and isinstance(nested[1][0], torch.Tensor) and nested[2] == 3


def test_non_contiguous_input_runs():
    m = _module("host")
    x, w = _inputs()
    xt = x.t().contiguous().t()  # same values, column-major
    assert not xt.is_contiguous()
    np.testing.assert_allclose(m.forward(xt, w).numpy(), reference(x.numpy(), w.numpy()), rtol=1e-5, atol=1e-6)


def test_vm_lowering_rejects_call_py_func():
    mod = RelaxExample.ir_module()
    mod.attrs["context_window"] = 16
    target = presets.load("cpu-webgpu").target
    with pytest.raises(DeployError, match="call_py_func needs a Python host; target webgpu cannot run it"):
        lower_vm(mod, {}, target, {}, functions=("main",))
