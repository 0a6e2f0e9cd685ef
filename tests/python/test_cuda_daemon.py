"""The daemon on the CUDA worker (`winnow serve --device cuda`), against the same daemon on the
CPU worker: same greedy tokens, batching that does not change them, the KV pool sized by
--gpu-memory-utilization, compression refused at admission, every block back at the end.

Skipped, saying why, when this build has no CUDA or no GPU is visible (CI machines have
neither). docs/gpu.md says how these ran on a GPU machine.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import shutil
import subprocess

import grpc
import pytest

from daemon_harness import Daemon, binary_path, model_path

PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "List three primary colors:",
]
MAX_TOKENS = 24


def _gpu_visible() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(
    not binary_path().exists() or not model_path().exists() or not _gpu_visible(),
    reason="no CUDA device visible (or no winnow build / model): CUDA daemon tests skipped")


def _greedy(daemon: Daemon, prompt: str) -> list[int]:
    _, ids, final = daemon.client.generate_text(prompt, max_tokens=MAX_TOKENS, ignore_eos=True,
                                                timeout=120)
    assert final is not None
    return ids


@pytest.fixture(scope="module")
def cpu_tokens() -> dict[str, list[int]]:
    with Daemon("--device", "cpu") as cpu:
        return {p: _greedy(cpu, p) for p in PROMPTS}


@pytest.fixture(scope="module")
def gpu() -> Daemon:
    daemon = Daemon("--device", "cuda:0", "--gpu-memory-utilization", "0.5")
    yield daemon
    daemon.stop()


def test_reports_the_gpu_and_sizes_the_pool_from_the_memory_fraction(gpu):
    info = gpu.client.model_info()
    assert info.device.startswith("cuda:0 ("), info.device
    status = gpu.client.server_status()
    assert status.device == info.device
    assert status.kv_blocks_total > 0
    line = re.search(r"gpu memory: 0\.50 of ([\d.]+) GiB on cuda:0: .* ([\d.]+) GiB for the KV "
                     r"cache", gpu.logs())
    assert line, gpu.logs()
    assert 0 < float(line.group(2)) < 0.5 * float(line.group(1))


def test_greedy_tokens_equal_the_cpu_workers(gpu, cpu_tokens):
    for prompt in PROMPTS:
        assert _greedy(gpu, prompt) == cpu_tokens[prompt], prompt
    gpu.wait_pool_free()


def test_concurrent_requests_get_the_tokens_they_get_alone(gpu, cpu_tokens):
    # Continuous batching mixes these prompts' prefills and decodes in shared iterations.
    with cf.ThreadPoolExecutor(len(PROMPTS) * 2) as pool:
        futures = {pool.submit(_greedy, gpu, p): p for p in PROMPTS * 2}
        for future, prompt in futures.items():
            assert future.result() == cpu_tokens[prompt], prompt
    gpu.wait_pool_free()


def test_a_compression_policy_is_refused_at_admission(gpu):
    with pytest.raises(grpc.RpcError) as err:
        list(gpu.client.generate(PROMPTS[0], max_tokens=4,
                                 compression={"policy": "snapkv", "budget": 0.5}))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "compression.policy" in err.value.details()
    gpu.wait_pool_free()
