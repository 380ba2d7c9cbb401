"""Per-sample generators for a whole block at once, the same streams as :func:`sample_rng`.

``sample_rng(seed, epoch, sid)`` is ``default_rng(SeedSequence([seed, epoch, sid]))``: building the
SeedSequence and the PCG64 from it costs ~11 µs per sample alone and ~35 µs inside the augmentation
loop (cold caches after each decode), ~4 % of a training image's CPU (``python bench/profiles.py
rng DATA`` measures both). ``BlockRngs`` runs NumPy's
SeedSequence hashing (entropy mixing, then ``generate_state(4, uint64)``) vectorised over a block's
sample ids and PCG64's seeding step in Python integers, then hands out one reused ``Generator`` whose
bit generator is set to each sample's state: the same numbers, a few µs per sample. Values that need
more than one 32-bit word (seeds, epochs or ids >= 2**32) take ``sample_rng`` itself.
"""

from __future__ import annotations

import numpy as np

from raypipe.kernels.transform import sample_rng

__all__ = ["BlockRngs"]

# numpy/random/bit_generator.pyx (SeedSequence): pool of 4 uint32 words, hash constants, 16-bit xorshift
_POOL = 4
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_XSHIFT = 16
_M32 = 0xFFFFFFFF
# PCG64's 128-bit LCG multiplier (pcg64.h: PCG_DEFAULT_MULTIPLIER_128)
_PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645
_M128 = (1 << 128) - 1


def _hash_consts(init: int, mult: int, n: int) -> list[np.uint32]:
    """The hash constant before each of n steps, and after the last: it only depends on the step."""
    out, h = [], init
    for _ in range(n + 1):
        out.append(np.uint32(h))
        h = (h * mult) & _M32
    return out


# each hash step xors the value with the constant, advances the constant, then multiplies by it
_A = _hash_consts(_INIT_A, _MULT_A, _POOL + _POOL * (_POOL - 1))  # mixing the entropy into the pool
_B = _hash_consts(_INIT_B, _MULT_B, 2 * _POOL)  # generate_state: 8 uint32 words


def _hashmix(values: np.ndarray, step: int) -> np.ndarray:
    v = (values ^ _A[step]) * _A[step + 1]
    return v ^ (v >> np.uint32(_XSHIFT))


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    r = np.uint32(_MIX_L) * x - np.uint32(_MIX_R) * y
    return r ^ (r >> np.uint32(_XSHIFT))


def seed_words(seed: int, epoch: int, sample_ids: np.ndarray) -> np.ndarray:
    """``SeedSequence([seed, epoch, sid]).generate_state(4, np.uint64)`` for every sid, shape (n, 4);
    all three values must be in [0, 2**32)."""
    sids = np.asarray(sample_ids, dtype=np.uint32)
    with np.errstate(over="ignore"):
        entropy = [np.full_like(sids, seed), np.full_like(sids, epoch), sids, np.zeros_like(sids)]
        step = 0
        pool = []
        for i in range(_POOL):  # the fourth word hashes 0: three entropy words fill a pool of four
            pool.append(_hashmix(entropy[i], step))
            step += 1
        for src in range(_POOL):
            for dst in range(_POOL):
                if src != dst:
                    pool[dst] = _mix(pool[dst], _hashmix(pool[src], step))
                    step += 1
        words = []
        for i in range(2 * _POOL):  # generate_state(8 uint32) = 4 uint64
            v = (pool[i % _POOL] ^ _B[i]) * _B[i + 1]
            words.append(v ^ (v >> np.uint32(_XSHIFT)))
    w32 = np.stack(words, axis=1).astype(np.uint64)
    return w32[:, 0::2] | (w32[:, 1::2] << np.uint64(32))


def pcg64_state(words: np.ndarray) -> tuple[int, int]:
    """PCG64's (state, inc) after seeding it with SeedSequence words ``words`` (4 uint64)."""
    s = (int(words[0]) << 64) | int(words[1])
    inc = (((int(words[2]) << 64) | int(words[3])) << 1 | 1) & _M128
    state = inc  # state = 0, one LCG step
    state = (state + s) & _M128
    state = (state * _PCG_MULT + inc) & _M128
    return state, inc


class BlockRngs:
    """``rngs.get(i)``: the generator of ``sample_ids[i]`` in ``(seed, epoch)``, equal in its numbers to
    ``sample_rng(seed, epoch, sample_ids[i])``. Generators handed out share one bit generator: each
    ``get`` re-seeds it, so use one sample's generator before asking for the next."""

    def __init__(self, seed: int, epoch: int, sample_ids) -> None:
        self.seed, self.epoch = int(seed), int(epoch)
        ids = np.asarray(sample_ids, dtype=np.int64).reshape(-1)
        self.ids = ids
        fits = 0 <= self.seed <= _M32 and 0 <= self.epoch <= _M32 and bool(((ids >= 0) & (ids <= _M32)).all())
        self._words = seed_words(self.seed, self.epoch, ids) if fits and len(ids) else None
        self._bits = np.random.PCG64(0)
        self._rng = np.random.Generator(self._bits)

    def get(self, i: int) -> np.random.Generator:
        if self._words is None:
            return sample_rng(self.seed, self.epoch, int(self.ids[i]))
        state, inc = pcg64_state(self._words[i])
        self._bits.state = {
            "bit_generator": "PCG64",
            "state": {"state": state, "inc": inc},
            "has_uint32": 0,
            "uinteger": 0,
        }
        return self._rng
