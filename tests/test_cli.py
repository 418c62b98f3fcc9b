"""posswap patch on a saved tiny GPT-2 with the real GPT-2 tokenizer; errors write nothing."""

from __future__ import annotations

import pytest
import torch
import transformers

import posswap
from posswap.cli import main
from posswap.data import GPT2_TOKENIZER_DIR


@pytest.fixture
def tiny_gpt2_dir(tmp_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(GPT2_TOKENIZER_DIR)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tokenizer), n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def test_cli_patch_saves_model_and_tokenizer(tiny_gpt2_dir, tmp_path, capsys):
    out = tmp_path / "tiny-128"
    code = main(
        [
            "patch",
            str(tiny_gpt2_dir),
            "--method",
            "interpolate",
            "--mode",
            "linear",
            "--max-length",
            "128",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert "max_length 32 -> 128" in capsys.readouterr().out
    model = posswap.from_pretrained(str(out))
    assert isinstance(model, transformers.GPT2LMHeadModel)
    assert model.config.posswap["mode"] == "linear"
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.model_max_length == 128
    ids = tokenizer("It is a truth universally acknowledged " * 20, return_tensors="pt").input_ids[:, :128]
    assert model(input_ids=ids).logits.shape[1] == ids.shape[1]


@pytest.mark.parametrize(
    "options,message",
    [
        (["--mode", "nearest", "--max-length", "64"], "mode must be one of"),
        (["--max-length", "0"], "max_length must be a positive integer"),
        (["--max-length", "64.5"], "max_length must be a positive integer"),
    ],
)
def test_cli_errors_write_nothing(tiny_gpt2_dir, tmp_path, capsys, options, message):
    out = tmp_path / "never"
    assert main(["patch", str(tiny_gpt2_dir), "--method", "interpolate", *options, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_cli_unknown_model_folder(tmp_path, capsys):
    assert (
        main(
            [
                "patch",
                str(tmp_path / "missing"),
                "--method",
                "interpolate",
                "--max-length",
                "64",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    assert "error" in capsys.readouterr().err


def test_cli_help_lists_methods(capsys):
    with pytest.raises(SystemExit):
        main(["patch", "--help"])
    assert "--method interpolate" in capsys.readouterr().out


def test_cli_patch_alibi(tiny_gpt2_dir, tmp_path):
    out = tmp_path / "tiny-alibi"
    code = main(
        [
            "patch",
            str(tiny_gpt2_dir),
            "--method",
            "alibi",
            "--max-length",
            "256",
            "--backend",
            "eager",
            "--symmetric",
            "false",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    model = posswap.from_pretrained(str(out))
    assert model.config.posswap["backend"] == "eager" and model.config.posswap["symmetric"] is False
    assert model.config._attn_implementation == "posswap_bias_eager"
    assert model(input_ids=torch.arange(3, 259)[None]).logits.shape[1] == 256
    assert (
        main(
            [
                "patch",
                str(tiny_gpt2_dir),
                "--method",
                "alibi",
                "--max-length",
                "256",
                "--backend",
                "fast",
                "--out",
                str(out),
            ]
        )
        == 2
    )
