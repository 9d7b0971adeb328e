// How long a row's fetch will take, predicted from what the lookahead has seen: the fetch
// scheduler (fetch_schedule.h) starts the rows that take longest early enough, and it can only
// know what a server does from the prompt and from the service times it observed itself.
//
// Two predictors, and the evidence of which one to trust:
//   - the row's own history: the last time a fetch of this row took. Right when a server's time is
//     a function of the prompt (the same request costs the same), as vLLM's prefill is;
//   - a length model: seconds = a + b x tokens, a least-squares line through every observation
//     (a, b >= 0) once kMinLineFit were seen, proportional to the tokens before. vLLM's prefill
//     time grows with the prompt's tokens; where it does not (no line with b > 0 fits), it
//     predicts the mean, so rows keep their plan order.
// Before anything was observed, the prediction is the prompt's token count (the unit does not
// matter: the scheduler compares predictions with each other).
// Each time a row with history is observed again, both predictors' log errors are added up; the
// history is trusted until kMinRepeats repeats were seen, then while its error is no larger than
// the length model's (a server whose slow requests are random, not a property of the prompt,
// makes history worse than the line).
// How far off the trusted predictor is (its mean |log(actual / predicted)|) gives tail_factor():
// a request may take that factor times its prediction (about the 95th percentile of a lognormal
// error), so the scheduler starts long requests earlier when predictions are poor.
//
// Not thread-safe: the lookahead calls it under its lock.
#pragma once

#include <cstdint>
#include <unordered_map>

namespace draftfeed {

class ServiceTimeModel {
 public:
  static constexpr std::int64_t kMinRepeats = 8;
  // Observations before the length model fits a line (before: proportional to the tokens).
  static constexpr std::int64_t kMinLineFit = 16;

  // A successful fetch of `row` (`tokens` prompt tokens) took `seconds`.
  void observe(std::int64_t row, std::int64_t tokens, double seconds);
  // The predicted time of a fetch of `row`, in seconds once anything was observed.
  double predict(std::int64_t row, std::int64_t tokens) const;
  // The length model's prediction alone.
  double predict_from_length(std::int64_t tokens) const;

  bool trusts_history() const;
  // exp(2 x the trusted predictor's mean |log error|): 1 when predictions are exact or unknown.
  double tail_factor() const;
  std::int64_t observations() const { return n_; }
  std::int64_t repeats() const { return repeats_; }

 private:
  std::unordered_map<std::int64_t, double> history_;  // row -> seconds of its last fetch
  // Sums of the least-squares line, over every observation.
  std::int64_t n_ = 0;
  double sum_t_ = 0, sum_s_ = 0, sum_tt_ = 0, sum_ts_ = 0;
  // Evidence: summed |log(actual / predicted)| of each predictor, over repeated rows.
  std::int64_t repeats_ = 0;
  double history_error_ = 0, length_error_ = 0;
  // The length model's summed |log error| over every observation after the second.
  std::int64_t length_checks_ = 0;
  double length_check_error_ = 0;
};

}  // namespace draftfeed
