"""Shared fixtures: paths to the winnow binary and the model, and the transformers reference."""
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _path_from_env(var: str, default: Path) -> Path:
    value = os.environ.get(var)
    return Path(value) if value else default


@pytest.fixture(scope="session")
def winnow_bin() -> Path:
    path = _path_from_env("WINNOW_BIN", ROOT / "build" / "winnow")
    if not path.exists():
        pytest.fail(f"winnow binary not found at {path}; run `make build` (or set WINNOW_BIN)")
    return path


@pytest.fixture(scope="session")
def model_path() -> Path:
    path = _path_from_env("WINNOW_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not path.exists():
        pytest.fail(f"model not found at {path}; run `make model` (or set WINNOW_MODEL)")
    return path


def run_winnow(winnow_bin: Path, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run([str(winnow_bin), *args], input=stdin, capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"winnow {' '.join(args[:1])} failed ({proc.returncode}): "
                             f"{proc.stderr.strip()}")
    return proc.stdout


def run_winnow_json(winnow_bin: Path, *args: str) -> dict:
    return json.loads(run_winnow(winnow_bin, *args))


@pytest.fixture(scope="session")
def hf_model(model_path):
    """transformers loading the same GGUF, dequantised to float32: the numeric reference."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(os.cpu_count() or 1)
    model = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name,
                                                 dtype=torch.float32)
    model.eval()
    return model


@pytest.fixture(scope="session")
def hf_tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_path.parent), gguf_file=model_path.name)
