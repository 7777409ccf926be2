"""PNG plot: training-time overhead vs cluster size, one line per policy."""

from __future__ import annotations

from pathlib import Path

from nodemedic_cli.fleet.simulate import Summary


def overhead_plot(summaries: list[Summary], path: Path, title: str) -> Path:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for policy in dict.fromkeys(s.policy for s in summaries):
        rows = sorted((s for s in summaries if s.policy == policy), key=lambda s: s.instances)
        ax.plot([s.instances for s in rows], [s.overhead_pct for s in rows], marker="o", label=policy)
    sizes = sorted({s.instances for s in summaries})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}%"))
    ax.set_xlabel("instances in the cluster")
    ax.set_ylabel("training time added by failures (log scale)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
