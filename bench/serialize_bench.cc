// serialize_bench: encode and decode speed of the block format per codec, for one Llama-3-8B
// block (16 tokens, bf16, 2 MiB), against memcpy of the same bytes in the same run; and the LZ4
// ratio with and without byte shuffle on KV-like bf16 data (sinusoids plus noise per channel).
#include <chrono>
#include <cstring>
#include <iostream>
#include <vector>

#include "base/byte_size.h"
#include "base/memory/memory_policy.h"
#include "bench/harness/bench_report.h"
#include "serialize/format/block_codec.h"
#include "tests/support/test_blocks.h"

using namespace kvtier;
using namespace kvtier::bench;

int main() {
  keep_freed_block_memory();
  LayoutRegistry registry;
  auto layout = *registry.add(*layout_preset("llama-3-8b"));
  Block block = testing::make_block(layout, 1, testing::Values::kKvLike);
  const double bytes = static_cast<double>(block.data().size());

  std::vector<uint8_t> copy_dst(block.data().size());
  Timing memcpy_t = time_calls([&] {
    std::memcpy(copy_dst.data(), block.data().data(), block.data().size());
    asm volatile("" ::"r"(copy_dst.data()) : "memory");
  });
  const double memcpy_gbps = bytes / memcpy_t.median_s / 1e9;

  Report report("serialize_bench: Llama-3-8B block (16 tokens x 32 layers x 8 kv heads x 128, bf16, " +
                    format_byte_size(block.data().size()) + ")",
                {"path", "median us", "GB/s", "vs memcpy", "stored/raw"});
  report.set_meta("machine", machine_description());
  report.set_meta("method", "median of 9 samples of >=100 ms each; GB/s of block data");
  report.set_meta("checksum", std::string("xxh3-64, ") + checksum64_implementation());
  report.add_row({"memcpy (reference)", fmt_double(memcpy_t.median_s * 1e6, 1),
                  fmt_double(memcpy_gbps), "1.00", ""});

  for (FrameCodec c : {FrameCodec::kNone, FrameCodec::kLz4, FrameCodec::kLz4Shuffle}) {
    BlockCodec codec(c);
    Bytes frame;
    frame.reserve(max_frame_size(block.data().size() + 65536, c));
    Timing enc = time_calls([&] {
      if (!codec.encode(block, frame).ok()) std::abort();
    });
    Timing dec = time_calls([&] {
      auto r = codec.decode(frame, registry);
      if (!r.ok()) std::abort();
    });
    const double enc_gbps = bytes / enc.median_s / 1e9;
    const double dec_gbps = bytes / dec.median_s / 1e9;
    const double both_gbps = bytes / (enc.median_s + dec.median_s) / 1e9;
    const std::string ratio = fmt_double(static_cast<double>(frame.size()) / bytes, 3);
    const std::string name(frame_codec_name(c));
    report.add_row({name + " encode", fmt_double(enc.median_s * 1e6, 1), fmt_double(enc_gbps),
                    fmt_double(enc_gbps / memcpy_gbps), ratio});
    report.add_row({name + " decode", fmt_double(dec.median_s * 1e6, 1), fmt_double(dec_gbps),
                    fmt_double(dec_gbps / memcpy_gbps), ratio});
    report.add_row({name + " encode+decode", fmt_double((enc.median_s + dec.median_s) * 1e6, 1),
                    fmt_double(both_gbps), fmt_double(both_gbps / memcpy_gbps), ratio});
  }
  // The SSD read path does not copy: the frame is read (O_DIRECT) into an aligned buffer that the
  // decoded block adopts, so decoding is the checksum and the header checks. Frames read from disk
  // are not in cache; neither are these (a fresh buffer per call, filled outside the timing).
  {
    BlockCodec codec(FrameCodec::kNone);
    Bytes frame;
    if (!codec.encode(block, frame).ok()) std::abort();
    Timing enc = time_calls([&] {
      if (!codec.encode(block, frame).ok()) std::abort();
    });
    constexpr int kBatch = 48;
    std::vector<double> samples;
    for (int r = 0; r < 9; ++r) {
      std::vector<AlignedBuffer> buffers;
      for (int i = 0; i < kBatch; ++i) {
        buffers.emplace_back(frame.size(), 4096, /*zeroed=*/false);
        std::memcpy(buffers.back().data(), frame.data(), frame.size());
      }
      const auto t0 = std::chrono::steady_clock::now();
      for (auto& b : buffers) {
        auto d = codec.decode_owned(std::move(b), frame.size(), registry);
        if (!d.ok()) std::abort();
      }
      samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kBatch);
    }
    const double dec_s = percentile(samples, 0.5);
    const double dec_gbps = bytes / dec_s / 1e9, both_gbps = bytes / (enc.median_s + dec_s) / 1e9;
    report.add_row({"none decode, adopting (SSD read path)", fmt_double(dec_s * 1e6, 1), fmt_double(dec_gbps),
                    fmt_double(dec_gbps / memcpy_gbps), ""});
    report.add_row({"none encode + adopting decode", fmt_double((enc.median_s + dec_s) * 1e6, 1),
                    fmt_double(both_gbps), fmt_double(both_gbps / memcpy_gbps), ""});
  }
  // Small blocks: what the SSD read path spends per block beyond the bytes (the header's parse and
  // checks), for the tiny layout's 16 KiB blocks, against memcpy of the same 16 KiB.
  {
    auto tiny = *registry.add(*layout_preset("tiny"));
    Block small = testing::make_block(tiny, 2, testing::Values::kKvLike);
    BlockCodec codec(FrameCodec::kNone);
    Bytes frame;
    if (!codec.encode(small, frame).ok()) std::abort();
    std::vector<uint8_t> dst(small.data().size());
    Timing copy = time_calls([&] {
      std::memcpy(dst.data(), small.data().data(), small.data().size());
      asm volatile("" ::"r"(dst.data()) : "memory");
    });
    AlignedBuffer buffer(frame.size(), 4096, false);
    Timing dec = time_calls([&] {
      AlignedBuffer b(frame.size(), 4096, false);
      std::memcpy(b.data(), frame.data(), frame.size());
      auto d = codec.decode_owned(std::move(b), frame.size(), registry);
      if (!d.ok()) std::abort();
    });
    const double tiny_bytes = static_cast<double>(small.data().size());
    report.add_row({"tiny 16 KiB: memcpy", fmt_double(copy.median_s * 1e6, 2), fmt_double(tiny_bytes / copy.median_s / 1e9), "", ""});
    report.add_row({"tiny 16 KiB: copy in + adopting decode", fmt_double(dec.median_s * 1e6, 2),
                    fmt_double(tiny_bytes / dec.median_s / 1e9), "", ""});
  }
  report.add_note("goal: uncompressed encode+decode >= 0.50 of memcpy");
  report.add_note("encode+decode = one block encoded then decoded: GB/s = bytes / (t_enc + t_dec)");
  report.print();
  report.write_json(output_path("serialize_bench.json"));
  return 0;
}
