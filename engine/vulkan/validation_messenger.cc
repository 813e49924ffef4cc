#include "engine/vulkan/validation_messenger.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace kvtier {
namespace {

constexpr const char* kLayer = "VK_LAYER_KHRONOS_validation";

}  // namespace

Status ValidationMessenger::check_available() {
  uint32_t n = 0;
  vkEnumerateInstanceLayerProperties(&n, nullptr);
  std::vector<VkLayerProperties> layers(n);
  vkEnumerateInstanceLayerProperties(&n, layers.data());
  for (const VkLayerProperties& l : layers) {
    if (std::strcmp(l.layerName, kLayer) == 0) return ok_status();
  }
  return unavailable(std::string("KVTIER_VK_VALIDATION=1 but ") + kLayer +
                     " is not installed (Debian: vulkan-validationlayers)");
}

std::vector<const char*> ValidationMessenger::layers() { return {kLayer}; }

std::vector<const char*> ValidationMessenger::extensions() { return {VK_EXT_DEBUG_UTILS_EXTENSION_NAME}; }

VkDebugUtilsMessengerCreateInfoEXT ValidationMessenger::create_info() {
  VkDebugUtilsMessengerCreateInfoEXT ci{.sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
  ci.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  ci.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT;
  ci.pfnUserCallback = &ValidationMessenger::on_message;
  ci.pUserData = this;
  return ci;
}

Status ValidationMessenger::attach(VkInstance instance) {
  auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
      vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT"));
  if (!create) return unavailable("validation: vkCreateDebugUtilsMessengerEXT is missing");
  const VkDebugUtilsMessengerCreateInfoEXT ci = create_info();
  if (VkResult r = create(instance, &ci, nullptr, &messenger_); r != VK_SUCCESS) {
    return unavailable("validation: vkCreateDebugUtilsMessengerEXT failed (" + std::to_string(r) + ")");
  }
  instance_ = instance;
  spdlog::info("Vulkan validation on ({}, thread-safety checks included)", kLayer);
  return ok_status();
}

ValidationMessenger::~ValidationMessenger() {
  if (!messenger_) return;
  auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
      vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
  if (destroy) destroy(instance_, messenger_, nullptr);
}

VkBool32 VKAPI_PTR ValidationMessenger::on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                   VkDebugUtilsMessageTypeFlagsEXT,
                                                   const VkDebugUtilsMessengerCallbackDataEXT* data, void* self) {
  auto* m = static_cast<ValidationMessenger*>(self);
  const bool error = severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  (error ? m->errors_ : m->warnings_).fetch_add(1);
  if (auto n = m->log_.admit()) {
    const char* id = data && data->pMessageIdName ? data->pMessageIdName : "?";
    const char* text = data && data->pMessage ? data->pMessage : "";
    if (error) spdlog::error("Vulkan validation: [{}] {}", id, text);
    else spdlog::warn("Vulkan validation: [{}] {}", id, text);
  }
  return VK_FALSE;  // the call goes on, as it would without the layer
}

}  // namespace kvtier
