#!/usr/bin/env python3
"""Runs the winnow client CLI from a source checkout, without installing the package:

    python clients/python/winnow_client.py --prompt "The capital of France is" --max-tokens 8

Installed (`pip install clients/python`), the same CLI is `winnow-client` or
`python -m winnow_client`.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from winnow_stubs import use_source_tree  # noqa: E402

use_source_tree()  # clients/python/src goes before this script's directory
sys.modules.pop("winnow_client", None)

from winnow_client import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
