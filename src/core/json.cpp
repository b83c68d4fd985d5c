#include "cisa/json.h"

#include <cmath>
#include <cstdio>

namespace cisa {

Json& Json::operator[](const std::string& key) {
  if (std::holds_alternative<std::nullptr_t>(v_)) v_ = Object{};
  auto& obj = std::get<Object>(v_);
  for (auto& [k, v] : obj)
    if (k == key) return v;
  obj.emplace_back(key, Json());
  return obj.back().second;
}

void Json::push_back(Json j) {
  if (std::holds_alternative<std::nullptr_t>(v_)) v_ = Array{};
  std::get<Array>(v_).push_back(std::move(j));
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

void Json::dump_to(std::string& out, int indent, int depth) const {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  if (std::holds_alternative<std::nullptr_t>(v_)) {
    out += "null";
  } else if (auto* b = std::get_if<bool>(&v_)) {
    out += *b ? "true" : "false";
  } else if (auto* i = std::get_if<int64_t>(&v_)) {
    out += std::to_string(*i);
  } else if (auto* d = std::get_if<double>(&v_)) {
    if (!std::isfinite(*d)) {
      out += "null";  // JSON has no NaN or infinity
    } else {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.10g", *d);
      out += buf;
    }
  } else if (auto* s = std::get_if<std::string>(&v_)) {
    out += json_quote(*s);
  } else if (auto* a = std::get_if<Array>(&v_)) {
    out += '[';
    for (size_t k = 0; k < a->size(); ++k) {
      if (k) out += ',';
      newline(depth + 1);
      (*a)[k].dump_to(out, indent, depth + 1);
    }
    if (!a->empty()) newline(depth);
    out += ']';
  } else {
    const auto& o = std::get<Object>(v_);
    out += '{';
    for (size_t k = 0; k < o.size(); ++k) {
      if (k) out += ',';
      newline(depth + 1);
      out += json_quote(o[k].first);
      out += indent < 0 ? ":" : ": ";
      o[k].second.dump_to(out, indent, depth + 1);
    }
    if (!o.empty()) newline(depth);
    out += '}';
  }
}

std::string Json::dump(int indent) const {
  std::string out;
  dump_to(out, indent, 0);
  return out;
}

}  // namespace cisa
