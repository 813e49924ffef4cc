// ValidationMessenger: Khronos's validation layer, on request (KVTIER_VK_VALIDATION=1), with its
// reports counted and logged. Its thread-safety checks see a Vulkan object used from two threads
// without the external synchronization the spec asks for — the shared-command-pool bug crashed the
// NVIDIA driver yet ran clean on lavapipe, where only the layer can see it. Tests run the engine's
// concurrency tests with it and require zero errors.
#pragma once

#include <vulkan/vulkan.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "base/log.h"
#include "base/status.h"

namespace kvtier {

// Thread-safe (the layer calls back from whichever thread broke a rule).
class ValidationMessenger {
 public:
  // kUnavailable when the layer (Debian: vulkan-validationlayers) or VK_EXT_debug_utils is
  // missing: asked-for validation that silently did not run would pass every test.
  static Status check_available();
  // What vkCreateInstance must enable, and the create-info to chain into it so that instance
  // creation itself is checked.
  static std::vector<const char*> layers();
  static std::vector<const char*> extensions();
  VkDebugUtilsMessengerCreateInfoEXT create_info();

  ValidationMessenger() = default;
  ValidationMessenger(const ValidationMessenger&) = delete;
  ValidationMessenger& operator=(const ValidationMessenger&) = delete;
  ~ValidationMessenger();

  // Registers with `instance` (after vkCreateInstance); reports go to this object until it dies,
  // which must happen before vkDestroyInstance.
  Status attach(VkInstance instance);

  // Reports of severity error: broken rules (thread-safety ones included).
  uint64_t errors() const { return errors_.load(); }
  uint64_t warnings() const { return warnings_.load(); }

 private:
  static VkBool32 VKAPI_PTR on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                       VkDebugUtilsMessageTypeFlagsEXT types,
                                       const VkDebugUtilsMessengerCallbackDataEXT* data, void* self);

  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> warnings_{0};
  LogThrottle log_;  // a broken rule repeats per call: the first at once, then one line a second
};

}  // namespace kvtier
