#include "scheduler/device.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "scheduler/model_worker.h"
#include "spdlog/spdlog.h"

#if WINNOW_HAVE_CUDA
#include "kernels/cuda/device.h"
#include "model/cuda_model.h"
#endif

namespace winnow::scheduler {

std::string Device::ToString() const {
  return is_cuda() ? absl::StrCat("cuda:", index) : "cpu";
}

bool BuiltWithCuda() {
#if WINNOW_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  if (text == "cpu") return Device{};
  absl::string_view rest = text;
  if (!absl::ConsumePrefix(&rest, "cuda")) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be cpu, cuda or cuda:N (N a device ordinal); got '", text, "'"));
  }
  int32_t index = 0;
  if (!rest.empty()) {
    const bool digits = absl::ConsumePrefix(&rest, ":") && !rest.empty() &&
                        std::all_of(rest.begin(), rest.end(), absl::ascii_isdigit);
    if (!digits || !absl::SimpleAtoi(rest, &index)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "must be cpu, cuda or cuda:N with N a device ordinal >= 0; got '", text, "'"));
    }
  }
  return Device{Device::Kind::kCuda, index};
}

absl::Status CheckBuiltFor(const Device& device) {
  if (!device.is_cuda() || BuiltWithCuda()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "'", device.ToString(), "': this winnow was built without CUDA (no nvcc at configure "
      "time, or -DWINNOW_CUDA=OFF); only cpu is available"));
}

Device DefaultDevice() {
#if WINNOW_HAVE_CUDA
  if (!kernels::cuda::ListDevices().empty()) return Device{Device::Kind::kCuda, 0};
#endif
  return Device{};
}

std::string DescribeDevice(const Device& device) {
#if WINNOW_HAVE_CUDA
  for (const kernels::cuda::DeviceInfo& info : kernels::cuda::ListDevices()) {
    if (device.is_cuda() && info.index == device.index) {
      return absl::StrCat(device.ToString(), " (", info.name, ")");
    }
  }
#endif
  return device.ToString();
}

absl::StatusOr<kernels::KvDtype> KvDtypeFor(const Device& device,
                                            std::optional<kernels::KvDtype> given) {
  if (!device.is_cuda()) return given.value_or(kernels::KvDtype::kF16);
  if (!given.has_value() || *given == kernels::KvDtype::kBF16) return kernels::KvDtype::kBF16;
  return absl::InvalidArgumentError(absl::StrCat(
      kernels::KvDtypeName(*given), " does not run on device ", device.ToString(),
      ": the CUDA worker stores K/V as bf16; use bf16, or --device cpu"));
}

absl::StatusOr<std::unique_ptr<Worker>> MakeWorker(const Device& device, const model::Model& model,
                                                   cache::BlockPool& pool,
                                                   const WorkerOptions& host,
                                                   const model::ForwardLimits& limits,
                                                   bool cuda_graphs) {
  if (!device.is_cuda()) return MakeCpuWorker(model, pool, host);
#if WINNOW_HAVE_CUDA
  auto threads = std::make_unique<kernels::ThreadPool>(host.num_threads);
  WINNOW_ASSIGN_OR_RETURN(std::unique_ptr<model::CudaModel> cuda,
                          model::CudaModel::Create(model, pool, *threads, device.index, limits));
  cuda->set_cuda_graphs(cuda_graphs);
  return std::make_unique<ModelWorker>(model, pool, std::move(threads), std::move(cuda));
#else
  (void)cuda_graphs;
  return absl::InvalidArgumentError(
      absl::StrCat("device ", device.ToString(), ": this winnow was built without CUDA"));
#endif
}

absl::StatusOr<int64_t> KvBytesForGpuMemory(const Device& device, const model::Model& model,
                                            double fraction, const model::ForwardLimits& limits) {
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError("--gpu-memory-utilization applies to a cuda device only");
  }
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu-memory-utilization must be in (0, 1], got ", fraction));
  }
#if WINNOW_HAVE_CUDA
  WINNOW_ASSIGN_OR_RETURN(const kernels::cuda::DeviceMemory memory,
                          kernels::cuda::MemoryInfo(device.index));
  const int64_t in_use = memory.total_bytes - memory.free_bytes;
  const int64_t besides_kv = model::CudaModel::DeviceBytesBesidesKv(model, limits);
  const int64_t budget = static_cast<int64_t>(fraction * static_cast<double>(memory.total_bytes));
  const int64_t kv = budget - in_use - besides_kv;
  constexpr double kGiB = 1 << 30;
  if (kv <= 0) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "--gpu-memory-utilization %.2f of %s's %.1f GiB leaves no room for the KV cache: %.1f GiB "
        "already in use, %.1f GiB for weights, activations and workspaces",
        fraction, device.ToString(), memory.total_bytes / kGiB, in_use / kGiB,
        besides_kv / kGiB));
  }
  spdlog::info(
      "gpu memory: {:.2f} of {:.1f} GiB on {}: {:.1f} GiB in use before loading, {:.1f} GiB for "
      "weights, activations and workspaces, {:.1f} GiB for the KV cache",
      fraction, memory.total_bytes / kGiB, device.ToString(), in_use / kGiB, besides_kv / kGiB,
      kv / kGiB);
  return kv;
#else
  return absl::InvalidArgumentError(
      absl::StrCat("device ", device.ToString(), ": this winnow was built without CUDA"));
#endif
}

}  // namespace winnow::scheduler
