// cisa/core/json.h — JSON values (nlohmann::ordered_json) and the project's one way to print and
// read them: `--json` output, result files, eval result lines.
//
//   cisa::Json j = cisa::Json::object();
//   j["context"] = 65536;
//   j["ratios"] = cisa::Json::array({1.0, 2.5});
//   std::cout << cisa::json_dump(j, 2) << "\n";            // not j.dump(): see below
//   CISA_RETURN_IF_ERROR(cisa::write_json_atomic("out.json", j));
//   CISA_ASSIGN_OR_RETURN(cisa::Json back, cisa::json_parse(text));
//
// Objects keep insertion order, so printed documents read in the order they were built.
//
// Print with json_dump, never with nlohmann's own dump(): the committed results and the tests
// depend on the format json_dump writes, which differs from dump() in numbers and strings:
//   - a double prints as printf's %.10g ("1", "0.25", "1e-05", "1.234567891e+12"), never with a
//     trailing ".0"; NaN and infinities print as null (JSON has neither);
//   - strings are always valid UTF-8 JSON: control characters and DEL become \u00XX (\n, \r, \t
//     and \" \\ keep their short forms), and every byte that is not part of a well-formed UTF-8
//     sequence becomes the escape \ufffd, one per byte (a cut character, a Latin-1 byte).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cisa/core/status.h"

namespace cisa {

using Json = nlohmann::ordered_json;

// The text of `j`: compact when indent < 0; otherwise pretty, `indent` spaces per level, `": "`
// between a key and its value, empty arrays and objects as [] and {}.
std::string json_dump(const Json& j, int indent = -1);

// `s` as a JSON string literal (with the quotes), escaped as described above.
std::string json_quote(std::string_view s);

// Parses one JSON document (whitespace around it allowed). kDataLoss naming the position on
// malformed input, invalid UTF-8 in a string, or nesting deeper than kJsonMaxDepth.
inline constexpr int kJsonMaxDepth = 64;
Result<Json> json_parse(std::string_view text);

// Writes json_dump(j, indent) and a newline to `path` through write_file_atomic (atomic_file.h).
Status write_json_atomic(const std::string& path, const Json& j, int indent = 2);

// Lenient reads of one member of an object, for documents the project wrote itself (eval result
// lines, run.json, a script's output): a member that is absent or of another type, or a `j` that
// is no object, reads as the fallback, so an old or cut document degrades to "no value".
const Json* json_member(const Json& j, const char* key);  // nullptr when absent
double json_number(const Json& j, const char* key, double fallback = 0);
std::string json_string(const Json& j, const char* key, const std::string& fallback = "");
// The numbers (strings) of the array member `key`, other elements skipped; empty when no array.
std::vector<double> json_numbers(const Json& j, const char* key);
std::vector<std::string> json_strings(const Json& j, const char* key);

}  // namespace cisa
