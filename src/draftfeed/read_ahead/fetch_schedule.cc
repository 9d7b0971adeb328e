#include "draftfeed/read_ahead/fetch_schedule.h"

#include <algorithm>
#include <string>

#include "draftfeed/common/error.h"

namespace draftfeed {

FetchSchedule::FetchSchedule(int slots, double slack) : slots_(slots), slack_(slack) {
  require(slots >= 1, ErrorKind::kInvalidArgument,
          "the fetch schedule needs at least one slot, got " + std::to_string(slots));
  require(slack >= 0, ErrorKind::kInvalidArgument,
          "the fetch schedule's slack must be >= 0, got " + std::to_string(slack));
}

void FetchSchedule::enqueue(Item& item) {
  const Order order = order_of(item);
  (item.claimed ? claimed_ : queue_).insert(order);
  by_row_[item.row].insert(order);
}

void FetchSchedule::dequeue(const Item& item) {
  const Order order = order_of(item);
  (item.claimed ? claimed_ : queue_).erase(order);
  const auto row = by_row_.find(item.row);
  if (row != by_row_.end()) {
    row->second.erase(order);
    if (row->second.empty()) by_row_.erase(row);
  }
}

void FetchSchedule::drop_stream(int stream) {
  const auto plan = plans_.find(stream);
  if (plan == plans_.end()) return;
  for (const std::uint64_t seq : plan->second) {
    const Item& item = items_.at(seq);
    if (!item.started) dequeue(item);
    if (--occurrences_[item.row] == 0) occurrences_.erase(item.row);
    items_.erase(seq);
  }
  plans_.erase(plan);
  stream_rows_.erase(stream);
  stream_order_.erase(std::remove(stream_order_.begin(), stream_order_.end(), stream),
                      stream_order_.end());
}

void FetchSchedule::set_plan(int stream, const Batches& batches, const Batches& next,
                             const ServiceTimeModel& model) {
  drop_stream(stream);
  std::vector<std::uint64_t>& seqs = plans_[stream];
  for (const bool is_next : {false, true}) {
    const Batches& plan = is_next ? next : batches;
    for (std::size_t b = 0; b < plan.size(); ++b) {
      for (const Row& row : plan[b]) {
        Item item;
        item.row = row.row;
        item.tokens = row.tokens;
        item.stream = stream;
        item.next = is_next;
        item.batch = static_cast<std::int64_t>(b);
        item.seq = next_seq_++;
        seqs.push_back(item.seq);
        items_.emplace(item.seq, item);
        ++occurrences_[row.row];
        ++stream_rows_[stream][row.row];
      }
    }
  }
  stream_order_.push_back(stream);
  rekey(model);
}

void FetchSchedule::compute_keys(int stream, const ServiceTimeModel& model) {
  // Deadlines: the plan's predicted work up to and including the item's batch, over the slots;
  // the next plan's continue after the current one's.
  const bool active = !stream_order_.empty() && stream_order_.back() == stream;
  const std::vector<std::uint64_t>& seqs = plans_.at(stream);
  const double slack = std::max(slack_, model.tail_factor());
  double work = 0;
  std::size_t i = 0;
  while (i < seqs.size()) {
    const Item& first = items_.at(seqs[i]);
    std::size_t end = i;
    double batch_work = 0;
    while (end < seqs.size()) {
      const Item& item = items_.at(seqs[end]);
      if (item.next != first.next || item.batch != first.batch) break;
      batch_work += model.predict(item.row, item.tokens);
      ++end;
    }
    work += batch_work;
    const double deadline = work / slots_;
    for (std::size_t k = i; k < end; ++k) {
      Item& item = items_.at(seqs[k]);
      item.key = deadline - slack * model.predict(item.row, item.tokens);
      item.tier = active && !item.next ? 0 : 1;
    }
    i = end;
  }
}

void FetchSchedule::rekey(const ServiceTimeModel& model) {
  queue_.clear();
  claimed_.clear();
  by_row_.clear();
  for (const int stream : stream_order_) {
    compute_keys(stream, model);
    for (const std::uint64_t seq : plans_.at(stream)) {
      Item& item = items_.at(seq);
      if (!item.started) enqueue(item);
    }
  }
}

bool FetchSchedule::mark_started(std::int64_t row) { return take_row(row).has_value(); }

std::optional<FetchSchedule::Item> FetchSchedule::take_row(std::int64_t row) {
  const auto found = by_row_.find(row);
  if (found == by_row_.end()) return std::nullopt;
  Item& item = items_.at(std::get<2>(*found->second.begin()));
  dequeue(item);
  item.started = true;
  return item;
}

bool FetchSchedule::claim(std::int64_t row) {
  const auto found = by_row_.find(row);
  if (found == by_row_.end()) return false;
  for (const Order& order : found->second) {
    Item& item = items_.at(std::get<2>(order));
    if (item.claimed) continue;
    queue_.erase(order);
    item.claimed = true;
    claimed_.insert(order);
    return true;
  }
  return true;  // every queued occurrence is claimed already: it comes
}

bool FetchSchedule::can_pick(const std::function<bool(std::int64_t tokens)>& fits) const {
  return !claimed_.empty() ||
         (!queue_.empty() && fits(items_.at(std::get<2>(*queue_.begin())).tokens));
}

std::optional<FetchSchedule::Item> FetchSchedule::pick(
    const std::function<bool(std::int64_t tokens)>& fits) {
  const Item* head = queue_.empty() ? nullptr : &items_.at(std::get<2>(*queue_.begin()));
  const Item* claimed = claimed_.empty() ? nullptr : &items_.at(std::get<2>(*claimed_.begin()));
  if (head != nullptr && !fits(head->tokens)) head = nullptr;
  const Item* chosen = head;
  if (claimed != nullptr && (chosen == nullptr || order_of(*claimed) < order_of(*chosen))) {
    chosen = claimed;
  }
  if (chosen == nullptr) return std::nullopt;
  Item& item = items_.at(chosen->seq);
  dequeue(item);
  item.started = true;
  return item;
}

void FetchSchedule::requeue(const Item& item) {
  const auto found = items_.find(item.seq);
  if (found == items_.end() || !found->second.started) return;  // its plan was replaced
  found->second.started = false;
  found->second.claimed = false;
  enqueue(found->second);
}

std::int64_t FetchSchedule::occurrences(std::int64_t row) const {
  const auto found = occurrences_.find(row);
  return found == occurrences_.end() ? 0 : found->second;
}

std::int64_t FetchSchedule::occurrences(int stream, std::int64_t row) const {
  const auto rows = stream_rows_.find(stream);
  if (rows == stream_rows_.end()) return 0;
  const auto found = rows->second.find(row);
  return found == rows->second.end() ? 0 : found->second;
}

}  // namespace draftfeed
