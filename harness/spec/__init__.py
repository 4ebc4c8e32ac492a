"""Stage 1, the scenario: YAML files -> validated specs -> cases.

Receives ``scenarios/*.yaml`` (strict YAML: duplicate and unknown keys are errors) and the
catalog of what the harness knows (axes, recipes, backends, meshes, models); hands on
:class:`matrix.Case` objects, plain data that every later stage reads. Imports nothing of the
harness outside this package and no torch at import time."""
