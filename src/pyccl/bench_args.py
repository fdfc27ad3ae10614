"""Command-line arguments that ``pyccl.bench`` and ``pyccl.tune`` share.

Every check runs before the ranks start: a run can take half an hour, and a
typo in an output path or a flag should cost seconds, not the run."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import tempfile
from typing import Optional

from .bench_timing import doubling_sizes, parse_bytes


def add_size_arguments(parser: argparse.ArgumentParser) -> None:
    """nccl-tests' -b/-e/-f (sizes of the whole buffer), for sizes_from_args."""
    parser.add_argument("-b", "--min-bytes", default="1K", help="smallest size, whole buffer (nccl-tests' -b)")
    parser.add_argument("-e", "--max-bytes", default="256M", help="largest size (nccl-tests' -e)")
    parser.add_argument("-f", "--step-factor", type=int, default=2, help="each size is this times the last")


def sizes_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list:
    """The sizes add_size_arguments' flags ask for; a bad one is a usage error naming them."""
    try:
        return doubling_sizes(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes), args.step_factor)
    except ValueError as e:
        parser.error(f"-b/-e/-f: {e}")


def check_counts(parser: argparse.ArgumentParser, args: argparse.Namespace, min_world: int) -> None:
    """--world (when given) at least `min_world`; --iters and --trials at least 1; --timeout above 0."""
    if args.world is not None and args.world < min_world:
        parser.error(f"--world must be at least {min_world}, got {args.world}")
    if args.iters < 1 or args.trials < 1:
        parser.error(f"--iters and --trials must be at least 1, got {args.iters} and {args.trials}")
    if not args.timeout > 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout}")


def check_world_fits(parser: argparse.ArgumentParser, world: int, gpus: int) -> None:
    """A usage error when --world asks for more GPUs than are visible."""
    if world > gpus:
        parser.error(f"--world {world}: only {gpus} GPUs are visible")


def check_output(parser: argparse.ArgumentParser, flag: str, path: Optional[str]) -> None:
    """A usage error naming `flag` unless `path` (if given) can be written:
    its folder exists and is writable, and it is not itself a folder."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        parser.error(f"{flag} {path}: is a folder; give a file name")
    if not os.path.isdir(folder):
        parser.error(f"{flag} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        parser.error(f"{flag} {path}: not writable")


def check_plot(parser: argparse.ArgumentParser, path: Optional[str]) -> None:
    """--plot needs matplotlib; say so before the run, not after it."""
    if path is None:
        return
    check_output(parser, "--plot", path)
    if importlib.util.find_spec("matplotlib") is None:
        parser.error(f"--plot {path}: needs matplotlib (pip install matplotlib)")


def engine_options(parser: argparse.ArgumentParser, text: Optional[str]) -> Optional[dict]:
    """--engine's JSON object (CollectiveEngine options), or None."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        parser.error(f"--engine: not JSON ({e}): {text}")
    if not isinstance(value, dict):
        parser.error(f"--engine: expected a JSON object of engine options, e.g. '{{\"ll_max_bytes\": 65536}}', "
                     f"got {text}")
    return value


def write_atomically(path: str, text: str) -> None:
    """Writes `text` to `path` through a file beside it, so that a run that
    fails partway leaves an earlier file of that name whole."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # as open() would have made it, not mkstemp's 0600
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
