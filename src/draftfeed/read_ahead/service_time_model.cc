#include "draftfeed/read_ahead/service_time_model.h"

#include <algorithm>
#include <cmath>

namespace draftfeed {

namespace {

// Times are positive; a fetch measured as 0 (a clock's resolution) still has a logarithm.
constexpr double kFloorSeconds = 1e-6;

double log_error(double actual, double predicted) {
  return std::abs(std::log(std::max(actual, kFloorSeconds) / std::max(predicted, kFloorSeconds)));
}

}  // namespace

void ServiceTimeModel::observe(std::int64_t row, std::int64_t tokens, double seconds) {
  seconds = std::max(seconds, 0.0);
  const auto seen = history_.find(row);
  if (seen != history_.end() && n_ > 0) {
    ++repeats_;
    history_error_ += log_error(seconds, seen->second);
    length_error_ += log_error(seconds, predict_from_length(tokens));
  }
  if (n_ >= 2) {
    ++length_checks_;
    length_check_error_ += log_error(seconds, predict_from_length(tokens));
  }
  history_[row] = seconds;
  const auto t = static_cast<double>(tokens);
  ++n_;
  sum_t_ += t;
  sum_s_ += seconds;
  sum_tt_ += t * t;
  sum_ts_ += t * seconds;
}

double ServiceTimeModel::predict_from_length(std::int64_t tokens) const {
  const auto t = static_cast<double>(tokens);
  if (n_ == 0) return t;
  const auto n = static_cast<double>(n_);
  const double mean = sum_s_ / n;
  const double spread = n * sum_tt_ - sum_t_ * sum_t_;
  // Until enough observations pin a line down (a heavy tail tilts a line through a few points
  // any way), the time is taken as proportional to the tokens.
  if (n_ < kMinLineFit || spread <= 0) return sum_t_ > 0 ? t * sum_s_ / sum_t_ : mean;
  const double slope = (n * sum_ts_ - sum_t_ * sum_s_) / spread;
  if (slope <= 0) return mean;  // no sign that longer prompts take longer
  const double intercept = (sum_s_ - slope * sum_t_) / n;
  if (intercept < 0) return t * sum_s_ / sum_t_;  // through the origin instead
  return intercept + slope * t;
}

bool ServiceTimeModel::trusts_history() const {
  return repeats_ < kMinRepeats || history_error_ <= length_error_;
}

double ServiceTimeModel::tail_factor() const {
  // The factor of a lognormal error's 95th percentile over its median is exp(1.645 sigma), and
  // its mean |log error| is 0.8 sigma: about exp(2 x the mean).
  constexpr double kPercentileOverMean = 2.0;
  double mean = 0;
  if (trusts_history() && repeats_ > 0) {
    mean = history_error_ / static_cast<double>(repeats_);
  } else if (length_checks_ > 0) {
    mean = length_check_error_ / static_cast<double>(length_checks_);
  }
  return std::exp(kPercentileOverMean * mean);
}

double ServiceTimeModel::predict(std::int64_t row, std::int64_t tokens) const {
  if (trusts_history()) {
    const auto seen = history_.find(row);
    if (seen != history_.end()) return seen->second;
  }
  return predict_from_length(tokens);
}

}  // namespace draftfeed
