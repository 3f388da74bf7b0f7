"""``python -m fp8lab.attention``: the logging process of :func:`fp8lab.attention.te_selection_logs`
(cases as JSON on stdin, TE's selection log on stderr)."""

import sys

from fp8lab.attention.logs import child_main

if __name__ == "__main__":  # pragma: no cover - runs on the GPU, in a fresh process
    sys.exit(child_main())
