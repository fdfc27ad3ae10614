"""End-to-end tensor-parallel decode and prefill of a Llama-3-70B-shaped model
with the all-reduce going through each library in turn.

The model: hidden 8192, 64 query / 8 KV heads of 128, FFN 28672 (SiLU-gated),
RMSNorm, random bf16 weights (scaled by 1/sqrt(fan-in)), as many of the 80
layers as fit in the GPU's memory beside the largest KV cache, split over the
ranks as Megatron-style tensor parallelism does (columns of QKV and gate/up,
rows of O and down): two all-reduces of (tokens x 8192) bf16 per layer.

- Decode: one step (every sequence of the batch gets one token, attending to
  a KV cache of `ctx` tokens) captured in a CUDA graph; the median of the
  replays of each variant, the variants timed in turn for `--rounds` rounds.
- Prefill: `tokens` tokens of one sequence (causal attention), eager, median
  of `--reps` runs.

The all-reduce variants (the rest of the step is the same code):
- nccl_pg: ``dist.all_reduce`` on the NCCL process group;
- nccl_direct: ``ncclAllReduce`` called directly (as vLLM's pynccl does);
- symm_mem: torch symmetric memory, the projection written straight into the
  symmetric buffer, then ``two_shot_all_reduce_`` in place (what vLLM's
  symmetric-memory all-reduce runs without multicast; torch's one-shot kernel
  stopped making progress in this model on 4 x H200, 2026-11-22);
- pyccl: ``pyccl.all_reduce`` (automatic choice; NCCL for large prefill messages);
- pyccl_fused: ``pyccl.fused_all_reduce_rmsnorm`` (all-reduce + residual add +
  the next RMSNorm, by its automatic choice of algorithm);
- pyccl_fused_<algorithm>, one per ``--fused-algorithms`` entry: the same with
  that algorithm forced (one_shot, two_shot, two_kernel, unfused).

    python benchmarks/e2e_decode.py [--world 4] [--layers N] [--batches 1,8,32,64] [--ctx 1024,4096]
        [--prefill 2048,4096,8192] [--fused-algorithms one_shot,two_kernel] [--json out.json]
    python benchmarks/e2e_decode.py --plot out.png --from out.json [--from other.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, MAX_LAYERS = 8192, 64, 8, 128, 28672, 80
EPS = 1e-5
VARIANTS = ("nccl_pg", "nccl_direct", "symm_mem", "pyccl", "pyccl_fused")


def _per_layer_bytes(world: int) -> int:
    q, kv, ffn = HEADS // world, KV_HEADS // world, FFN // world
    params = HIDDEN * (q + 2 * kv) * HEAD_DIM + q * HEAD_DIM * HIDDEN + HIDDEN * 2 * ffn + ffn * HIDDEN + 2 * HIDDEN
    return 2 * params


def _kv_bytes(world: int, batch: int, ctx: int) -> int:
    return 2 * batch * (KV_HEADS // world) * ctx * HEAD_DIM * 2


class Model:
    """This rank's shard of the decoder; the all-reduce comes from a Reducer."""

    def __init__(self, torch, layers: int, world: int, device, seed: int, max_batch: int, max_ctx: int):
        self.torch = torch
        self.q, self.kv, self.ffn = HEADS // world, KV_HEADS // world, FFN // world
        gen = torch.Generator(device=device).manual_seed(seed)

        def weight(rows, cols):
            w = torch.empty(rows, cols, device=device, dtype=torch.bfloat16)
            return w.normal_(0.0, 1.0 / math.sqrt(rows), generator=gen)
        norm_gen = torch.Generator(device=device).manual_seed(7)  # norms: the same on every rank
        self.layers = []
        for _ in range(layers):
            self.layers.append({
                "qkv": weight(HIDDEN, (self.q + 2 * self.kv) * HEAD_DIM),
                "o": weight(self.q * HEAD_DIM, HIDDEN),
                "gate_up": weight(HIDDEN, 2 * self.ffn),
                "down": weight(self.ffn, HIDDEN),
                "attn_norm": (1 + 0.1 * torch.randn(HIDDEN, device=device, generator=norm_gen)).bfloat16(),
                "ffn_norm": (1 + 0.1 * torch.randn(HIDDEN, device=device, generator=norm_gen)).bfloat16(),
                "k_cache": torch.randn(max_batch, self.kv, max_ctx, HEAD_DIM, device=device, generator=gen,
                                       dtype=torch.bfloat16),
                "v_cache": torch.randn(max_batch, self.kv, max_ctx, HEAD_DIM, device=device, generator=gen,
                                       dtype=torch.bfloat16),
            })
        self.final_norm = (1 + 0.1 * torch.randn(HIDDEN, device=device, generator=norm_gen)).bfloat16()

    def _rotary(self, positions, shape):
        """cos and sin of the rotary embedding (Llama 3's base) at `positions`, viewed as `shape`."""
        torch = self.torch
        half = HEAD_DIM // 2
        freqs = 1.0 / (500000.0 ** (torch.arange(half, device=positions.device, dtype=torch.float32) / half))
        angles = positions.float()[:, None] * freqs[None, :]
        return angles.cos().bfloat16().view(shape), angles.sin().bfloat16().view(shape)

    def _rope(self, t, cos, sin):
        half = HEAD_DIM // 2
        x1, x2 = t[..., :half], t[..., half:]
        return self.torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def decode(self, x, reducer, ctx: int):
        """One decode step: x is (batch, hidden), each sequence at position ctx - 1."""
        torch, F = self.torch, self.torch.nn.functional
        b = x.shape[0]
        positions = torch.full((b,), ctx - 1, device=x.device, dtype=torch.int64)
        cos, sin = self._rotary(positions, (b, 1, 1, HEAD_DIM // 2))
        residual = x.clone()
        h = F.rms_norm(residual, (HIDDEN,), self.layers[0]["attn_norm"], EPS)
        for i, layer in enumerate(self.layers):
            qkv = h @ layer["qkv"]
            q, k, v = qkv.split([self.q * HEAD_DIM, self.kv * HEAD_DIM, self.kv * HEAD_DIM], dim=-1)
            q = self._rope(q.view(b, self.q, 1, HEAD_DIM), cos, sin)
            k = self._rope(k.view(b, self.kv, 1, HEAD_DIM), cos, sin)
            kc, vc = layer["k_cache"][:b, :, :ctx], layer["v_cache"][:b, :, :ctx]
            kc[:, :, ctx - 1:ctx].copy_(k)
            vc[:, :, ctx - 1:ctx].copy_(v.view(b, self.kv, 1, HEAD_DIM))
            # GQA decode: the query heads of one KV head as that head's query rows.
            att = F.scaled_dot_product_attention(q.view(b, self.kv, self.q // self.kv, HEAD_DIM), kc, vc)
            h, residual = self._output_and_ffn(i, att.reshape(b, self.q * HEAD_DIM), residual, reducer)
        return h

    def prefill(self, x, reducer):
        """A causal prefill of x's rows (one sequence), writing no cache."""
        torch, F = self.torch, self.torch.nn.functional
        t = x.shape[0]
        cos, sin = self._rotary(torch.arange(t, device=x.device), (1, 1, t, HEAD_DIM // 2))
        residual = x.clone()
        h = F.rms_norm(residual, (HIDDEN,), self.layers[0]["attn_norm"], EPS)
        group = self.q // self.kv
        for i, layer in enumerate(self.layers):
            q, k, v = (h @ layer["qkv"]).split([self.q * HEAD_DIM, self.kv * HEAD_DIM, self.kv * HEAD_DIM], dim=-1)
            q = self._rope(q.view(t, self.q, HEAD_DIM).transpose(0, 1).unsqueeze(0), cos, sin)
            k = self._rope(k.view(t, self.kv, HEAD_DIM).transpose(0, 1).unsqueeze(0), cos, sin)
            v = v.view(t, self.kv, HEAD_DIM).transpose(0, 1).unsqueeze(0)
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h, residual = self._output_and_ffn(i, att[0].transpose(0, 1).reshape(t, self.q * HEAD_DIM), residual,
                                               reducer)
        return h

    def _output_and_ffn(self, i: int, att, residual, reducer):
        """Layer i after attention: the row-parallel O projection, all-reduce +
        residual add + the FFN's norm, the FFN, all-reduce + residual add + the
        next layer's norm. Returns (normed input of the next layer, residual)."""
        torch, F = self.torch, self.torch.nn.functional
        layer = self.layers[i]
        rows = att.shape[0]
        partial = reducer.buffer(rows)
        torch.matmul(att, layer["o"], out=partial)
        h, residual = reducer.reduce_add_norm(partial, residual, layer["ffn_norm"])
        gate, up = (h @ layer["gate_up"]).chunk(2, dim=-1)
        partial = reducer.buffer(rows)
        torch.matmul(F.silu(gate) * up, layer["down"], out=partial)
        nxt = self.layers[i + 1]["attn_norm"] if i + 1 < len(self.layers) else self.final_norm
        return reducer.reduce_add_norm(partial, residual, nxt)


class Reducer:
    """The all-reduce + residual add + RMSNorm of one variant. buffer(rows)
    is where the row-parallel projection writes its partial sums."""

    def __init__(self, torch, variant: str, ctx: dict):
        self.torch, self.variant, self.ctx = torch, variant, ctx

    def buffer(self, rows: int):
        if self.variant == "symm_mem":
            return self.ctx["symm"][:rows * HIDDEN].view(rows, HIDDEN)
        return self.torch.empty(rows, HIDDEN, device=self.ctx["device"], dtype=self.torch.bfloat16)

    def reduce_add_norm(self, partial, residual, weight):
        torch, c = self.torch, self.ctx
        F = torch.nn.functional
        if self.variant.startswith("pyccl_fused"):
            algorithm = self.variant[len("pyccl_fused_"):] or None
            return c["pyccl"].fused_all_reduce_rmsnorm(partial, residual, weight, EPS, residual_out=residual,
                                                       algorithm=algorithm)
        if self.variant == "nccl_pg":
            c["dist"].all_reduce(partial)
            reduced = partial
        elif self.variant == "nccl_direct":
            c["nccl"].all_reduce(partial)
            reduced = partial
        elif self.variant == "pyccl":
            reduced = c["pyccl"].all_reduce(partial)
        else:
            torch.ops.symm_mem.two_shot_all_reduce_(partial, "sum", c["group_name"])
            reduced = partial
        residual.add_(reduced)
        return F.rms_norm(residual, (HIDDEN,), weight, EPS), residual


def _graph_ms(torch, fn, replays: int) -> float:
    """Median ms of `fn` captured once in a CUDA graph (pyccl.bench's timer)."""
    from pyccl.bench_timing import time_graph

    return time_graph(fn, 1, replays) / 1000


def _eager_ms(torch, fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _stage(rank: int, text: str) -> None:
    if rank == 0:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def body(rank, world, store, opts):
    import faulthandler
    import sys

    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    import pyccl
    from pyccl._nccl import NcclComm

    if opts.get("stack_after"):
        faulthandler.dump_traceback_later(opts["stack_after"], exit=False, file=sys.stderr)
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=device)
    max_batch, max_ctx = max(opts["batches"]), max(opts["ctx"])
    max_rows = max([max_batch] + opts["prefill"])
    layers = opts["layers"]
    if layers is None:
        free = torch.cuda.mem_get_info(device)[0]
        room = 0.85 * free - 16e9 - max(opts["prefill"] + [0]) * 300e3
        per_layer = _per_layer_bytes(world) + _kv_bytes(world, max_batch, max_ctx)
        layers = max(1, min(MAX_LAYERS, int(room // per_layer)))
        agreed = torch.tensor([layers], device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)  # every rank the same model
        layers = int(agreed.item())
    ctx = {"device": device, "dist": dist, "pyccl": pyccl, "group_name": dist.group.WORLD.group_name,
           "nccl": NcclComm(store, rank, world, device.index)}
    pyccl.communicator_for(None, device)  # made before any capture
    ctx["symm"] = symm_mem.empty(max_rows * HIDDEN, dtype=torch.bfloat16, device=device)
    symm_mem.rendezvous(ctx["symm"], ctx["group_name"])
    ctx["symm"].normal_()
    _stage(rank, f"{layers} layers")
    model = Model(torch, layers, world, device, 1000 + rank, max_batch, max_ctx)
    torch.cuda.synchronize()
    _stage(rank, "model made")
    variants = opts["variants"]
    reducers = {v: Reducer(torch, v, ctx) for v in variants}
    shared = torch.Generator(device=device).manual_seed(5)  # the input tokens' states: the same on every rank
    rows = []
    for batch in opts["batches"]:
        x = torch.randn(batch, HIDDEN, device=device, generator=shared).bfloat16()
        for c in opts["ctx"]:
            outs = {}
            for v in variants:
                outs[v] = model.decode(x, reducers[v], c).float()
                torch.cuda.synchronize()
                _stage(rank, f"decode batch {batch} ctx {c}: {v} ran eagerly")
            check = {v: torch.nn.functional.cosine_similarity(outs[v], outs["nccl_pg"], dim=-1).min().item()
                     for v in variants}
            times = {v: [] for v in variants}
            for _ in range(opts["rounds"]):
                for v in variants:
                    times[v].append(_graph_ms(torch, lambda v=v: model.decode(x, reducers[v], c), opts["replays"]))
            row = {"phase": "decode", "batch": batch, "ctx": c, "layers": layers, "cos_min": check}
            row.update({v: statistics.median(ts) for v, ts in times.items()})
            rows.append(row)
            if rank == 0:
                print(f"decode batch {batch} ctx {c}: " + ", ".join(f"{v} {row[v]:.3f}" for v in variants), flush=True)
    for tokens in opts["prefill"]:
        x = torch.randn(tokens, HIDDEN, device=device, generator=shared).bfloat16()
        outs = {v: model.prefill(x, reducers[v]).float() for v in variants}
        check = {v: torch.nn.functional.cosine_similarity(outs[v], outs["nccl_pg"], dim=-1).min().item()
                 for v in variants}
        del outs
        times = {v: [] for v in variants}
        for _ in range(opts["rounds"]):
            for v in variants:
                times[v].append(_eager_ms(torch, lambda v=v: model.prefill(x, reducers[v]), opts["reps"]))
        row = {"phase": "prefill", "tokens": tokens, "layers": layers, "cos_min": check}
        row.update({v: statistics.median(ts) for v, ts in times.items()})
        rows.append(row)
        if rank == 0:
            print(f"prefill {tokens}: " + ", ".join(f"{v} {row[v]:.2f}" for v in variants), flush=True)
    ctx["nccl"].close()
    dist.destroy_process_group()
    return ({"rows": rows, "layers": layers, "gpu": torch.cuda.get_device_name(device), "variants": list(variants)}
            if rank == 0 else None)


def _table(result) -> str:
    variants = result.get("variants", VARIANTS)
    forced = [v for v in variants if v not in VARIANTS]
    lines = [f"world {result['world']}, {result['layers']} layers, {result['gpu']}; ms per step (decode: CUDA graph, "
             f"one token per sequence; prefill: eager)",
             "| phase | batch / tokens | ctx | " + " | ".join(variants) +
             " | NCCL PG / pyccl_fused | NCCL direct / pyccl_fused | NCCL PG / pyccl | symm / pyccl_fused |" +
             "".join(f" NCCL PG / {v} |" for v in forced),
             "|---|---:|---:|" + "---:|" * (len(variants) + 4 + len(forced))]
    for r in result["rows"]:
        size = r.get("batch", r.get("tokens"))
        cells = " | ".join(f"{r[v]:.3f}" for v in variants)
        lines.append(f"| {r['phase']} | {size} | {r.get('ctx', '–')} | {cells} | "
                     f"{r['nccl_pg'] / r['pyccl_fused']:.3f} | "
                     f"{r['nccl_direct'] / r['pyccl_fused']:.3f} | {r['nccl_pg'] / r['pyccl']:.3f} | "
                     f"{r['symm_mem'] / r['pyccl_fused']:.3f} |" +
                     "".join(f" {r['nccl_pg'] / r[v]:.3f} |" for v in forced))
    worst = min(min(r["cos_min"].values()) for r in result["rows"])
    lines.append(f"\nsmallest cosine similarity of any variant's output to nccl_pg's: {worst:.5f}")
    return "\n".join(lines)


def plot(results, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, result in zip(axes[0], results):
        decode = [r for r in result["rows"] if r["phase"] == "decode"]
        labels = [f"b{r['batch']}\nctx{r['ctx']}" for r in decode]
        shown = [v for v in result.get("variants", VARIANTS) if v != "nccl_pg"]
        width = 0.8 / len(shown)
        for k, v in enumerate(shown):
            xs = [i + (k - (len(shown) - 1) / 2) * width for i in range(len(decode))]
            ax.bar(xs, [r["nccl_pg"] / r[v] for r in decode], width=width, label=v)
        ax.set_ylim(0.9, max(1.2, max(r["nccl_pg"] / r[v] for r in decode for v in shown) + 0.02))
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(1.1, color="gray", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(decode)), labels, fontsize=7)
        ax.set_ylabel("decode speed-up over ProcessGroupNCCL")
        ax.set_title(f"{result['world']} x {result['gpu']}, {result['layers']} layers")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _ints(text: str) -> list:
    return [int(t) for t in text.split(",") if t.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--layers", type=int, default=None, help="default: as many as fit (at most 80)")
    parser.add_argument("--batches", type=_ints, default=[1, 8, 32, 64])
    parser.add_argument("--ctx", type=_ints, default=[1024, 4096])
    parser.add_argument("--prefill", type=_ints, default=[2048, 4096, 8192])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--fused-algorithms", type=lambda t: [a for a in t.split(",") if a], default=[],
                        help="also time pyccl_fused with each of these algorithms forced")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--stack-after", type=float, default=0, help="print every rank's Python stack after S s")
    parser.add_argument("--plot", help="draw the decode speed-ups of --from results into this PNG")
    parser.add_argument("--from", dest="sources", action="append", default=[], help="a --json result to plot")
    args = parser.parse_args()
    if args.plot:
        plot([json.load(open(s)) for s in args.sources], args.plot)
        return
    if args.layers is not None and not 1 <= args.layers <= MAX_LAYERS:
        parser.error(f"--layers must be in 1..{MAX_LAYERS}")
    from pyccl._spawn import run_ranks

    from pyccl.fused import FUSED_ALGORITHMS

    for algorithm in args.fused_algorithms:
        if algorithm not in FUSED_ALGORITHMS:
            parser.error(f"--fused-algorithms: {algorithm!r} is not one of {', '.join(FUSED_ALGORITHMS)}")
    opts = {k: getattr(args, k) for k in ("layers", "batches", "ctx", "prefill", "rounds", "replays", "reps",
                                          "stack_after")}
    opts["variants"] = list(VARIANTS) + [f"pyccl_fused_{a}" for a in args.fused_algorithms]
    result = run_ranks(body, args.world, args=(opts,), timeout=3000)[0]
    result["world"] = args.world
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(_table(result))


if __name__ == "__main__":
    main()
