// What every kvtier benchmark shares: timing by repetitions (median, since these machines are
// shared and noisy), and a report that prints a table beside its same-run reference and writes
// the same rows as JSON.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace kvtier::bench {

struct Timing {
  double median_s = 0;  // seconds per call, median over repetitions
  double min_s = 0;
  double max_s = 0;
  int repetitions = 0;
};

// Calls `fn` repeatedly: `repetitions` samples, each timing as many back-to-back calls as fit in
// `sample_time` (at least one). Returns per-call seconds.
Timing time_calls(const std::function<void()>& fn, int repetitions = 9,
                  std::chrono::duration<double> sample_time = std::chrono::milliseconds(100));

// One-off samples (a call per sample), for operations too slow to batch.
Timing time_each(const std::function<void()>& fn, int repetitions);

// Median and percentile of raw samples.
double percentile(std::vector<double> samples, double q);
inline double median(std::vector<double> samples) { return percentile(std::move(samples), 0.5); }

// A subject against its reference when the two ran in turns, round by round (reference, subject,
// reference, subject, ...): the ratio of each round's pair, so a machine that drifts between rounds
// (a shared disk, a busy host) moves both sides of a ratio together instead of one median.
struct PairedRatio {
  double median = 0, min = 0, max = 0;
  size_t pairs = 0;
  // "0.78 [0.70-0.85]"
  std::string text() const;
};
// Per round: reference_seconds[i] / subject_seconds[i] (the subject's speed as a fraction of the
// reference's). Rounds where either is not positive are left out.
PairedRatio paired_ratio(const std::vector<double>& reference_seconds, const std::vector<double>& subject_seconds);
// The same from rates (bytes/s, ops/s): subject_rate[i] / reference_rate[i].
PairedRatio paired_rate_ratio(const std::vector<double>& reference_rates, const std::vector<double>& subject_rates);

class Report {
 public:
  Report(std::string title, std::vector<std::string> columns)
      : title_(std::move(title)), columns_(std::move(columns)) {}
  void add_row(std::vector<std::string> cells);
  void add_note(std::string note) { notes_.push_back(std::move(note)); }
  void set_meta(const std::string& key, const std::string& value) { meta_[key] = value; }
  // Prints an aligned table to stdout.
  void print() const;
  // Writes {"title", "meta", "columns", "rows", "notes"} to `path`; returns false on error.
  bool write_json(const std::string& path) const;

 private:
  std::string title_;
  std::vector<std::string> columns_;
  std::vector<std::vector<std::string>> rows_;
  std::vector<std::string> notes_;
  std::map<std::string, std::string> meta_;
};

std::string fmt_double(double v, int precision = 2);
// Where benchmarks write their JSON: $KVTIER_BENCH_OUT or the current directory.
std::string output_path(const std::string& file_name);
// "hostname, N cores, CPU model" for the report header.
std::string machine_description();

}  // namespace kvtier::bench
