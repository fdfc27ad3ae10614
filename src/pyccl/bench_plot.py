"""The benchmark's PNG: per collective, latency (µs) up to 1 MiB and bus
bandwidth (GB/s) above, for every implementation measured.

    python -m pyccl.bench_plot bench.json bench.png

Works on any machine from the JSON that ``python -m pyccl.bench --out`` wrote;
needs matplotlib (``pip install matplotlib``; not a dependency of pyccl).
"""

from __future__ import annotations

import argparse
import json
import sys

from .bench_timing import BUS_FACTOR as _BUS_FACTOR, size_label

_SERIES = ("pyccl", "pyccl_pg", "pyccl_sym", "nccl_direct", "nccl", "symm_one_shot", "symm_two_shot")
_SPLIT = 1 << 20


def plot(results: dict, path: str) -> None:
    """Writes the PNG for `results` (the bench's JSON) to `path`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit("the plot needs matplotlib: pip install matplotlib") from e
    tables = results["tables"]
    world = results["world"]
    fig, axes = plt.subplots(len(tables), 2, figsize=(12, 3.2 * len(tables)), squeeze=False)
    for row_axes, (collective, rows) in zip(axes, tables.items()):
        small = [r for r in rows if r["bytes"] <= _SPLIT]
        large = [r for r in rows if r["bytes"] >= _SPLIT]
        factor = _BUS_FACTOR[collective](world)
        for name in _SERIES:
            pts = [(r["bytes"], r[name]) for r in small if r.get(name) is not None]
            if pts:
                row_axes[0].plot(*zip(*pts), marker="o", markersize=3, label=name)
            pts = [(r["bytes"], r["bytes"] * factor / (r[name] * 1e-6) / 1e9) for r in large if r.get(name) is not None]
            if pts:
                row_axes[1].plot(*zip(*pts), marker="o", markersize=3, label=name)
        row_axes[0].set(xscale="log", title=f"{collective}: latency", xlabel="message size", ylabel="µs")
        row_axes[1].set(xscale="log", title=f"{collective}: bus bandwidth", xlabel="message size", ylabel="GB/s")
        for ax, part in zip(row_axes, (small, large)):
            ax.grid(True, which="both", alpha=0.3)
            ticks = sorted({r["bytes"] for r in part})
            if ticks:  # the measured sizes, labelled in KiB and MiB
                ax.set_xticks(ticks, [size_label(t) for t in ticks], rotation=45, fontsize=7)
                ax.minorticks_off()
        row_axes[0].legend(fontsize=7)
    how = "eager calls" if results.get("mode") == "eager" else "CUDA graphs"  # runs before --eager: graphs
    fig.suptitle(f"pyccl, {world} x {results.get('gpu', '?')}, {results.get('dtype', '?')}, {how}, "
                 f"{results.get('date', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="the JSON that python -m pyccl.bench --out wrote")
    parser.add_argument("png", help="the picture to write")
    args = parser.parse_args(argv)
    try:
        with open(args.results) as f:
            results = json.load(f)
    except OSError as e:
        parser.error(f"results {args.results!r}: {e.strerror}")
    except ValueError as e:
        parser.error(f"results {args.results!r}: not JSON ({e})")
    if not isinstance(results, dict) or "tables" not in results or "world" not in results:
        parser.error(f"results {args.results!r}: not a file python -m pyccl.bench --out wrote")
    plot(results, args.png)
    print(f"wrote {args.png}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
