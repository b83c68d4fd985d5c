// json_dump / json_quote / json_parse: the project's format over nlohmann::ordered_json (json.h).
#include "cisa/core/json.h"

#include <cmath>
#include <cstdio>

#include "cisa/core/atomic_file.h"

namespace cisa {
namespace {

// Length of the well-formed UTF-8 sequence starting at s[i] (Unicode 15, table 3-7: no overlong
// forms, no surrogates, nothing above U+10FFFF), or 0 when the bytes there are not one.
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = at(i);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c == 0xE0)
    n = 3, lo = 0xA0;
  else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
    n = 3;
  else if (c == 0xED)
    n = 3, hi = 0x9F;
  else if (c == 0xF0)
    n = 4, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3)
    n = 4;
  else if (c == 0xF4)
    n = 4, hi = 0x8F;
  else
    return 0;
  if (i + n > s.size()) return 0;
  if (at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (at(i + k) < 0x80 || at(i + k) > 0xBF) return 0;
  return n;
}

void quote_to(std::string& out, std::string_view s) {
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7F) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else if (c < 0x80) {
          out += static_cast<char>(c);
        } else if (const size_t n = utf8_sequence_length(s, i)) {
          out.append(s, i, n);
          i += n - 1;
        } else {
          // Not UTF-8 (a cut multi-byte character, a Latin-1 byte): the replacement character,
          // one per offending byte.
          out += "\\ufffd";
        }
    }
  }
  out += '"';
}

void dump_to(std::string& out, const Json& j, int indent, int depth) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(d), ' ');
  };
  switch (j.type()) {
    case Json::value_t::boolean:
      out += j.get<bool>() ? "true" : "false";
      break;
    case Json::value_t::number_integer:
      out += std::to_string(j.get<int64_t>());
      break;
    case Json::value_t::number_unsigned:
      out += std::to_string(j.get<uint64_t>());
      break;
    case Json::value_t::number_float: {
      const double d = j.get<double>();
      if (!std::isfinite(d)) {
        out += "null";  // JSON has no NaN or infinity
      } else {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.10g", d);
        out += buf;
      }
      break;
    }
    case Json::value_t::string:
      quote_to(out, j.get_ref<const std::string&>());
      break;
    case Json::value_t::array: {
      out += '[';
      bool first = true;
      for (const Json& v : j) {
        if (!first) out += ',';
        first = false;
        newline(depth + 1);
        dump_to(out, v, indent, depth + 1);
      }
      if (!j.empty()) newline(depth);
      out += ']';
      break;
    }
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) out += ',';
        first = false;
        newline(depth + 1);
        quote_to(out, it.key());
        out += indent < 0 ? ":" : ": ";
        dump_to(out, it.value(), indent, depth + 1);
      }
      if (!j.empty()) newline(depth);
      out += '}';
      break;
    }
    default:  // null; binary and discarded values are never built by the project
      out += "null";
  }
}

struct TooDeep {};

}  // namespace

std::string json_quote(std::string_view s) {
  std::string out;
  quote_to(out, s);
  return out;
}

std::string json_dump(const Json& j, int indent) {
  std::string out;
  dump_to(out, j, indent, 0);
  return out;
}

Result<Json> json_parse(std::string_view text) {
  // nlohmann's parser keeps its own stack (no recursion); the bound is on what callers walk.
  const Json::parser_callback_t bound_depth = [](int depth, Json::parse_event_t, Json&) {
    if (depth > kJsonMaxDepth) throw TooDeep{};
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), bound_depth);
  } catch (const TooDeep&) {
    return data_loss("JSON: nesting deeper than " + std::to_string(kJsonMaxDepth));
  } catch (const Json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 7: ..." without the tag.
    std::string what = e.what();
    if (const size_t tag = what.find("] ");
        what.rfind("[json.exception.", 0) == 0 && tag != std::string::npos)
      what.erase(0, tag + 2);
    return data_loss("JSON: " + what);
  }
}

Status write_json_atomic(const std::string& path, const Json& j, int indent) {
  return write_file_atomic(path, json_dump(j, indent) + "\n");
}

const Json* json_member(const Json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

double json_number(const Json& j, const char* key, double fallback) {
  const Json* v = json_member(j, key);
  return v && v->is_number() ? v->get<double>() : fallback;
}

std::string json_string(const Json& j, const char* key, const std::string& fallback) {
  const Json* v = json_member(j, key);
  return v && v->is_string() ? v->get<std::string>() : fallback;
}

std::vector<double> json_numbers(const Json& j, const char* key) {
  std::vector<double> out;
  if (const Json* v = json_member(j, key); v && v->is_array())
    for (const Json& x : *v)
      if (x.is_number()) out.push_back(x.get<double>());
  return out;
}

std::vector<std::string> json_strings(const Json& j, const char* key) {
  std::vector<std::string> out;
  if (const Json* v = json_member(j, key); v && v->is_array())
    for (const Json& x : *v)
      if (x.is_string()) out.push_back(x.get<std::string>());
  return out;
}

}  // namespace cisa
