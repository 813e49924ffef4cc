"""Cache.plan for an engine kvtier does not run: what it decides from the rates the engine tells
it and the loads kvtier times, and the errors a wrong call gets. CPU tensors; the CUDA loop is
measured by bench/torch_engine_bench.py."""
import pytest
import torch

import kvtier
from conftest import open_cache, paged_arrays, small_layout, tokens_for


def stored_prefix(c, layout, blocks, gen):
    k, v = paged_arrays(layout, blocks + 1, gen)
    tokens = tokens_for(40, 16 * blocks + 5)
    assert c.save_blocks(tokens, range(blocks), k, v).stored == blocks
    return tokens, k, v


def test_a_miss_plans_nothing_to_load(tmp_path):
    with open_cache(small_layout("BF16"), tmp_path) as c:
        plan = c.plan(tokens_for(41, 100))
        assert (plan.cached_blocks, plan.compute_blocks, plan.loads, plan.deadline) == (0, 0, False, None)
        assert isinstance(plan, kvtier.PrefillPlan)


def test_before_it_knows_the_engine_it_loads_everything_but_the_last_token(tmp_path, gen):
    layout = small_layout("BF16")
    with open_cache(layout, tmp_path) as c:
        tokens, _, _ = stored_prefix(c, layout, 8, gen)
        plan = c.plan(tokens)
        assert plan.cached_blocks == 8 and plan.compute_blocks == 0 and plan.loads
        assert plan.cached_tokens == 128 and plan.compute_tokens == 0
        assert plan.compute_only is None, "no prefill sample yet"
        # A prompt of exactly 8 blocks: the last token is computed, so the last block is too.
        assert c.plan(tokens[:128]).cached_blocks == 7
        assert c.plan(tokens, policy="compute").compute_blocks == 8


def test_it_computes_for_a_fast_engine_and_loads_for_a_slow_one(tmp_path, gen):
    layout = small_layout("BF16")
    with open_cache(layout, tmp_path) as c:
        tokens, _, _ = stored_prefix(c, layout, 8, gen)
        k, v = paged_arrays(layout, 9)
        for _ in range(4):  # pure loads, each timed by load_blocks (the first only warms up)
            assert c.load_blocks(tokens[:-1], range(8), k, v).blocks == 8
        plan = c.plan(tokens, policy="load")
        assert plan.load_seconds is not None and 0 < plan.load_seconds < 1.0
        # An engine far faster than a memory copy: computing wins by more than the margin.
        for n in (64, 256, 1024):
            c.observe_prefill(n, 1e-12 * n)
        # A load timed far under its estimate (loads of microseconds jitter) makes the next plan a
        # probe, which loads; the one after it plans from the estimates.
        fast = c.plan(tokens)
        for _ in range(2):
            if not fast.probe:
                break
            fast = c.plan(tokens)
        assert not fast.probe
        assert fast.compute_blocks == fast.cached_blocks == 8 and not fast.loads and fast.deadline is None
        assert fast.compute_only < fast.load_only
    with open_cache(layout, tmp_path / "slow") as c:
        tokens, _, _ = stored_prefix(c, layout, 8, gen)
        k, v = paged_arrays(layout, 9)
        for _ in range(4):
            c.load_blocks(tokens[:-1], range(8), k, v)
        for n in (64, 256, 1024):  # a second a token: loading wins
            c.observe_prefill(n, 1.0 * n)
        slow = c.plan(tokens)
        assert slow.compute_blocks == 0 and slow.loads
        assert slow.deadline == pytest.approx(slow.compute_only + 0.002), "waited for until a recompute would end"


def test_the_documented_loop_follows_a_split_and_a_deadline(tmp_path, gen):
    # The plan's parts put together by hand: blocks [0, s) computed (here: copied from the source),
    # [s, 8) loaded with the plan's deadline; the result equals the whole prefix.
    layout = small_layout("BF16")
    with open_cache(layout, tmp_path) as c:
        tokens, k, v = stored_prefix(c, layout, 8, gen)
        k2, v2 = paged_arrays(layout, 9)
        s = 3
        got = c.load_blocks(tokens[:-1], range(8), k2, v2, first_block=s, deadline=10.0)
        assert got.first_block == s and got.blocks == 5 and got.resume_at == 128
        for layer in range(layout["num_layers"]):
            k2[layer][:s] = k[layer][:s]
            v2[layer][:s] = v[layer][:s]
            assert torch.equal(k2[layer][:8].view(torch.int16), k[layer][:8].view(torch.int16))
        plan = c.plan(tokens, policy="load")
        c.observe_split(plan, 0.01)  # not a split: ignored, not an error


def test_wrong_calls_raise_value_error(tmp_path):
    with open_cache(small_layout("BF16"), tmp_path) as c:
        with pytest.raises(ValueError, match="cost, load or compute"):
            c.plan(tokens_for(1, 40), policy="fastest")
        with pytest.raises(ValueError, match="tokens > 0"):
            c.observe_prefill(0, 0.1)
        with pytest.raises(ValueError, match="seconds > 0"):
            c.observe_prefill(16, -1.0)
        with pytest.raises(ValueError, match="seconds > 0"):
            c.observe_prefill(16, float("nan"))
        foreign = kvtier.PrefillPlan(1, 0, 16, None, None, None, None, None, False)
        with pytest.raises(ValueError, match="a plan this cache made"):
            c.observe_split(foreign, 0.1)
        with pytest.raises(ValueError, match="split's time"):
            c.observe_split(c.plan(tokens_for(1, 40)), 0.0)


def test_the_engine_bench_says_why_it_skips_without_cuda():
    # bench/torch_engine_bench.py measures the loop above on a GPU; here it must say it cannot.
    import os
    import subprocess
    import sys
    from conftest import SOURCE_DIR
    if torch.cuda.is_available():
        pytest.skip("a CUDA device: the bench would run for minutes")
    run = subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "bench", "torch_engine_bench.py")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "skipped" in run.stdout and "CUDA" in run.stdout, run.stdout
