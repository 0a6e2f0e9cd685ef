"""Fixtures for the compression-quality check (`make quality-check`), kept out of `make test`
until the seed policies meet its criteria on the default model (see docs/compression.md)."""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def model_path() -> Path:
    path = Path(os.environ.get("WINNOW_MODEL",
                               ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    if not path.exists():
        pytest.fail(f"model not found at {path}; run `make model` (or set WINNOW_MODEL)")
    return path
