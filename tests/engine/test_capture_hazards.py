"""CaptureHazards names, on CPU tensors, each operation a CUDA-graph capture could not hold.

One tiny function per hazard kind, each doing exactly that one thing; a
function of ordinary device work gives nothing; Triton kernels run in the
CPU interpreter add nothing, even when the interpreter moves arguments with
`tensor.cpu()` as earlier Triton releases did.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from engine.devtools.testing.capture_hazards import CaptureHazards, capture_hazards

try:
    import triton.language as tl
except ImportError:  # Triton is a Linux x86-64 dependency only; its tests skip
    tl = None

X = torch.tensor([0.0, 3.0, 0.0, 1.0, 2.0, 2.0])
MASK = torch.tensor([True, False, True, False, True, False])
COUNTS = torch.tensor([1, 0, 2, 1, 0, 1])


def _branch_on(t: torch.Tensor) -> int:
    if t.sum():
        return 1
    return 0


def _assign_masked(t: torch.Tensor) -> None:
    t.clone()[MASK] = 0.0


def _assign_at_list(t: torch.Tensor) -> None:
    t.clone()[[0, 2]] = 1.0


# (what the function does, the function, the operator it must be reported as)
HAZARDS = [
    ("item", lambda: X.sum().item(), "aten._local_scalar_dense"),
    ("float", lambda: float(X[1]), "aten._local_scalar_dense"),
    ("int", lambda: int(X[1]), "aten._local_scalar_dense"),
    ("bool", lambda: bool(X[1] > 0), "aten._local_scalar_dense"),
    ("if_tensor", lambda: _branch_on(X), "aten._local_scalar_dense"),
    ("is_nonzero", lambda: X[1:2].is_nonzero(), "aten._local_scalar_dense"),
    ("nonzero", lambda: X.nonzero(), "aten.nonzero"),
    ("argwhere", lambda: torch.argwhere(X), "aten.nonzero"),
    ("where_condition_only", lambda: torch.where(X > 1), "aten.nonzero"),
    ("bincount", lambda: torch.bincount(COUNTS), "aten.bincount"),
    ("histc_without_a_range", lambda: torch.histc(X, bins=4), "aten.histc"),
    ("unique", lambda: torch.unique(X), "aten._unique2"),
    ("unique_dim", lambda: torch.unique(X.view(3, 2), dim=0), "aten.unique_dim"),
    ("unique_consecutive", lambda: torch.unique_consecutive(X), "aten.unique_consecutive"),
    ("masked_select", lambda: X.masked_select(MASK), "aten.masked_select"),
    ("bool_mask_read", lambda: X[MASK], "aten.index.Tensor"),
    ("bool_mask_write", lambda: _assign_masked(X), "aten.index_put_"),
    ("repeat_interleave", lambda: torch.repeat_interleave(X, COUNTS), "aten.repeat_interleave"),
    ("repeat_counts_only", lambda: torch.repeat_interleave(COUNTS), "aten.repeat_interleave"),
    ("torch_tensor_of_data", lambda: X + torch.tensor([1.0]), "aten.lift_fresh"),
    ("list_index", lambda: X[[0, 2]], "aten.lift_fresh"),
    ("list_index_write", lambda: _assign_at_list(X), "aten.lift_fresh"),
    ("to_other_device", lambda: X.to("meta"), "aten._to_copy"),
    ("copy_from_other_device", lambda: torch.empty(6, device="meta").copy_(X), "aten.copy_"),
    ("equal", lambda: torch.equal(X, X), "aten.equal"),
    ("allclose", lambda: torch.allclose(X, X), "aten.allclose"),
    ("tolist", lambda: X.tolist(), "Tensor.tolist"),
    ("numpy", lambda: X.numpy(), "Tensor.numpy"),
    ("numpy_asarray", lambda: np.asarray(X), "Tensor.__array__"),
    ("cpu", lambda: X.cpu(), "Tensor.cpu"),
]


@pytest.mark.parametrize("fn,op", [pytest.param(fn, op, id=name) for name, fn, op in HAZARDS])
def test_each_hazard_kind_is_named_once_with_a_reason(fn, op):
    found = capture_hazards(fn)
    assert len(found) == 1, found
    name, _, reason = found[0].partition(": ")
    assert name.startswith(op), found
    assert reason, "a hazard comes with why it is one"


@pytest.mark.parametrize(
    "fn",
    [lambda t: t.sum().item(), lambda t: float(t[1]), lambda t: int(t[1])],
    ids=["item", "float", "int"],
)
def test_host_reads_are_named_under_inference_mode(fn):
    """The engine's forward runs under inference_mode, where item/float/int reach the
    mode as aten.item, not decomposed to _local_scalar_dense."""
    with torch.inference_mode():
        values = X.clone()
        found = capture_hazards(fn, values)
    assert len(found) == 1 and found[0].startswith("aten.item"), found


def _device_work(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Everything a sync-free MoE step is made of: none of it reads the device back."""
    scores = (x @ x.T).softmax(dim=-1)
    top = torch.topk(scores, 2, dim=-1)
    order = torch.sort(ids, stable=True)
    counts = torch.zeros(4, dtype=torch.long).scatter_add_(0, ids, torch.ones_like(ids))
    starts = counts.cumsum(0) - counts
    slots = torch.searchsorted(order.values, torch.arange(4))
    picked = x.index_select(0, ids % x.shape[0]).gather(1, top.indices % x.shape[1])
    out = torch.where(picked > 0, picked, 0.0).masked_fill(picked > 1, 1.0)
    repeated = torch.repeat_interleave(ids, torch.full_like(ids, 2), output_size=2 * ids.numel())
    histogram = torch.histc(x, bins=4, min=-3.0, max=3.0)  # a range given: nothing read back
    buffer = torch.full((8,), 7, dtype=torch.long)
    buffer[3] = 0  # a Python scalar assigned: a device fill on CUDA, not a host copy
    buffer[ids] = starts[ids] + slots[ids]
    return out.sum() + repeated.sum() + buffer.sum() + top.values.sum() + histogram.sum()


def test_device_only_work_has_no_hazards():
    x = torch.randn(5, 5)
    ids = torch.tensor([3, 0, 3, 1, 2, 0])
    assert capture_hazards(_device_work, x, ids) == []


def test_hazards_are_listed_in_the_order_they_ran():
    def step(t):
        t.tolist()
        torch.bincount(t)
        return t.sum().item()

    found = capture_hazards(step, COUNTS)
    assert [f.split(":")[0] for f in found] == [
        "Tensor.tolist",
        "aten.bincount.default",
        "aten._local_scalar_dense.default",
    ]


def test_the_mode_ends_with_its_block_even_on_an_error():
    with pytest.raises(RuntimeError, match="inside"):
        with CaptureHazards() as hazards:
            X.sum().item()
            raise RuntimeError("inside")
    X.sum().item()  # outside: not recorded
    assert len(hazards.found) == 1
    assert _get_current_dispatch_mode() is None


def _double_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2, mask=mask)


@pytest.fixture
def interpreted_kernel(monkeypatch):
    """_double_kernel as Triton's CPU interpreter runs it (TRITON_INTERPRET is read at jit time)."""
    triton = pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return triton.jit(_double_kernel)


def test_triton_interpreter_adds_no_hazards(interpreted_kernel):
    x = torch.arange(5.0)
    assert capture_hazards(lambda: interpreted_kernel[(1,)](x, 5, BLOCK=8)) == []
    assert x.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_an_interpreter_that_moves_arguments_to_the_host_is_ignored(
    interpreted_kernel, monkeypatch
):
    """Earlier Triton interpreters copied each tensor argument with `.cpu()`: the interpreter's
    own work, ignored; the same call in the code under test is reported."""
    from triton.runtime import interpreter

    original = interpreter.GridExecutor._init_args_hst

    def init_args_with_cpu_copies(self, args_dev, kwargs):
        for arg in args_dev:
            if isinstance(arg, torch.Tensor):
                arg.cpu()
        return original(self, args_dev, kwargs)

    monkeypatch.setattr(interpreter.GridExecutor, "_init_args_hst", init_args_with_cpu_copies)
    x = torch.arange(5.0)
    assert capture_hazards(lambda: interpreted_kernel[(1,)](x, 5, BLOCK=8)) == []
    assert capture_hazards(lambda: x.cpu()) == ["Tensor.cpu: copies the tensor to the host"]
