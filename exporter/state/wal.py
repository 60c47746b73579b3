"""A SQLite write-ahead log's damage found from its own checksums, before SQLite reads it
(SQLite silently drops every frame after a bad one: committed windows lost)."""

from __future__ import annotations

import struct

_WAL_MAGIC = (0x377F0682, 0x377F0683)


def wal_checksum(data: bytes, big_endian: bool, s0: int = 0, s1: int = 0) -> tuple[int, int]:
    """SQLite's WAL checksum (pairs of 32-bit words, cumulative), continued from (s0, s1)."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def wal_damage(wal: bytes) -> str | None:
    """Why a write-ahead log is damaged, or None when SQLite will replay all it committed.
    Older frames (other salts), a torn last frame and frames after the last commit are what a
    kill leaves; a frame failing its checksum with commits of its generation after it is damage."""
    if len(wal) < 32:
        return None
    magic, _, page_size, _, salt1, salt2, c0, c1 = struct.unpack(">8I", wal[:32])
    if magic not in _WAL_MAGIC:
        return "bad header magic"
    big = magic & 1 == 1
    if wal_checksum(wal[:24], big) != (c0, c1):
        return "header checksum mismatch"
    sums = (c0, c1)
    offset, frame = 32, 24 + page_size
    while offset + frame <= len(wal):
        head = wal[offset:offset + 24]
        _, _, f_salt1, f_salt2, f0, f1 = struct.unpack(">6I", head)
        if (f_salt1, f_salt2) != (salt1, salt2):
            return None  # an older generation's frame: the log ends before it
        sums = wal_checksum(head[:8], big, *sums)
        sums = wal_checksum(wal[offset + 24:offset + frame], big, *sums)
        if sums != (f0, f1):
            # A kill between a frame's header and its page leaves a torn last frame: harmless
            # unless a later frame of this generation ends a transaction (a commit lost).
            heads = (struct.unpack_from(">3I", wal, at + 4)  # commit size, salts
                     for at in range(offset + frame, len(wal) - frame + 1, frame))
            lost = sum(1 for commit, *salts in heads if commit and salts == [salt1, salt2])
            if lost:
                index = (offset - 32) // frame
                return f"frame {index} checksum mismatch; {lost} committed transaction(s) after it"
            return None
        offset += frame
    return None
