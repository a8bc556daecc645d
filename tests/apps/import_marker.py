"""An installed module with an import-time side effect, as a forged message might name: importing
it writes the file ``TEST_IMPORT_MARKER`` names (tests/test_trust.py checks it never is)."""

import os
from pathlib import Path

if os.environ.get("TEST_IMPORT_MARKER"):
    Path(os.environ["TEST_IMPORT_MARKER"]).write_text("imported")
