// One value of an Arrow array as JSON text, shaped as the `datasets` package returns it in Python.
//
// Why: the online path sends a multimodal row's `messages` to vLLM's /chat/completions, and the
// reference sends `load_from_disk(path)[i]["messages"]` serialised by Python's json. So the text
// must have the structure pyarrow's `to_pylist` gives: a struct is an object with every field in
// schema order (null fields as `null`), list / large_list / fixed_size_list an array, string and
// large_string a string, bool, integers of any width (uint64 in full), float16/32/64 as the
// shortest text that reads back as the same double (Python's `repr`; NaN, Infinity and -Infinity
// spelled as Python's json spells them), the null type `null`.
//
// Output is compact (no spaces) and keeps non-ASCII characters as UTF-8: the same JSON value as
// `json.dumps`, not the same bytes. Invalid UTF-8 is an error (Python's strict decoding refuses
// it).
//
// Types with no faithful JSON form (binary, dictionary encoding, unions, maps, decimals, temporal
// types, view and run-end encoded types) are refused by looking at the type alone, so a column
// gives the same answer for every row.
//
// Every buffer access is checked first (the bytes are an untrusted mapped file): offsets inside
// their buffer, non-decreasing and inside the child array; validity bits inside their bitmap;
// child indices inside the child. Alignment is never assumed. Checks are lazy: only the parts of
// the arrays that the requested element reaches are looked at.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "draftfeed/common/error.h"
#include "draftfeed/dataset/arrow_ipc.h"

namespace draftfeed::arrow {

// Limits that keep a hostile file from exhausting memory or the stack.
struct JsonLimits {
  std::size_t max_bytes = std::size_t{64} << 20;  // one value's JSON text
  int max_depth = kMaxFieldDepth;                 // nesting of the type (list in struct in ...)
};

// The JSON text of element `index` of `array`, whose schema field is `field` (a top-level column:
// its name and type text appear in error messages). `where` (e.g. "<shard path>: row 12") starts
// every message.
// Errors: kFormat for corrupt buffers or invalid UTF-8; kUnsupported for types with no JSON form
// and for values past `limits`; kInvalidArgument for an index outside the array.
Result<std::string> arrow_value_json(const Field& field, const ArrayView& array, std::int64_t index,
                                     const std::string& where, const JsonLimits& limits = {});

}  // namespace draftfeed::arrow
