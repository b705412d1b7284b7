"""Tests that kill the mutants of :mod:`fedrl_envs.rng` the mutation-testing run (docs/testing.md) found alive.

Known answers: SplitMix64 rewritten here on Python ints from the published algorithm, and its
published first output for seed 0.
"""

from __future__ import annotations

import math

import pytest
import torch

from fedrl_envs import RandomStreams, derive_keys
from fedrl_envs.rng import _shr, mix64, seed_from_entropy, words_to_uniform

_M64 = (1 << 64) - 1


def _splitmix(z: int) -> int:
    """SplitMix64's output function on Python ints (unsigned), written from the published algorithm."""
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _signed(z: int) -> int:
    return z - (1 << 64) if z >= 1 << 63 else z


def _ref_key(seed: int, index: int) -> int:
    return _splitmix(_splitmix(seed & _M64) ^ _splitmix((2 * index + 1) & _M64))


def _ref_word(key: int, j: int) -> int:
    return _splitmix((key + j * 0x9E3779B97F4A7C15) & _M64)


def test_mix64_is_splitmix64():
    # SplitMix64 seeded with 0 first outputs 0xE220A8397B1DCDAF (the published reference value).
    assert int(mix64(torch.tensor(0))) == _signed(0xE220A8397B1DCDAF)
    xs = [0, 1, -1, 12345, 2**62 + 7, -(2**63), 2**63 - 1, -987654321]
    assert mix64(torch.tensor(xs)).tolist() == [_signed(_splitmix(x & _M64)) for x in xs]
    assert _shr(torch.tensor([-1, -(2**63), 2**62]), 30).tolist() == [(2**64 - 1) >> 30, 2**33, 2**32]


def test_derive_keys_and_words_equal_the_reference():
    seeds, index = [0, 7, 2**64 - 1, -5], [0, 1, 2**43 + 3]
    keys = derive_keys(torch.tensor(seeds[:2]).reshape(-1, 1), torch.tensor(index).reshape(1, -1))
    assert keys.tolist() == [[_signed(_ref_key(s, i)) for i in index] for s in seeds[:2]]
    assert int(derive_keys(2**64 - 1, 3)) == _signed(_ref_key(2**64 - 1, 3)) == int(derive_keys(-1, 3))
    assert int(derive_keys(-5, 2**63 + 1)) == _signed(_ref_key(-5, 2**63 + 1))
    streams = RandomStreams(keys)
    first = streams.bits((2, 3))
    assert first.shape == (2, 3, 2, 3)
    second = streams.bits((4,))
    for r in range(2):
        for c in range(3):
            k = _ref_key(seeds[r], index[c])
            assert first[r, c].reshape(-1).tolist() == [_signed(_ref_word(k, j)) for j in range(6)]
            assert second[r, c].tolist() == [_signed(_ref_word(k, j)) for j in range(6, 10)]
    assert torch.equal(streams.counters, torch.full((2, 3), 10))


def test_bits_at_and_advance_follow_the_counters():
    streams = RandomStreams.from_seed(3, 4)
    assert torch.equal(streams.keys, derive_keys(3, torch.arange(4)))
    streams.advance(5, where=torch.tensor([True, False, True, False]))
    assert streams.counters.tolist() == [5, 0, 5, 0]
    picked = streams.bits_at(torch.tensor([[0], [1], [3]]), torch.tensor([[0, 2]]))
    ahead = streams[torch.arange(4)].bits((3,))  # a copy: this draws without moving ``streams``
    assert streams.counters.tolist() == [5, 0, 5, 0]
    assert picked.tolist() == [[int(ahead[0, 0]), int(ahead[0, 2])], [int(ahead[1, 0]), int(ahead[1, 2])], [int(ahead[3, 0]), int(ahead[3, 2])]]
    assert torch.equal(streams.uniform_at(torch.tensor([2]), torch.tensor([1]), torch.float64), words_to_uniform(ahead[2, 1:2], torch.float64))
    streams.advance(2)
    assert streams.counters.tolist() == [7, 2, 7, 2]
    state = streams.state_dict()
    state["counters"] += 100  # a copy: the streams do not move
    assert streams.counters.tolist() == [7, 2, 7, 2]
    other = RandomStreams(torch.zeros(4, dtype=torch.int64))
    other.load_state_dict(streams.state_dict())
    assert torch.equal(other.bits((3,)), streams.bits((3,)))
    sub = streams[1:3]
    assert sub.batch_shape == (2,) and torch.equal(sub.keys, streams.keys[1:3])
    sub.advance(1)
    assert streams.counters.tolist() == [10, 5, 10, 5]  # the slice is a copy
    assert repr(sub) == "RandomStreams(batch_shape=(2,), device=cpu)"


def test_words_to_uniform_keeps_the_top_mantissa_bits():
    words = torch.tensor([0, -1, 1 << 62, (1 << 40) * 3, 12345678901234567])
    u64 = words_to_uniform(words, torch.float64)
    assert u64.tolist() == [((w & _M64) >> 11) * 2.0**-53 for w in words.tolist()]
    assert words_to_uniform(words).tolist() == [((w & _M64) >> 40) * 2.0**-24 for w in words.tolist()]
    assert words_to_uniform(words, torch.float16).tolist() == [((w & _M64) >> 53) * 2.0**-11 for w in words.tolist()]
    assert words_to_uniform(words, torch.bfloat16).tolist() == [((w & _M64) >> 56) * 2.0**-8 for w in words.tolist()]
    assert float(words_to_uniform(torch.tensor([-1]))) < 1.0  # never rounded up to 1
    with pytest.raises(TypeError, match="dtype"):
        words_to_uniform(words, torch.int32)


def test_normal_is_box_muller_on_two_uniform_draws():
    a, b = RandomStreams.from_seed(9, 3), RandomStreams.from_seed(9, 3)
    z = a.normal((4,), dtype=torch.float64)
    u = b.uniform((2, 4), dtype=torch.float64)
    expected = torch.sqrt(-2.0 * torch.log1p(-u[:, 0])) * torch.cos(2.0 * math.pi * u[:, 1])
    assert torch.allclose(z, expected, rtol=1e-15, atol=0.0)
    assert a.normal((4,)).dtype == torch.float32
    big = RandomStreams.from_seed(1, 1).normal((200_000,), dtype=torch.float64)
    assert abs(float(big.mean())) < 0.01 and abs(float(big.std()) - 1.0) < 0.01


def test_seed_from_entropy_has_exactly_the_requested_bits():
    for bits in (1, 62, 64):
        seeds = [seed_from_entropy(bits) for _ in range(64)]
        assert all(0 <= s < 2**bits for s in seeds)
        # The top bit is set in about half of the draws (all 64 unset: probability 2**-64).
        assert any(s >= 2 ** (bits - 1) for s in seeds)
    assert all(0 <= seed_from_entropy() < 2**62 for _ in range(64))
    assert any(seed_from_entropy() >= 2**61 for _ in range(64))
    for bad in (0, 65, -3, 2.5, True, "8"):
        with pytest.raises(ValueError, match="bits"):
            seed_from_entropy(bad)


def test_from_seed_checks_its_seed_and_keeps_the_device():
    with pytest.raises(TypeError, match="seed must be an int, got float"):
        RandomStreams.from_seed(1.5, 2)
    with pytest.raises(TypeError, match="got bool"):
        RandomStreams.from_seed(True, 2)
    assert RandomStreams.from_seed(torch.tensor(4), 2, device="meta").device.type == "meta"
    assert str(RandomStreams.from_seed(4, 2).device) == "cpu"


def test_load_state_dict_casts_to_int64():
    # A state saved by other code (int32 counters, keys as a list-built tensor) loads as int64 copies.
    src = RandomStreams.from_seed(2, 3)
    src.advance(4)
    state = {"keys": src.keys.clone(), "counters": src.counters.to(torch.int32)}
    dst = RandomStreams(torch.zeros(3, dtype=torch.int64))
    dst.load_state_dict(state)
    assert dst.keys.dtype == torch.int64 and dst.counters.dtype == torch.int64
    state["counters"] += 1
    assert torch.equal(dst.bits((2,)), src.bits((2,)))


def test_to_moves_keys_and_counters_in_place():
    streams = RandomStreams.from_seed(1, 2)
    streams.advance(3)
    moved = streams.to("meta")
    assert moved is streams
    assert streams.keys.device.type == "meta" and streams.counters.device.type == "meta"
    assert streams.counters.dtype == torch.int64 and streams.batch_shape == (2,)


def test_int32_seeds_indices_and_keys_are_widened_to_int64():
    # The hash is 64-bit wrapping arithmetic: narrower integer inputs must be widened first.
    i32 = torch.int32
    assert torch.equal(derive_keys(torch.tensor([7, -2], dtype=i32), torch.tensor([1, 3], dtype=i32)), derive_keys(torch.tensor([7, -2]), torch.tensor([1, 3])))
    assert int(derive_keys(torch.tensor(7, dtype=i32), 1)) == _signed(_ref_key(7, 1))
    small = RandomStreams(torch.tensor([5, -9], dtype=i32))
    assert small.keys.dtype == torch.int64
    assert small.bits((3,)).tolist() == [[_signed(_ref_word(k & _M64, j)) for j in range(3)] for k in (5, -9)]
    loaded = RandomStreams(torch.zeros(2, dtype=torch.int64))
    loaded.load_state_dict({"keys": torch.tensor([5, -9], dtype=i32), "counters": torch.tensor([0, 0], dtype=i32)})
    assert loaded.keys.dtype == torch.int64
    assert torch.equal(loaded.bits((3,)), RandomStreams(torch.tensor([5, -9])).bits((3,)))


def test_uniform_dtype_does_not_follow_the_default_dtype():
    words = RandomStreams.from_seed(0, 1).bits((5,))
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = words_to_uniform(words)
    finally:
        torch.set_default_dtype(before)
    assert out.dtype == torch.float32 and torch.equal(out, words_to_uniform(words))


def test_keys_words_and_loaded_states_stay_on_the_streams_device():
    # PyTorch's meta device stands in for an accelerator: any operation mixing its data-less
    # tensors with CPU tensors raises, so a dropped ``device=`` shows up on a CPU-only machine.
    meta = torch.device("meta")
    keys = derive_keys(torch.zeros(2, 1, dtype=torch.int64, device="meta"), torch.arange(3))  # CPU indices
    assert keys.device == meta and keys.dtype == torch.int64 and tuple(keys.shape) == (2, 3)
    streams = RandomStreams(torch.zeros(2, dtype=torch.int64), device="meta")
    words = streams.bits((3,))
    assert words.device == meta and words.dtype == torch.int64 and tuple(words.shape) == (2, 3)
    streams.load_state_dict(RandomStreams.from_seed(0, 2).state_dict())  # a state saved on the CPU
    assert (streams.keys.device, streams.counters.device) == (meta, meta)
    assert (streams.keys.dtype, streams.counters.dtype) == (torch.int64, torch.int64)
