"""BF16 products through float32 where torch lacks BF16 matrix kernels
(engine/host/bf16_products.py): which rows take that path, and that its values are
the product rounded once to BF16, against a float64 reference."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from engine.host import bf16_products


def _operands(rows: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 96, generator=g).bfloat16()
    w = torch.randn(80, 96, generator=g).bfloat16()
    b = torch.randn(80, generator=g).bfloat16()
    return x, w, b


def _ulps_from_exact(got: torch.Tensor, x, w, b) -> torch.Tensor:
    exact = F.linear(x.double(), w.double(), b.double())
    ulp = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 7)
    return (got.double() - exact).abs() / ulp


@pytest.fixture
def slow_bf16(monkeypatch):
    monkeypatch.setattr(bf16_products, "torch_bf16_products_are_slow", lambda: True)


@pytest.fixture
def computed_in(monkeypatch) -> list:
    """The dtypes the module's products ran in (the paths can give the same bits)."""
    seen = []

    def spy(x, *args):
        seen.append(x.dtype)
        return F.linear(x, *args)

    monkeypatch.setattr(bf16_products, "F", SimpleNamespace(linear=spy))
    return seen


def test_many_rows_are_the_product_rounded_once(slow_bf16, computed_in):
    x, w, b = _operands(bf16_products.FLOAT32_FROM_ROWS)
    got = bf16_products.linear(x.view(2, -1, 96), w, b)  # rows counted over every dim
    assert computed_in == [torch.float32]
    assert got.dtype == torch.bfloat16 and got.shape == (2, x.shape[0] // 2, 80)
    # float32 sums of 96 products, then one rounding: within a BF16 ulp of the exact value
    assert _ulps_from_exact(got.view(-1, 80), x, w, b).max() <= 1.0


def test_fewer_rows_stay_in_torchs_bf16_product(slow_bf16, computed_in):
    x, w, b = _operands(bf16_products.FLOAT32_FROM_ROWS - 1)
    assert torch.equal(bf16_products.linear(x, w, b), F.linear(x, w, b))
    assert computed_in == [torch.bfloat16]


def test_a_cpu_with_bf16_kernels_keeps_torchs_product(monkeypatch, computed_in):
    monkeypatch.setattr(bf16_products, "torch_bf16_products_are_slow", lambda: False)
    x, w, b = _operands(4 * bf16_products.FLOAT32_FROM_ROWS)
    assert torch.equal(bf16_products.linear(x, w, b), F.linear(x, w, b))
    assert computed_in == [torch.bfloat16]


def test_float32_operands_are_untouched(slow_bf16, computed_in):
    x, w, b = (t.float() for t in _operands(64))
    assert torch.equal(bf16_products.linear(x, w, b), F.linear(x, w, b))
    assert computed_in == [torch.float32]


@pytest.mark.parametrize("slow", [True, False])
def test_einsums_run_in_float32_on_cpus_without_bf16_kernels(monkeypatch, slow):
    """MLA's absorbed products: float32 sums rounded once where BF16 kernels are missing
    (within a BF16 ulp of the exact value), torch's own BF16 einsum where they exist."""
    monkeypatch.setattr(bf16_products, "torch_bf16_products_are_slow", lambda: slow)
    seen = []

    def spy(equation, *operands):
        seen.append(operands[0].dtype)
        return torch.einsum(equation, *operands)

    monkeypatch.setattr(
        bf16_products,
        "torch",
        SimpleNamespace(
            einsum=spy, **{name: getattr(torch, name) for name in ("bfloat16", "float32")}
        ),
    )
    g = torch.Generator().manual_seed(3)
    q = torch.randn(5, 4, 32, generator=g).bfloat16()
    w = torch.randn(4, 32, 64, generator=g).bfloat16()
    got = bf16_products.einsum("thn,hnr->thr", q, w)
    assert got.dtype == torch.bfloat16 and got.shape == (5, 4, 64)
    assert seen == [torch.float32 if slow else torch.bfloat16]
    exact = torch.einsum("thn,hnr->thr", q.double(), w.double())
    ulp = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 7)
    assert ((got.double() - exact).abs() / ulp).max() <= (1.0 if slow else 4.0)
