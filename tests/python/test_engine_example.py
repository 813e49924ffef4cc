"""The example engine (python/examples/paged_engine.py) answers from restored KV exactly as it
answers from scratch — bit for bit, bf16 and f16, from RAM, from SSD, and from a directory reopened
by another process."""
import json
import os
import subprocess
import sys

import pytest
import torch

import kvtier
from conftest import SOURCE_DIR

EXAMPLES = os.path.join(SOURCE_DIR, "python", "examples")
sys.path.insert(0, EXAMPLES)
from paged_engine import PagedEngine, prompt  # noqa: E402


def bits(t):
    return t.view(torch.int32)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_answers_from_restored_kv_equal_answers_from_scratch_from_ram_and_ssd(tmp_path, dtype):
    reference = PagedEngine(dtype=dtype)
    first_turn = prompt(1, 150)
    second_turn = first_turn + prompt(2, 70)
    block = PagedEngine(dtype=dtype).layout()
    for ram, tier in (("64M", "ram"), ("128K", "ssd")):  # 128K: 4 blocks of RAM, the rest spills
        with kvtier.Cache(block, ram=ram, ssd_dir=str(tmp_path / f"ssd-{tier}"), ssd_capacity="64M",
                          ssd_segment_size="4M", namespace="engine") as cache:
            writer = PagedEngine(cache, dtype=dtype)
            _, loaded = writer.answer(first_turn)
            assert loaded == 0, "cold"
            assert tier in {b.tier for b in cache.lookup(first_turn).blocks}
            for turn in (first_turn, second_turn):
                got, loaded = PagedEngine(cache, dtype=dtype).answer(turn)
                assert loaded >= 144, "every full block of the first turn came from the cache"
                want, _ = reference.answer(turn)
                assert torch.equal(bits(got), bits(want))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_a_cuda_engine_in_vllms_layout_answers_bit_exact_from_restored_kv(tmp_path, dtype):
    reference = PagedEngine(dtype=dtype, device="cuda", kv_layout="vllm")
    first_turn = prompt(4, 150)
    second_turn = first_turn + prompt(5, 70)
    block = reference.layout()
    for ram, tier in (("64M", "ram"), ("128K", "ssd")):
        with kvtier.Cache(block, ram=ram, ssd_dir=str(tmp_path / f"ssd-{tier}"), ssd_capacity="64M",
                          ssd_segment_size="4M", namespace="engine") as cache:
            assert PagedEngine(cache, dtype=dtype, device="cuda", kv_layout="vllm").answer(first_turn)[1] == 0
            assert tier in {b.tier for b in cache.lookup(first_turn).blocks}
            for turn in (first_turn, second_turn):
                got, loaded = PagedEngine(cache, dtype=dtype, device="cuda", kv_layout="vllm").answer(turn)
                assert loaded >= 144
                want, _ = reference.answer(turn)
                assert torch.equal(bits(got.cpu()), bits(want.cpu()))


def test_restored_kv_decides_the_answer(tmp_path):
    # The control: KV stored by an engine with other weights under the same namespace changes the
    # answer, so the equality above is not an accident of an unused cache.
    tokens = prompt(3, 100)
    with kvtier.Cache(PagedEngine().layout(), ram="64M", namespace="engine") as cache:
        PagedEngine(cache, seed=99).answer(tokens)
        got, loaded = PagedEngine(cache).answer(tokens)
        want, _ = PagedEngine().answer(tokens)
    assert loaded == 96
    assert not torch.equal(bits(got), bits(want))


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_a_new_process_answers_bit_exact_from_the_directory(tmp_path, dtype):
    env = dict(os.environ)
    def run():
        out = subprocess.run([sys.executable, os.path.join(EXAMPLES, "paged_engine.py"), "--ssd-dir",
                              str(tmp_path / "ssd"), "--dtype", dtype, "--tokens", "180", "--json"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])
    cold, warm = run(), run()
    assert cold["loaded"] == 0 and warm["loaded"] == 176
    want, _ = PagedEngine(dtype=dtype).answer(prompt(1, 180))
    assert warm["answer"] == cold["answer"] == want.numpy().tobytes().hex()
