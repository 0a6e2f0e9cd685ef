// Which device the engine's worker runs on (--device cpu | cuda[:N]) and the worker for it.
// One device per process: more GPUs are more daemons behind the gateway (docs/deploy.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cache/block_pool.h"
#include "kernels/cpu/kv_dtype.h"
#include "model/model.h"
#include "scheduler/worker.h"

namespace winnow::scheduler {

struct Device {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int32_t index = 0;  // the CUDA device ordinal (kCuda only)

  bool is_cuda() const { return kind == Kind::kCuda; }
  // "cpu" or "cuda:N": what ParseDevice reads back.
  std::string ToString() const;
  bool operator==(const Device&) const = default;
};

// True when this binary was built with the CUDA worker (nvcc found at configure time).
bool BuiltWithCuda();

// "cpu", "cuda" (= cuda:0) or "cuda:N"; InvalidArgument for anything else. Only the syntax:
// a lower settings layer may name a device that a higher one overrides (CheckBuiltFor checks
// the final choice). Whether device N exists is checked when the worker is created.
absl::StatusOr<Device> ParseDevice(absl::string_view text);

// InvalidArgument for a cuda device in a build without CUDA.
absl::Status CheckBuiltFor(const Device& device);

// cuda:0 when this build has CUDA and a GPU is visible, else cpu.
Device DefaultDevice();

// The device for the startup log and GetModelInfo: "cpu", or "cuda:0 (NVIDIA H100 80GB HBM3)".
std::string DescribeDevice(const Device& device);

// The KV dtype for `device` when `given` is the one asked for (nullopt: none was): f16 by
// default on cpu; on cuda bf16, the only one the CUDA worker stores (its activation type), so
// another given dtype is InvalidArgument.
absl::StatusOr<kernels::KvDtype> KvDtypeFor(const Device& device,
                                            std::optional<kernels::KvDtype> given);

// Whether `pool` must hold the K/V data on the host (the CPU worker) or only the books (the
// CUDA worker keeps the data in its device arena).
inline bool NeedsHostArena(const Device& device) { return !device.is_cuda(); }

// The worker for `device`, on threads of its own (`host`): the CPU worker, or the CUDA worker
// with the model's weights, its activations for batches within `limits`, a device KV arena for
// `pool` and, with `cuda_graphs`, CUDA graphs for decode (InvalidArgument when the device or
// the pool's dtype does not fit). The model and pool must outlive it.
absl::StatusOr<std::unique_ptr<Worker>> MakeWorker(const Device& device, const model::Model& model,
                                                   cache::BlockPool& pool,
                                                   const WorkerOptions& host = {},
                                                   const model::ForwardLimits& limits = {},
                                                   bool cuda_graphs = true);

// The KV pool bytes that keep this process within `fraction` of the GPU's memory (vLLM's
// --gpu-memory-utilization): fraction x total, less what is in use now (other processes, this
// process's CUDA context), less what the CUDA worker takes besides the pool (weights,
// activations for `limits`, workspaces). InvalidArgument on cpu, for a fraction outside (0, 1],
// or in a build without CUDA; ResourceExhausted, with the numbers, when nothing is left.
absl::StatusOr<int64_t> KvBytesForGpuMemory(const Device& device, const model::Model& model,
                                            double fraction, const model::ForwardLimits& limits);

}  // namespace winnow::scheduler
