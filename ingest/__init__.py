"""Ingest: raw campaign artifacts -> normalized tables (see ingest.io, core.records)."""
