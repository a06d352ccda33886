"""Keep figures cheap to redraw: few ticks, plain tick labels, no minor ticks.

Matplotlib lays out and renders every tick label on every draw, and with its
minor ticks a log axis has dozens of ticks: most of a redraw's time goes there.
Three or four plain labels per axis (``0.01``, not mathtext ``10^{-2}``) and no
minor ticks cut a redraw by half or more.

>>> import math

from matplotlib.figure import Figure
>>> fig = Figure()
>>> ax = fig.add_subplot()
>>> ax.set_xscale("log")
>>> lighten(fig)
>>> type(ax.xaxis.get_minor_locator()).__name__, ax.xaxis.get_major_formatter()(0.01, 0)
('NullLocator', '0.01')
"""

from __future__ import annotations

import math

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator

__all__ = ["lighten", "pin_labels", "plain"]

#: Tick labels as ``0.01``, ``1``, ``100``: plain text, no mathtext.
plain = FuncFormatter(lambda value, _pos: f"{value:g}")


def lighten(fig: Figure, *, nbins: int = 4, labelsize: float = 8) -> None:
    """At most ``nbins`` plain major tick labels per axis and no minor ticks, on every axes of ``fig``.

    Call it after the axes' scales are set (setting a scale resets the tickers).
    """
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if not axis.get_ticklocs().size:  # ticks switched off on purpose
                continue
            if axis.get_scale() == "log":
                lo, hi = sorted(axis.get_view_interval())
                narrow = lo > 0 and math.log10(hi / lo) < 1.5  # under 1.5 decades: 1-2-5 ticks
                axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0) if narrow else (1.0,), numticks=nbins))
                axis.set_major_formatter(plain)
            elif axis.get_scale() == "linear":
                axis.set_major_locator(MaxNLocator(nbins=nbins, steps=[1, 2, 2.5, 5, 10]))
            axis.set_minor_locator(NullLocator())
        ax.tick_params(labelsize=labelsize)


def pin_labels(fig: Figure) -> None:
    """Keep axis labels and titles where the last draw put them.

    Otherwise every draw measures all tick labels again to place them. Call it
    after a first draw (the layout is then known).
    """
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            label = axis.label
            if label.get_text():
                x, y = ax.transAxes.inverted().transform(label.get_transform().transform(label.get_position()))
                axis.set_label_coords(x, y)
        if ax.get_title():
            ax.set_title(
                ax.get_title(),
                y=ax.title.get_position()[1],
                fontsize=ax.title.get_fontsize(),
                color=ax.title.get_color(),
            )
