#include "draftfeed/source/online_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "draftfeed/common/enum_names.h"
#include "draftfeed/common/finite.h"
#include "draftfeed/hidden/fp8_quantize.h"
#include "draftfeed/source/cache_source.h"
#include "draftfeed/source/packed_fetch.h"

namespace draftfeed {

namespace fs = std::filesystem;

namespace {

constexpr std::array<EnumName<OnGenerate>, 3> kOnGenerateNames = {{
    {OnGenerate::kCache, "cache"},
    {OnGenerate::kDelete, "delete"},
    {OnGenerate::kPack, "pack"},
}};

std::shared_ptr<const CacheStore> make_store(const OnlineSourceOptions& options) {
  CacheStoreOptions store = options.cache.store();
  if (!options.server_dir.empty()) store.allowed_folders.push_back(options.server_dir);
  store.layout = options.cache_layout;
  return std::make_shared<const CacheStore>(store);
}

GeneratedFileOptions reader_options(const OnlineSourceOptions& options) {
  GeneratedFileOptions out;
  out.server_dir = options.server_dir;
  out.max_file_bytes = options.max_file_bytes;
  out.lock_timeout = options.cache.lock_timeout;
  out.lock_poll = options.cache.lock_poll;
  out.clock_skew = options.generated_file_clock_skew;
  return out;
}

const OnlineSourceOptions& checked(const OnlineSourceOptions& options) {
  options.validate();
  return options;
}

// How a transfer's load error is counted.
FileProblem transfer_problem(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kNotFound:
      return FileProblem::kMissing;
    case ErrorKind::kMismatch:
      return FileProblem::kTokenMismatch;
    case ErrorKind::kFormat:
    case ErrorKind::kUnsupported:
      return FileProblem::kBadShape;
    case ErrorKind::kNonFinite:
      return FileProblem::kNonFinite;
    default:
      return FileProblem::kTransferFailed;
  }
}

// "NaN 2, Inf 0 in layer slot(s) 0, 3" for a sample whose values are not all finite.
std::string nonfinite_summary(const HiddenStatesView& hidden) {
  const auto counts = count_nonfinite_per_slot(hidden.data, hidden.tokens, hidden.layers,
                                               hidden.hidden, hidden.dtype);
  std::int64_t nan = 0;
  std::int64_t inf = 0;
  std::string slots;
  for (std::size_t l = 0; l < counts.size(); ++l) {
    nan += counts[l].nan;
    inf += counts[l].inf;
    if (counts[l].total() > 0) slots += (slots.empty() ? "" : ", ") + std::to_string(l);
  }
  return "NaN " + std::to_string(nan) + ", Inf " + std::to_string(inf) + " in layer slot(s) " +
         slots;
}

}  // namespace

void OnlineSourceOptions::validate() const {
  require(!cache.hidden_states_path.empty(), ErrorKind::kInvalidArgument,
          "the online source needs hidden_states_path (the cache folder)");
  cache.validate();
  client.validate();
  require(generated_file_clock_skew.count() >= 0, ErrorKind::kInvalidArgument,
          "generated_file_clock_skew must be >= 0, got " +
              std::to_string(generated_file_clock_skew.count()));
  if (!server_dir.empty()) {
    // draftfeed never removes or moves a file in the cache folder that it did not write
    // (generated_file.h): a server folder there would fill up.
    std::error_code ec;
    const fs::path server = fs::weakly_canonical(fs::absolute(server_dir), ec);
    const fs::path root = fs::weakly_canonical(fs::absolute(cache.hidden_states_path), ec);
    const auto [end, _] = std::mismatch(root.begin(), root.end(), server.begin(), server.end());
    require(ec || end != root.end(), ErrorKind::kInvalidArgument,
            "server_dir " + server_dir + " lies in the cache folder (hidden_states_path " +
                cache.hidden_states_path +
                "), where draftfeed never removes files it did not write: give the servers a "
                "folder of their own");
  }
  require(max_abandoned_files >= 0, ErrorKind::kInvalidArgument,
          "max_abandoned_files must be >= 0, got " + std::to_string(max_abandoned_files));
  require(generation_validation_retries >= 0, ErrorKind::kInvalidArgument,
          "generation_validation_retries must be >= 0, got " +
              std::to_string(generation_validation_retries));
  require(max_consecutive_generation_failures >= 1, ErrorKind::kInvalidArgument,
          "max_consecutive_generation_failures must be >= 1, got " +
              std::to_string(max_consecutive_generation_failures));
  require(transfer == nullptr || cache.on_missing == OnMissing::kGenerate,
          ErrorKind::kInvalidArgument,
          std::string("a transfer object is used by the online source only with "
                      "on_missing='generate' (got '") +
              on_missing_name(cache.on_missing) + "')");
  if (on_generate == OnGenerate::kPack) {
    require(transfer == nullptr, ErrorKind::kInvalidArgument,
            "on_generate='pack' keeps the files the servers write in the cache folder's pack; "
            "a transfer object's samples are not files: use on_generate='cache' or 'delete' "
            "with it");
    require(!cache_fp8, ErrorKind::kInvalidArgument,
            "on_generate='pack' keeps the generated files losslessly compressed; cache_fp8 is "
            "for on_generate='cache' (quantize a pack's rows with draftfeed unpack, quantize)");
    pack_options().validate();
  }
}

PackAppendOptions OnlineSourceOptions::pack_options() const {
  PackAppendOptions out;
  out.root = cache.hidden_states_path;
  out.budget_bytes = cache_budget_bytes;
  out.shard_bytes = cache_shard_bytes;
  out.compress = cache_compress;
  out.lock_wait = cache_lock_wait;
  out.what =
      "draftfeed online source (keeping generated rows, pid " + std::to_string(::getpid()) + ")";
  return out;
}

OnGenerate parse_on_generate(std::string_view text) {
  return parse_enum(text, kOnGenerateNames, "on_generate");
}

const char* on_generate_name(OnGenerate on_generate) {
  return enum_name(on_generate, kOnGenerateNames);
}

OnlineSampleSource::OnlineSampleSource(const OnlineSourceOptions& options)
    : options_(checked(options)),
      read_rows_(options_.cache.rows_are_read()),
      store_(make_store(options_)),
      reader_(store_, reader_options(options_)),
      client_(options_.client),
      log_(options_.log_failures) {
  if (options_.cache.on_missing != OnMissing::kGenerate && options_.transfer == nullptr) {
    offline_ = std::make_shared<CacheSampleSource>(store_, options_.cache);
  } else if (options_.transfer == nullptr) {
    if (options_.on_generate == OnGenerate::kPack) {
      std::error_code ec;
      fs::create_directories(options_.cache.hidden_states_path, ec);
      appender_ = std::make_unique<PackAppender>(options_.pack_options());
    }
    pack_ = open_packed_cache(options_.cache.hidden_states_path);
  }
}

void OnlineSampleSource::will_need(const ReadAheadPlan& plan) {
  if (appender_ != nullptr) {
    // This source's rows of the epoch before are committed (waited for: this epoch reads them),
    // then this epoch's rows are watched, so that their shard is committed when the last comes.
    appender_->flush();
    drain_pack_messages();
    std::lock_guard lock(mutex_);
    std::unordered_set<std::int64_t>& rows = planned_[plan.stream];
    rows.clear();
    for (const PlannedBatch& batch : *plan.batches)
      rows.insert(batch.rows.begin(), batch.rows.end());
  }
  if (pack_ != nullptr) {
    // What other ranks, hosts and runs kept since (one stat of the manifest).
    auto refreshed = pack_->refresh();
    if (!refreshed.ok()) throw refreshed.error();
  }
}

void OnlineSampleSource::forget_plan(int stream) {
  std::lock_guard lock(mutex_);
  planned_.erase(stream);
}

bool OnlineSampleSource::stored_locally(std::int64_t global_row) const {
  if (pack_ == nullptr) return false;
  const std::shared_ptr<const PackedCache> pack = pack_->current();
  return pack != nullptr && pack->find(global_row) != nullptr;
}

void OnlineSampleSource::fetched_planned(std::int64_t row) {
  if (appender_ == nullptr) return;
  bool epoch_done = false;
  {
    std::lock_guard lock(mutex_);
    for (auto& [stream, rows] : planned_) {
      if (rows.erase(row) > 0 && rows.empty()) epoch_done = true;
    }
  }
  // The plan's last row: its shard is committed now, while the epoch's last copies and steps
  // run, so that other ranks' next epoch finds these rows.
  if (epoch_done) appender_->flush_async();
}

void OnlineSampleSource::drain_pack_messages() {
  if (appender_ == nullptr) return;
  for (std::string& message : appender_->take_messages()) log_.warn(std::move(message));
}

OnlineSampleSource::~OnlineSampleSource() {
  sweep_abandoned();
  if (!abandoned_.empty()) {
    log_.warn(
        std::to_string(abandoned_.size()) +
        " failed generated file(s) are still locked by their writer and stay in place, e.g. " +
        abandoned_.front().name.folder + "/" + abandoned_.front().name.name);
  }
}

void OnlineSampleSource::sweep_abandoned() {
  std::vector<AbandonedFile> files;
  {
    std::lock_guard lock(mutex_);
    files.swap(abandoned_);
  }
  if (files.empty()) return;
  std::vector<AbandonedFile> still_locked;
  std::int64_t removed = 0;
  std::int64_t kept = 0;
  for (AbandonedFile& file : files) {
    const std::string shown = file.name.folder + "/" + file.name.name;
    // One try, no wait: a lock still held stays its writer's.
    if (wait_for_lock_at(file.folder->get(), file.name.name + ".lock", shown + ".lock",
                         std::chrono::duration<double>(0), options_.cache.lock_poll)) {
      still_locked.push_back(std::move(file));
      continue;
    }
    if (!file.held) {
      // Written after the read gave up: opened now, and held to the same rules.
      auto opened = HeldFile::open(UniqueFd(::fcntl(file.folder->get(), F_DUPFD_CLOEXEC, 0)),
                                   file.name.folder, file.name.name, false);
      if (!opened.ok()) {
        if (opened.error().kind() != ErrorKind::kNotFound) {
          ++kept;
          warn_left_in_place(shown, opened.error().what());
        }
        continue;
      }
      file.held = std::make_shared<const HeldFile>(std::move(opened).value());
    }
    const HeldFile& held = *file.held;
    // Asked again now: the file held may have been given another name meanwhile.
    const std::string keep = reader_.keep_reason(held, true, file.request_sent);
    if (!keep.empty()) {
      ++kept;
      warn_left_in_place(held.path(), keep);
      continue;
    }
    if (auto error = held.remove()) {
      log_.warn("cannot remove a failed generated file: " + std::string(error->what()));
      continue;
    }
    remove_released_lock(held);
    ++removed;
  }
  std::lock_guard lock(mutex_);
  stats_.deleted += removed;
  stats_.left_in_place += kept;
  for (AbandonedFile& file : still_locked) abandoned_.push_back(std::move(file));
  stats_.abandoned = static_cast<std::int64_t>(abandoned_.size());
}

int OnlineSampleSource::blocking_fetches() const {
  const int requests = options_.client.fetch_threads;
  return requests + (options_.transfer ? options_.transfer->loads_beside_requests(requests) : 0);
}

void OnlineSampleSource::cancel() {
  client_.cancel();
  if (options_.transfer) options_.transfer->cancel();
}

void OnlineSampleSource::resume() {
  std::lock_guard lock(mutex_);
  if (stats_.fatal) return;  // after a fatal outcome the run is over
  client_.resume();
  if (options_.transfer) options_.transfer->resume();
}

FetchOutcome OnlineSampleSource::fetch(std::int64_t row, const IntArrayView& input_ids) {
  std::optional<FetchOutcome> stored = fetch_stored(row, input_ids);  // watched there
  if (stored) return std::move(*stored);
  return fetch_not_stored(row, input_ids);
}

FetchOutcome OnlineSampleSource::fetch_not_stored(std::int64_t row, const IntArrayView& input_ids) {
  FetchOutcome outcome = generate_row(row, input_ids);
  fetched_planned(row);
  return outcome;
}

std::optional<FetchOutcome> OnlineSampleSource::fetch_stored(std::int64_t row,
                                                             const IntArrayView& input_ids) {
  if (offline_) {
    // Offline, the cache is all there is: a missing file is the row's outcome (skipped).
    FetchOutcome outcome = offline_->fetch(row, input_ids);
    std::lock_guard lock(mutex_);
    if (outcome.sample) {
      ++stats_.cache_hits;
    } else if (outcome.reason == DropReason::kMissing) {
      ++stats_.skipped;
    } else {
      ++stats_.cache_rejected;
    }
    return outcome;
  }
  if (options_.transfer) {
    FetchOutcome cached = options_.transfer->get_cached(row, input_ids);
    if (!cached.sample && cached.reason == DropReason::kMissing) return std::nullopt;
    std::lock_guard lock(mutex_);
    ++(cached.sample ? stats_.cache_hits : stats_.cache_rejected);
    return cached;
  }
  const std::shared_ptr<const PackedCache> pack = pack_ != nullptr ? pack_->current() : nullptr;
  std::optional<FetchOutcome> stored = stored_in(pack.get(), row, input_ids);
  if (pack_ != nullptr && (!stored || drop_may_be_a_rewrite(*stored))) {
    // A pack or unpack that finished meanwhile (one stat of the manifest to know): the row is
    // read from where it is now rather than generated again.
    auto now = pack_->refresh();
    if (now.ok() && now.value() != pack) stored = stored_in(now.value().get(), row, input_ids);
  }
  {
    std::lock_guard lock(mutex_);
    if (stored) ++(stored->sample ? stats_.cache_hits : stats_.cache_rejected);
  }
  if (stored) fetched_planned(row);
  return stored;
}

std::optional<FetchOutcome> OnlineSampleSource::stored_in(const PackedCache* pack, std::int64_t row,
                                                          const IntArrayView& input_ids) {
  // As the cache source: a packed sample that fails its checks gives way to a per-sample file of
  // its row; without one, the pack's reason is the row's.
  std::optional<FetchOutcome> packed_drop;
  if (const PackEntry* entry = pack != nullptr ? pack->find(row) : nullptr) {
    FetchOutcome outcome =
        fetch_packed(*pack, *entry, input_ids, options_.cache.fp8_dequantize_dtype);
    if (outcome.sample) return outcome;
    packed_drop = std::move(outcome);
  }
  auto found = store_->lookup(row, kMapForRowReads);
  if (!found.ok()) {
    return FetchOutcome::dropped(DropReason::kInvalid,
                                 "row " + std::to_string(row) + ": " + found.error().what());
  }
  if (!found.value()) return packed_drop;
  return CacheSampleSource::check(row, input_ids, *found.value(),
                                  options_.cache.fp8_dequantize_dtype, read_rows_);
}

Result<std::optional<std::string>> OnlineSampleSource::chat_messages(std::int64_t row) const {
  const auto& dataset = options_.dataset;
  if (!dataset || !dataset->has_messages()) return std::optional<std::string>();
  Result<std::string> json = dataset->messages_json(row);
  if (!json.ok()) return json.error();
  Result<bool> multimodal = has_multimodal_content(json.value());
  if (!multimodal.ok()) {
    // A null `messages` value, or one that is not a list of turns: the reference would find no
    // multimodal turn either, and send the token ids.
    return std::optional<std::string>();
  }
  if (!multimodal.value()) return std::optional<std::string>();
  return std::optional<std::string>(std::move(json).value());
}

FetchOutcome OnlineSampleSource::generate_row(std::int64_t row, const IntArrayView& input_ids) {
  std::vector<std::int64_t> ids(static_cast<std::size_t>(input_ids.size()));
  if (!input_ids.guarded_copy_to(ids.data())) {
    // The dataset shard shrank under the epoch: the row cannot be asked for; dropped, counted by
    // the pipeline, no request and no failure streak.
    std::string message = unreadable_row(input_ids, row, "input_ids").what();
    log_.warn(message);
    return FetchOutcome::dropped(DropReason::kInvalid, std::move(message),
                                 options_.fail_on_hidden_state_error);
  }
  sweep_abandoned();
  Result<std::optional<std::string>> messages = chat_messages(row);
  if (!messages.ok()) {
    // A data problem, not the server's: dropped and counted, no request, no failure streak.
    std::string message = "row " + std::to_string(row) +
                          ": cannot build the chat request: " + messages.error().what();
    {
      std::lock_guard lock(mutex_);
      ++stats_.bad_messages;
    }
    log_.warn(message);
    return FetchOutcome::dropped(DropReason::kInvalid, std::move(message),
                                 options_.fail_on_hidden_state_error);
  }
  if (messages.value()) {
    std::lock_guard lock(mutex_);
    ++stats_.chat_rows;
  }
  const int total = options_.generation_validation_retries + 1;
  std::string last_error;
  for (int attempt = 1; attempt <= total; ++attempt) {
    if (attempt > 1) {
      // As the reference's recovery guard: every failed attempt but the last is reported as it
      // happens; the last is reported with the row's outcome below.
      log_.warn("hidden-state round trip failed for row " + std::to_string(row) + " (attempt " +
                std::to_string(attempt - 1) + "/" + std::to_string(total) + "): " + last_error);
    }
    {
      std::lock_guard lock(mutex_);
      ++stats_.round_trips;
    }
    const auto request_sent = std::chrono::system_clock::now();
    GenerationResult generation =
        messages.value() ? client_.generate_chat(*messages.value(), ids) : client_.generate(ids);
    if (generation.failure == GenerationResult::Failure::kCancelled) {
      std::lock_guard lock(mutex_);
      if (stats_.fatal) {
        // The run failed earlier (another row): say so again rather than drop rows quietly.
        return FetchOutcome::dropped(
            DropReason::kGenerationFailed,
            "row " + std::to_string(row) +
                ": not generated, the online source failed earlier: " + stats_.fatal_message,
            true);
      }
      return FetchOutcome::dropped(DropReason::kGenerationFailed,
                                   "row " + std::to_string(row) + ": " + generation.message);
    }
    if (generation.fatal()) {
      client_.cancel();  // the run ends: other rows' requests and backoff sleeps end now too
      std::lock_guard lock(mutex_);
      ++stats_.failures.request[static_cast<std::size_t>(generation.failure)];
      stats_.fatal = true;
      stats_.fatal_message = "row " + std::to_string(row) + ": " + generation.message;
      return FetchOutcome::dropped(DropReason::kGenerationFailed, stats_.fatal_message, true);
    }
    if (!generation.ok()) {
      std::lock_guard lock(mutex_);
      ++stats_.failures.request[static_cast<std::size_t>(generation.failure)];
      last_error = generation.message;
      continue;
    }
    if (options_.transfer) {
      std::optional<FetchedSample> sample = load_through_transfer(row, ids, generation, last_error);
      if (!sample) continue;
      finish_through_transfer(row, generation.handle);
      record_success();
      return FetchOutcome::ok(std::move(*sample));
    }
    GeneratedFile file = reader_.read(generation.handle, RowIds(ids), row, request_sent);
    if (!file.ok()) {
      {
        std::lock_guard lock(mutex_);
        ++stats_.failures.file[static_cast<std::size_t>(file.problem)];
      }
      last_error = generation.endpoint + ": " + file.message;
      discard_failed(file, request_sent);
      continue;
    }
    finish_generated(row, file);
    record_success();
    return CacheSampleSource::check(row, input_ids, *file.sample,
                                    options_.cache.fp8_dequantize_dtype, read_rows_);
  }

  std::lock_guard lock(mutex_);
  ++stats_.exhausted;
  const std::int64_t consecutive = ++stats_.consecutive_failures;
  stats_.max_consecutive_failures = std::max(stats_.max_consecutive_failures, consecutive);
  const bool too_many = consecutive >= options_.max_consecutive_generation_failures;
  std::string message = "row " + std::to_string(row) + ": hidden-state generation failed after " +
                        std::to_string(total) + " round trip(s) (consecutive failures " +
                        std::to_string(consecutive) + "/" +
                        std::to_string(options_.max_consecutive_generation_failures) +
                        "): " + last_error;
  if (too_many) {
    message = "the servers look gone: " + std::to_string(consecutive) +
              " rows in a row failed generation (max_consecutive_generation_failures = " +
              std::to_string(options_.max_consecutive_generation_failures) + "); last: " + message;
  } else if (options_.fail_on_hidden_state_error) {
    message += " (fail_on_hidden_state_error is set)";
  }
  const bool fatal = too_many || options_.fail_on_hidden_state_error;
  if (fatal && !stats_.fatal) {
    stats_.fatal = true;
    stats_.fatal_message = message;
  }
  if (fatal) client_.cancel();  // the run ends: other rows' requests end now too
  log_.warn(message);
  return FetchOutcome::dropped(DropReason::kGenerationFailed, message, fatal);
}

void OnlineSampleSource::record_success() {
  std::int64_t recovered = 0;
  {
    std::lock_guard lock(mutex_);
    ++stats_.generated;
    recovered = std::exchange(stats_.consecutive_failures, 0);
  }
  if (recovered > 0) {
    log_.warn("hidden-state generation recovered after " + std::to_string(recovered) +
              " consecutive failure(s)");
  }
}

void OnlineSampleSource::finish_generated(std::int64_t row, const GeneratedFile& file) {
  if (appender_ != nullptr) {
    // Offered to the pack (encoded and written by the appender's thread, from this mapping), and
    // the server's file removed as on_generate = delete removes it.
    appender_->offer(row, file.sample->file);
    if (finish_release(row, file, std::nullopt)) {
      std::lock_guard lock(mutex_);
      ++stats_.deleted;
    }
    return;
  }
  const bool cache = options_.on_generate == OnGenerate::kCache;
  if (cache && options_.cache_fp8 && file.sample->hidden_states.dtype != DType::kF8E4M3) {
    // Quantized into the cache (replacing an older file atomically, on disk before the rename:
    // the server's file, the only other copy, goes next), then the server's file removed as
    // on_generate = delete removes it.
    try {
      write_fp8_sample(store_->path_for_writing(row), *file.sample,
                       SafetensorsWriteOptions{.atomic = true, .fsync = true});
      store_->remove_other_layout(row);
    } catch (const Error& error) {
      log_.warn("row " + std::to_string(row) +
                ": generated hidden states used but not cached: " + error.what());
      std::lock_guard lock(mutex_);
      ++stats_.cleanup_errors;
      return;
    }
    {
      std::lock_guard lock(mutex_);
      ++stats_.adopted;
    }
    finish_release(row, file, std::nullopt);
    return;
  }
  if (finish_release(row, file, cache ? std::optional<std::int64_t>(row) : std::nullopt)) {
    std::lock_guard lock(mutex_);
    ++(cache ? stats_.adopted : stats_.deleted);
  }
}

bool OnlineSampleSource::finish_release(std::int64_t row, const GeneratedFile& file,
                                        std::optional<std::int64_t> cache_row) {
  if (!file.removable()) {
    // Not provably the request's output (a link, another name, the cache's folder, older than the
    // request...): read, used, and left exactly where it is.
    {
      std::lock_guard lock(mutex_);
      ++stats_.left_in_place;
    }
    warn_left_in_place(file.path, file.keep_reason);
    return false;
  }
  if (auto error = release_generated(*store_, file, cache_row)) {
    // The sample itself is good and stays mapped: use it, report the cache problem.
    log_.warn("row " + std::to_string(row) + ": generated hidden states used but not " +
              (cache_row ? "cached" : "removed") + ": " + error->what());
    std::lock_guard lock(mutex_);
    ++stats_.cleanup_errors;
    return false;
  }
  return true;
}

void OnlineSampleSource::warn_left_in_place(const std::string& path, const std::string& why) {
  log_.warn(path + ": generated file left in place, not " +
            (options_.on_generate == OnGenerate::kCache ? "moved into the cache" : "deleted") +
            ": " + why);
}

void OnlineSampleSource::discard_failed(const GeneratedFile& file,
                                        std::chrono::system_clock::time_point request_sent) {
  // As the reference, a failed file is deleted, but only one that may go (generated_file.h: inside
  // the server folder, the request's output); anything else that exists stays, said with its path.
  switch (file.problem) {
    case FileProblem::kOutsideServerDir:
    case FileProblem::kCacheFile:
    case FileProblem::kNotRegular: {
      {
        std::lock_guard lock(mutex_);
        ++stats_.left_in_place;
      }
      warn_left_in_place(file.path, std::string("it failed (") + file_problem_name(file.problem) +
                                        ") and is never touched");
      return;
    }
    default:
      break;
  }
  if (file.problem == FileProblem::kLockTimeout && file.folder) {
    // Its writer still holds it: removed by a later sweep, once the lock is free, if it may go.
    // The files so held are bounded (their descriptors): past the bound the oldest is let go of.
    std::optional<AbandonedFile> let_go;
    {
      std::lock_guard lock(mutex_);
      abandoned_.push_back({file.held, file.folder, file.name, request_sent});
      if (static_cast<std::int64_t>(abandoned_.size()) > options_.max_abandoned_files) {
        let_go = std::move(abandoned_.front());
        abandoned_.erase(abandoned_.begin());
        ++stats_.left_in_place;
      }
      stats_.abandoned = static_cast<std::int64_t>(abandoned_.size());
    }
    if (let_go) {
      warn_left_in_place(let_go->name.folder + "/" + let_go->name.name,
                         "its writer still holds its lock, and " +
                             std::to_string(options_.max_abandoned_files) +
                             " failed files held so are the most kept open (max_abandoned_files)");
    }
    return;
  }
  if (!file.held) return;  // nothing was opened: nothing to remove
  if (!file.removable()) {
    {
      std::lock_guard lock(mutex_);
      ++stats_.left_in_place;
    }
    warn_left_in_place(file.path, file.keep_reason);
    return;
  }
  if (auto error = file.held->remove()) {
    log_.warn("cannot remove a failed generated file: " + std::string(error->what()));
    std::lock_guard lock(mutex_);
    ++stats_.cleanup_errors;
    return;
  }
  remove_released_lock(*file.held);
  std::lock_guard lock(mutex_);
  ++stats_.deleted;
}

std::optional<FetchedSample> OnlineSampleSource::load_through_transfer(
    std::int64_t row, std::span<const std::int64_t> ids, const GenerationResult& generation,
    std::string& error) {
  HiddenStatesTransfer& transfer = *options_.transfer;
  FileProblem problem = FileProblem::kNone;
  std::optional<FetchedSample> sample;
  {
    // setup() once, before the first load; a failure is this round trip's failure.
    std::lock_guard setup_lock(setup_mutex_);
    if (!transfer_ready_) {
      try {
        transfer.setup();
        transfer_ready_ = true;
      } catch (const std::exception& e) {
        problem = FileProblem::kTransferFailed;
        error = "the transfer's setup() failed: " + std::string(e.what());
      }
    }
  }
  if (problem == FileProblem::kNone) {
    Result<FetchedSample> loaded =
        transfer.get_generated(generation.transfer_params, generation.handle, row, ids);
    if (!loaded.ok()) {
      problem = transfer_problem(loaded.error().kind());
      error = generation.endpoint + ": " + loaded.error().what();
    } else {
      const HiddenStatesView& hidden = loaded.value().hidden;
      const auto count = static_cast<std::size_t>(hidden.tokens * hidden.layers * hidden.hidden);
      if (all_finite(hidden.data, count, hidden.dtype)) {
        sample = std::move(loaded).value();
      } else {
        problem = FileProblem::kNonFinite;
        error = generation.endpoint + ": row " + std::to_string(row) + ", handle " +
                generation.handle + ": hidden_states has " + nonfinite_summary(hidden);
      }
    }
  }
  if (sample) return sample;
  {
    std::lock_guard lock(mutex_);
    ++stats_.failures.file[static_cast<std::size_t>(problem)];
  }
  remove_through_transfer(generation.handle);  // as the reference: a failed sample is deleted
  return std::nullopt;
}

void OnlineSampleSource::finish_through_transfer(std::int64_t row, const std::string& handle) {
  if (options_.on_generate == OnGenerate::kCache) {
    try {
      if (options_.transfer->cache(handle, row)) {
        std::lock_guard lock(mutex_);
        ++stats_.adopted;
        return;
      }
    } catch (const std::exception& e) {
      log_.warn("row " + std::to_string(row) +
                ": generated hidden states used but not cached: " + e.what());
      std::lock_guard lock(mutex_);
      ++stats_.cleanup_errors;
      return;
    }
  }
  remove_through_transfer(handle);
}

void OnlineSampleSource::remove_through_transfer(const std::string& handle) {
  try {
    options_.transfer->remove(handle);
    std::lock_guard lock(mutex_);
    ++stats_.deleted;
  } catch (const std::exception& e) {
    log_.warn("cannot clean up generated hidden states " + handle + ": " + e.what());
    std::lock_guard lock(mutex_);
    ++stats_.cleanup_errors;
  }
}

StatsTree OnlineSampleSource::stats_report() const {
  StatsTree out;
  StatsTree online = stats_tree(stats());
  if (options_.transfer) {
    for (StatsTree::Group& group : options_.transfer->stats_report().groups) {
      online.add_group(std::move(group.name), std::move(group.tree));
    }
  }
  out.add_group("online", std::move(online));
  if (appender_ != nullptr) out.add_group("kept", stats_tree(appender_->stats()));
  return out;
}

std::optional<PackAppendStats> OnlineSampleSource::kept_stats() const {
  if (appender_ == nullptr) return std::nullopt;
  return appender_->stats();
}

void OnlineSampleSource::flush_kept() {
  if (appender_ == nullptr) return;
  appender_->flush();
  drain_pack_messages();
}

OnlineSourceStats OnlineSampleSource::stats() const {
  OnlineSourceStats out;
  {
    std::lock_guard lock(mutex_);
    out = stats_;
  }
  out.client = client_.stats();
  return out;
}

}  // namespace draftfeed
