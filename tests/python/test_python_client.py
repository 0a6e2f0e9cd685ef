"""clients/python is an installable package: the wheel ships the generated gRPC stubs, imports
without grpcio-tools (no protoc at import time), and reaches the whole API of a live daemon."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from daemon_harness import REPO, Daemon, binary_path, model_path

CLIENT = REPO / "clients" / "python"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The built wheel, unpacked where a site-packages would hold it."""
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy (the proto link resolved, as in an sdist), so the checkout stays clean.
    source = out / "src"
    shutil.copytree(CLIENT, source, symlinks=False,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(out), str(source)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (wheel,) = out.glob("winnow_client-*.whl")
    site = out / "site"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(site)
    for needed in ("winnow/v1/inference_pb2.py", "winnow/v1/inference_pb2_grpc.py",
                   "winnow/v1/inference_pb2.pyi", "winnow/v1/__init__.py",
                   "winnow_client/__init__.py", "winnow_client/__main__.py"):
        assert needed in names, sorted(names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "winnow-client = winnow_client:main" in (site / entry_points).read_text()
    return site


def run_installed(site, code: str = "", args: list[str] | None = None):
    # grpc_tools is made unimportable: the installed package must not need protoc.
    prelude = "import sys; sys.modules['grpc_tools'] = None\n"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    cmd = [sys.executable, "-c", prelude + code] if args is None else \
        [sys.executable, "-c", prelude + "import runpy; sys.argv = ['winnow-client'] + "
         + repr(args) + "; runpy.run_module('winnow_client', run_name='__main__')"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd="/")
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


@pytest.fixture(scope="module")
def daemon():
    if not binary_path().exists() or not model_path().exists():
        pytest.fail(f"need {binary_path()} and {model_path()} (make build model)")
    with Daemon() as d:
        yield d


def test_installed_package_reaches_the_whole_api(installed, daemon):
    out = run_installed(installed, f"""
import json, winnow_client
from winnow_client import WinnowClient, pb2
assert winnow_client.__file__.startswith({str(installed)!r}), winnow_client.__file__
with WinnowClient({daemon.target!r}) as c:
    info = c.model_info()
    hidden = info.hidden_size
    text, ids, final = c.generate_text(
        segments=[("text", "Notes:"), ("context", " red green blue " * 20),
                  ("embedding", "image", 2, [0.0] * (2 * hidden)), ("text", " Colours:")],
        max_tokens=4, temperature=0.7, seed=5, top_k=40, top_p=0.9, min_p=0.01,
        repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.2,
        logprobs=True, top_logprobs=2, priority=3,
        compression={{"policy": "snapkv", "budget": 0.5, "params": {{"window": 4}},
                      "options": {{"pooling": "max"}}}})
    chat_ids = c.tokenize(chat=[("user", "hi")])
    print(json.dumps({{"n": len(ids), "reason": pb2.FinishReason.Name(final.finish_reason),
                      "evicted": final.usage.kv_tokens_evicted,
                      "chat_tokens": len(chat_ids), "health": c.health()}}))
""")
    result = json.loads(out)
    assert result["n"] >= 1 and result["reason"] in ("FINISH_REASON_LENGTH", "FINISH_REASON_STOP")
    assert result["evicted"] > 0  # the compression spec reached the policy
    assert result["chat_tokens"] > 1 and result["health"] == "SERVING"


def test_installed_cli(installed, daemon):
    out = run_installed(installed, args=["--target", daemon.target, "--prompt",
                                         "The capital of France is", "--max-tokens", "3",
                                         "--policy", "streaming_llm", "--budget", "0.5",
                                         "--json"])
    final = json.loads(out.strip().splitlines()[-1])
    assert final["finish_reason"] in ("FINISH_REASON_LENGTH", "FINISH_REASON_STOP")


def test_source_checkout_cli_still_works(daemon):
    p = subprocess.run([sys.executable, str(CLIENT / "winnow_client.py"), "--target",
                        daemon.target, "--prompt", "The capital of France is", "--max-tokens",
                        "3"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout, p.stderr
    assert "completion_tokens=3" in p.stderr
