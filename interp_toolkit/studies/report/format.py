"""The report's text: the rate table, contrasts and comparisons as aligned text, markdown and CSV."""

from __future__ import annotations

import csv
import io as _io
import json
from typing import Any, Mapping, Sequence

from interp_toolkit.studies.grid.cells import (
    SHORT_NAMES,
    cell_fields,
    cell_label,
    format_setting,
    regime_fields,
    varying_fields,
)


def format_reference_comparison(rows: Sequence[Mapping[str, Any]]) -> str:
    """:func:`reference_comparison` as aligned text."""
    lines = [["cell", "k/n here", "k/n published", "difference", "95% Newcombe", "Fisher p"]]
    for row in rows:
        lines.append([row["cell"], f"{row['k']}/{row['n']}", f"{row['reference_k']}/{row['reference_n']}",
                      f"{row['difference']:+.2f}", f"[{row['newcombe_low']:+.2f}, {row['newcombe_high']:+.2f}]",
                      f"{row['fisher_p']:.3g}"])
    return _align(lines)


def _csv_value(value: Any) -> Any:
    """A cell of a CSV: empty for None, JSON for a list (an extra setting such as betas)."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return json.dumps(list(value))
    return value


def csv_text(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> str:
    """``rows`` as CSV text with the columns ``fields`` (other keys left out)."""
    buffer = _io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(fields), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _csv_value(row.get(k)) for k in fields})
    return buffer.getvalue()


def near_miss_text(row: Mapping[str, Any]) -> str:
    """A cell's near misses as ``k/n`` (runs within 1 point of the criterion, of the runs whose
    near-miss view is known), ``"-"`` when none is known (rows of an older outcomes.csv)."""
    known = row.get("n_near_miss_known") or 0
    return f"{row.get('n_near_misses') or 0}/{known}" if known else "-"


def clock_text(row: Mapping[str, Any]) -> tuple[str, str]:
    """A cell's ``steps`` and ``decay_clocks`` at its epoch budget as text (``"?"``: unknown)."""
    steps, clocks = row.get("steps"), row.get("decay_clocks")
    return ("?" if steps is None else f"{steps:,}"), ("?" if clocks is None else f"{clocks:.3g}")


def _setting_columns(table: Sequence[Mapping[str, Any]]) -> list[str]:
    """Cell fields shown as columns: task, L, H, wd and r always; regime fields when they vary."""
    shown = set(varying_fields(table))
    return [k for k in cell_fields(table) if k in ("task", "n_layers", "n_heads", "weight_decay", "r") or k in shown]


def shared_settings(table: Sequence[Mapping[str, Any]]) -> str:
    """The regime settings every row shares, as ``"seq_len 8, n_values 10, ..."`` (empty if none)."""
    if not table:
        return ""
    varying = set(varying_fields(table))
    # A None batch_size is full-batch training; any other None is a setting an older record lacks.
    known = [k for k in regime_fields(table) if k not in varying and (table[0].get(k) is not None
                                                         or (k == "batch_size" and table[0].get("epochs") is not None))]
    return ", ".join(f"{k} {format_setting(k, table[0].get(k))}" for k in known)


def format_table(table: Sequence[Mapping[str, Any]]) -> str:
    """The rate table as aligned text (``rate``: paper criterion; ``rule``: both splits).

    Regime columns (``seq_len``, ``n_train``, ``epochs``, ...) are printed only when they vary.
    """
    settings = _setting_columns(table)
    running = any(row.get("n_running") for row in table)
    header = [SHORT_NAMES.get(k, k) for k in settings] + [
        "steps", "clocks", "seeds", "gen", "rate", "95% Wilson", "near miss", "rule", "rule rate",
        "95% Wilson (rule)", "transient", "med. epoch", "adv", "val"] + (["running"] if running else [])
    lines = [header]
    for row in table:
        median = row["median_first_generalized_epoch"]
        lines.append([format_setting(k, row.get(k)) for k in settings] + [
            *clock_text(row), str(row["n_seeds"]), str(row["n_generalized"]), f"{row['rate']:.2f}",
            f"[{row['wilson_low']:.2f}, {row['wilson_high']:.2f}]", near_miss_text(row), str(row["n_rule_learned"]),
            f"{row['rule_learned_rate']:.2f}",
            f"[{row['rule_learned_wilson_low']:.2f}, {row['rule_learned_wilson_high']:.2f}]",
            str(row["n_transient"]), "-" if median is None else f"{median:g}", f"{row['mean_final_adv_acc']:.3f}",
            f"{row['mean_final_val_acc']:.3f}",
        ] + ([str(row.get("n_running") or 0)] if running else []))
    return _align(lines)


def format_contrasts(contrasts: Sequence[Mapping[str, Any]]) -> str:
    """Contrasts (a - b) as aligned text: difference, 95% Newcombe interval, Fisher p."""
    lines = [["cell a", "cell b", "k/n a", "k/n b", "difference", "95% Newcombe", "Fisher p"]]
    for row in contrasts:
        lines.append([
            row["cell_a"], row["cell_b"], f"{row['k_a']}/{row['n_a']}", f"{row['k_b']}/{row['n_b']}",
            f"{row['difference']:+.2f}", f"[{row['newcombe_low']:+.2f}, {row['newcombe_high']:+.2f}]",
            f"{row['fisher_p']:.3g}",
        ])
    return _align(lines)


def format_markdown(table: Sequence[Mapping[str, Any]], contrasts: Sequence[Mapping[str, Any]] = (),
                    comparisons: Sequence[Mapping[str, Any]] = (),
                    references: Sequence[Mapping[str, Any]] = ()) -> str:
    """The rate table (cell, k/n, rate, 95% Wilson; the same for the rule-learned rate),
    the contrasts (difference, 95% Newcombe, Fisher p) and, when given, the cells against
    published rates (:func:`reference_comparison`) as markdown tables, after a line naming
    the settings every cell shares (those that vary are in the cell labels).

    Each cell has its optimization clock at its epoch budget (optimizer steps; decay clocks =
    steps x lr x wd) and, beside the paper's rate, its near misses: runs within 1 point of
    the criterion, of those whose near-miss view is known (``-``: none, e.g. rows of an
    outcomes.csv written before it existed)."""
    shown = varying_fields(table)
    shared = shared_settings(table)
    lines = [f"Settings of every cell: {shared}.", ""] if shared else []
    running = any(row.get("n_running") for row in table)  # a column only while some run trains
    lines += ["| cell | steps | decay clocks | generalized k/n | rate | 95% Wilson | near misses (within 1%) k/n | "
              "rule learned k/n | rule-learned rate | 95% Wilson (rule) | transient | median first epoch | final adv | "
              "final val |" + (" running |" if running else ""),
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
              + (" --- |" if running else "")]
    for row in table:
        median = row["median_first_generalized_epoch"]
        steps, clocks = clock_text(row)
        lines.append(
            f"| {cell_label(row, shown)} | {steps} | {clocks} | {row['n_generalized']}/{row['n_seeds']} | "
            f"{row['rate']:.2f} | [{row['wilson_low']:.2f}, {row['wilson_high']:.2f}] | {near_miss_text(row)} | "
            f"{row['n_rule_learned']}/{row['n_seeds']} | "
            f"{row['rule_learned_rate']:.2f} | [{row['rule_learned_wilson_low']:.2f}, "
            f"{row['rule_learned_wilson_high']:.2f}] | {row['n_transient']} | "
            f"{'-' if median is None else f'{median:g}'} | {row['mean_final_adv_acc']:.3f} | "
            f"{row['mean_final_val_acc']:.3f} |" + (f" {row.get('n_running') or 0} |" if running else ""))
    for title, rows in (("Contrasts of the paper rate within each architecture (a - b)", contrasts),
                        ("Requested comparisons (a - b)", comparisons)):
        if not rows:
            continue
        lines += ["", f"{title}:", "",
                  "| cell a | cell b | rate | k/n a | k/n b | difference | 95% Newcombe | Fisher p |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for row in rows:
            rate = "paper" if row.get("column", "generalized") == "generalized" else "rule learned"
            lines.append(
                f"| {row['cell_a']} | {row['cell_b']} | {rate} | {row['k_a']}/{row['n_a']} | {row['k_b']}/{row['n_b']} "
                f"| {row['difference']:+.2f} | [{row['newcombe_low']:+.2f}, {row['newcombe_high']:+.2f}] | "
                f"{row['fisher_p']:.3g} |")
    if references:
        sources = sorted({row["reference_source"] for row in references})
        lines += ["", "Against the published rates (here - published; " + "; ".join(sources) + "):", "",
                  "| cell | k/n here | k/n published | difference | 95% Newcombe | Fisher p |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for row in references:
            lines.append(
                f"| {row['cell']} | {row['k']}/{row['n']} | {row['reference_k']}/{row['reference_n']} | "
                f"{row['difference']:+.2f} | [{row['newcombe_low']:+.2f}, {row['newcombe_high']:+.2f}] | "
                f"{row['fisher_p']:.3g} |")
    return "\n".join(lines) + "\n"


def _align(lines: Sequence[Sequence[str]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


__all__ = ["csv_text", "format_contrasts", "format_markdown", "format_reference_comparison",
           "format_table", "shared_settings"]
