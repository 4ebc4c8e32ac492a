"""Stage 4, the worker: ``python -m harness.worker --plan PLAN`` on every rank of a launch.
Receives the launch's plan and fed tasks (``task_feed``); per task runs the producers (train,
reference, save, load, ...) and the checks in dependency order (``runner``), agrees on the
outcome over a gloo control group, and hands the task's result rows back as a file."""
