"""Stage 7, the results: each case's verdict and rows -> the run's record (coverage rows made
from the verdict, the terminal summary) -> ``<store>/history/<run>.parquet``, summary.csv and
meta.json in the results store (``store.py``). Receives what the plugin collected; hands files
to the report stage."""
