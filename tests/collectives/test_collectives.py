"""Collectives, in host mode (CPU processes: the algorithms' logic, in CI) and
on GPUs: numerics against float64, bitwise agreement across ranks,
back-to-back calls, CUDA-graph replays, the engine's options and choices."""

import json
import random

import pytest
import torch

import pyccl
import ranks_collectives as rcol
import ranks_engine_choice as rch
import ranks_exchanges as rex
from conftest import gpu_count, gpu_worlds, host_and_gpu, host_and_gpu_worlds, on_gpus, on_host, requires_gpus
from pyccl._spawn import run_ranks


@pytest.mark.parametrize("gpu, world", host_and_gpu_worlds((2, 3, 4), (2, 3, 4, 6, 8)))
def test_all_reduce_random_cases_match_float64_reference(gpu, world):
    seed = random.randrange(1 << 20)
    cases, max_count = (60, 3_000_000) if gpu else (45, 40_000)
    for bad, record in run_ranks(rcol.all_reduce_cases, world, args=(gpu, seed, cases, max_count), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@pytest.mark.parametrize("gpu, programmatic_launch", [
    on_host(None, id="host"), on_gpus(True, id="gpu-pdl"), on_gpus(False, id="gpu-no-pdl")])
def test_all_reduce_back_to_back_without_host_sync(gpu, programmatic_launch):
    # On GPUs, programmatic dependent launch (the default) lets each kernel be
    # scheduled while the one before it runs; both ways must keep the stream's order.
    if gpu:
        args = (True, 200, {"programmatic_launch": programmatic_launch})
    else:
        args = (False, 20)
    for bad in run_ranks(rcol.back_to_back, min(gpu_count(), 4) if gpu else 3, args=args, timeout=300):
        assert bad == 0


@requires_gpus(2)
def test_all_reduce_in_cuda_graph_replays():
    for bad in run_ranks(rcol.graph_replays, min(gpu_count(), 4), args=(20,), timeout=300):
        assert bad == []


def test_all_reduce_rejects_bad_arguments():
    out = run_ranks(rcol.bad_arguments, 2, timeout=120)
    for messages in out:
        assert "'op'" in messages["op"]
        assert "'tensor'" in messages["dtype"] and "float32" in messages["dtype"] and "int16" in messages["dtype"]
        assert "'out'" in messages["out_size"]
        assert "'algorithm'" in messages["algorithm"]
        assert "'tensor'" in messages["contiguous"]


def test_half_conversions_round_to_nearest_even():
    # The host-mode fp16/bf16 conversions (used in CI) agree with torch's, bit for bit.
    x = torch.randn(100_000, dtype=torch.float64) * torch.logspace(-9, 5, 100_000, dtype=torch.float64)
    x = torch.cat([x, torch.tensor([0.0, -0.0, 65504.0, 65520.0, 1e-8, 6e-8, float("inf")], dtype=torch.float64)])
    for dtype in (torch.float16, torch.bfloat16):
        got = pyccl._C._round_trip_16bit(x.float(), dtype)
        assert torch.equal(got.view(torch.int16), x.float().to(dtype).view(torch.int16)), dtype


@pytest.mark.parametrize("gpu, options", [
    on_host({}, id="host-pull"), on_host({"hb_push": True}, id="host-push"),
    on_host({"hb_push": True, "hb_rounds_per_launch": 1}, id="host-push-1"),
    on_host({"hb_rounds_per_launch": 2}, id="host-pull-2"),
    on_gpus({}, id="gpu-default"), on_gpus({"hb_push": True}, id="gpu-push"), on_gpus({"hb_push": False}, id="gpu-pull"),
    on_gpus({"hb_rounds_per_launch": 1}, id="gpu-one-round-per-launch")])
def test_all_reduce_in_pieces(gpu, options):
    # HB rounds are 1 MiB in host mode and 16 MiB on GPUs: 700 000 float32 take
    # three there, and 40 MB of float32 and bf16 several here, in one launch or
    # (hb_rounds_per_launch) in several.
    seed = random.randrange(1 << 20)
    world, counts = (min(gpu_count(), 4), (10_000_003, 20_000_001)) if gpu else (3, (700_001, 1_300_003))
    for bad in run_ranks(rcol.large_cases, world, args=(gpu, seed, *counts, options), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


@pytest.mark.parametrize("gpu, world", host_and_gpu_worlds((4,), (2, 3, 4, 6, 8)))
def test_all_reduce_push_random_cases(gpu, world):
    # Small HB rounds (64 KiB in host mode, 1 MiB on GPUs): most 2PA HB cases take several rounds.
    seed = random.randrange(1 << 20)
    options = {"hb_push": True, "hb_piece_bytes": (1 << 20) if gpu else (64 << 10)}
    cases, max_count = (40, 3_000_000) if gpu else (45, 40_000)
    for bad, record in run_ranks(rcol.all_reduce_cases, world, args=(gpu, seed, cases, max_count, options),
                                 timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@requires_gpus(2, own=True)
def test_all_reduce_on_a_torch_nccl_group():
    # The size rule, not the shipped tuning table: on 2 H200s the table keeps
    # 20 MB on 2PA HB, and this test is about the hand-off to NCCL.
    env = {"PYCCL_NCCL_MIN_BYTES": str(16 << 20)}
    for bad in run_ranks(rcol.group_path, min(gpu_count(), 4), timeout=300, env=env):
        assert bad == []


@pytest.mark.parametrize("gpu, world", host_and_gpu_worlds((2, 3, 4), (2, 3, 4, 6, 8)))
def test_exchanges_random_cases(gpu, world):
    # all_gather / all_to_all / broadcast over every dtype (bit-exact), reduce_scatter
    # against float64; LL, HB and the automatic choice; in place and out of place.
    seed = random.randrange(1 << 20)
    cases, max_count = (80, 2_000_000) if gpu else (48, 30_000)
    for bad, record in run_ranks(rex.exchange_cases, world, args=(gpu, seed, cases, max_count), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@pytest.mark.parametrize("gpu", host_and_gpu())
@pytest.mark.parametrize("options", [{"hb_push": True}, {"hb_push": False}, {"hb_push": True, "hb_rounds_per_launch": 1}],
                         ids=["push", "pull", "push-1"])
def test_exchanges_in_rounds(gpu, options):
    # HB rounds of 64 KiB in host mode (16 KiB per rank pair at 4 ranks) and 1 MiB on GPUs: most HB cases
    # run several rounds, in one launch or (hb_rounds_per_launch) one per launch.
    seed = random.randrange(1 << 20)
    options = {**options, "hb_piece_bytes": (1 << 20) if gpu else (64 << 10)}
    world, cases, max_count = (min(gpu_count(), 4), 60, 2_000_000) if gpu else (4, 40, 30_000)
    for bad, record in run_ranks(rex.exchange_cases, world, args=(gpu, seed, cases, max_count, options),
                                 timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@pytest.mark.parametrize("gpu", host_and_gpu())
def test_exchanges_and_all_reduce_back_to_back(gpu):
    # On GPUs 5000 rounds of two calls each: 10 000 back-to-back collectives of mixed sizes, checked in
    # windows of 250 rounds.
    world, args = (min(gpu_count(), 4), (True, 5000, 250)) if gpu else (3, (False, 40))
    for bad in run_ranks(rex.mixed_back_to_back, world, args=args, timeout=400 if gpu else 300):
        assert bad == []


@requires_gpus(2)
def test_every_collective_in_a_graph_captured_before_any_eager_call():
    for bad in run_ranks(rcol.graph_all_collectives, min(gpu_count(), 4), args=(1000,), timeout=400):
        assert bad == []


def test_exchanges_reject_bad_arguments():
    for messages in run_ranks(rex.exchange_bad_arguments, 2, timeout=120):
        kind, text = messages["rs_dtype"]
        assert kind == "PycclTypeError" and "int16" in text and "'tensor'" in text
        assert "'tensor'" in messages["rs_split"][1] and "equal parts" in messages["rs_split"][1]
        assert "'out'" in messages["rs_out"][1]
        assert "'out'" in messages["ag_out"][1]
        assert "'out'" in messages["ag_dtype_out"][1] and "dtype" in messages["ag_dtype_out"][1]
        assert "'tensor'" in messages["a2a_split"][1]
        assert "'src'" in messages["bcast_src"][1]
        assert "'algorithm'" in messages["algorithm"][1] and "all_gather" in messages["algorithm"][1]
        assert messages["device"][0] != "accepted"


@pytest.mark.parametrize("gpu, world", [on_host(2, id="host-2"), on_host(3, id="host-3"),
                                        on_gpus(min(gpu_count(), 4), id="gpu")])
def test_outputs_overlapping_inputs_are_in_place_or_refused(gpu, world):
    # On GPUs the kernels' and plans' own checks.
    for refused, wrong in run_ranks(rcol.overlapping_outputs, world, args=(gpu,), timeout=300 if gpu else 180):
        assert wrong == []
        assert len(refused) == 17
        for (collective, algo), message in refused.items():
            assert "invalid argument 'out'" in message and "overlaps the input" in message, (collective, algo, message)
        if not gpu:
            assert "chunk" in refused[("all_gather", "ll")] and "chunk" in refused[("reduce_scatter", "hb")]


def test_eight_ranks_every_collective():
    # The largest world size in one node: every collective and protocol at 8 ranks.
    seed = random.randrange(1 << 20)
    for bad, record in run_ranks(rex.exchange_cases, 8, args=(False, seed, 16, 3000), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"
    for bad, record in run_ranks(rcol.all_reduce_cases, 8, args=(False, seed, 12, 3000), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


def test_closed_communicator_refuses_every_collective():
    for out in run_ranks(rcol.closed_communicator, 2, timeout=120):
        for label, message in out.items():
            assert message.startswith("ClosedError") and "closed" in message, (label, message)


@pytest.mark.parametrize("gpu", host_and_gpu(own=True))
def test_zeros_infinities_and_nan_as_nccl(gpu):
    world = min(gpu_count(), 4) if gpu else 3
    for bad in run_ranks(rcol.special_values, world, args=(gpu,), timeout=300 if gpu else 120):
        assert bad == [], bad[:3]


def test_one_phase_hb_on_fewer_blocks_and_in_rounds():
    # one_phase_hb_bytes_per_block: 1PA HB calls run on 1..4 of the 4 HB blocks
    # (each block's counter then advances only when it runs), mixed with 2PA HB
    # on all of them; 64 KiB HB pieces make most 1PA HB calls take several rounds.
    seed = random.randrange(1 << 20)
    options = {"hb_blocks": 4, "one_phase_hb_bytes_per_block": 8192, "hb_piece_bytes": 64 << 10}
    for bad, record in run_ranks(rcol.all_reduce_cases, 3, args=(False, seed, 45, 40_000, options), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"
    for bad in run_ranks(rcol.back_to_back, 3, args=(False, 24, options), timeout=300):
        assert bad == 0


def test_engine_takes_a_tables_kernel_choices():
    for picked, bad, errors in run_ranks(rch.engine_choices, 2, timeout=120):
        assert picked == {100: "1pa_ll", 2048: "1pa_ll", 2049: "1pa_hb", 16384: "1pa_hb", 1 << 20: "2pa_ll",
                          "sym1000": "1pa_ll", "sym1025": "2pa_hb", f"sym{1 << 20}": "2pa_hb",
                          "ag512": "hb", "ag4096": "ll", "rs": "ll"}
        assert bad == []
        assert "'all_reduce_by_size'" in errors["order"] and "grow" in errors["order"]
        assert "'all_reduce_by_size'" in errors["name"] and "ring" in errors["name"]
        assert "'all_reduce_by_size'" in errors["ll_max"] and "ll_max_bytes" in errors["ll_max"]
        assert "'all_reduce_symmetric_by_size'" in errors["sym_ll_max"]
        assert "'exchange_by_size'" in errors["collective"] and "gather" in errors["collective"]


@pytest.mark.parametrize("gpu, world", [on_host(2, id="host-2"), on_host(3, id="host-3"),
                                        on_gpus(min(gpu_count(), 4), id="gpu")])
def test_engine_options_must_agree_on_every_rank(gpu, world):
    # Ranks whose options differ would cut the scratch or pick algorithms differently: corrupt data or a hang.
    # On GPUs the engine also caps its send/receive lanes after the agreement.
    last = world - 1
    out = run_ranks(rch.engine_options_must_agree, world, args=(gpu,), timeout=300 if gpu else 120)
    for errors, bad in out:
        assert errors == out[0][0]  # every rank raises alike
        assert bad == []
    errors = out[0][0]
    assert all("every rank" in e for e in errors.values()), errors
    assert "'all_reduce_by_size'" in errors["table_length"]
    if gpu:
        assert "'ll_max_bytes'" in errors["scalar"] and f"rank {last} has 8192" in errors["scalar"]
        return
    assert "'ll_max_bytes'" in errors["scalar"] and f"rank 0 has 16384, rank {last} has 8192" in errors["scalar"]
    assert "'exchange_ll_threshold_bytes'" in errors["exchange"] and "reduce_scatter" in errors["exchange"]
    assert "'all_reduce_by_size'" in errors["table_length"] and "entries" in errors["table_length"]
    assert "'exchange_by_size'" in errors["table_entry"] and "all_gather entry 0's max bytes" in errors["table_entry"]
    assert "'p2p_ll_max_bytes'" in errors["p2p_default"] and "None (the default)" in errors["p2p_default"]
    assert errors["setting"] == ("PYCCL_ALGO (environment) must be the same on every rank of communicator 'coll' "
                                 f"(rank 0 has it unset, rank {last} has '1pa_ll')")


def test_ranks_must_choose_under_the_same_environment():
    # One rank forcing an algorithm would wait on peers that chose another.
    for error, threads_left, bad in run_ranks(rch.communicator_under_another_algo, 3, timeout=120):
        assert "PYCCL_ALGO (environment)" in error and "rank 2 has '2pa_hb'" in error, error
        assert threads_left == 0
        assert bad == []


def _table_file(tmp_path, collectives: dict) -> str:
    """A 2-rank host tuning table with `collectives`' entries, written under tmp_path."""
    table = {"version": 1, "gpu": "host", "world": 2, "dtype": "bfloat16", "date": "d", "command": "c",
             "collectives": collectives}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    return str(path)


def test_a_communicators_engine_follows_the_tuning_table(tmp_path):
    # The engine's own choice (the fused all-reduce's two-kernel path uses it) takes the table's kernels.
    path = _table_file(tmp_path, {"all_reduce": [{"max_bytes": 1024, "algorithm": "2pa_ll"},
                                                 {"max_bytes": 8192, "algorithm": "1pa_hb"},
                                                 {"max_bytes": None, "algorithm": "nccl"}],
                                  "all_gather": [{"max_bytes": None, "algorithm": "hb"}]})
    for picked in run_ranks(rch.engine_choice_by_size, 2, timeout=120, env={"PYCCL_TUNING_FILE": path}):
        # Past the last kernel entry (NCCL's, where a group has NCCL), 1PA HB goes on.
        assert picked == {512: "2pa_ll", 4096: "1pa_hb", 40_000: "1pa_hb", "ag": "hb"}
    for picked in run_ranks(rch.engine_choice_by_size, 2, timeout=120, env={"PYCCL_TUNING_FILE": "none"}):
        assert picked == {512: "1pa_ll", 4096: "1pa_ll", 40_000: "2pa_ll", "ag": "ll"}  # host-mode defaults


def test_a_groups_communicator_is_made_under_a_tuning_table(tmp_path):
    # communicator_for makes the group's communicator under its lock, and the new engine looks up
    # the table: the lookup must not wait on that lock.
    path = _table_file(tmp_path, {"all_reduce": [{"max_bytes": None, "algorithm": "1pa_hb"}]})
    out = run_ranks(rch.group_communicator_with_a_table, 2, timeout=60, env={"PYCCL_TUNING_FILE": path})
    assert out == [(True, "1pa_hb")] * 2


def test_ll_calls_on_fewer_blocks_for_small_messages():
    # ll_packets_per_block: small LL calls run on 1..4 of the 4 blocks (each
    # block's counter then advances only when it runs).
    seed = random.randrange(1 << 20)
    options = {"ll_blocks": 4, "ll_packets_per_block": 64}
    for bad, record in run_ranks(rex.exchange_cases, 3, args=(False, seed, 40, 3000, options), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"
    for bad, record in run_ranks(rcol.all_reduce_cases, 3, args=(False, seed, 30, 3000, options), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@pytest.mark.parametrize("gpu", host_and_gpu())
def test_random_engine_configurations(gpu):
    # Every run draws two configurations of the engine's options and runs
    # random all-reduces and exchanges on each, so that over many runs the
    # tests cover the settings users may choose, not only the defaults. On
    # GPUs the options left unset take the GPU defaults (a small ll_max_bytes
    # was once refused there for the 128 KiB 1PA LL threshold, which the user
    # never set).
    seed = random.randrange(1 << 20)
    rng = random.Random(seed)
    worlds, count, max_count = (gpu_worlds(2, 3, 4), 16, 300_000) if gpu else ([2, 3, 4, 5], 24, 30_000)
    for _ in range(2):
        options, world = rcol.random_engine_options(rng), rng.choice(worlds)
        for body in (rcol.all_reduce_cases, rex.exchange_cases):
            for bad, record in run_ranks(body, world, args=(gpu, seed, count, max_count, options), timeout=300):
                assert bad == [], f"seed {seed} world {world} {options}: {bad} (device record {record})"


def test_destroyed_groups_give_up_their_communicators():
    # A new group may take a destroyed one's id; it must never be handed the old communicator.
    for seen in run_ranks(rch.communicators_of_destroyed_groups, 2, timeout=120):
        assert seen == {"first": True, "world kept": True, "second": True, "new communicator": True,
                        "destroyed closed": True, "after close": True, "another communicator": True}


@pytest.mark.parametrize("gpu, world, through_group", [
    on_host(2, False, id="host-2"), on_host(3, False, id="host-3"), on_host(3, True, id="host-3-group"),
    on_gpus(2, False, id="gpu-2")])
def test_float64_float8_integer_and_bool_reductions_give_nccls_results(gpu, world, through_group):
    """float64, int8, uint8, int32, uint32, int64, uint64, float8_e4m3fn, float8_e5m2 and bool, every op,
    all-reduce (in and out of place) and reduce-scatter, reduced by the kernels (each one forced in turn, and
    the selector's choice), at a size of vector tails and one of several vectors per block: NCCL's results
    (integers wrap in their width, avg truncates, unsigned compare as unsigned; float64 in rank order, NaN
    losing to numbers; float8 likewise, saturated and rounded once) on fresh random inputs over each type's
    whole range. avg of bool and int16 are refused naming the argument, and the communicator stays usable."""
    seed = random.randrange(1 << 20)
    counts = (97, 2053) if not through_group else (97,)
    for bad, refused, usable in run_ranks(rcol.other_dtype_reductions, world,
                                          args=(seed, counts, through_group, gpu), timeout=400):
        assert bad == [], f"seed {seed}: {bad}"
        if gpu:
            assert [r[2] for r in refused] == ["InvalidArgumentError", "PycclTypeError"], refused
            assert usable
            continue
        (bool_avg, int16) = refused
        assert bool_avg[2] in ("InvalidArgumentError", "ValueError") and "'op'" in bool_avg[3], bool_avg
        assert "avg does not apply to bool" in bool_avg[3], bool_avg
        assert int16[2] in ("PycclTypeError", "TypeError") and "torch.int16" in int16[3], int16
        assert usable
