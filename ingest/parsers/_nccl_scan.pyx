# cython: language_level=3
"""Compiled scanner (see ingest.parsers.LineParser.native_scan). Not written yet."""

BUILT = True
