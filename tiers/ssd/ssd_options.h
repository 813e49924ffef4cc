// SsdTierOptions: how the SSD tier is set up (the server's --ssd-* flags map onto these).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "serialize/format/frame.h"

namespace kvtier {

struct SsdTierOptions {
  std::string dir;                          // turns the tier on (--ssd-cache-dir)
  // Several directories, one per drive (--ssd-cache-dir given more than once): StripedSsdTier
  // opens an SsdTier in each, splitting capacity_bytes and spill_queue_bytes evenly. Empty: `dir`.
  std::vector<std::string> dirs;
  uint64_t capacity_bytes = 64ull << 30;    // --ssd-capacity; at least two segments
  uint64_t segment_size = 256ull << 20;     // fixed for the life of a directory (MANIFEST.json)
  uint64_t spill_queue_bytes = 512ull << 20;
  FrameCodec codec = FrameCodec::kNone;     // --compression
  bool reinsert_read_blocks = true;         // move blocks read since they were written out of a
                                            // segment that is being reclaimed
  bool reset = false;                       // --ssd-reset: wipe the directory's cache on purpose
  bool direct_io = true;                    // O_DIRECT; falls back to buffered I/O with fdatasync
                                            // where the file system refuses it
  unsigned writer_queue_depth = 64;         // io_uring depth of the writer (>= 32)
  unsigned reader_queue_depth = 64;
  // Records adjacent on disk are read together in ops of up to this many bytes, then split (0:
  // one op per record). Off by default. On the H100 host's disk (ssd_bench, 16 KiB to 2 MiB
  // blocks) it cost 5-10% for short restores, two 128-block prefixes in flight (a record is then
  // verified only once its whole op is in), yet a 512-block fetch of 16 KiB blocks took ~15%
  // less time with 1 MiB ops. Either way the restore there waits on the disk, not the CPU.
  uint64_t coalesce_read_bytes = 0;
  // Segments written at once, write groups taking turns between them (each group stays in one, so
  // blocks spilled together stay back to back). Tried because a second directory (a second writer
  // and file) raised spill on the H100 host in every run; one run of 1/2/4 here was inconclusive
  // (0.94/0.69/0.98 of durable fio, each against its own noisy fio), so it stays at 1.
  unsigned active_segments = 1;
  size_t max_batch_items = 64;              // blocks per write batch (one submit, one fdatasync)
  uint64_t max_batch_bytes = 128ull << 20;  // also the bytes the writer keeps in flight
  // Batches whose writes or syncs may overlap. Measured on this project's ext4 VM disk (1024
  // Llama-3-8B blocks): 2 -> 1.10-1.39 GB/s, 4 -> 1.27, 8 -> 1.43.
  unsigned writer_groups_in_flight = 4;
  std::chrono::milliseconds drain_timeout{10000};  // close(): how long to keep writing the queue
  // Bytes a namespace may hold on the SSD (records, 4 KiB padded). A spill that would take its
  // namespace past its quota is refused (counted); the count is rebuilt from the index at open.
  std::map<std::string, uint64_t, std::less<>> namespace_quotas;
};

}  // namespace kvtier
