#include "serialize/block.h"

#include <cassert>
#include <cstring>

#include "serialize/affine_quant.h"

namespace kvtier {

namespace {
// Parts start on 16-byte boundaries. A dense tensor is always a multiple of 16 bytes (head_dim is
// a multiple of 8 elements of >= 2 bytes), so dense layers pack without gaps.
constexpr size_t kPartAlign = 16;
}  // namespace

Block::Block(std::shared_ptr<const KvLayout> layout, BlockIdentity id, LayerForms forms,
             bool zeroed, bool allocate)
    : layout_(std::move(layout)),
      id_(std::move(id)),
      forms_(std::move(forms)),
      dequantized_from_(layout_->num_layers) {
  const size_t n = layout_->elements_per_tensor();
  size_t off = 0;
  slots_.resize(2 * layout_->num_layers);
  for (int l = 0; l < layout_->num_layers; ++l) {
    const size_t esz = dtype_size(layout_->layers[l].dtype);
    for (int p = 0; p < 2; ++p) {
      Slot& s = slots_[2 * l + p];
      if (!forms_[l]) {
        s.offset = off;
        s.bytes = n * esz;
        off = align_up(off + s.bytes, kPartAlign);
      } else {
        QuantizedSizes qs = quantized_sizes(n, *forms_[l]);
        s.offset = off;
        s.bytes = qs.packed_words * 4;
        off = align_up(off + s.bytes, kPartAlign);
        s.scales_offset = off;
        s.scales_bytes = qs.groups * esz;
        off = align_up(off + s.scales_bytes, kPartAlign);
        s.biases_offset = off;
        s.biases_bytes = qs.groups * esz;
        off = align_up(off + s.biases_bytes, kPartAlign);
      }
    }
  }
  size_ = off;
  if (allocate) storage_ = AlignedBuffer(off, AlignedBuffer::kDefaultAlignment, zeroed);
}

Block Block::dense(std::shared_ptr<const KvLayout> layout, BlockIdentity id) {
  LayerForms forms(layout->num_layers);
  return Block(std::move(layout), std::move(id), std::move(forms));
}

Block Block::dense_uninitialized(std::shared_ptr<const KvLayout> layout, BlockIdentity id) {
  LayerForms forms(layout->num_layers);
  return Block(std::move(layout), std::move(id), std::move(forms), /*zeroed=*/false);
}

Block Block::adopt_dense(std::shared_ptr<const KvLayout> layout, BlockIdentity id,
                         AlignedBuffer storage, size_t offset) {
  LayerForms forms(layout->num_layers);
  // Lays out the slots without allocating (an empty buffer), then takes the record's storage.
  Block b(std::move(layout), std::move(id), std::move(forms), /*zeroed=*/false, /*allocate=*/false);
  assert(offset + b.size_ <= storage.size());
  b.storage_ = std::move(storage);
  b.offset_ = offset;
  return b;
}

Result<Block> Block::with_forms(std::shared_ptr<const KvLayout> layout, BlockIdentity id,
                                LayerForms forms) {
  if (static_cast<int>(forms.size()) != layout->num_layers) {
    return invalid_argument("block forms: " + std::to_string(forms.size()) + " entries for " +
                            std::to_string(layout->num_layers) + " layers");
  }
  for (size_t l = 0; l < forms.size(); ++l) {
    if (forms[l]) {
      KVTIER_RETURN_IF_ERROR(validate_quantization(*forms[l], layout->head_dim)
                                 .with_context("layer " + std::to_string(l)));
    }
  }
  return Block(std::move(layout), std::move(id), std::move(forms));
}

bool Block::any_quantized() const {
  for (const auto& f : forms_) {
    if (f) return true;
  }
  return false;
}

std::span<const uint8_t> Block::dense_part(int layer, KvPart part) const {
  const Slot& s = slots_[2 * layer + static_cast<int>(part)];
  return {base() + s.offset, s.bytes};
}

std::span<uint8_t> Block::dense_part(int layer, KvPart part) {
  const Slot& s = slots_[2 * layer + static_cast<int>(part)];
  return {base() + s.offset, s.bytes};
}

QuantizedParts<const uint8_t> Block::quantized_part(int layer, KvPart part) const {
  const Slot& s = slots_[2 * layer + static_cast<int>(part)];
  const uint8_t* d = base();
  return {{d + s.offset, s.bytes}, {d + s.scales_offset, s.scales_bytes},
          {d + s.biases_offset, s.biases_bytes}};
}

QuantizedParts<uint8_t> Block::quantized_part(int layer, KvPart part) {
  const Slot& s = slots_[2 * layer + static_cast<int>(part)];
  uint8_t* d = base();
  return {{d + s.offset, s.bytes}, {d + s.scales_offset, s.scales_bytes},
          {d + s.biases_offset, s.biases_bytes}};
}

Block Block::dequantized() const {
  Block out = Block::dense_uninitialized(layout_, id_);
  for (int l = 0; l < layout_->num_layers; ++l) {
    const DType dt = layout_->layers[l].dtype;
    for (KvPart p : {KvPart::kK, KvPart::kV}) {
      if (!forms_[l]) {
        auto src = dense_part(l, p);
        std::memcpy(out.dense_part(l, p).data(), src.data(), src.size());
        continue;
      }
      auto q = quantized_part(l, p);
      std::span<const uint32_t> words(reinterpret_cast<const uint32_t*>(q.packed.data()),
                                      q.packed.size() / 4);
      // Sizes come from this block's own slots, so the size checks cannot fail here.
      [[maybe_unused]] Status st =
          affine_dequantize(dt, *forms_[l], words, q.scales, q.biases, out.dense_part(l, p));
      assert(st.ok());
    }
    out.dequantized_from_[l] = forms_[l] ? forms_[l] : dequantized_from_[l];
  }
  return out;
}

Result<Block> Block::quantized(const Quantization& q) const {
  LayerForms forms(layout_->num_layers);
  for (int l = 0; l < layout_->num_layers; ++l) forms[l] = forms_[l] ? forms_[l] : q;
  KVTIER_ASSIGN_OR_RETURN(Block out, with_forms(layout_, id_, forms));
  for (int l = 0; l < layout_->num_layers; ++l) {
    const DType dt = layout_->layers[l].dtype;
    for (KvPart p : {KvPart::kK, KvPart::kV}) {
      auto dst = out.quantized_part(l, p);
      if (forms_[l]) {
        auto src = quantized_part(l, p);
        std::memcpy(dst.packed.data(), src.packed.data(), src.packed.size());
        std::memcpy(dst.scales.data(), src.scales.data(), src.scales.size());
        std::memcpy(dst.biases.data(), src.biases.data(), src.biases.size());
        continue;
      }
      std::span<uint32_t> words(reinterpret_cast<uint32_t*>(dst.packed.data()),
                                dst.packed.size() / 4);
      KVTIER_RETURN_IF_ERROR(affine_quantize(dt, dense_part(l, p), q, words, dst.scales, dst.biases)
                                 .with_context("layer " + std::to_string(l)));
    }
  }
  return out;
}

Block Block::clone() const {
  Block out(layout_, id_, forms_);
  out.dequantized_from_ = dequantized_from_;
  std::memcpy(out.base(), base(), size_);
  return out;
}

}  // namespace kvtier
