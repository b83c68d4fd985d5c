// eval_json.h — a small JSON reader for the result lines `cisa eval` writes itself (resume and
// summary). cisa::Json (json.h) only writes; this only reads. Not a public header.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cisa/status.h"

namespace cisa::eval::detail {

struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject } type = Type::kNull;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<JsonValue> arr;
  std::map<std::string, JsonValue> obj;

  const JsonValue* get(const std::string& key) const;  // nullptr when absent or not an object
  double number(const std::string& key, double fallback = 0) const;
  std::string string(const std::string& key, const std::string& fallback = "") const;
  std::vector<double> numbers(const std::string& key) const;  // array of numbers (else empty)
  std::vector<std::string> strings(const std::string& key) const;
};

// Parses one JSON document (whitespace around it allowed). kDataLoss with the byte offset on
// malformed input; nesting deeper than 64 is rejected.
Result<JsonValue> parse_json(std::string_view text);

}  // namespace cisa::eval::detail
