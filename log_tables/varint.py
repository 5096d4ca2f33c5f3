"""Zigzag varints: how Avro writes its ints and longs and Kafka its record fields (the
same encoding: the sign folded into the low bit, then 7 bits a byte, low bytes first)."""

from __future__ import annotations


def zigzag(n: int) -> bytes:
    """``n`` (a 64-bit signed integer) as a zigzag varint."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
