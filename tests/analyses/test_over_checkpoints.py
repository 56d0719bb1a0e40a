import functools

import pytest

from interp_toolkit.analyses._common import Table
from interp_toolkit.analyses.ablation import ablation
from interp_toolkit.analyses.over_checkpoints import over_checkpoints, splits_from_run
from interp_toolkit.checkpoint import load_checkpoint, save_checkpoint
from interp_toolkit.errors import UserError
from interp_toolkit.runs.trainer import fingerprint, list_checkpoints


def test_over_checkpoints_table_cache_and_files(tiny_run, tmp_path):
    run_dir, splits = tiny_run
    epochs = [e for e, _ in list_checkpoints(run_dir)]
    assert epochs == [0, 1, 2, 3, 4, 6]
    out = tmp_path / "fp"
    first = over_checkpoints("fingerprints", run_dir, splits=splits, config={"n": 64}, out_dir=out, progress=False)
    assert first.computed == epochs and first.cache_hits == []
    assert first.table.columns[0] == "epoch"
    assert sorted(set(first.table.column("epoch"))) == epochs
    assert len(first.rows) == len(epochs) * 2  # two heads per checkpoint
    assert first.csv_path.is_file() and first.png_path.is_file()
    assert first.png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Table.from_csv(first.csv_path).column("qk_rho") == pytest.approx(first.table.column("qk_rho"))

    csv_text = first.csv_path.read_text()
    again = over_checkpoints("fingerprints", run_dir, splits=splits, config={"n": 64}, out_dir=out, progress=False)
    assert again.computed == [] and again.cache_hits == epochs
    assert again.rows == first.rows
    # served from the cache, the table keeps the analysis's column order (epoch first), so the CSV is the same
    assert again.table.columns == first.table.columns and again.csv_path.read_text() == csv_text

    # another config is another cache entry
    other = over_checkpoints("fingerprints", run_dir, splits=splits, config={"n": 32}, out_dir=out,
                             epochs=[0, 6], progress=False)
    assert other.computed == [0, 6]


def test_changed_checkpoint_is_recomputed(tiny_run, tmp_path):
    import shutil

    run_dir, splits = tiny_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    kwargs = dict(splits=splits, config={"split_names": ["val"], "components": ["L0H0"], "n": 32},
                  progress=False, plot=False)
    over_checkpoints("ablation", copy, **kwargs)
    # overwrite epoch 6 with the epoch-0 weights: only that checkpoint is recomputed
    model0, meta = load_checkpoint(copy / "checkpoints" / "epoch_000000.safetensors")
    save_checkpoint(
        model0, copy / "checkpoints" / "epoch_000006.safetensors", metadata={**meta, "epoch": 6}
    )  # its own epoch
    result = over_checkpoints("ablation", copy, **kwargs)
    assert result.computed == [6]
    rows0 = [{k: v for k, v in r.items() if k != "epoch"} for r in result.table.where(epoch=0).rows]
    rows6 = [{k: v for k, v in r.items() if k != "epoch"} for r in result.table.where(epoch=6).rows]
    assert rows0 == rows6


def test_cache_entry_without_a_current_value_column_is_recomputed(tiny_run, tmp_path):
    """A cache written before the analysis gained a value column (here ``qk_rho`` removed from
    one entry) is stale: that checkpoint is computed again, the others are hits."""
    import json

    run_dir, splits = tiny_run
    out = tmp_path / "fp"
    kwargs = dict(splits=splits, config={"n": 64}, out_dir=out, epochs=[0, 6], progress=False, plot=False)
    first = over_checkpoints("fingerprints", run_dir, **kwargs)
    (old,) = sorted((out / "cache").glob("epoch_000006_*.json"))
    entry = json.loads(old.read_text())
    entry["rows"] = [{k: v for k, v in row.items() if k != "qk_rho"} for row in entry["rows"]]
    old.write_text(json.dumps(entry))
    again = over_checkpoints("fingerprints", run_dir, **kwargs)
    assert again.computed == [6] and again.cache_hits == [0]
    assert again.rows == first.rows


def test_callable_analysis_and_splits_from_run(tiny_run, tmp_path):
    run_dir, splits = tiny_run
    rebuilt = splits_from_run(run_dir)
    assert {k: fingerprint(v) for k, v in rebuilt.items()} == {k: fingerprint(v) for k, v in splits.items()}
    fn = functools.partial(ablation, method="zero", split_names=["adv"], components=["attn0"], n=16)
    result = over_checkpoints(fn, run_dir, epochs=[6], out_dir=tmp_path / "abl", progress=False)
    assert {r["method"] for r in result.rows} == {"zero"} and {r["split"] for r in result.rows} == {"adv"}
    assert result.png_path.is_file()


def test_over_checkpoints_bad_input(tiny_run, tmp_path):
    run_dir, splits = tiny_run
    with pytest.raises(UserError, match="unknown analysis 'probing'"):
        over_checkpoints("probing", run_dir, splits=splits)
    with pytest.raises(UserError, match=r"no checkpoint for epochs \[5\]"):
        over_checkpoints("fingerprints", run_dir, splits=splits, epochs=[5])
    with pytest.raises(UserError, match="has no checkpoints"):
        over_checkpoints("fingerprints", tmp_path, splits=splits)
    with pytest.raises(UserError, match=r"does not accept config keys \['chunksize'\]"):
        over_checkpoints("gradients", run_dir, splits=splits, config={"chunksize": 8})
    with pytest.raises(UserError, match="JSON-serializable"):
        over_checkpoints("fingerprints", run_dir, splits=splits, config={"n": object()})


def test_last_analyses_the_last_checkpoint_only(tiny_run, tmp_path):
    run_dir, splits = tiny_run
    with pytest.raises(UserError, match=r"last and epochs \(\[0\]\) are exclusive"):
        over_checkpoints("fingerprints", run_dir, splits=splits, epochs=[0], last=True, out_dir=tmp_path)
    assert not any(tmp_path.iterdir())  # refused before any work
    result = over_checkpoints("fingerprints", run_dir, splits=splits, config={"n": 16}, last=True,
                              out_dir=tmp_path / "fp", plot=False, progress=False)
    assert result.computed == [list_checkpoints(run_dir)[-1][0]] == [6]
    assert sorted(set(result.table.column("epoch"))) == [6]


def test_partials_with_different_bound_arguments_do_not_share_a_cache(tiny_run, tmp_path):
    run_dir, splits = tiny_run
    kwargs = dict(splits=splits, epochs=[6], out_dir=tmp_path / "abl", progress=False, plot=False)
    zero = functools.partial(ablation, method="zero", split_names=["adv"], components=["attn0"], n=16)
    mean = functools.partial(ablation, method="mean", split_names=["adv"], components=["attn0"], n=16)
    first = over_checkpoints(zero, run_dir, **kwargs)
    second = over_checkpoints(mean, run_dir, **kwargs)
    assert second.computed == [6]
    assert {r["method"] for r in first.rows} == {"zero"} and {r["method"] for r in second.rows} == {"mean"}
    assert over_checkpoints(zero, run_dir, **kwargs).cache_hits == [6]


def test_analysis_version_is_part_of_the_cache_key(tiny_run, tmp_path):
    """Changed code under the same name and columns: bumping the version recomputes, the same
    version is a hit; each entry records its version and the package that wrote it."""
    import json

    from interp_toolkit import __version__
    from interp_toolkit.analyses.over_checkpoints import ANALYSES

    run_dir, splits = tiny_run
    calls = []

    def counting(model, splits, n=16):
        calls.append(n)
        return ablation(model, splits, method="zero", split_names=["adv"], components=["attn0"], n=n)

    kwargs = dict(splits=splits, epochs=[6], out_dir=tmp_path / "abl", progress=False, plot=False)
    over_checkpoints(counting, run_dir, **kwargs)
    assert over_checkpoints(counting, run_dir, version=1, **kwargs).cache_hits == [6]  # 1 is the default
    assert over_checkpoints(counting, run_dir, version=2, **kwargs).computed == [6]
    assert over_checkpoints(counting, run_dir, version=2, **kwargs).cache_hits == [6]
    assert len(calls) == 2
    entries = [json.loads(p.read_text()) for p in sorted((tmp_path / "abl" / "cache").glob("*.json"))]
    assert sorted(e["version"] for e in entries) == [1, 2]
    assert {e["written_by"] for e in entries} == {f"interp-toolkit {__version__}"}
    # a registered analysis carries its own version (gradients gained the minority columns)
    assert ANALYSES["gradients"].version == 2 and ANALYSES["fingerprints"].version == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_analysis_version_is_refused_before_work(tiny_run, tmp_path, bad):
    run_dir, splits = tiny_run
    with pytest.raises(UserError, match=rf"version must be a positive int .*got {bad!r}"):
        over_checkpoints("fingerprints", run_dir, splits=splits, version=bad, out_dir=tmp_path / "fp")
    assert not (tmp_path / "fp").exists()


def test_an_edited_analysis_recomputes_without_a_version_bump(tiny_run, tmp_path):
    """Your own analysis is keyed on its code: the same function name with an edited body is
    recomputed, not served from the cache; the unedited one is a hit."""
    import importlib.util
    import textwrap

    from interp_toolkit.analyses import AnalysisResult, Table

    run_dir, splits = tiny_run
    source = textwrap.dedent('''
        from interp_toolkit.analyses import AnalysisResult, Table

        def norm(model, splits):
            return AnalysisResult(Table([{"component": "all", "value": float(SCALE)}]))
    ''')

    def load(scale: int, name: str):
        path = tmp_path / f"{name}.py"
        path.write_text(source.replace("SCALE", str(scale)))
        spec = importlib.util.spec_from_file_location("my_analysis", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.norm

    kwargs = dict(splits=splits, epochs=[6], out_dir=tmp_path / "mine", progress=False, plot=False)
    first = over_checkpoints(load(1, "a"), run_dir, **kwargs)
    assert first.computed == [6] and first.rows[0]["value"] == 1.0
    assert over_checkpoints(load(1, "b"), run_dir, **kwargs).cache_hits == [6]  # same code: a hit
    edited = over_checkpoints(load(2, "c"), run_dir, **kwargs)
    assert edited.computed == [6] and edited.rows[0]["value"] == 2.0
    assert isinstance(AnalysisResult(Table([])).table, Table)
