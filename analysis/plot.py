"""Drawing: median curves with IQR bands in a grid of panels, heat maps, saving as PNG and PDF.

Every figure function returns a `Figure`: the tidy DataFrame it plotted
(columns panel, series, x, median, q25, q75, n_seeds, diverged), the
training runs it used, the files it wrote, any tables and notes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib import ticker  # noqa: E402

from analysis.style import LLOYD, LLOYD_COLOR  # noqa: E402

CURVE_COLUMNS = ["panel", "series", "x", "median", "q25", "q75", "n_seeds", "diverged"]
DODGE = 0.06  # draw_points: sideways shift between neighbouring series, in units of the gap between x values


class MissingInput(LookupError):
    """A figure's inputs are not in the store; the message names them (shown in the report's index)."""


@dataclass
class Figure:
    name: str
    data: pd.DataFrame
    run_ids: list[str]
    files: list[Path] = field(default_factory=list)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    ylims: dict[str, tuple[float, float]] = field(default_factory=dict)  # panel -> y-range, where set


def save(fig: plt.Figure, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    for path in paths:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return paths


def grid(n_panels: int, ncols: int | None = None, size: float = 3.2) -> tuple[plt.Figure, np.ndarray]:
    ncols = ncols or min(n_panels, 4)
    nrows = math.ceil(n_panels / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols, size * 0.8 * nrows), squeeze=False)
    for ax in axes.flat[n_panels:]:
        ax.set_visible(False)
    return fig, axes.flat


def draw_curves(
    data: pd.DataFrame,
    styles: dict[str, dict],
    out_dir: Path,
    name: str,
    *,
    xlabel: str,
    ylabel: str,
    ncols: int | None = None,
    logy: bool = False,
    panels: list[str] | None = None,
    ylims: dict[str, tuple[float, float]] | None = None,
) -> list[Path]:
    """One panel per data.panel; in each, one median line and IQR band per series (Lloyd's black, on top);
    `ylims`: a panel's y-range, where matplotlib's own would not do."""
    panels = panels or list(dict.fromkeys(data["panel"]))
    fig, axes = grid(len(panels), ncols)
    for ax, panel in zip(axes, panels):
        part = data[data["panel"] == panel]
        present = set(part["series"])
        order = [s for s in styles if s in present] + sorted(present - set(styles) - {LLOYD})
        order += [LLOYD] if LLOYD in present else []
        for series in order:
            curve = part[part["series"] == series].sort_values("x")
            style = {"color": LLOYD_COLOR, "linestyle": "-"} if series == LLOYD else styles.get(series, {})
            note = curve["diverged"].iloc[0] if "diverged" in curve and curve["diverged"].iloc[0] else ""
            ax.plot(
                curve["x"], curve["median"], label=f"{series} ({note})" if note else series, lw=1.4, **style
            )
            ax.fill_between(
                curve["x"],
                curve["q25"],
                curve["q75"],
                alpha=0.2,
                color=style.get("color", LLOYD_COLOR),
                linewidth=0,
            )
        label_axes(ax, panel, xlabel, ylabel, logy)
        if ylims and panel in ylims:
            ax.set_ylim(*ylims[panel])
    return save(legend(fig, axes[: len(panels)]), out_dir, name)


def draw_points(
    data: pd.DataFrame,
    styles: dict[str, dict],
    out_dir: Path,
    name: str,
    *,
    xlabel: str,
    ylabel: str,
    ncols: int | None = None,
    logy: bool = False,
    panels: list[str] | None = None,
) -> list[Path]:
    """Per panel, each series' median at every x with IQR error bars, joined by its line; Lloyd's level black.

    The x values (numbers or names) sit evenly spaced in sorted order, so lr 0.001..1 or k 6..25 read
    like a log axis and families as categories; the series are shifted sideways a little so their bars
    stay apart, and Lloyd's level (lloyd_reference) is a line across the panel. An x at the top of a
    panel marks a point where some runs of that series diverged (its row's `diverged` note).
    """
    panels = panels or list(dict.fromkeys(data["panel"]))
    values = sorted(set(data.loc[data["series"] != LLOYD, "x"]))
    position = {v: i for i, v in enumerate(values)}
    named = [s for s in styles if s in set(data["series"])]
    fig, axes = grid(len(panels), ncols)
    for ax, panel in zip(axes, panels):
        part = data[data["panel"] == panel]
        for j, series in enumerate(named):
            points = part[part["series"] == series].sort_values("x")
            if points.empty:  # a series of another panel only (ne at tau 1, not at tau 0.1)
                continue
            at = points["x"].map(position) + DODGE * (j - (len(named) - 1) / 2)
            errors = [points["median"] - points["q25"], points["q75"] - points["median"]]
            ax.errorbar(
                at,
                points["median"],
                yerr=errors,
                marker="o",
                ms=3,
                capsize=2,
                lw=1.2,
                label=series,
                **styles[series],
            )
            hit = points["diverged"].fillna("") != ""
            ax.plot(
                at[hit],
                [0.97] * int(hit.sum()),
                "x",
                color=styles[series].get("color"),
                transform=ax.get_xaxis_transform(),
            )
        for level in part.loc[part["series"] == LLOYD, "median"].unique():
            ax.axhline(level, color=LLOYD_COLOR, lw=1.2, label=LLOYD)
        names = [f"{v:g}" if isinstance(v, float) else str(v) for v in values]
        ax.set_xticks(
            range(len(values)), names, rotation=30 if any(isinstance(v, str) for v in values) else 0
        )
        label_axes(ax, panel, xlabel, ylabel, logy)
    return save(legend(fig, axes[: len(panels)]), out_dir, name)


def label_axes(ax: plt.Axes, title: str, xlabel: str, ylabel: str, logy: bool) -> None:
    ax.set_title(title, fontsize=8)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(which="both", labelsize=7)
    if logy:
        ax.set_yscale("log")
        # Plain numbers (4, 20, 0.9), not 4x10^0: a narrow log range is labelled at its minor ticks too.
        plain = ticker.FuncFormatter(lambda value, _: f"{value:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.5)))


def legend(fig: plt.Figure, axes) -> plt.Figure:
    """One legend above all panels (each label once), the panels laid out below it."""
    handles = {}
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(text, handle)
    legend_rows = math.ceil(len(handles) / 6)
    top = 1 - 0.3 * legend_rows / fig.get_figheight()  # inches of legend -> fraction of the figure
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.legend(
        handles.values(),
        handles.keys(),
        loc="upper center",
        ncol=min(len(handles), 6),
        fontsize=8,
        bbox_to_anchor=(0.5, 1.0),
        frameon=False,
    )
    return fig


def draw_heatmap(matrix: np.ndarray, labels: list[str], out_dir: Path, name: str, title: str) -> list[Path]:
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    image = ax.imshow(matrix, cmap="viridis")
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
    ax.set_yticks(range(len(labels)), labels, fontsize=6)
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="earth-mover distance")
    fig.tight_layout()
    return save(fig, out_dir, name)


def draw_contours(data: pd.DataFrame, out_dir: Path, name: str, ncols: int | None = None) -> list[Path]:
    """One filled contour of data.value over (alpha, beta) per data.panel; the trained weights at (0, 0)."""
    panels = list(dict.fromkeys(data["panel"]))
    fig, axes = grid(len(panels), ncols)
    for ax, panel in zip(axes, panels):
        part = data[data["panel"] == panel].pivot_table(index="beta", columns="alpha", values="value")
        levels = np.log10(part.to_numpy().clip(min=1e-12))
        mesh = ax.contourf(part.columns, part.index, levels, levels=20, cmap="viridis")
        ax.plot(0, 0, "w*", ms=8)
        fig.colorbar(mesh, ax=ax).ax.tick_params(labelsize=6)
        ax.set_title(f"{panel} (log10 loss)", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    return save(fig, out_dir, name)
