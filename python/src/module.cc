// _kvtier: the thin C extension under `import kvtier`. It converts arguments, releases the GIL
// around every call into the cache (hashing, I/O, copies) and turns a Status into the exception a
// Python user expects. Names, defaults and docstrings live in the pure-Python layer (kvtier/).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <nlohmann/json.hpp>

#include "base/byte_size.h"
#include "base/log.h"
#include "inprocess/embedded_cache.h"
#include "python/src/tensor_export.h"
#include "python/src/tensor_import.h"

namespace py = pybind11;

namespace kvtier::python {
namespace {

PyObject* g_cache_full_error = nullptr;
PyObject* g_collision_error = nullptr;

// kInvalidArgument and kFailedPrecondition (bad input, a closed cache) are ValueError; a hash
// collision is HashCollisionError (a ValueError); no room anywhere is CacheFullError; disk and
// data faults are OSError; a missing device is RuntimeError. While opening, a failed precondition
// is a directory another process holds: OSError.
[[noreturn]] void raise(const Status& st, bool opening = false) {
  PyObject* type = PyExc_RuntimeError;
  switch (st.code()) {
    case StatusCode::kInvalidArgument: type = PyExc_ValueError; break;
    case StatusCode::kFailedPrecondition: type = opening ? PyExc_OSError : PyExc_ValueError; break;
    case StatusCode::kConflict: type = g_collision_error; break;
    case StatusCode::kResourceExhausted: type = g_cache_full_error; break;
    case StatusCode::kNotFound:
    case StatusCode::kIoError:
    case StatusCode::kNoSpace:
    case StatusCode::kCorruption:
    case StatusCode::kAlreadyExists: type = PyExc_OSError; break;
    case StatusCode::kPermissionDenied: type = PyExc_PermissionError; break;
    default: break;
  }
  PyErr_SetString(type, st.message().c_str());
  throw py::error_already_set();
}

template <typename T>
T value_or_raise(Result<T> r) {
  if (!r.ok()) raise(r.status());
  return std::move(r).value();
}

std::optional<BlockHash> parse_parent(const py::object& parent) {
  if (parent.is_none()) return std::nullopt;
  if (py::isinstance<py::bytes>(parent)) {
    const std::string b = parent.cast<std::string>();
    if (b.size() != BlockHash::kSize) throw py::value_error("parent: a hash is 32 bytes");
    BlockHash h;
    std::memcpy(h.bytes.data(), b.data(), b.size());
    return h;
  }
  auto h = BlockHash::from_hex(parent.cast<std::string>());
  if (!h.ok()) throw py::value_error("parent: " + h.status().message());
  return *h;
}

// Runs `f` without the GIL; raises its error with the GIL back.
inline void value_or_raise(const Status& st) {
  if (!st.ok()) raise(st);
}

template <typename F>
auto call(F&& f) {
  auto r = [&] {
    py::gil_scoped_release nogil;
    return f();
  }();
  return value_or_raise(std::move(r));
}

std::vector<int64_t> import_ids(py::handle obj) {
  const std::vector<uint32_t> ids = import_tokens(obj, "block_ids", "block id");
  return {ids.begin(), ids.end()};
}

// The fetched blocks, as the Python layer reads them.
class Fetched {
 public:
  explicit Fetched(std::shared_ptr<FetchedBlocks> f) : f_(std::move(f)) {}
  size_t size() const { return f_->blocks().size(); }
  size_t matched_tokens() const { return f_->matched_tokens(); }
  py::tuple info(size_t i) const {
    const FetchedBlock& b = at(i);
    py::dict dq;
    for (size_t l = 0; l < b.dequantized_from.size(); ++l) {
      if (b.dequantized_from[l]) dq[py::int_(l)] = py::make_tuple(b.dequantized_from[l]->bits, b.dequantized_from[l]->group_size);
    }
    return py::make_tuple(b.hash.hex(), b.tier, b.tokens, dq);
  }
  BlockTensor tensor(size_t i, size_t layer, int part) const {
    const FetchedBlock& b = at(i);
    if (layer >= b.layers.size()) throw py::index_error("layer out of range");
    const LayerKv& kv = b.layers[layer];
    return BlockTensor(f_, &(part == 0 ? kv.k : kv.v).parts[0]);
  }
  void release_pins() { f_->release_pins(); }

 private:
  const FetchedBlock& at(size_t i) const {
    if (i >= size()) throw py::index_error("block index out of range");
    return f_->blocks()[i];
  }
  std::shared_ptr<FetchedBlocks> f_;
};

class PyCache {
 public:
  explicit PyCache(const EmbeddedCacheOptions& o) {
    Result<std::unique_ptr<EmbeddedCache>> c = [&] {
      py::gil_scoped_release nogil;  // opening recovers an SSD directory: real I/O
      return EmbeddedCache::open(o);
    }();
    if (!c.ok()) raise(c.status(), /*opening=*/true);
    cache_ = std::move(c).value();
  }

  std::string layout_json() const { return cache_->layout().to_json().dump(); }
  py::object hybrid_layout_json() const {
    const HybridLayout* h = cache_->hybrid_layout();
    return h ? py::object(py::str(h->to_json().dump())) : py::object(py::none());
  }

  py::object kv_events_endpoints() const {
    auto e = cache_->kv_events_endpoints();
    return e ? py::object(py::make_tuple(e->first, e->second)) : py::object(py::none());
  }

  bool store_state(py::handle tokens, const std::vector<std::string>& extra, py::handle state) {
    const std::vector<uint32_t> t = import_tokens(tokens, "tokens");
    std::vector<ImportedTensor> keep;
    const std::vector<LayerKv> views = import_block_layers(state, {}, keep);
    return call([&] { return cache_->store_state({t, extra}, std::span<const LayerKv>(views)); });
  }

  py::object fetch_state(py::handle tokens, const std::vector<std::string>& extra) {
    const std::vector<uint32_t> t = import_tokens(tokens, "tokens");
    std::optional<std::vector<uint8_t>> s = call([&] { return cache_->fetch_state({t, extra}); });
    if (!s) return py::none();
    return py::bytes(reinterpret_cast<const char*>(s->data()), s->size());
  }
  size_t block_bytes() const { return cache_->block_bytes(); }

  std::vector<std::string> block_hashes(py::handle tokens, const std::vector<std::string>& extra) {
    const std::vector<uint32_t> t = import_tokens(tokens, "tokens");
    std::vector<BlockHash> hashes = call([&] { return cache_->block_hashes({t, extra}); });
    std::vector<std::string> out;
    for (const BlockHash& h : hashes) out.push_back(h.hex());
    return out;
  }

  py::tuple lookup(py::handle tokens, const std::vector<std::string>& extra) {
    const std::vector<uint32_t> t = import_tokens(tokens, "tokens");
    PrefixMatch m = call([&] { return cache_->lookup({t, extra}); });
    py::list blocks;
    for (const auto& b : m.blocks) blocks.append(py::make_tuple(b.hash.hex(), b.tier));
    py::dict estimates;
    for (const auto& e : m.load_estimates) {
      estimates[py::str(e.tier)] = e.seconds ? py::object(py::float_(*e.seconds)) : py::object(py::none());
    }
    return py::make_tuple(m.matched_tokens, blocks, estimates);
  }

  py::tuple store(py::handle tokens, const py::object& parent, py::handle layers,
                  const std::vector<std::string>& extra, bool bf16_words) {
    const std::vector<uint32_t> t = import_tokens(tokens, "tokens");
    const std::optional<BlockHash> p = parse_parent(parent);
    std::vector<ImportedTensor> keep;
    const std::vector<LayerKv> views = import_block_layers(layers, {bf16_words}, keep);
    StoreResult r = call([&] { return cache_->store({t, extra}, p, views); });
    return py::make_tuple(r.hash.hex(), r.inserted);
  }

  py::tuple save_blocks(py::handle tokens, py::handle ids, py::handle k, py::handle v,
                        const std::vector<std::string>& extra, bool bf16_words) {
    PagedCall c(tokens, ids, k, v, bf16_words);
    SaveReport r = call([&] { return cache_->save_blocks({c.tokens, extra}, c.block_ids, c.paged); });
    return py::make_tuple(r.stored, r.already_cached, r.refused);
  }

  // (first block, blocks loaded, deadline passed). deadline: seconds from now; negative: none.
  py::tuple load_blocks(py::handle tokens, py::handle ids, py::handle k, py::handle v,
                        const std::vector<std::string>& extra, bool bf16_words, size_t first_block,
                        double deadline_seconds) {
    PagedCall c(tokens, ids, k, v, bf16_words);
    const LoadOptions o = load_options(first_block, deadline_seconds);
    LoadReport r = call([&] { return cache_->load_blocks({c.tokens, extra}, c.block_ids, c.paged, o); });
    return py::make_tuple(r.first_block, r.loaded_blocks, r.deadline_passed);
  }

  // CUDA engines (kvtier/_cuda.py drives these). (num_blocks, CUDA ordinal or -1) of paged K/V.
  py::tuple check_paged(py::handle k, py::handle v, py::handle ids, bool write, bool bf16_words) {
    PagedCall c(py::list(), ids, k, v, bf16_words, /*allow_cuda=*/true);
    const int device = c.ks.cuda_device();
    if (c.vs.cuda_device() != device) throw py::value_error("k_cache and v_cache are on different devices");
    const int64_t n = call([&] {
      return cache_->check_paged_layers(c.paged, write ? TensorAccess::kWrite : TensorAccess::kRead, c.block_ids);
    });
    return py::make_tuple(n, device);
  }

  std::vector<size_t> missing_blocks(py::handle tokens, const std::vector<std::string>& extra, size_t max_blocks) {
    const std::vector<uint32_t> t = import_tokens(tokens, "tokens");
    return call([&] { return cache_->missing_blocks({t, extra}, max_blocks); });
  }

  void check_block_ids(py::handle ids, int64_t num_blocks) {
    const std::vector<int64_t> block_ids = import_ids(ids);
    const Status st = cache_->check_block_ids(block_ids, num_blocks);
    if (!st.ok()) raise(st);
  }

  // `stage(slot, first, count)` runs with the GIL before each slot's copies are queued; an
  // exception in it ends the save (nothing published) and is raised here.
  py::tuple save_device_blocks(py::handle tokens, const std::vector<std::string>& extra,
                               const std::vector<size_t>& indices, int device, uint64_t stream,
                               const std::vector<uint64_t>& slots, size_t slot_blocks, py::function stage) {
    const std::vector<uint32_t> t = import_tokens(tokens, "tokens");
    const DeviceStaging from{device, stream, slots, slot_blocks};
    PythonHook hook(stage);
    Result<SaveReport> r = [&] {
      py::gil_scoped_release nogil;
      return cache_->save_device_blocks({t, extra}, indices, from, hook.as_hook());
    }();
    hook.rethrow();
    const SaveReport report = value_or_raise(std::move(r));
    return py::make_tuple(report.stored, report.already_cached, report.refused);
  }

  py::tuple store_device_block(py::handle tokens, const py::object& parent, const std::vector<std::string>& extra,
                               int device, uint64_t stream, uint64_t src) {
    const std::vector<uint32_t> t = import_tokens(tokens, "tokens");
    const std::optional<BlockHash> p = parse_parent(parent);
    const DeviceStaging from{device, stream, {src}, 1};
    StoreResult r = call([&] { return cache_->store_device_block({t, extra}, p, from); });
    return py::make_tuple(r.hash.hex(), r.inserted);
  }

  // `filled(slot, first, count)` runs with the GIL as each staging slot's copies are queued; an
  // exception in it ends the load and is raised here.
  py::tuple load_device_blocks(py::handle tokens, const std::vector<std::string>& extra, size_t first_block,
                               double deadline_seconds, size_t max_blocks, int device, uint64_t stream,
                               const std::vector<uint64_t>& slots, size_t slot_blocks, py::function filled) {
    const std::vector<uint32_t> t = import_tokens(tokens, "tokens");
    const LoadOptions o = load_options(first_block, deadline_seconds);
    const DeviceStaging to{device, stream, slots, slot_blocks};
    PythonHook hook(filled);
    Result<LoadReport> r = [&] {
      py::gil_scoped_release nogil;
      return cache_->load_device_blocks({t, extra}, o, max_blocks, to, hook.as_hook());
    }();
    hook.rethrow();
    const LoadReport report = value_or_raise(std::move(r));
    return py::make_tuple(report.first_block, report.loaded_blocks, report.deadline_passed,
                          report.source_tier);
  }

  PrefillPlan plan_prefill(py::handle tokens, const std::vector<std::string>& extra,
                           const std::string& policy) {
    const std::vector<uint32_t> t = import_tokens(tokens, "tokens");
    const PlanPolicy p = value_or_raise(parse_plan_policy(policy));
    return call([&] { return cache_->plan_prefill({t, extra}, p); });
  }
  void observe_prefill(uint64_t tokens, uint64_t context, double seconds) {
    call([&] { return cache_->observe_prefill(tokens, context, seconds); });
  }
  // A CUDA load's report (load_device_blocks' tuple) and when its copies retired.
  void observe_load(size_t first_block, size_t loaded_blocks, bool deadline_passed, int source_tier,
                    double seconds) {
    const LoadReport r{first_block, loaded_blocks, deadline_passed, source_tier};
    call([&] { return cache_->observe_load(r, seconds); });
  }
  void observe_split(const PrefillPlan& plan, double seconds) {
    call([&] { return cache_->observe_split(plan, seconds); });
  }

  void report_device_failure(const std::string& what) { cache_->report_device_failure(what); }
  void report_read_in_place(size_t blocks) {
    call([&] { return cache_->report_read_in_place(blocks); });
  }
  void report_device_fallback(const std::string& path, const std::string& why) {
    call([&] { return cache_->report_device_fallback(path, why); });
  }

  // A layerwise load's whole host set-up in one call, on the path to the engine's first kernel
  // (measured on the H200 host: the Python steps it replaces cost ~0.3 ms there): the engine's
  // block ids checked, blocks [first_block, ...) pinned for `device`, and the GPU's table written
  // into `table` (page-locked host memory of `table_words` 8-byte words, the caller's): the n
  // blocks' target ids, then their host addresses. None when they cannot be read in place.
  std::optional<Fetched> pin_for_device(py::handle tokens, const std::vector<std::string>& extra,
                                        size_t first_block, py::handle block_ids,
                                        int64_t num_blocks, int device, uintptr_t table,
                                        size_t table_words) {
    const std::vector<uint32_t> t = import_tokens(tokens, "tokens");
    const std::vector<int64_t> ids = import_ids(block_ids);
    const size_t end =
        std::min(ids.size(), t.size() / static_cast<size_t>(cache_->layout().block_size));
    const std::span<const int64_t> used =
        first_block < end ? std::span(ids).subspan(first_block, end - first_block)
                          : std::span<const int64_t>();
    value_or_raise(cache_->check_block_ids(used, num_blocks));
    if (2 * used.size() > table_words) {
      throw py::value_error("the address table holds " + std::to_string(table_words) + " words, " +
                            std::to_string(2 * used.size()) + " needed");
    }
    std::shared_ptr<FetchedBlocks> f = call([&] {
      return cache_->pin_for_device({t, extra}, first_block, used.size(), device);
    });
    if (!f) return std::nullopt;
    auto* words = reinterpret_cast<int64_t*>(table);
    const std::vector<FetchedBlock>& blocks = f->blocks();
    std::copy_n(used.begin(), blocks.size(), words);
    for (size_t i = 0; i < blocks.size(); ++i)
      words[blocks.size() + i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(blocks[i].bytes));
    return Fetched(std::move(f));
  }

  Fetched fetch(py::handle tokens, const std::vector<std::string>& extra, size_t max_blocks) {
    const std::vector<uint32_t> t = import_tokens(tokens, "tokens");
    return Fetched(call([&] { return cache_->fetch({t, extra}, max_blocks); }));
  }

  std::string stats_json() { return call([&] { return cache_->stats_json(); }); }
  std::string metrics_text() { return call([&] { return cache_->metrics_text(); }); }

  size_t close() {
    py::gil_scoped_release nogil;
    return cache_->close();
  }

 private:
  // A Python function as a DeviceSlotHook, called from a thread without the GIL; what it raises
  // is kept and raised again by the caller, GIL held, once the call into the cache is over.
  class PythonHook {
   public:
    explicit PythonHook(py::function f) : f_(std::move(f)) {}
    DeviceSlotHook as_hook() {
      return [this](size_t slot, size_t first, size_t count) { return call(slot, first, count); };
    }
    void rethrow() {
      if (raised_) throw std::move(*raised_);
    }

   private:
    template <typename... Args>
    Status call(Args... args) {
      py::gil_scoped_acquire gil;
      try {
        f_(args...);
      } catch (py::error_already_set& e) {
        raised_.emplace(std::move(e));
        return internal_error("the engine's side of the transfer failed");
      }
      return ok_status();
    }

    py::function f_;
    std::optional<py::error_already_set> raised_;
  };

  static LoadOptions load_options(size_t first_block, double deadline_seconds) {
    LoadOptions o{first_block, std::nullopt};
    if (deadline_seconds >= 0) {
      o.deadline = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(deadline_seconds));
    }
    return o;
  }

  // The arguments of save_blocks and load_blocks, imported (the tensors' owners kept alive).
  struct PagedCall {
    PagedCall(py::handle t, py::handle ids, py::handle k, py::handle v, bool bf16_words, bool allow_cuda = false)
        : tokens(import_tokens(t, "tokens")),
          block_ids(import_ids(ids)),
          ks(import_layers(k, {bf16_words, allow_cuda}, "k_cache")),
          vs(import_layers(v, {bf16_words, allow_cuda}, "v_cache")) {
      if (ks.layers.size() != vs.layers.size()) {
        throw py::value_error("k_cache has " + std::to_string(ks.layers.size()) + " layers, v_cache " +
                              std::to_string(vs.layers.size()));
      }
      for (size_t l = 0; l < ks.layers.size(); ++l) paged.push_back({ks.layers[l], vs.layers[l]});
    }
    std::vector<uint32_t> tokens;
    std::vector<int64_t> block_ids;
    ImportedLayers ks, vs;
    std::vector<LayerKv> paged;
  };

  std::unique_ptr<EmbeddedCache> cache_;
};

EmbeddedCacheOptions options_from(const py::dict& d) {
  EmbeddedCacheOptions o;
  static const char* kKeys[] = {"layout",
                                "namespace",
                                "hash",
                                "ram_capacity",
                                "kv_cache_quantization",
                                "ssd_dir",
                                "ssd_capacity",
                                "ssd_segment_size",
                                "compression",
                                "ssd_reset",
                                "gpu_memory",
                                "remote",
                                "persist_on_close",
                                "close_timeout",
                                "eviction",
                                "ssd_admission",
                                "ssd_write_budget",
                                "hybrid_layout",
                                "kv_events",
                                "kv_events_replay",
                                "cuda_device"};
  for (auto item : d) {
    const std::string key = item.first.cast<std::string>();
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
      throw py::type_error("unknown option '" + key + "'");
    }
  }
  auto get = [&](const char* k) -> py::object { return d.contains(k) ? py::object(d[k]) : py::none(); };
  if (auto v = get("layout"); !v.is_none()) o.layout = v.cast<std::string>();
  if (auto v = get("hybrid_layout"); !v.is_none()) o.hybrid_layout = v.cast<std::string>();
  if (auto v = get("namespace"); !v.is_none()) o.ns = v.cast<std::string>();
  if (auto v = get("hash"); !v.is_none()) o.hash = v.cast<std::string>();
  if (auto v = get("ram_capacity"); !v.is_none()) o.ram_capacity = v.cast<uint64_t>();
  if (auto v = get("kv_cache_quantization"); !v.is_none()) o.kv_cache_quantization = v.cast<int>();
  if (auto v = get("ssd_dir"); !v.is_none()) {
    o.ssd_dirs = py::isinstance<py::str>(v) ? std::vector<std::string>{v.cast<std::string>()}
                                            : v.cast<std::vector<std::string>>();
  }
  if (auto v = get("ssd_capacity"); !v.is_none()) o.ssd_capacity = v.cast<uint64_t>();
  if (auto v = get("ssd_segment_size"); !v.is_none()) o.ssd_segment_size = v.cast<uint64_t>();
  if (auto v = get("compression"); !v.is_none()) o.compression = v.cast<std::string>();
  if (auto v = get("ssd_reset"); !v.is_none()) o.ssd_reset = v.cast<bool>();
  if (auto v = get("gpu_memory"); !v.is_none()) o.gpu_memory = v.cast<uint64_t>();
  if (auto v = get("remote"); !v.is_none()) o.remote = v.cast<std::string>();
  if (auto v = get("kv_events"); !v.is_none()) o.kv_events = v.cast<std::string>();
  if (auto v = get("kv_events_replay"); !v.is_none()) o.kv_events_replay = v.cast<std::string>();
  if (auto v = get("eviction"); !v.is_none()) o.eviction = v.cast<std::string>();
  if (auto v = get("ssd_admission"); !v.is_none()) o.ssd_admission = v.cast<std::string>();
  if (auto v = get("ssd_write_budget"); !v.is_none()) o.ssd_write_budget = v.cast<uint64_t>();
  if (auto v = get("persist_on_close"); !v.is_none()) o.persist_on_close = v.cast<bool>();
  if (auto v = get("cuda_device"); !v.is_none()) o.cuda_device = v.cast<int>();
  if (auto v = get("close_timeout"); !v.is_none()) {
    o.close_timeout = std::chrono::milliseconds(static_cast<int64_t>(v.cast<double>() * 1000));
  }
  return o;
}

}  // namespace
}  // namespace kvtier::python

PYBIND11_MODULE(_kvtier, m) {
  using namespace kvtier;
  using namespace kvtier::python;
  m.doc() = "kvtier's C extension; use the `kvtier` package.";
  g_cache_full_error = PyErr_NewExceptionWithDoc("kvtier.CacheFullError",
                                                 "No tier had room for a block (everything pinned).",
                                                 PyExc_RuntimeError, nullptr);
  g_collision_error = PyErr_NewExceptionWithDoc("kvtier.HashCollisionError",
                                                "A block with other tokens is stored under this hash.",
                                                PyExc_ValueError, nullptr);
  m.attr("CacheFullError") = py::handle(g_cache_full_error);
  m.attr("HashCollisionError") = py::handle(g_collision_error);

  m.def("parse_size", [](const std::string& text) { return value_or_raise(parse_byte_size(text)); });
  m.def("set_log_level", [](const std::string& level) { return init_logging(level); });

  bind_block_tensor(m);
  py::class_<Fetched>(m, "Fetched")
      .def("__len__", &Fetched::size)
      .def_property_readonly("matched_tokens", &Fetched::matched_tokens)
      .def("info", &Fetched::info)
      .def("tensor", &Fetched::tensor)
      .def("release_pins", &Fetched::release_pins);
  // Seconds as floats, None where the planner has no estimate yet.
  py::class_<PrefillPlan>(m, "EnginePlan")
      .def_readonly("cached_blocks", &PrefillPlan::cached_blocks)
      .def_readonly("compute_blocks", &PrefillPlan::compute_blocks)
      .def_readonly("predicted", &PrefillPlan::predicted)
      .def_readonly("load_only", &PrefillPlan::load_only)
      .def_readonly("compute_only", &PrefillPlan::compute_only)
      .def_readonly("load_seconds", &PrefillPlan::load_seconds)
      .def_readonly("deadline", &PrefillPlan::deadline)
      .def_readonly("probe", &PrefillPlan::probe);
  py::class_<PyCache>(m, "Cache")
      .def(py::init([](const py::dict& options) { return new PyCache(options_from(options)); }))
      .def_property_readonly("layout_json", &PyCache::layout_json)
      .def_property_readonly("hybrid_layout_json", &PyCache::hybrid_layout_json)
      .def_property_readonly("kv_events_endpoints", &PyCache::kv_events_endpoints)
      .def("store_state", &PyCache::store_state)
      .def("fetch_state", &PyCache::fetch_state)
      .def_property_readonly("block_bytes", &PyCache::block_bytes)
      .def("block_hashes", &PyCache::block_hashes)
      .def("lookup", &PyCache::lookup)
      .def("store", &PyCache::store)
      .def("save_blocks", &PyCache::save_blocks)
      .def("load_blocks", &PyCache::load_blocks)
      .def("fetch", &PyCache::fetch)
      .def("pin_for_device", &PyCache::pin_for_device)
      .def("report_read_in_place", &PyCache::report_read_in_place)
      .def("report_device_failure", &PyCache::report_device_failure)
      .def("report_device_fallback", &PyCache::report_device_fallback)
      .def("check_paged", &PyCache::check_paged)
      .def("missing_blocks", &PyCache::missing_blocks)
      .def("check_block_ids", &PyCache::check_block_ids)
      .def("save_device_blocks", &PyCache::save_device_blocks)
      .def("store_device_block", &PyCache::store_device_block)
      .def("load_device_blocks", &PyCache::load_device_blocks)
      .def("plan_prefill", &PyCache::plan_prefill)
      .def("observe_prefill", &PyCache::observe_prefill)
      .def("observe_load", &PyCache::observe_load)
      .def("observe_split", &PyCache::observe_split)
      .def("stats_json", &PyCache::stats_json)
      .def("metrics_text", &PyCache::metrics_text)
      .def("close", &PyCache::close);
}
