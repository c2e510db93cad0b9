"""``flashsplit models``: the end-to-end benchmark's smoke run (tiny widths) on any machine."""

import json

import pytest

pytest.importorskip("transformers", reason="the transformers extra is not installed")

from flashsplit.__main__ import main  # noqa: E402
from flashsplit.bench.models import parse_cell  # noqa: E402


@pytest.mark.parametrize("models", [pytest.param(["llama3-8b", "gpt-oss-20b"], marks=pytest.mark.full),
                                    ["gpt-oss-20b"]], ids=["llama-and-gpt-oss", "gpt-oss"])
def test_models_smoke_run_compares_tokens_and_writes_json(models, tmp_path, capsys):
    path = tmp_path / "models.json"
    assert main(["models", "--tiny", "--models", *models, "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    cells = data["cells"]
    assert [(c["model"], c["batch"]) for c in cells] == [(model, batch) for model in models for batch in (1, 2)]
    for cell in cells:
        results = cell["results"]
        assert [r["impl"] for r in results] == (["sdpa"] if cell["model"] == "llama3-8b"
                                                else ["eager", "flex_attention"]) + ["split_kv"]
        assert [r["reference"] for r in results] == [True] * (len(results) - 1) + [False]
        if cell["model"] == "gpt-oss-20b" and data["device"] == "cpu":
            flex = results.pop(1)  # a smoke run on the CPU leaves transformers' FlexAttention out
            assert "CUDA only" in flex["error"] and flex["ms_per_token"] is None
        for result in results:
            assert result["error"] is None and result["ms_per_token"] > 0 and result["prefill_s"] > 0
        # The leader generates; the others are fed its tokens: 1 warm-up + 2 timed steps, so 2 picks
        # per row have a leading token after them.
        assert results[0]["same"] + results[0]["ties"] + results[0]["different"] == 0
        for result in results[1:]:
            assert result["same"] + result["ties"] + result["different"] == 2 * cell["batch"]
            assert result["different"] == 0, cell
    table = capsys.readouterr().out
    assert "| gpt-oss-20b | 2 x 48 | eager | split_kv |" in table
    assert "x eager" in table


def test_models_generate_mode_compares_free_generations(tmp_path):
    """``--modes generate``: transformers' generate for each implementation, timed as the
    difference of two generations; free generations compared up to their first difference."""
    path = tmp_path / "models.json"
    assert main(["models", "--tiny", "--models", "llama3-8b", "--modes", "generate", "--json", str(path)]) == 0
    cells = json.loads(path.read_text())["cells"]
    assert [(c["batch"], c["mode"]) for c in cells] == [(1, "generate"), (2, "generate")]
    for cell in cells:
        reference, ours = cell["results"]
        assert (reference["impl"], ours["impl"]) == ("sdpa", "split_kv")
        assert isinstance(reference["ms_per_token"], float) and isinstance(ours["ms_per_token"], float)
        # --tiny: 1 warm-up + 2 timed steps, 3 new tokens a row, all the reference's.
        assert (ours["same"], ours["ties"], ours["different"]) == (3 * cell["batch"], 0, 0), cell


def test_models_cells_parse_and_bad_cells_are_refused():
    assert parse_cell("8x32k") == (8, 32768)
    with pytest.raises(SystemExit):
        main(["models", "--cells", "32k"])
