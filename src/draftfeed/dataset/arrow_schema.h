// Parsing of the Arrow `Schema` flatbuffer into `arrow::Field`s (used by arrow_ipc.cc only).
#pragma once

#include <string>
#include <vector>

#include "draftfeed/dataset/arrow_ipc.h"
#include "draftfeed/dataset/flatbuffer_reader.h"

namespace draftfeed::arrow {

struct ParsedSchema {
  std::vector<Field> fields;
  bool big_endian = false;
};

// Reads a Schema table. Throws Error(kFormat) for corrupt metadata (a field without a type, the
// wrong number of children for its type, nesting past kMaxFieldDepth, more than kMaxFields fields)
// and Error(kUnsupported) for type codes newer than this reader knows; `what` names the file.
ParsedSchema parse_schema(const fb::Table& schema, const std::string& what);

}  // namespace draftfeed::arrow
