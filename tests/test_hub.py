"""push_to_hub end to end: the real huggingface_hub client against a stand-in Hub on 127.0.0.1."""

from __future__ import annotations

import json

import huggingface_hub
import pytest
import torch
from conftest import make_model, token_ids

import posswap
from posswap import cli
from posswap.evaluation.results import ModelResults, Results
from posswap.hub import model_card, push_to_hub


def patched_gpt2(method: str = "rope"):
    model = make_model("gpt2", "GPT2LMHeadModel")
    configs = {"rope": posswap.RopeConfig(max_length=128), "interpolate": posswap.InterpolateConfig(max_length=128)}
    return posswap.patch(model, configs[method])


def results() -> Results:
    # Scores as posswap eval writes them (fixed here: the card must show them, not compute them).
    model = ModelResults(kind="causal", limit=128, metrics={"ppl": [41.5, 57.25]})
    return Results(lengths=[32, 128], data="posswap:austen-heldout", models={"gpt2-rope-128": model})


def test_push_folder_end_to_end(hub, tmp_path):
    model = patched_gpt2()
    model.save_pretrained(tmp_path / "out")
    plot = tmp_path / "report" / "ppl_vs_length.png"
    plot.parent.mkdir()
    plot.write_bytes(b"\x89PNG not really")
    (tmp_path / "report" / "results.json").write_text(json.dumps(results().to_dict()))

    url = push_to_hub(
        tmp_path / "out",
        "me/gpt2-rope-128",
        results=tmp_path / "report" / "results.json",
        plots=[plot],
        data="posswap:austen-train",
        steps=20,
        private=True,
    )

    assert url == f"{hub.url}/me/gpt2-rope-128"
    assert hub.repos["me/gpt2-rope-128"]["private"] is True
    files = hub.files("me/gpt2-rope-128")
    assert {"config.json", "model.safetensors", "README.md", "plots/ppl_vs_length.png", "modeling_posswap.py"} <= set(
        files
    )
    assert files["model.safetensors"] == (tmp_path / "out" / "model.safetensors").read_bytes()
    assert json.loads(files["config.json"])["posswap"] == model.config.posswap
    card = files["README.md"].decode()
    meta = huggingface_hub.ModelCard(card).data
    assert meta.library_name == "transformers" and meta.tags == ["posswap", "rope"]
    for text in (
        "`rope`",
        "32 -> 128",
        'posswap.from_pretrained("me/gpt2-rope-128")',
        "posswap:austen-train",
        "steps: 20",
        results().table(),
        "![ppl_vs_length](plots/ppl_vs_length.png)",
        'AutoModel.from_pretrained("me/gpt2-rope-128", trust_remote_code=True)',
        "posswap export me/gpt2-rope-128",
    ):
        assert text in card
    # What arrived is a working checkpoint: the same logits after posswap.from_pretrained.
    loaded = posswap.from_pretrained(str(hub.root / "me/gpt2-rope-128")).eval()
    ids = token_ids(100)
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits)


def test_push_model_then_transformers_push_keeps_card(hub):
    model = patched_gpt2("interpolate")
    push_to_hub(model, "me/gpt2-long", results=results(), base_model="openai-community/gpt2")
    card = hub.files("me/gpt2-long")["README.md"].decode()
    assert huggingface_hub.ModelCard(card).data.base_model == "openai-community/gpt2"
    assert 'GPT2LMHeadModel.from_pretrained("me/gpt2-long")' in card  # interpolate: plain transformers loads it

    # transformers' own method still works, carries the posswap block and keeps the card on the repo.
    model.push_to_hub("me/gpt2-long", commit_message="again")
    files = hub.files("me/gpt2-long")
    assert json.loads(files["config.json"])["posswap"]["method"] == "interpolate"
    assert results().table() in files["README.md"].decode()
    assert hub.repos["me/gpt2-long"]["commits"] == ["Upload posswap model", "again"]


@pytest.mark.parametrize("repo_id", ["me/two/slashes", "me/bad name", "-me/x", ""])
def test_bad_repo_id_fails_before_any_request(hub, tmp_path, repo_id):
    patched_gpt2().save_pretrained(tmp_path / "out")
    with pytest.raises(ValueError, match="Bad repo id"):
        push_to_hub(tmp_path / "out", repo_id)
    assert hub.requests == []


def test_not_logged_in_fails_before_any_request(hub, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    with pytest.raises(ValueError, match="Not logged in"):
        push_to_hub(patched_gpt2(), "me/x")
    assert hub.requests == []


def test_wrong_token_is_a_clear_cli_error(hub, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    patched_gpt2().save_pretrained(tmp_path / "out")
    assert cli.main(["push", str(tmp_path / "out"), "me/x"]) == 2
    err = capsys.readouterr().err
    assert "posswap push: error: the Hub refused the upload" in err and "401" in err


def test_cli_push(hub, tmp_path, capsys):
    patched_gpt2().save_pretrained(tmp_path / "out")
    results().save(tmp_path / "results.json")
    assert (
        cli.main(["push", str(tmp_path / "out"), "me/cli", "--private", "--results", str(tmp_path / "results.json")])
        == 0
    )
    assert f"{hub.url}/me/cli" in capsys.readouterr().out
    assert hub.repos["me/cli"]["private"] is True
    assert results().table() in hub.files("me/cli")["README.md"].decode()


def test_card_leaves_out_sections_without_data():
    card = model_card(patched_gpt2())
    assert "`rope`" in card and "32 -> 128" in card
    for absent in ("## Training", "## Evaluation", "## Plots", "base_model", "license"):
        assert absent not in card
    card = model_card(patched_gpt2(), data="posswap:austen-train")
    assert "- data: posswap:austen-train" in card and "steps" not in card


def test_user_readme_is_kept_and_never_silently_drops_results(hub, tmp_path):
    patched_gpt2().save_pretrained(tmp_path / "out")
    (tmp_path / "out" / "README.md").write_text("# my own card\n")
    with pytest.raises(ValueError, match="not written by posswap"):
        push_to_hub(tmp_path / "out", "me/own", results=results())
    assert hub.requests == []
    push_to_hub(tmp_path / "out", "me/own")
    assert hub.files("me/own")["README.md"] == b"# my own card\n"


def test_unpatched_model_has_no_card(tmp_path):
    with pytest.raises(ValueError, match="no 'posswap' block"):
        model_card(make_model("gpt2", "GPT2LMHeadModel"))


def test_overlapping_pushes_keep_the_timeout_until_the_last_ends():
    """Pushes from several threads share huggingface_hub's session: one ending must not take the timeout from
    another still running, and the session's own timeout comes back after the last."""
    from huggingface_hub.utils import get_session

    from posswap.hub import HUB_TIMEOUT, hub_timeout

    session = get_session()
    own = session.timeout
    first, second = hub_timeout("push again"), hub_timeout("push again")
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert session.timeout.read == HUB_TIMEOUT  # the second push still has its timeout
    second.__exit__(None, None, None)
    assert session.timeout == own
