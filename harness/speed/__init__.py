"""The accelerations: every layer of the harness that exists only for speed, behind one seam.

Receives the run's choice (``pytest --accelerations all|none|NAME,...``, the plugin's options)
and hands every stage above one answer to "is this layer on?" (``layers.Accelerations``; in a
rank, ``layers.active(name)`` reads the launch environment). With none on, the run takes the
plain path -- fresh torchrun agents and ranks, no preload, no lane affinity, every reference
computed where it is needed, every comparison by the general formula -- and every case's
outcome is the same (tests/test_accelerations.py). ``layers.LAYERS`` lists each layer: what
it does, where its code is, what else turns it off; docs/performance.md what each gained.

The layers whose code needs nothing above this stage live here (``gc_pause``,
``inductor_cache``, ``bytecode_cache``, ``task_seconds``, ``lane_choice``, ``reference_cache``);
those that start or fork processes stay with the process code they extend (the rank server in
launch/, the forked stager in worker/) and ask the seam.
"""
