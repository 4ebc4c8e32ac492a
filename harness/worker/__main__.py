"""``python -m harness.worker --plan PLAN`` (started by torchrun, once per rank).

The ``__main__`` guard matters: process-based async DCP spawns a helper process that
re-imports this module, which must not start another worker.
"""

import sys

if __name__ == "__main__":
    from harness.worker.main import main

    sys.exit(main())
