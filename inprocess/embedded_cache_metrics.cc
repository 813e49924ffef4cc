// EmbeddedCache's metrics: the door's own counters, the CUDA transfers', then every tier's, as JSON
// and as Prometheus text.
#include <mutex>
#include <utility>

#include "base/metrics/metrics_exporters.h"
#include "cache/cache_stack.h"
#include "inprocess/cuda/cuda_host_pinning.h"
#include "inprocess/embedded_cache.h"
#include "inprocess/embedded_cache_impl.h"

namespace kvtier {

void EmbeddedCache::Impl::visit_metrics(MetricVisitor& v) {
  const EmbeddedCacheMetrics& m = metrics;
  v.counter("kvtier_embedded_rejected_calls_total",
            "Calls refused for bad input (shape, dtype, tokens, ids)", {},
            m.rejected_calls.value());
  v.counter("kvtier_embedded_blocks_total", "Blocks offered by the engine, by outcome",
            {{"outcome", "stored"}}, m.stored_blocks.value());
  v.counter("kvtier_embedded_blocks_total", "Blocks offered by the engine, by outcome",
            {{"outcome", "already_cached"}}, m.already_cached.value());
  v.counter("kvtier_embedded_blocks_total", "Blocks offered by the engine, by outcome",
            {{"outcome", "refused"}}, m.refused_blocks.value());
  v.counter("kvtier_embedded_loaded_blocks_total", "Blocks copied into the engine's tensors", {},
            m.loaded_blocks.value());
  v.counter("kvtier_embedded_fetched_blocks_total", "Blocks handed out as views", {},
            m.fetched_blocks.value());
  v.counter("kvtier_embedded_bytes_in_total", "KV bytes copied in from the engine", {},
            m.bytes_in.value());
  v.counter("kvtier_embedded_bytes_out_total", "KV bytes copied out to the engine", {},
            m.bytes_out.value());
  {
    std::lock_guard lock(device_mu);
    const cuda::DeviceTransferMetrics* d = device ? &device->metrics() : nullptr;
    const char* help =
        "KV bytes moved between kvtier's host memory and an engine's CUDA memory (by DMA, or read "
        "in place by its GPU)";
    v.counter("kvtier_embedded_cuda_bytes_total", help, {{"direction", "to_device"}},
              d ? d->bytes_to_device.value() : 0);
    v.counter("kvtier_embedded_cuda_bytes_total", help, {{"direction", "from_device"}},
              d ? d->bytes_from_device.value() : 0);
    v.counter("kvtier_embedded_cuda_unpinned_copies_total",
              "CUDA copies of host bytes that were not page-locked (bounce-buffered by the driver)",
              {}, d ? d->unpinned_copies.value() : 0);
    v.counter("kvtier_embedded_cuda_copies_total",
              "DMA calls between kvtier's host memory and an engine's CUDA memory (blocks lying "
              "side by side go as one)",
              {}, d ? d->copies.value() : 0);
    v.counter("kvtier_embedded_cuda_failures_total",
              "CUDA transfers that failed (no driver, a driver error), other than bad input", {},
              metrics.cuda_failures.value());
    for (const auto& [path, count] :
         {std::pair{"slot_kernel", &metrics.cuda_fallback_slot_kernel},
          std::pair{"read_in_place", &metrics.cuda_fallback_read_in_place},
          std::pair{"graph_capture", &metrics.cuda_fallback_graph_capture}}) {
      v.counter("kvtier_embedded_cuda_fallbacks_total",
                "Times the CUDA door gave up a fast path for a slower one that moves the same bits",
                {{"path", path}}, count->value());
    }
    v.gauge("kvtier_embedded_cuda_pinned_bytes",
            "Host memory page-locked for CUDA copies (process-wide)", {},
            static_cast<double>(cuda::CudaHostPinning::instance().registered_bytes()));
    v.counter("kvtier_embedded_cuda_pin_failures_total",
              "Host chunks the CUDA driver would not page-lock (process-wide): their copies go "
              "through its bounce buffer, and layerwise loads from them are copied instead",
              {}, cuda::CudaHostPinning::instance().failed_registrations());
    v.gauge("kvtier_embedded_cuda_chunks_queued",
            "Host chunks waiting for kvtier's thread to page-lock them", {},
            static_cast<double>(cuda::CudaHostPinning::instance().queued_chunks()));
  }
  stack->visit_metrics(v);
  if (hybrid) hybrid->visit_metrics(v);
}

Result<std::string> EmbeddedCache::stats_json() const {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter());
  JsonMetricsWriter w;
  visit_metrics(w);
  return w.json().dump();
}

Result<std::string> EmbeddedCache::metrics_text() const {
  KVTIER_ASSIGN_OR_RETURN(auto call, enter());
  PrometheusTextWriter w;
  visit_metrics(w);
  return w.text();
}

}  // namespace kvtier
