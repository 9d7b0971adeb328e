// `draftfeed kernels`: the batch copy's kernels side by side with memcpy of the same bytes, so a
// kernel's speed is read as a share of what the memory system gives this machine at that moment.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "args.h"
#include "command.h"
#include "draftfeed/batch/hidden_copy.h"
#include "draftfeed/common/cpu_features.h"
#include "draftfeed/common/dtype.h"
#include "draftfeed/common/error.h"
#include "draftfeed/common/run_workers.h"
#include "flag_table.h"
#include "timing.h"

namespace draftfeed::cli {
namespace {

const std::string kUsage = R"(usage: draftfeed kernels [options]

Times the batch copy (copy_hidden_rows, the code every batch goes through, dispatch included) for
each source dtype, batch dtype and noise, against memcpy of the same rows (same strides, same
bytes written, same threads), on one batch of synthetic hidden states in memory. Each repeat times
memcpy and every kernel once, one after the other, so load on the machine falls on both alike;
the share is the median over repeats of memcpy's seconds / the kernel's seconds. memcpy copies the
same rows in the wider of the source and batch dtypes (what a kernel writes, and no less than it
reads); GB/s are of the batch bytes written.

The layout is the engine's: per token, the verifier's first L-1 layers (one row of (L-1) x H
elements) out of a file row of L x H, copied in jobs of --job-tokens tokens (one sample each).

options:
)";

const FlagTable& command_flags() {
  static const FlagTable table{
      {"threads", "N", "threads, each copying its share of the jobs (default 1)"},
      {"hidden-size", "H", "hidden size (default 2048)"},
      {"layers", "L", "captured layers per token (default 4)"},
      {"tokens", "T", "tokens in the batch (default 8192, the reference's total_seq_len)"},
      {"job-tokens", "J", "tokens per copy job, a sample (default 512)"},
      {"repeat", "R", "timed repeats (default 7, after one warm-up)"},
      {"only", "NAMES",
       "comma-separated case names (default every case; see the output). A name ending in [avx2] "
       "is the AVX2 kernel with the AVX-512 ones forbidden, listed by default where the CPU has "
       "those (DRAFTFEED_AVX512=0 forbids them throughout)"},
      {"json", "", "print the result as JSON"},
  };
  return table;
}

// One case: what is copied, into what, with which noise. The memcpy that bounds it copies the same
// rows in the wider of the two dtypes: every byte the kernel writes, and every byte it reads (a
// cast from f32 reads twice what it writes, so memcpy of what it writes would not bound it).
struct Case {
  const char* name;
  DType src;
  DType dst;
  NoiseKind noise;
  const char* goal;  // what the kernel should reach, as a share of memcpy
  double goal_share;
  // True: the case's AVX2 kernel with the AVX-512 ones forbidden, timed beside the AVX-512 one
  // the dispatch takes (listed only where the CPU has them).
  bool avx2_beside_avx512 = false;
};

constexpr Case kCases[] = {
    {"bf16->bf16", DType::kBF16, DType::kBF16, NoiseKind::kNone, "no noise", 0.90},
    {"bf16->f32", DType::kBF16, DType::kF32, NoiseKind::kNone, "no noise", 0.90},
    {"f16->bf16", DType::kF16, DType::kBF16, NoiseKind::kNone, "no noise", 0.90},
    {"f32->bf16", DType::kF32, DType::kBF16, NoiseKind::kNone, "no noise", 0.90},
    {"f32->f32", DType::kF32, DType::kF32, NoiseKind::kNone, "no noise", 0.90},
    {"bf16->bf16+uniform", DType::kBF16, DType::kBF16, NoiseKind::kUniform, "uniform noise", 0.85},
    {"bf16->f32+uniform", DType::kBF16, DType::kF32, NoiseKind::kUniform, "uniform noise", 0.85},
    {"fp8->bf16", DType::kF8E4M3, DType::kBF16, NoiseKind::kNone, "FP8 dequantize", 0.85},
    {"fp8->bf16+uniform", DType::kF8E4M3, DType::kBF16, NoiseKind::kUniform, "FP8 dequantize",
     0.85},
    {"bf16->bf16+uniform[avx2]", DType::kBF16, DType::kBF16, NoiseKind::kUniform, "uniform noise",
     0.85, true},
    {"fp8->bf16+uniform[avx2]", DType::kF8E4M3, DType::kBF16, NoiseKind::kUniform, "FP8 dequantize",
     0.85, true},
    {"bf16->bf16+gaussian", DType::kBF16, DType::kBF16, NoiseKind::kGaussian, "", 0.0},
};

// Deterministic pseudo-random bits (xorshift64*): the data only has to look like hidden states.
struct Bits {
  std::uint64_t state;
  std::uint64_t next() {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545F4914F6CDD1DULL;
  }
  // Roughly N(0, 1)-sized values: a sum of uniforms, in [-3, 3).
  float value() {
    const auto u = [this] { return static_cast<float>(next() >> 40) * 0x1p-24f; };
    return (u() + u() + u() - 1.5f) * 2.0f;
  }
};

struct Data {
  std::int64_t tokens = 0;
  std::int64_t row = 0;    // L x H: a file row
  std::int64_t width = 0;  // (L - 1) x H: the copied part
  std::vector<std::uint8_t> bf16, f16, f32, fp8, scales;
  std::vector<std::uint8_t> out;  // one batch, f32-sized, from `batch` on
  std::uint8_t* batch = nullptr;
};

Data make_data(std::int64_t tokens, std::int64_t hidden, std::int64_t layers) {
  Data d;
  d.tokens = tokens;
  d.row = layers * hidden;
  d.width = (layers - 1) * hidden;
  const auto n = static_cast<std::size_t>(tokens * d.row);
  d.bf16.resize(n * 2);
  d.f16.resize(n * 2);
  d.f32.resize(n * 4);
  d.fp8.resize(n);
  d.scales.resize(static_cast<std::size_t>(tokens) * 4);
  Bits bits{0x9E3779B97F4A7C15ULL};
  for (std::size_t i = 0; i < n; ++i) {
    const float v = bits.value();
    std::memcpy(&d.f32[i * 4], &v, 4);
    const std::uint16_t b = float_to_bf16(v);
    const std::uint16_t h = float_to_f16(v);
    std::memcpy(&d.bf16[i * 2], &b, 2);
    std::memcpy(&d.f16[i * 2], &h, 2);
    // Any finite E4M3 code (0x7F and 0xFF are its NaNs).
    auto code = static_cast<std::uint8_t>(bits.next() >> 56);
    if ((code & 0x7F) == 0x7F) code ^= 1;
    d.fp8[i] = code;
  }
  for (std::int64_t t = 0; t < tokens; ++t) {
    const float scale = 0.01f + static_cast<float>(bits.next() >> 40) * 0x1p-24f;
    std::memcpy(&d.scales[static_cast<std::size_t>(t) * 4], &scale, 4);
  }
  // The engine's batch buffers are page-aligned (pipeline/host_memory.h): so is this one.
  d.out.assign(static_cast<std::size_t>(tokens * d.width) * 4 + 4096, 0);
  d.batch = d.out.data() + (4096 - reinterpret_cast<std::uintptr_t>(d.out.data()) % 4096);
  return d;
}

const std::vector<std::uint8_t>& source_of(const Data& d, DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return d.bf16;
    case DType::kF16:
      return d.f16;
    case DType::kF32:
      return d.f32;
    default:
      break;
  }
  return d.fp8;
}

// Copies every job (or memcpys its rows) on `threads` threads, jobs dealt round robin; returns
// seconds and adds the non-finite count to `nonfinite` (so no work is optimised away).
double run_pass(Data& d, const Case& c, bool memcpy_only, unsigned threads, std::int64_t job_tokens,
                std::int64_t& nonfinite) {
  const DType wider = dtype_size(c.src) > dtype_size(c.dst) ? c.src : c.dst;
  const std::vector<std::uint8_t>& src = source_of(d, memcpy_only ? wider : c.src);
  const std::size_t src_elem = dtype_size(memcpy_only ? wider : c.src);
  const std::size_t dst_elem = dtype_size(memcpy_only ? wider : c.dst);
  const std::int64_t jobs = (d.tokens + job_tokens - 1) / job_tokens;
  std::vector<std::int64_t> counts(threads, 0);
  const bool avx512_allowed = set_avx512_kernels_allowed(!c.avx2_beside_avx512);
  const auto start = std::chrono::steady_clock::now();
  run_workers(threads, [&](unsigned index, const std::atomic<bool>& /*stop*/) {
    for (std::int64_t j = index; j < jobs; j += threads) {
      const std::int64_t first = j * job_tokens;
      const std::int64_t rows = std::min(job_tokens, d.tokens - first);
      const std::uint8_t* from = src.data() + static_cast<std::size_t>(first * d.row) * src_elem;
      std::uint8_t* to = d.batch + static_cast<std::size_t>(first * d.width) * dst_elem;
      if (memcpy_only) {
        const std::size_t bytes = static_cast<std::size_t>(d.width) * dst_elem;
        for (std::int64_t r = 0; r < rows; ++r) {
          std::memcpy(to + static_cast<std::size_t>(r * d.width) * dst_elem,
                      from + static_cast<std::size_t>(r * d.row) * src_elem, bytes);
        }
        continue;
      }
      RowCopy job;
      job.src = from;
      job.src_dtype = c.src;
      job.src_row_stride = d.row;
      job.src_scales = d.scales.data() + static_cast<std::size_t>(first) * 4;
      job.dst = to;
      job.dst_dtype = c.dst;
      job.dst_row_stride = d.width;
      job.rows = rows;
      job.width = d.width;
      job.noise = c.noise;
      job.noise_std = 0.05f;
      job.noise_sample_key = static_cast<std::uint64_t>(j) * 0x9E3779B97F4A7C15ULL;
      // As the engine writes a batch this size (streaming stores from kStreamedBatchBytes on).
      job.stores = batch_row_stores(static_cast<std::size_t>(d.tokens * d.width) * dst_elem);
      counts[index] += copy_hidden_rows(job);
    }
  });
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  set_avx512_kernels_allowed(avx512_allowed);
  for (const std::int64_t count : counts) nonfinite += count;
  return seconds.count();
}

// The instruction sets the batch copy's kernels use on this CPU, as the dispatch chooses them.
std::string vector_kernels() {
  if (avx512_kernels_enabled()) return "AVX-512 (uniform noise into bf16), AVX2 (the rest)";
  if (cpu_has_avx2_f16c()) return "AVX2";
  return "none (scalar code, compiler-vectorised)";
}

std::vector<const Case*> chosen_cases(const std::string& only) {
  std::vector<std::string> names;
  for (std::size_t start = 0; start <= only.size();) {
    const std::size_t comma = std::min(only.find(',', start), only.size());
    if (comma > start) names.push_back(only.substr(start, comma - start));
    start = comma + 1;
  }
  std::vector<const Case*> chosen;
  for (const Case& c : kCases) {
    // By default the AVX2 kernels beside the AVX-512 ones only where the dispatch takes those.
    if (names.empty() ? !c.avx2_beside_avx512 || avx512_kernels_enabled()
                      : std::find(names.begin(), names.end(), c.name) != names.end()) {
      chosen.push_back(&c);
    }
  }
  require(names.empty() || chosen.size() == names.size(), ErrorKind::kInvalidArgument,
          "--only names an unknown case: '" + only + "'");
  return chosen;
}

int run_kernels(const std::vector<std::string>& argv) {
  const Args args = command_flags().parse(argv);
  args.expect_positionals(0, 0, "");
  const auto threads = static_cast<unsigned>(args.integer("threads", 1));
  const std::int64_t hidden = args.integer("hidden-size", 2048);
  const std::int64_t layers = args.integer("layers", 4);
  const std::int64_t tokens = args.integer("tokens", 8192);
  const std::int64_t job_tokens = args.integer("job-tokens", 512);
  const std::int64_t repeat = args.integer("repeat", 7);
  require(
      threads >= 1 && hidden >= 1 && layers >= 2 && tokens >= 1 && job_tokens >= 1 && repeat >= 1,
      ErrorKind::kInvalidArgument,
      "--threads, --hidden-size, --tokens, --job-tokens and --repeat must be >= 1, "
      "--layers >= 2");
  const std::vector<const Case*> cases = chosen_cases(args.str("only", ""));

  Data data = make_data(tokens, hidden, layers);
  // Per case: seconds of its kernel and of its memcpy in each repeat (both in the same repeat).
  std::vector<std::vector<double>> kernel_s(cases.size()), memcpy_s(cases.size());
  std::int64_t nonfinite = 0;
  for (std::int64_t rep = -1; rep < repeat; ++rep) {  // rep -1: warm-up, not kept
    for (std::size_t k = 0; k < cases.size(); ++k) {
      const double m = run_pass(data, *cases[k], true, threads, job_tokens, nonfinite);
      const double s = run_pass(data, *cases[k], false, threads, job_tokens, nonfinite);
      if (rep < 0) continue;
      memcpy_s[k].push_back(m);
      kernel_s[k].push_back(s);
    }
  }

  nlohmann::json out;
  out["threads"] = threads;
  out["hidden_size"] = hidden;
  out["layers"] = layers;
  out["tokens"] = tokens;
  out["job_tokens"] = job_tokens;
  out["repeat"] = repeat;
  out["nonfinite"] = nonfinite;
  out["vector_kernels"] = vector_kernels();
  out["cases"] = nlohmann::json::array();
  if (!args.has("json")) {
    std::printf(
        "batch copy vs memcpy of the same rows: %u thread(s), H=%lld, %lld layers, %lld "
        "tokens, jobs of %lld tokens, median of %lld repeats; vector kernels: %s\n",
        threads, static_cast<long long>(hidden), static_cast<long long>(layers),
        static_cast<long long>(tokens), static_cast<long long>(job_tokens),
        static_cast<long long>(repeat), vector_kernels().c_str());
    std::printf("  %-25s %12s %12s %9s %s\n", "case", "written GB/s", "memcpy GB/s", "share",
                "goal");
  }
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const Case& c = *cases[k];
    const double written =
        static_cast<double>(tokens * data.width) * static_cast<double>(dtype_size(c.dst)) / 1e9;
    const double copied = static_cast<double>(tokens * data.width) *
                          static_cast<double>(std::max(dtype_size(c.dst), dtype_size(c.src))) / 1e9;
    std::vector<double> shares;
    for (std::size_t r = 0; r < kernel_s[k].size(); ++r) {
      shares.push_back(memcpy_s[k][r] / kernel_s[k][r]);
    }
    const double share = median(shares);
    const double kernel_gbps = written / median(kernel_s[k]);
    const double memcpy_gbps = copied / median(memcpy_s[k]);
    out["cases"].push_back({{"name", c.name},
                            {"kernel_gb_per_s", kernel_gbps},
                            {"memcpy_gb_per_s", memcpy_gbps},
                            {"share", share},
                            {"shares", shares},
                            {"goal", c.goal},
                            {"goal_share", c.goal_share},
                            {"bytes_written", written * 1e9},
                            {"memcpy_bytes", copied * 1e9}});
    if (!args.has("json")) {
      std::printf(
          "  %-25s %12.2f %12.2f %8.0f%% %s\n", c.name, kernel_gbps, memcpy_gbps, share * 100.0,
          c.goal_share > 0 ? (std::string(c.goal) +
                              " >= " + std::to_string(static_cast<int>(c.goal_share * 100)) + "%")
                                 .c_str()
                           : "-");
    }
  }
  if (args.has("json")) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

const CommandRegistration kKernels({"kernels", "time the batch copy's kernels against memcpy",
                                    kUsage + command_flags().help(), run_kernels});

}  // namespace
}  // namespace draftfeed::cli
