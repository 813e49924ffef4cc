// The binary data plane's frames: kvtierd's block routes (PUT, GET, batch GET, DELETE) as
// fixed-size little-endian headers followed by raw bytes, on a port of their own beside HTTP.
// A block moves with one 48-byte header and one scatter/gather write, not HTTP's header text and
// 4 KiB reads. docs/wire-protocol.md describes every byte; this file is its code.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "base/status.h"
#include "serialize/block_hash.h"

namespace kvtier::wire {

inline constexpr uint32_t kMagic = 0x3154564b;  // the bytes "KVT1"
inline constexpr size_t kRequestHeaderBytes = 48;
inline constexpr size_t kResponseHeaderBytes = 16;
// A response body_len that means "one item per requested hash follows" (batch GET streams).
inline constexpr uint64_t kStreamedBody = ~0ull;
inline constexpr size_t kMaxNamespaceBytes = 1024;
inline constexpr size_t kMaxKeyBytes = 4096;
inline constexpr size_t kMaxBatchHashes = 1u << 20;

enum class Op : uint8_t {
  kHello = 1,     // body: the API key; authenticates the connection
  kPut = 2,       // body: a block document stored under `hash`
  kGet = 3,       // response body: the block document
  kBatchGet = 4,  // body: 32-byte hashes; response: per hash an 8-byte length and the document
  kDelete = 5,
};
const char* op_name(Op op);

struct RequestHeader {
  Op op = Op::kGet;
  uint16_t namespace_bytes = 0;  // the namespace's UTF-8 bytes follow the header
  uint64_t body_bytes = 0;       // then this many bytes of body
  BlockHash hash;                // zero where the op takes none
};

struct ResponseHeader {
  uint16_t status = 200;  // HTTP's numbers: 200, 201, 204, 400, 401, 403, 404, 409, 413, 422, 503, 507
  uint64_t body_bytes = 0;  // an error's body is the HTTP API's JSON error
};

std::array<uint8_t, kRequestHeaderBytes> encode(const RequestHeader& h);
std::array<uint8_t, kResponseHeaderBytes> encode(const ResponseHeader& h);
// kInvalidArgument for a wrong magic, an unknown op or a reserved byte that is not zero.
Result<RequestHeader> decode_request(std::span<const uint8_t, kRequestHeaderBytes> bytes);
Result<ResponseHeader> decode_response(std::span<const uint8_t, kResponseHeaderBytes> bytes);

}  // namespace kvtier::wire
