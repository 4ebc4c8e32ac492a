"""Distributed correctness harness for FSDP2 x TP x DCP with quantized training.

Data flows one way: scenario spec (``spec``) -> matrix (``matrix``) -> launcher
(``launcher`` / ``scheduler``) -> worker per rank (``worker``) -> checks (``checks``) ->
result rows (``results``) -> pytest outcome (``plugin``) and report.
"""

__version__ = "0.1.0"
