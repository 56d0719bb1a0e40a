import pandas as pd
import torch

from interp_toolkit.analyses._common import AnalysisResult, Table


def test_table_to_pandas_keeps_rows_columns_and_missing_values():
    table = Table([{"component": "L0H0", "delta": -0.5}, {"component": "L0H1", "delta": 0.25, "extra": 3}])
    frame = table.to_pandas()
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == table.columns == ["component", "delta", "extra"]
    assert frame["delta"].tolist() == [-0.5, 0.25]
    assert pd.isna(frame.loc[0, "extra"]) and frame.loc[1, "extra"] == 3
    assert frame.to_dict("records")[1] == table.rows[1]


def test_analysis_result_to_pandas_carries_config():
    result = AnalysisResult(Table([{"a": 1}]), {"t": torch.zeros(1)}, {"n": 32})
    frame = result.to_pandas()
    assert frame["a"].tolist() == [1] and frame.attrs["config"] == {"n": 32}
