// The compiled kernels: SPIR-V of every kernels/<folder>/*.comp, embedded at build time, by
// kernel name ("paged_attention_decode"). Empty span for an unknown name.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace kvtier {

std::span<const uint32_t> spirv_for(std::string_view kernel);

}  // namespace kvtier
