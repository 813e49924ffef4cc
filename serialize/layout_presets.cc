// Layout presets for models people run. KV shapes from the models' published configs:
//   Qwen3-0.6B: 28 layers, 8 KV heads, head_dim 128 (bf16 weights).
//   Llama-3-8B: 32 layers, 8 KV heads (GQA 32/8), head_dim 128.
#include <filesystem>

#include "serialize/kv_layout.h"

namespace kvtier {

Result<KvLayout> layout_preset(std::string_view name) {
  if (name == "qwen3-0.6b") return KvLayout::uniform("qwen3-0.6b", 28, 8, 128, 16, DType::kBF16);
  if (name == "llama-3-8b") return KvLayout::uniform("llama-3-8b", 32, 8, 128, 16, DType::kBF16);
  if (name == "tiny") return KvLayout::uniform("tiny", 2, 2, 64, 16, DType::kBF16);
  std::string known;
  for (const auto& n : layout_preset_names()) known += (known.empty() ? "" : ", ") + n;
  return not_found("unknown layout preset '" + std::string(name) + "' (known: " + known + ")");
}

std::vector<std::string> layout_preset_names() { return {"qwen3-0.6b", "llama-3-8b", "tiny"}; }

Result<KvLayout> resolve_layout(std::string_view preset_or_path) {
  auto preset = layout_preset(preset_or_path);
  if (preset.ok()) return preset;
  if (std::filesystem::exists(std::string(preset_or_path))) {
    return KvLayout::load_file(std::string(preset_or_path));
  }
  return preset.status();
}

}  // namespace kvtier
