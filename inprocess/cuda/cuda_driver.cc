#include "inprocess/cuda/cuda_driver.h"

#include <dlfcn.h>

#include <map>
#include <mutex>
#include <string>

namespace kvtier::cuda {
namespace {

template <typename F>
Status bind(void* lib, F*& fn, const char* name) {
  fn = reinterpret_cast<F*>(dlsym(lib, name));
  if (fn == nullptr) return unavailable(std::string("libcuda.so.1 has no ") + name + " (driver too old?)");
  return ok_status();
}

}  // namespace

Status CudaDriver::load() {
  // Never closed: the driver stays loaded for the process, as torch keeps it.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return unavailable(std::string("cannot load the CUDA driver: ") + dlerror());
  // The _v2 entry points are the ones with 64-bit sizes and pointers; the plain names are the
  // 32-bit ABI kept for old binaries.
  KVTIER_RETURN_IF_ERROR(bind(lib, cuInit, "cuInit"));
  KVTIER_RETURN_IF_ERROR(bind(lib, cuGetErrorString, "cuGetErrorString"));
  KVTIER_RETURN_IF_ERROR(bind(lib, cuDeviceGet, "cuDeviceGet"));
  KVTIER_RETURN_IF_ERROR(bind(lib, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"));
  KVTIER_RETURN_IF_ERROR(bind(lib, cuCtxPushCurrent, "cuCtxPushCurrent_v2"));
  KVTIER_RETURN_IF_ERROR(bind(lib, cuCtxPopCurrent, "cuCtxPopCurrent_v2"));
  KVTIER_RETURN_IF_ERROR(bind(lib, cuMemHostRegister, "cuMemHostRegister_v2"));
  KVTIER_RETURN_IF_ERROR(bind(lib, cuMemHostUnregister, "cuMemHostUnregister"));
  KVTIER_RETURN_IF_ERROR(bind(lib, cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"));
  KVTIER_RETURN_IF_ERROR(bind(lib, cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"));
  KVTIER_RETURN_IF_ERROR(bind(lib, cuStreamSynchronize, "cuStreamSynchronize"));
  KVTIER_RETURN_IF_ERROR(bind(lib, cuEventCreate, "cuEventCreate"));
  KVTIER_RETURN_IF_ERROR(bind(lib, cuEventRecord, "cuEventRecord"));
  KVTIER_RETURN_IF_ERROR(bind(lib, cuEventQuery, "cuEventQuery"));
  KVTIER_RETURN_IF_ERROR(bind(lib, cuEventSynchronize, "cuEventSynchronize"));
  KVTIER_RETURN_IF_ERROR(bind(lib, cuEventDestroy, "cuEventDestroy_v2"));
  return check(cuInit(0), "cuInit");
}

Result<const CudaDriver*> CudaDriver::get() {
  static CudaDriver driver;
  static Status loaded;
  static std::once_flag once;
  std::call_once(once, [] { loaded = driver.load(); });
  if (!loaded.ok()) return loaded;
  return &driver;
}

Status CudaDriver::check(CUresult r, std::string_view call) const {
  if (r == kSuccess) return ok_status();
  const char* text = nullptr;
  if (cuGetErrorString == nullptr || cuGetErrorString(r, &text) != kSuccess || text == nullptr) text = "unknown error";
  return internal_error(std::string(call) + ": " + text + " (" + std::to_string(r) + ")");
}

Result<ScopedDeviceContext> ScopedDeviceContext::enter(const CudaDriver& d, int ordinal) {
  // Retained once per device and never released: torch holds the same primary context for the
  // process's life.
  static std::mutex mu;
  static std::map<int, CUcontext> contexts;
  CUcontext ctx = nullptr;
  {
    std::lock_guard lock(mu);
    auto it = contexts.find(ordinal);
    if (it == contexts.end()) {
      CUdevice dev = 0;
      KVTIER_RETURN_IF_ERROR(d.check(d.cuDeviceGet(&dev, ordinal), "cuDeviceGet"));
      KVTIER_RETURN_IF_ERROR(d.check(d.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain"));
      it = contexts.emplace(ordinal, ctx).first;
    }
    ctx = it->second;
  }
  KVTIER_RETURN_IF_ERROR(d.check(d.cuCtxPushCurrent(ctx), "cuCtxPushCurrent"));
  return ScopedDeviceContext(&d);
}

ScopedDeviceContext::~ScopedDeviceContext() {
  if (driver_ == nullptr) return;
  CUcontext popped = nullptr;
  driver_->cuCtxPopCurrent(&popped);
}

}  // namespace kvtier::cuda
