"""Imported by the run's rank server (``rank_server.py``) before it forks anything: importing it
is the server's preload (``fork_agent.preload_from_env``), as ``multiprocessing``'s forkserver
preloads modules by name."""

from harness.launch import fork_agent

fork_agent.preload_from_env()
