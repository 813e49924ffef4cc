#include "bench/harness/bench_report.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>

namespace kvtier::bench {

namespace {
Timing summarize(std::vector<double> samples) {
  Timing t;
  t.repetitions = static_cast<int>(samples.size());
  std::sort(samples.begin(), samples.end());
  t.min_s = samples.front();
  t.max_s = samples.back();
  t.median_s = percentile(samples, 0.5);
  return t;
}
}  // namespace

double percentile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const double pos = q * static_cast<double>(samples.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, samples.size() - 1);
  return samples[lo] + (samples[hi] - samples[lo]) * (pos - static_cast<double>(lo));
}

PairedRatio paired_ratio(const std::vector<double>& reference_seconds, const std::vector<double>& subject_seconds) {
  std::vector<double> ratios;
  for (size_t i = 0; i < std::min(reference_seconds.size(), subject_seconds.size()); ++i) {
    if (reference_seconds[i] > 0 && subject_seconds[i] > 0) ratios.push_back(reference_seconds[i] / subject_seconds[i]);
  }
  PairedRatio r;
  r.pairs = ratios.size();
  if (ratios.empty()) return r;
  r.median = median(ratios);
  r.min = *std::min_element(ratios.begin(), ratios.end());
  r.max = *std::max_element(ratios.begin(), ratios.end());
  return r;
}

PairedRatio paired_rate_ratio(const std::vector<double>& reference_rates, const std::vector<double>& subject_rates) {
  auto seconds_per_unit = [](const std::vector<double>& rates) {
    std::vector<double> out;
    for (double r : rates) out.push_back(r > 0 ? 1.0 / r : 0.0);
    return out;
  };
  return paired_ratio(seconds_per_unit(reference_rates), seconds_per_unit(subject_rates));
}

std::string PairedRatio::text() const {
  return fmt_double(median) + " [" + fmt_double(min) + "-" + fmt_double(max) + "]";
}

Timing time_calls(const std::function<void()>& fn, int repetitions,
                  std::chrono::duration<double> sample_time) {
  using clock = std::chrono::steady_clock;
  fn();  // warm caches and allocators
  // Calibrate how many calls fill one sample.
  auto t0 = clock::now();
  fn();
  const double one = std::chrono::duration<double>(clock::now() - t0).count();
  const int calls = std::max(1, static_cast<int>(sample_time.count() / std::max(one, 1e-9)));
  std::vector<double> samples;
  for (int r = 0; r < repetitions; ++r) {
    auto s = clock::now();
    for (int i = 0; i < calls; ++i) fn();
    samples.push_back(std::chrono::duration<double>(clock::now() - s).count() / calls);
  }
  return summarize(std::move(samples));
}

Timing time_each(const std::function<void()>& fn, int repetitions) {
  using clock = std::chrono::steady_clock;
  std::vector<double> samples;
  for (int r = 0; r < repetitions; ++r) {
    auto s = clock::now();
    fn();
    samples.push_back(std::chrono::duration<double>(clock::now() - s).count());
  }
  return summarize(std::move(samples));
}

void Report::add_row(std::vector<std::string> cells) {
  cells.resize(columns_.size());
  rows_.push_back(std::move(cells));
}

void Report::print() const {
  std::vector<size_t> width(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    width[c] = columns_[c].size();
    for (const auto& r : rows_) width[c] = std::max(width[c], r[c].size());
  }
  std::cout << "\n== " << title_ << " ==\n";
  for (const auto& [k, v] : meta_) std::cout << "  " << k << ": " << v << "\n";
  auto line = [&](const std::vector<std::string>& cells) {
    std::cout << "| ";
    for (size_t c = 0; c < cells.size(); ++c) {
      std::cout << cells[c] << std::string(width[c] - cells[c].size(), ' ') << " | ";
    }
    std::cout << "\n";
  };
  line(columns_);
  std::cout << "|";
  for (size_t w : width) std::cout << std::string(w + 2, '-') << "|";
  std::cout << "\n";
  for (const auto& r : rows_) line(r);
  for (const auto& n : notes_) std::cout << "  note: " << n << "\n";
  std::cout.flush();
}

bool Report::write_json(const std::string& path) const {
  nlohmann::json j;
  j["title"] = title_;
  j["meta"] = meta_;
  j["columns"] = columns_;
  j["rows"] = rows_;
  j["notes"] = notes_;
  std::ofstream out(path);
  if (!out) return false;
  out << j.dump(2) << "\n";
  std::cout << "  wrote " << path << "\n";
  return static_cast<bool>(out);
}

std::string fmt_double(double v, int precision) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, v);
  return buf;
}

std::string output_path(const std::string& file_name) {
  const char* dir = std::getenv("KVTIER_BENCH_OUT");
  return (dir && *dir ? std::string(dir) + "/" : std::string()) + file_name;
}

std::string machine_description() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string cpu = "unknown CPU";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  return std::string(host) + ", " + std::to_string(std::thread::hardware_concurrency()) +
         " cores, " + cpu;
}

}  // namespace kvtier::bench
