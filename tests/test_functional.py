"""resample_table: the math behind interpolate, checked on tables whose right answer is known."""

import pytest
import torch

from posswap.portable.posswap_functional import resample_positions, resample_table


def test_copy_tiles_old_rows():
    table = torch.randn(5, 3)
    new = resample_table(table, 12, "copy")
    assert new.shape == (12, 3)
    for row in range(12):
        assert torch.equal(new[row], table[row % 5])


def test_copy_shrink_keeps_first_rows():
    table = torch.randn(8, 3)
    assert torch.equal(resample_table(table, 3, "copy"), table[:3])


@pytest.mark.parametrize("mode", ["copy", "linear", "cubic", "stride", "hierarchical"])
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


def test_hierarchical_is_su_decomposition_by_hand():
    # Su (2020), anchored at row 1: u_i = (e_(i+1) - a e_1) / (1 - a), v_r = (e_r - a e_1) / (1 - a); position
    # q * n + r reads a u_q + (1 - a) v_r, here a = 0.4.
    table = torch.randn(6, 3, dtype=torch.float64)
    u = (table[1:] - 0.4 * table[1]) / 0.6
    v = (table - 0.4 * table[1]) / 0.6
    new = resample_table(table, 20, "hierarchical")
    for p in range(20):
        torch.testing.assert_close(new[p], 0.4 * u[p // 6] + 0.6 * v[p % 6])
    assert torch.equal(new[:6], table)  # every old position keeps its exact vector
    # Two tokens of one block sit at their old offset: the difference of their rows is the old rows' difference.
    torch.testing.assert_close(new[15] - new[13], table[3] - table[1])


def test_hierarchical_refuses_past_the_square_and_shrinks_to_the_first_rows():
    table = torch.randn(4, 2)
    assert torch.equal(resample_table(table, 3, "hierarchical"), table[:3])
    assert resample_table(table, 12, "hierarchical").shape == (12, 2)
    with pytest.raises(ValueError, match="reaches 12 positions from 4 rows; got 13"):
        resample_table(table, 13, "hierarchical")


def test_blocked_stride_is_stride_tables_end_to_end_with_block_vectors():
    table = torch.randn(4, 3, dtype=torch.float64)
    new = resample_positions(table, 0, 16, "stride", blocks=2)
    half = resample_table(table, 8, "stride")
    torch.testing.assert_close(new[:8], half)
    torch.testing.assert_close(new[8:], half + (table[2] - table[1]) * (0.4 / 0.6))
    with pytest.raises(ValueError, match="stride_blocks must divide 16 into blocks"):
        resample_positions(table, 0, 16, "stride", blocks=3)
