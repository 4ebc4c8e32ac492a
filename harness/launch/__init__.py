"""Stage 3, the launches: runnable cases -> tasks -> torchrun process groups -> each case's
result. Receives the plugin's cases; the scheduler hands each lane's tasks to long-lived
launches through a feed, every process is tethered, bounded and killed at its end; hands
back :class:`case_result.CaseResult` (rows, status, logs) per case. Starts the worker stage as
processes (``python -m harness.worker``), never imports the plugin, verdict or results."""
