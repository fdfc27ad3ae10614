"""``Plan.plot``: the op timeline per rank and thread block as a PNG.

One row per (rank, thread block), one box per op in program order, coloured
by kind (data movement, reduction, synchronization); optional dependency on
matplotlib (``pip install matplotlib``).
"""

from __future__ import annotations

_COLOURS = {"put": "tab:blue", "put_packets": "tab:cyan", "put_with_signal": "tab:blue", "multi_put": "tab:blue",
            "multi_put_packets": "tab:cyan", "multi_get": "tab:blue", "multi_unpack": "tab:green",
            "copy": "tab:green", "multi_copy": "tab:green", "unpack": "tab:green", "reduce": "tab:orange",
            "reduce_packets": "tab:orange",
            "channel_reduce": "tab:orange", "multi_reduce": "tab:orange", "get": "tab:blue", "reduce_put": "tab:red",
            "reduce_put_packets": "tab:red", "switch_reduce": "tab:orange",
            "switch_broadcast": "tab:blue", "signal": "tab:purple", "multi_signal": "tab:purple",
            "wait": "tab:gray", "multi_wait": "tab:gray", "flush": "tab:brown", "barrier": "black",
            "sync": "lightgray"}


def plot_plan(plan, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("Plan.plot needs matplotlib: pip install matplotlib") from e
    rows = [(r["rank"], tb["id"], tb["ops"]) for r in plan.ranks for tb in r["threadblocks"]]
    width = max((len(ops) for _, _, ops in rows), default=1)
    fig, ax = plt.subplots(figsize=(min(4 + 0.35 * width, 40), 1 + 0.4 * len(rows)))
    for y, (rank, tb, ops) in enumerate(rows):
        for x, op in enumerate(ops):
            ax.barh(y, 0.9, left=x, color=_COLOURS.get(op["op"], "white"), edgecolor="black", linewidth=0.3)
            if width <= 40:
                ax.text(x + 0.45, y, op["op"].replace("_", "\n"), ha="center", va="center", fontsize=5)
    ax.set_yticks(range(len(rows)), [f"rank {r} tb {t}" for r, t, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("op (program order)")
    ax.set_title(f"{plan.name}: {plan.collective['name']}, {plan.num_ranks} ranks, {plan.protocol}, "
                 f"{plan.instances} instance(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
