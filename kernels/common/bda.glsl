// Buffer device addresses: every kernel takes its buffers as 64-bit addresses in push constants,
// so a KV array may exceed the 4 GiB (NVIDIA) or 128 MiB (lavapipe) limit of a storage-buffer
// binding, and no descriptor sets are needed.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

layout(buffer_reference, std430, buffer_reference_align = 4) buffer U32Ref { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer I32Ref { int v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer F32Ref { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer U32x4Ref { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer U64Ref { uint64_t v[]; };

// An address plus a byte offset (offsets may pass 4 GiB).
uint64_t at(uint64_t base, uint64_t byte_offset) { return base + byte_offset; }
