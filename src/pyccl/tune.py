"""Measure every algorithm of every collective on this machine and write the
tuning table pyccl's automatic choice uses: ``python -m pyccl.tune``.

Each candidate (pyccl's kernels, each forced, the DSL plans of
``pyccl.algorithms`` at several launch shapes, and NCCL through
ProcessGroupNCCL) runs captured in a CUDA graph at every size from
``--min-bytes`` to ``--max-bytes`` (doubling), as in ``pyccl.bench``; the
fastest wins its size, unless the choice of the size below is within
``--margin`` of it (plans must beat every kernel by more than the margin), and
runs of the same winner become one entry (see ``pyccl.tuning`` for the format).
Use the table with ``PYCCL_TUNING_FILE=<file>``, or add it to
``pyccl/tuning_tables/``.

Every measurement the table was built from goes to ``--rows`` (by default the
table's name with ``.rows.json``), and ``--from-rows`` builds a table again
from such a file, on any machine: a different margin needs no GPUs.

    python -m pyccl.tune --world 4 --dtype bfloat16 --out h200_w4_bf16.json
    python -m pyccl.tune --from-rows h200_w4_bf16.rows.json --margin 0.05 --out h200_w4_bf16.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys

import torch

from . import bench, bench_args, tuning
from .errors import InvalidArgumentError


def _choice(entry: dict) -> str:
    """A table entry's algorithm, with its plan and launch shape where it names one."""
    if entry["algorithm"] == "plan":
        return f"plan {entry['plan']} ({entry['instances']} x {entry['threads']})"
    return entry["algorithm"]


def _default_out(gpu: str, world: int, dtype: str) -> str:
    return f"pyccl_tuning_{gpu.replace(' ', '_')}_w{world}_{dtype}.json"


def _write_table(table: dict, out: str) -> None:
    """Checks `table`, writes it to `out` and prints its choices."""
    tuning.check_table(table, "(new)")
    bench_args.write_atomically(out, json.dumps(table, indent=1))
    for collective, entries in table["collectives"].items():
        ranges = ", ".join(f"{_choice(e)} to {e['max_bytes']} B" if e["max_bytes"] is not None
                           else f"{_choice(e)} above" for e in entries)
        print(f"{collective}: {ranges}")
    print(f"wrote {out}; use it with PYCCL_TUNING_FILE={out}")


def _rows_path(out: str) -> str:
    return (out[:-len(".json")] if out.endswith(".json") else out) + ".rows.json"


def _from_rows(parser: argparse.ArgumentParser, args, command: str) -> int:
    try:
        with open(args.from_rows) as f:
            rows = json.load(f)
        gpu, world, dtype, tables = rows["gpu"], rows["world"], rows["dtype"], rows["tables"]
    except OSError as e:
        parser.error(f"--from-rows {args.from_rows!r}: {e.strerror}")
    except (ValueError, KeyError, TypeError) as e:
        parser.error(f"--from-rows {args.from_rows!r}: not a file pyccl.tune wrote ({e!r})")
    out = args.out or _default_out(gpu, world, dtype)
    bench_args.check_output(parser, "--out", out)
    _write_table(tuning.build_table(tables, gpu=gpu, world=world, dtype=dtype, date=rows.get("date", ""),
                                    command=f"{rows.get('command', '?')}; then {command}", margin=args.margin), out)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=None, help="GPUs (default: all visible)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--collectives", default="all", help="comma-separated, or all")
    bench_args.add_size_arguments(parser)
    parser.add_argument("--iters", type=int, default=20, help="calls per CUDA graph")
    parser.add_argument("--trials", type=int, default=9, help="graph replays (median)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before the ranks are stopped")
    parser.add_argument("--no-plans", action="store_true", help="leave the DSL plans out (kernels and NCCL only)")
    parser.add_argument("--margin", type=float, default=tuning.DEFAULT_MARGIN,
                        help="how much faster (a fraction) a candidate must be to displace the choice of the size "
                             f"below, or a plan the fastest kernel (default {tuning.DEFAULT_MARGIN})")
    parser.add_argument("--out", default=None, help="the table file (default: pyccl_tuning_<gpu>_w<N>_<dtype>.json)")
    parser.add_argument("--rows", default=None, help="where the measurements go (default: the table's name, "
                                                     "with .rows.json)")
    parser.add_argument("--from-rows", default=None,
                        help="build the table from a --rows file instead of measuring (no GPUs needed)")
    args = parser.parse_args(argv)
    try:  # before the run, not after minutes of measuring
        tuning.check_margin(args.margin)
    except InvalidArgumentError as e:
        parser.error(f"--{e}")
    command = "python -m pyccl.tune " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    if args.from_rows:
        return _from_rows(parser, args, command)
    collectives = list(tuning.COLLECTIVES) if args.collectives == "all" else \
        [c.strip() for c in args.collectives.split(",") if c.strip()]
    for c in collectives:
        if c not in tuning.COLLECTIVES:
            parser.error(f"--collectives: {c!r} is not one of {', '.join(tuning.COLLECTIVES)} (or all)")
    sizes = bench_args.sizes_from_args(parser, args)
    bench_args.check_counts(parser, args, min_world=2)
    bench_args.check_output(parser, "--out", args.out)
    if args.out or args.rows:
        bench_args.check_output(parser, "--rows", args.rows or _rows_path(args.out))
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        print("pyccl.tune needs at least 2 GPUs (or --from-rows a file of measurements)", file=sys.stderr)
        return 2
    world = args.world or torch.cuda.device_count()
    bench_args.check_world_fits(parser, world, torch.cuda.device_count())
    gpu = torch.cuda.get_device_name(0)
    out = args.out
    if out is None:  # the default name, checked as a given one was above
        out = _default_out(gpu, world, args.dtype)
        bench_args.check_output(parser, "--out", out)
    rows_out = args.rows or _rows_path(out)
    bench_args.check_output(parser, "--rows", rows_out)
    from ._spawn import run_ranks

    res = run_ranks(bench._bench_rank, world, args=(collectives, sizes, args.dtype, args.iters, args.trials, True,
                                                    True, None, not args.no_plans), timeout=args.timeout)[0]
    date = str(datetime.date.today())
    # The measurements first: a table can be built again from them (--from-rows).
    bench_args.write_atomically(rows_out, json.dumps(
        {"gpu": gpu, "world": world, "dtype": args.dtype, "date": date, "command": command, "iters": args.iters,
         "trials": args.trials, "tables": res["tables"]}, indent=1))
    table = tuning.build_table(res["tables"], gpu=gpu, world=world, dtype=args.dtype, date=date, command=command,
                               margin=args.margin)
    _write_table(table, out)
    print(f"wrote the measurements to {rows_out} (python -m pyccl.tune --from-rows {rows_out} builds again)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
