"""The core below the three stages: records, errors, atomic writes, the hardware table, the analytic
formulas and the performance model that runner, ingest and report share. Imports none of them."""
