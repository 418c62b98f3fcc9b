"""resample_table: the math behind interpolate, checked on tables whose right answer is known."""

import pytest
import torch

from posswap.portable.posswap_functional import resample_table


def test_copy_tiles_old_rows():
    table = torch.randn(5, 3)
    new = resample_table(table, 12, "copy")
    assert new.shape == (12, 3)
    for row in range(12):
        assert torch.equal(new[row], table[row % 5])


def test_copy_shrink_keeps_first_rows():
    table = torch.randn(8, 3)
    assert torch.equal(resample_table(table, 3, "copy"), table[:3])


@pytest.mark.parametrize("mode", ["copy", "linear", "cubic"])
def test_same_length_is_identity(mode):
    table = torch.randn(7, 4)
    assert torch.equal(resample_table(table, 7, mode), table)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resampling_passes_through_old_rows(mode):
    # With aligned corners, new row 2k of (2n - 1) rows sits exactly on old row k.
    table = torch.randn(9, 4, dtype=torch.float64)
    new = resample_table(table, 17, mode)
    torch.testing.assert_close(new[::2], table, atol=1e-5, rtol=0)


def test_linear_is_exact_on_a_table_linear_in_position():
    positions = torch.arange(10, dtype=torch.float32)[:, None]
    table = positions * torch.tensor([[1.0, -2.0, 0.5]])
    new = resample_table(table, 37, "linear")
    expected = torch.linspace(0, 9, 37)[:, None] * torch.tensor([[1.0, -2.0, 0.5]])
    torch.testing.assert_close(new, expected, atol=1e-5, rtol=0)


def test_keeps_dtype():
    table = torch.randn(6, 4).to(torch.bfloat16)
    assert resample_table(table, 20, "cubic").dtype == torch.bfloat16


def test_unknown_mode():
    with pytest.raises(ValueError, match="mode must be one of"):
        resample_table(torch.randn(4, 2), 8, "nearest")
