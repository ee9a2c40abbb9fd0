"""What every perf chart shares, on matplotlib (Debian's python3-matplotlib): the policies' colours, a figure sized in
pixels, x axes ticked at the data's values, and SVG written the same way twice from the same data.

  from plotting import color, figure, save
  fig, ax = figure(720, 420, "title")
  ax.plot(xs, ys, color=color("steal"), label="steal")
  save(fig, "chart.svg")
"""
import sys

try:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
except ImportError:
    sys.exit("the perf charts need matplotlib: apt-get install python3-matplotlib (scripts/setup.sh installs it)")

COLORS = {"static": "#d62728", "oracle": "#7f7f7f", "lbbsp": "#ff7f0e", "central": "#9467bd", "steal": "#1f77b4", "steal-adaptive": "#2ca02c"}

matplotlib.rcParams.update({
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.titlesize": 10,
    "figure.titlesize": 11,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.color": "#eeeeee",
    "axes.spines.top": False,
    "svg.fonttype": "none",      # text stays text: smaller files, and searchable
    "svg.hashsalt": "stealbatch",  # the same ids on every run: a redrawn chart differs only where its data does
})


def color(policy):
    return COLORS.get(policy, "#000000")


def policy_legend(fig, policies, **legend):
    """A legend of coloured squares, one a policy, for the whole figure."""
    fig.legend(handles=[Patch(color=color(p), label=p) for p in policies], frameon=False, **legend)


def figure(width_px, height_px, title="", nrows=1, ncols=1, **subplots):
    """A figure of width_px x height_px (at 100 dpi) with a title; the axes as plt.subplots returns them."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(width_px / 100, height_px / 100), dpi=100, **subplots)
    if title:
        fig.suptitle(title)
    return fig, axes


def values_x(ax, values, log2=False):
    """An x axis with a tick at each of the data's values, labelled with the value itself (on a log2 axis 2, 4, 8
    rather than 2^1, 2^2, 2^3)."""
    if log2:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(values))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())


def save(fig, path):
    """Writes the figure in the format its file name says (.svg, .png, .pdf) and frees it."""
    fig.savefig(path, metadata={"Date": None} if path.endswith((".svg", ".pdf")) else None)
    plt.close(fig)
