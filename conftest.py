# The harness's pytest plugin. Installed packages also load it through the ``pytest11`` entry
# point ``harness.plugin``; pytest skips a second registration under the same name.
pytest_plugins = ["harness.plugin"]
