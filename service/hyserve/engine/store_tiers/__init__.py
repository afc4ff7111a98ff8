"""Tiers of the prefix store below host memory: the entry file format and the disk tier."""

from hyserve.engine.store_tiers.disk import DiskTier
from hyserve.engine.store_tiers.format import FORMAT_VERSION, EntryFormatError, decode_entry, encode_entry, read_header

__all__ = ["FORMAT_VERSION", "DiskTier", "EntryFormatError", "decode_entry", "encode_entry", "read_header"]
