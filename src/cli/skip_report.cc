#include "skip_report.h"

#include <cstdio>

namespace draftfeed::cli {

void add_skipped_json(nlohmann::json& j, const ScanCounts& skipped, const ScanExamples& examples) {
  nlohmann::json counts = nlohmann::json::object();
  nlohmann::json listed = nlohmann::json::object();
  for (std::size_t s = 0; s < kScanStatusCount; ++s) {
    const auto status = static_cast<ScanStatus>(s);
    if (status == ScanStatus::kOk || status == ScanStatus::kMissing) continue;
    counts[scan_status_name(status)] = skipped[s];
    for (const auto& example : examples[s]) {
      listed[scan_status_name(status)].push_back(
          {{"row", example.row}, {"reason", example.reason}});
    }
  }
  j["skipped"] = std::move(counts);
  j["examples"] = std::move(listed);
}

void print_skipped(const char* label, const ScanCounts& skipped, const ScanExamples& examples) {
  for (std::size_t s = 0; s < kScanStatusCount; ++s) {
    if (skipped[s] == 0) continue;
    std::printf("  %s (%s) %lld\n", label, scan_status_name(static_cast<ScanStatus>(s)),
                static_cast<long long>(skipped[s]));
    for (const auto& example : examples[s]) {
      std::printf("      row %lld: %s\n", static_cast<long long>(example.row),
                  example.reason.c_str());
    }
  }
}

}  // namespace draftfeed::cli
