#version 460
// reshape_and_cache: writes new tokens' K and V, [num_tokens, num_kv_heads, head_dim] in
// `in_dtype`, into the paged arrays [num_blocks, block_size, num_kv_heads, head_dim] in
// `cache_dtype`, token t going to slot slot_mapping[t] (block = slot / block_size); slot -1 skips.
// One invocation per pair of elements (head_dim is even), so a 16-bit cache is written in whole
// 32-bit words. Same dtypes copy the bits (NaN payloads survive); f32 -> 16-bit rounds to nearest
// even exactly as serialize/ does.
#extension GL_GOOGLE_include_directive : require
#include "common/bda.glsl"
#include "common/dtype.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform Params {
  uint64_t key;           // [num_tokens, num_kv_heads, head_dim], in_dtype
  uint64_t value;
  uint64_t k_cache;       // [num_blocks, block_size, num_kv_heads, head_dim], cache_dtype
  uint64_t v_cache;
  uint64_t slot_mapping;  // i32 [num_tokens]
  uint num_tokens;
  uint num_kv_heads;
  uint head_dim;
  uint in_dtype;
  uint cache_dtype;
} pc;

// Raw bits of elements i and i+1 (i even) of an array, as a pair of 32-bit values.
uvec2 load_pair_bits(uint64_t base, uint dt, uint64_t i) {
  if (dt == DT_F32) {
    F32Ref r = F32Ref(base + i * 4);
    return uvec2(floatBitsToUint(r.v[0]), floatBitsToUint(r.v[1]));
  }
  uint w = U32Ref(base + i * 2).v[0];
  return uvec2(w & 0xffffu, w >> 16);
}

float bits_to_f32(uint bits, uint dt) {
  if (dt == DT_F32) return uintBitsToFloat(bits);
  return dt == DT_BF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
}

void store_pair(uint64_t base, uint dt, uint64_t i, uvec2 bits, uint src_dt) {
  if (src_dt == dt) {
    if (dt == DT_F32) {
      F32Ref r = F32Ref(base + i * 4);
      r.v[0] = uintBitsToFloat(bits.x);
      r.v[1] = uintBitsToFloat(bits.y);
    } else {
      U32Ref(base + i * 2).v[0] = bits.x | (bits.y << 16);
    }
    return;
  }
  float a = bits_to_f32(bits.x, src_dt), b = bits_to_f32(bits.y, src_dt);
  if (dt == DT_F32) {
    F32Ref r = F32Ref(base + i * 4);
    r.v[0] = a;
    r.v[1] = b;
  } else {
    U32Ref(base + i * 2).v[0] = to_dtype_bits(a, dt) | (to_dtype_bits(b, dt) << 16);
  }
}

void main() {
  const uint pairs_per_token = pc.num_kv_heads * pc.head_dim / 2;
  const uint p = gl_GlobalInvocationID.x;
  if (p >= pc.num_tokens * pairs_per_token) return;
  const uint t = p / pairs_per_token;
  const uint within = (p % pairs_per_token) * 2;  // h * head_dim + d
  const int slot = I32Ref(pc.slot_mapping).v[t];
  if (slot < 0) return;
  const uint64_t src = uint64_t(t) * (pc.num_kv_heads * pc.head_dim) + within;
  const uint64_t dst = uint64_t(slot) * (pc.num_kv_heads * pc.head_dim) + within;
  store_pair(pc.k_cache, pc.cache_dtype, dst, load_pair_bits(pc.key, pc.in_dtype, src), pc.in_dtype);
  store_pair(pc.v_cache, pc.cache_dtype, dst, load_pair_bits(pc.value, pc.in_dtype, src), pc.in_dtype);
}
