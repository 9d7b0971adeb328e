// Python bindings of the FP8 pieces, for tests against torch and hs-connectors (under
// draftfeed._core):
//   fp8_to_float(codes uint8[n]) -> float32[n]            (common/fp8.h)
//   float_to_fp8(values float32[n]) -> uint8[n]
//   fp8_copy_rows(codes uint8[rows * width], scales float32[rows], dequantize, out_dtype,
//                 noise="none", noise_std=0.0, noise_key=0) -> (out, nonfinite)
//       the batch copy itself (batch/hidden_copy.h) over FP8 rows: `out` is float32[rows * width],
//       or uint16[rows * width] of bf16 bits for out_dtype "bfloat16"
//   quantize_fp8(values, dtype, tokens, per_token) -> (codes uint8[], scales float32[])
//       hs-connectors' per-token quantizer (hidden/fp8_quantize.h); `values` raw bf16/f16/f32 bytes
//   write_fp8_sample(source, target) -> bytes written: the FP8 file of a hidden-state file
//   fp8_dequantize(codes uint8[tokens * per_token], scales float32[tokens], dequantize)
//       -> (raw bytes, torch dtype name): FP8Transfer's dequantized tensor (for the Python paths)
#include "draftfeed/common/fp8.h"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "draftfeed/batch/fp8_dequantize.h"
#include "draftfeed/batch/hidden_copy.h"
#include "draftfeed/common/error.h"
#include "draftfeed/hidden/fp8_quantize.h"
#include "draftfeed/hidden/safetensors.h"

namespace draftfeed::python {

namespace {

using namespace nb::literals;

template <typename T>
using Input = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// A new numpy array owning `values`.
template <typename T>
nb::ndarray<nb::numpy, T> owned_array(std::vector<T> values) {
  auto* heap = new std::vector<T>(std::move(values));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  const std::size_t shape[1] = {heap->size()};
  return nb::ndarray<nb::numpy, T>(heap->data(), 1, shape, owner);
}

// The kernels' dtypes: a batch's (bf16 or f32), a file's (BF16, F16 or F32, safetensors names),
// FP8Transfer's dequantize dtype (bf16, f16 or f32).
DType batch_dtype(const std::string& name) {
  const DType dtype = parse_torch_dtype(name, "out_dtype");
  require(dtype == DType::kBF16 || dtype == DType::kF32, ErrorKind::kInvalidArgument,
          "out_dtype must be 'bfloat16' or 'float32', got '" + name + "'");
  return dtype;
}

DType source_dtype(const std::string& name) {
  const std::optional<DType> dtype = dtype_from_name(name);
  require(dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32,
          ErrorKind::kInvalidArgument, "dtype must be BF16, F16 or F32, got '" + name + "'");
  return *dtype;
}

DType dequantize_dtype(const std::string& name) {
  const DType dtype = parse_torch_dtype(name, "dequantize");
  require(is_fp8_dequantize_dtype(dtype), ErrorKind::kInvalidArgument,
          "FP8 values dequantize into bfloat16, float16 or float32 (FP8Transfer's "
          "dequantize_dtype), got '" +
              name + "'");
  return dtype;
}

nb::object copy_rows(const Input<std::uint8_t>& codes, const Input<float>& scales,
                     const std::string& dequantize, const std::string& out_dtype,
                     const std::string& noise, double noise_std, std::uint64_t noise_key) {
  const auto rows = static_cast<std::int64_t>(scales.shape(0));
  require(rows > 0 && codes.shape(0) % scales.shape(0) == 0, ErrorKind::kInvalidArgument,
          "codes must hold rows x width bytes for rows = len(scales) > 0");
  RowCopy job;
  job.src = codes.data();
  job.src_dtype = DType::kF8E4M3;
  job.width = static_cast<std::int64_t>(codes.shape(0)) / rows;
  job.src_row_stride = job.width;
  job.src_scales = reinterpret_cast<const std::uint8_t*>(scales.data());
  job.dequantize = dequantize_dtype(dequantize);
  job.dst_dtype = batch_dtype(out_dtype);
  job.dst_row_stride = job.width;
  job.rows = rows;
  job.noise = parse_noise_kind(noise);
  job.noise_std = static_cast<float>(noise_std);
  job.noise_sample_key = noise_key;
  const std::size_t count = codes.shape(0);
  if (job.dst_dtype == DType::kBF16) {
    std::vector<std::uint16_t> out(count);
    job.dst = reinterpret_cast<std::uint8_t*>(out.data());
    const std::int64_t bad = copy_hidden_rows(job);
    return nb::make_tuple(owned_array(std::move(out)), bad);
  }
  std::vector<float> out(count);
  job.dst = reinterpret_cast<std::uint8_t*>(out.data());
  const std::int64_t bad = copy_hidden_rows(job);
  return nb::make_tuple(owned_array(std::move(out)), bad);
}

}  // namespace

void init_fp8(nb::module_& m) {
  m.def(
      "fp8_to_float",
      [](const Input<std::uint8_t>& codes) {
        std::vector<float> out(codes.shape(0));
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = fp8_e4m3_to_float(codes(i));
        return owned_array(std::move(out));
      },
      "codes"_a, "float8_e4m3fn codes -> their float32 values");
  m.def(
      "float_to_fp8",
      [](const Input<float>& values) {
        std::vector<std::uint8_t> out(values.shape(0));
        {
          nb::gil_scoped_release release;
          for (std::size_t i = 0; i < out.size(); ++i) out[i] = float_to_fp8_e4m3(values(i));
        }
        return owned_array(std::move(out));
      },
      "values"_a, "float32 values -> float8_e4m3fn codes (round to nearest even, NaN past 464)");
  m.def("fp8_copy_rows", &copy_rows, "codes"_a, "scales"_a, "dequantize"_a = "bfloat16",
        "out_dtype"_a = "bfloat16", "noise"_a = "none", "noise_std"_a = 0.0, "noise_key"_a = 0,
        "The batch copy over FP8 rows (one scale per row): (values, non-finite count); bf16 "
        "values as uint16 bits.");
  m.def(
      "quantize_fp8",
      [](const nb::bytes& values, const std::string& dtype, std::int64_t tokens,
         std::int64_t per_token) {
        const DType src = source_dtype(dtype);
        require(tokens >= 0 && per_token >= 0 &&
                    static_cast<std::size_t>(tokens * per_token) * dtype_size(src) == values.size(),
                ErrorKind::kInvalidArgument, "values must hold tokens x per_token elements");
        std::vector<std::uint8_t> codes(static_cast<std::size_t>(tokens * per_token));
        std::vector<float> scales(static_cast<std::size_t>(tokens));
        quantize_fp8(static_cast<const std::uint8_t*>(values.data()), src, tokens, per_token,
                     codes.data(), scales.data());
        return std::make_tuple(owned_array(std::move(codes)), owned_array(std::move(scales)));
      },
      "values"_a, "dtype"_a, "tokens"_a, "per_token"_a,
      "hs-connectors' per-token FP8 quantization of raw values: (codes, scales)");
  m.def(
      "write_fp8_sample",
      [](const std::string& source, const std::string& target) {
        nb::gil_scoped_release release;
        const auto file = SafetensorsFile::open(source).value();
        const auto sample = HiddenStateSample::from_file(file).value();
        return write_fp8_sample(target, sample).bytes;
      },
      "source"_a, "target"_a,
      "Writes the FP8 file (hs-connectors' layout) of a bf16/f16/f32 hidden-state file; returns "
      "its size.");
  m.def(
      "fp8_dequantize",
      [](const Input<std::uint8_t>& codes, const Input<float>& scales,
         const std::string& dequantize) {
        const auto tokens = static_cast<std::int64_t>(scales.shape(0));
        require(tokens > 0 ? codes.shape(0) % scales.shape(0) == 0 : codes.shape(0) == 0,
                ErrorKind::kInvalidArgument, "codes must hold tokens x per_token values");
        const DType type = dequantize_dtype(dequantize);
        const std::int64_t per_token =
            tokens > 0 ? static_cast<std::int64_t>(codes.shape(0)) / tokens : 0;
        const std::vector<std::uint8_t> values = dequantize_fp8_tensor(
            codes.data(), reinterpret_cast<const std::uint8_t*>(scales.data()), tokens, per_token,
            type);
        return nb::make_tuple(
            nb::bytes(reinterpret_cast<const char*>(values.data()), values.size()),
            std::string(torch_dtype_name(type)));
      },
      "codes"_a, "scales"_a, "dequantize"_a = "bfloat16",
      "FP8Transfer's dequantize of a whole tensor: (raw bytes in that dtype, its torch name)");
}

}  // namespace draftfeed::python
