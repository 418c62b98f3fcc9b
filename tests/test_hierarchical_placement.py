"""interpolate's ``hierarchical`` mode on every architecture: inputs within the original length give the stock
outputs with no code of posswap's (the rows are the old ones); position p of a longer input reads old row p % n
plus the block vector of p // n, checked against the formula on the stock table; the saved folder reloads."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import MODEL_IDS, MODELS, OLD_LENGTH, make_model, outputs, reload_and_compare, sharpen_qk, token_ids

import posswap
from posswap.portable.posswap_architectures import find_sites

HIERARCHICAL = posswap.InterpolateConfig(max_length=3 * OLD_LENGTH, mode="hierarchical")


@pytest.mark.parametrize("model_type,head", MODELS, ids=MODEL_IDS)
def test_short_inputs_give_the_stock_outputs_and_long_ones_read_row_and_block(model_type, head, tmp_path):
    stock = sharpen_qk(make_model(model_type, head))
    patched = posswap.patch(copy.deepcopy(stock), HIERARCHICAL)
    ids = token_ids(OLD_LENGTH)
    with torch.no_grad():
        torch.testing.assert_close(outputs(patched, ids), outputs(stock, ids), atol=1e-5, rtol=0)
    sites = find_sites(stock)
    old = sites.table.weight.detach()[sites.offset :]
    new = find_sites(patched).table.weight.detach()[sites.offset :]
    assert new.shape[0] == 3 * OLD_LENGTH
    for p in (OLD_LENGTH - 1, OLD_LENGTH, OLD_LENGTH + 5, 2 * OLD_LENGTH + 7, 3 * OLD_LENGTH - 1):
        q, r = divmod(p, OLD_LENGTH)
        expected = old[r] + (old[1 + q] - old[1]) * (0.4 / 0.6)
        torch.testing.assert_close(new[p], expected, atol=1e-6, rtol=0)
    assert torch.equal(find_sites(patched).table.weight[: sites.offset], sites.table.weight[: sites.offset])
    loaded = reload_and_compare(patched, tmp_path, 3 * OLD_LENGTH - 2)
    assert loaded.config.posswap["mode"] == "hierarchical"
