// CudaDriver: the few CUDA driver calls kvtier makes to move blocks between its host memory and
// an engine's GPU, loaded from libcuda.so.1 at run time — kvtier builds without a CUDA toolkit and
// runs without a GPU; only an engine that hands it CUDA tensors loads the driver. The driver API
// (not the runtime) because every NVIDIA driver installs it, whichever CUDA torch was built for,
// and its streams and device pointers are the runtime's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace kvtier::cuda {

using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;
using CUdeviceptr = unsigned long long;

// The process's driver, loaded once. Thread-safe (the driver is).
class CudaDriver {
 public:
  // The driver, or an error saying why it could not be loaded (no libcuda.so.1, no GPU).
  static Result<const CudaDriver*> get();

  // A Status for a failed call: "cuMemHostRegister: out of memory (2)".
  Status check(CUresult r, std::string_view call) const;

  CUresult (*cuInit)(unsigned flags) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int ordinal) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuCtxPushCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxPopCurrent)(CUcontext*) = nullptr;
  CUresult (*cuMemHostRegister)(void*, size_t, unsigned flags) = nullptr;
  CUresult (*cuMemHostUnregister)(void*) = nullptr;
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned flags) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuEventQuery)(CUevent) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent) = nullptr;
  CUresult (*cuEventDestroy)(CUevent) = nullptr;

  static constexpr CUresult kSuccess = 0;
  static constexpr CUresult kNotReady = 600;
  static constexpr CUresult kHostMemoryAlreadyRegistered = 712;
  static constexpr unsigned kHostRegisterPortable = 1;
  static constexpr unsigned kHostRegisterDeviceMap = 2;
  static constexpr unsigned kEventDisableTiming = 2;

 private:
  CudaDriver() = default;
  Status load();
};

// Makes device `ordinal`'s primary context (the one torch and the CUDA runtime use) current on
// this thread for the scope, so the calls in it find it whichever thread runs them.
class ScopedDeviceContext {
 public:
  static Result<ScopedDeviceContext> enter(const CudaDriver& driver, int ordinal);
  ~ScopedDeviceContext();
  ScopedDeviceContext(ScopedDeviceContext&& other) noexcept : driver_(other.driver_) { other.driver_ = nullptr; }
  ScopedDeviceContext(const ScopedDeviceContext&) = delete;
  ScopedDeviceContext& operator=(const ScopedDeviceContext&) = delete;
  ScopedDeviceContext& operator=(ScopedDeviceContext&&) = delete;

 private:
  explicit ScopedDeviceContext(const CudaDriver* driver) : driver_(driver) {}
  const CudaDriver* driver_;
};

}  // namespace kvtier::cuda
