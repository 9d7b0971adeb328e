// The text forms of the options' enums (a split, a preprocess, on_missing...): one table per enum,
// read both ways. A value prints as its first name; later names of the same value are accepted
// aliases. An unknown text is Error(kInvalidArgument) naming the setting and the choices.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "draftfeed/common/error.h"

namespace draftfeed {

template <typename E>
struct EnumName {
  E value;
  std::string_view name;
};

template <typename E, std::size_t N>
E parse_enum(std::string_view text, const std::array<EnumName<E>, N>& names,
             std::string_view what) {
  for (const EnumName<E>& entry : names) {
    if (entry.name == text) return entry.value;
  }
  std::string choices;
  for (std::size_t i = 0; i < N; ++i) {
    if (names[i].name.empty()) continue;
    choices += std::string(choices.empty() ? "" : ", ") + "'" + std::string(names[i].name) + "'";
  }
  throw Error(ErrorKind::kInvalidArgument, std::string(what) + " must be one of " + choices +
                                               ", got '" + std::string(text) + "'");
}

// Whether `names` names the values 0, 1, ..., N-1 in that order, once each: with N the enum's
// count, a table that names every value (static_assert it beside the table, as a switch's -Wswitch
// would have said so).
template <typename E, std::size_t N>
constexpr bool names_each_value_in_order(const std::array<EnumName<E>, N>& names) {
  for (std::size_t i = 0; i < N; ++i) {
    if (static_cast<std::size_t>(names[i].value) != i) return false;
  }
  return true;
}

// The value's first name ("?" for a value the table lacks).
template <typename E, std::size_t N>
const char* enum_name(E value, const std::array<EnumName<E>, N>& names) {
  for (const EnumName<E>& entry : names) {
    if (entry.value == value) return entry.name.data();
  }
  return "?";
}

}  // namespace draftfeed
