"""Ingest: raw campaign artifacts -> normalized tables (see ingest.io, ingest.schema)."""
