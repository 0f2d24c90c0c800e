"""Device facts the schedulers read: resident blocks per multiprocessor from the device's limits."""
from __future__ import annotations

from jitops.device import KNOWN_TARGETS


def test_resident_blocks_takes_the_tightest_limit():
    h100 = KNOWN_TARGETS["sm_90"]
    assert h100.resident_blocks(256) == 8                                  # 2048 threads
    assert h100.resident_blocks(1024) == 2
    assert h100.resident_blocks(128, shared=100 * 1024) == 2              # 228 KB of shared memory
    assert h100.resident_blocks(256, registers_per_thread=128) == 2       # 65536 registers
    assert h100.resident_blocks(2048 + 1) == 1                            # never zero


def test_cdna_has_its_own_register_file():
    mi200 = KNOWN_TARGETS["gfx90a"]
    assert mi200.resident_blocks(256, registers_per_thread=128) == 4      # 131072 registers
