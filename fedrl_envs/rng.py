"""Counter-based random streams: one independent stream per row of a batch.

A ``torch.Generator`` is one sequential stream, so a batch of agents drawing from one generator
would make agent ``i``'s numbers depend on how many agents come before it, and a Python loop over
per-agent generators would put a loop over agents on every hot path. Instead every stream here is
a *key* (a 64-bit integer derived from a seed and a stream index) plus a *counter*; the ``j``-th
number of a stream is a pure hash of ``(key, counter + j)`` (SplitMix64). Consequences:

* all streams of a batch are drawn in one vectorized call, on any device;
* a stream's numbers depend only on its own key and counter, never on the other rows of the batch;
* CPU and CUDA produce bitwise-identical numbers (integer arithmetic only);
* the whole state is two integer tensors, so it saves, loads and copies exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["RandomStreams", "OneStream", "bits_at", "mix64", "uniform32_of_mix64", "uniform32_of_finalizer_input", "uniform32_of_finalizer_input_numpy", "uniform32_rows_numpy", "derive_keys", "seed_from_entropy", "words_to_uniform"]

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
_MUL1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MUL2 = -7723592293110705685  # 0x94D049BB133111EB


def _shr(x: Any, bits: int) -> Any:
    """Logical right shift of int64 tensors (torch's ``>>`` is arithmetic for signed types); also of
    Python ints in [0, 2**64), whose ``>>`` is already logical."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


_MASK64 = (1 << 64) - 1


def _no_wrap(x: torch.Tensor) -> torch.Tensor:
    return x  # int64 tensor arithmetic already wraps modulo 2**64


def _wrap_uint64(x: int) -> int:
    return x & _MASK64  # Python ints do not wrap: keep the low 64 bits (the same bits as int64's)


def _mix64(x: Any, wrap: Any) -> Any:
    # The one SplitMix64 finalizer, for int64 tensors and for Python ints held as unsigned 64-bit
    # values; ``wrap`` reduces modulo 2**64 after each add and multiply (a no-op for tensors).
    x = wrap(x + _GOLDEN)
    x = wrap((x ^ _shr(x, 30)) * _MUL1)
    x = wrap((x ^ _shr(x, 27)) * _MUL2)
    return x ^ _shr(x, 31)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finalizer: a bijective avalanche hash of int64 tensors (wrapping arithmetic)."""
    return _mix64(x, _no_wrap)


def uniform32_of_mix64(x: torch.Tensor) -> torch.Tensor:
    """``words_to_uniform(mix64(x), torch.float32)`` in three fewer operations, bit for bit.

    A float32 uniform keeps the top 24 bits of its word, and the finalizer's last step,
    ``x ^ (x >>> 31)``, changes only the low 33: so it is skipped.
    """
    return uniform32_of_finalizer_input(x + _GOLDEN)


# The finalizer's constants as NumPy uint64 scalars: Numba compiles the function below with them
# as typed constants (a Python int above 2**63 has no Numba type).
_U64_SHIFT30, _U64_SHIFT27, _U64_SHIFT40 = np.uint64(30), np.uint64(27), np.uint64(40)
_U64_MUL1, _U64_MUL2 = np.uint64(_MUL1 % 2**64), np.uint64(_MUL2 % 2**64)
_F32_TWO_TO_MINUS_24 = np.float32(2.0**-24)


def uniform32_of_finalizer_input_numpy(x: Any) -> Any:
    """:func:`uniform32_of_finalizer_input` on a NumPy ``uint64`` array or scalar (the same bits; an array is overwritten).

    NumPy's unsigned shifts are logical and its array arithmetic wraps modulo 2**64, as the int64
    tensor version's masked shifts and wrapping products do. The fused CPU steps
    (:mod:`fedrl_envs.fused`) compile this very function for one word at a time.
    """
    x ^= x >> _U64_SHIFT30
    x *= _U64_MUL1
    x ^= x >> _U64_SHIFT27
    x *= _U64_MUL2
    return np.float32(x >> _U64_SHIFT40) * _F32_TWO_TO_MINUS_24


_U64_GOLDEN = np.uint64(_GOLDEN % 2**64)


def uniform32_rows_numpy(keys: Any, counters: Any, out: Any) -> None:
    """``out[r, j]``: the ``j``-th float32 uniform :meth:`RandomStreams.uniform` draws next from the
    stream of ``(keys[r], counters[r])`` (NumPy ``uint64`` arrays, the int64 state's bits), without
    advancing anything; the same bits. Compiled by :mod:`fedrl_algos.policies.mlp.compiled`.

    Word ``j`` is the finalizer of ``key + (counter + j)·golden``, whose first step adds ``golden``:
    so the finalizer's remaining steps (:func:`uniform32_of_finalizer_input_numpy`) apply to
    ``key + (counter + j + 1)·golden``, all in wrapping uint64 arithmetic.
    """
    one = np.uint64(1)
    for r in range(out.shape[0]):
        word = keys[r] + (counters[r] + one) * _U64_GOLDEN
        for j in range(out.shape[1]):
            out[r, j] = uniform32_of_finalizer_input_numpy(word)
            word += _U64_GOLDEN


def uniform32_of_finalizer_input(x: torch.Tensor) -> torch.Tensor:
    """:func:`uniform32_of_mix64` of ``x - golden``: for callers that fold the finalizer's first
    addend into a precomputed term (the vector env's per-row reset words)."""
    x = (x ^ _shr(x, 30)) * _MUL1
    x = (x ^ _shr(x, 27)) * _MUL2
    return _shr(x, 40).to(torch.float32) * (2.0**-24)


def seed_from_entropy(bits: int = 62) -> int:
    """A fresh non-negative seed of ``bits`` bits from the operating system's entropy (for ``seed=None``).

    62 bits (the default) keep every derived quantity inside int64; SB3's ``set_random_seed`` needs
    ``bits <= 32`` (NumPy's legacy seeding takes 32-bit seeds).

    :param bits: number of random bits, 1 to 64
    """
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 64:
        raise ValueError(f"bits must be an int in [1, 64], got {bits!r}")
    return int(np.random.SeedSequence().generate_state(1, dtype=np.uint64)[0]) >> (64 - bits)


def _wrap_int64(value: Any) -> Any:
    """Python ints of any size as their two's-complement int64 value (seeds up to 2**64 - 1 are valid)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value + 2**63) % 2**64 - 2**63
    return value


def derive_keys(seed: int | torch.Tensor, index: int | torch.Tensor | Sequence[int]) -> torch.Tensor:
    """Stream keys for ``(seed, index)`` pairs; broadcasting like ``seed + index``.

    :param seed: a seed or an int64 tensor of seeds (e.g. one per run)
    :param index: stream indices within a seed (e.g. agent positions)
    :return: int64 tensor of keys
    """
    seed_t = torch.as_tensor(_wrap_int64(seed), dtype=torch.int64)
    index_t = torch.as_tensor(_wrap_int64(index), dtype=torch.int64, device=seed_t.device)
    return mix64(mix64(seed_t) ^ mix64(index_t * 2 + 1))


def words_to_uniform(words: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """64-bit words as uniform numbers in ``[0, 1)`` of ``dtype`` (the top mantissa-many bits)."""
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
    if dtype == torch.float64:
        return _shr(words, 11).to(torch.float64) * (2.0**-53)
    if dtype == torch.float32:
        # 24 bits fit a float32 mantissa exactly, so the result is never rounded up to 1.0.
        return _shr(words, 40).to(torch.float32) * (2.0**-24)
    # Narrower types (float16, bfloat16): keep only as many bits as the mantissa holds.
    bits = round(-math.log2(torch.finfo(dtype).eps)) + 1  # explicit mantissa bits + the implicit one
    return (_shr(words, 64 - bits).to(torch.float64) * (2.0**-bits)).to(dtype)


def bits_at(keys: torch.Tensor, counters: torch.Tensor, streams: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Words ``counters + offsets`` of the streams ``streams`` of ``(keys, counters)``: :meth:`RandomStreams.bits_at` as a pure function.

    :param keys: int64 stream keys (any shape; indexed flat)
    :param counters: int64 counters, the shape of ``keys``
    :param streams: int64 indices into the flattened streams, broadcasting with ``offsets``
    :param offsets: int64 word offsets from each selected stream's counter
    """
    idx = counters.reshape(-1)[streams] + offsets
    return mix64(keys.reshape(-1)[streams] + idx * _GOLDEN)


class RandomStreams:
    """A batch of independent random streams, one per row (agent, run, ...).

    :param keys: int64 tensor of stream keys, any shape ``batch_shape`` (see :func:`derive_keys`)
    :param device: device of the streams and of every number they draw
    """

    def __init__(self, keys: torch.Tensor, device: torch.device | str | None = None) -> None:
        keys = torch.as_tensor(keys, dtype=torch.int64)
        if device is not None:
            keys = keys.to(device)
        self.keys = keys
        self.counters = torch.zeros_like(keys)

    @classmethod
    def from_seed(
        cls, seed: int, n_streams: int, device: torch.device | str | None = None
    ) -> RandomStreams:
        """``n_streams`` streams derived from one integer seed (stream ``i`` has index ``i``)."""
        if not isinstance(seed, int | torch.Tensor) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        return cls(derive_keys(seed, torch.arange(n_streams)), device)

    @property
    def batch_shape(self) -> torch.Size:
        return self.keys.shape

    @property
    def device(self) -> torch.device:
        return self.keys.device

    def bits(self, shape: Sequence[int]) -> torch.Tensor:
        """Draw ``prod(shape)`` 64-bit words per stream: int64 tensor ``[*batch_shape, *shape]``."""
        return mix64(self._advance_words(shape))

    def _advance_words(self, shape: Sequence[int]) -> torch.Tensor:
        """The finalizer inputs of :meth:`bits` (``key + index * golden``), advancing the counters."""
        shape = tuple(int(s) for s in shape)
        count = 1
        for s in shape:
            count *= s
        offsets = torch.arange(count, dtype=torch.int64, device=self.device).reshape(shape)
        idx = self.counters.reshape(self.keys.shape + (1,) * len(shape)) + offsets
        self.counters = self.counters + count
        return self.keys.reshape(idx.shape[: self.keys.dim()] + (1,) * len(shape)) + idx * _GOLDEN

    def bits_at(self, streams: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Words ``counter + offsets`` of the selected streams, without advancing any counter.

        ``bits_at(i, o)`` equals word ``o`` of what :meth:`bits` would draw next from stream ``i``,
        so a caller that needs only some of a batch's numbers (the rows whose episodes just ended)
        hashes only those and then moves the counters on with :meth:`advance`.

        :param streams: int64 indices into the flattened streams, broadcasting with ``offsets``
        :param offsets: int64 word offsets from each selected stream's counter
        :return: int64 tensor of the broadcast shape
        """
        return bits_at(self.keys, self.counters, streams, offsets)

    def advance(self, count: int, where: torch.Tensor | None = None) -> None:
        """Move the counters of the streams selected by ``where`` (bool, ``batch_shape``; all when ``None``) by ``count`` words."""
        if where is None:
            self.counters = self.counters + count
        else:
            self.counters = self.counters + where.to(torch.int64) * count

    def uniform_at(self, streams: torch.Tensor, offsets: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """:meth:`bits_at` as uniform numbers in ``[0, 1)``, the values :meth:`uniform` gives those words."""
        return words_to_uniform(self.bits_at(streams, offsets), dtype)

    def uniform(self, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Uniform numbers in ``[0, 1)``: tensor ``[*batch_shape, *shape]`` of ``dtype``.

        :param shape: numbers per stream
        :param dtype: floating dtype of the result
        """
        if not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
        if dtype == torch.float32:
            return uniform32_of_mix64(self._advance_words(shape))
        return words_to_uniform(self.bits(shape), dtype)

    def normal(self, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Standard normal numbers (Box-Muller on two uniform draws).

        :param shape: numbers per stream
        :param dtype: floating dtype of the result
        """
        u = self.uniform((2, *shape), dtype=torch.float64)
        u1, u2 = u.unbind(self.keys.dim())
        z = torch.sqrt(-2.0 * torch.log1p(-u1)) * torch.cos(2.0 * torch.pi * u2)
        return z.to(dtype)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full state: keys and counters (copies)."""
        return {"keys": self.keys.clone(), "counters": self.counters.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore a state from :meth:`state_dict` (moved to this object's device)."""
        self.keys = state["keys"].to(self.device, torch.int64).clone()
        self.counters = state["counters"].to(self.device, torch.int64).clone()

    def to(self, device: torch.device | str) -> RandomStreams:
        """Move the streams (same numbers on every device)."""
        self.keys = self.keys.to(device)
        self.counters = self.counters.to(device)
        return self

    def __getitem__(self, index: int | slice | torch.Tensor) -> RandomStreams:
        """A new object holding a copy of the selected streams (keys and counters)."""
        out = RandomStreams.__new__(RandomStreams)
        out.keys = self.keys[index].clone()
        out.counters = self.counters[index].clone()
        return out

    def __repr__(self) -> str:
        return f"RandomStreams(batch_shape={tuple(self.batch_shape)}, device={self.device})"


class OneStream:
    """One stream of :class:`RandomStreams` in plain Python integers, for the single env's resets.

    Draws bitwise the numbers row ``0`` of ``RandomStreams(key[None])`` draws (the same SplitMix64
    hash of ``(key, counter)``), in a few microseconds instead of a dozen torch calls.

    :param key: the stream's key, e.g. ``derive_keys(seed, 0)`` (an int or a one-element int64 tensor)
    """

    def __init__(self, key: int | torch.Tensor) -> None:
        self.key = _wrap_uint64(int(key))
        self.counter = 0

    def uniform_float32(self, count: int) -> np.ndarray:
        """The next ``count`` uniform numbers in ``[0, 1)`` as float32 ``(count,)``, as
        ``RandomStreams.uniform((count,))`` gives them."""
        words = [
            _mix64(_wrap_uint64(self.key + (self.counter + j) * _GOLDEN), _wrap_uint64) for j in range(count)
        ]
        self.counter += count
        # 24 bits times 2**-24: exact in float32, as in RandomStreams.uniform.
        return np.array([w >> 40 for w in words], dtype=np.float32) * np.float32(2.0**-24)
