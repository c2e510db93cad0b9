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
        reference, ours = cell["results"]
        assert reference["impl"] == ("sdpa" if cell["model"] == "llama3-8b" else "eager")
        assert ours["impl"] == "split_kv"
        for result in (reference, ours):
            assert result["error"] is None and result["ms_per_token"] > 0 and result["prefill_s"] > 0
        # 1 warm-up + 2 timed steps: 2 picks per row have a reference token after them.
        assert ours["same"] + ours["ties"] + ours["different"] == 2 * cell["batch"]
        assert ours["different"] == 0, cell
    table = capsys.readouterr().out
    assert "| gpt-oss-20b | 2 x 48 | eager | split_kv |" in table


def test_models_cells_parse_and_bad_cells_are_refused():
    assert parse_cell("8x32k") == (8, 32768)
    with pytest.raises(SystemExit):
        main(["models", "--cells", "32k"])
