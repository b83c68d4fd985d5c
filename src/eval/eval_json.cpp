// Recursive-descent JSON reader (RFC 8259) for the eval result lines.
#include "eval_json.h"

#include <cctype>
#include <cstdlib>

namespace cisa::eval::detail {
namespace {

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  Status parse(JsonValue* out) {
    CISA_RETURN_IF_ERROR(value(out, 0));
    ws();
    if (i_ != s_.size()) return err("trailing characters");
    return Status::Ok();
  }

 private:
  Status err(const std::string& what) const {
    return data_loss("JSON: " + what + " at byte " + std::to_string(i_));
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  bool lit(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  static void put_utf8(std::string& o, uint32_t cp) {
    if (cp < 0x80)
      o.push_back(static_cast<char>(cp));
    else if (cp < 0x800)
      o += {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    else if (cp < 0x10000)
      o += {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
            static_cast<char>(0x80 | (cp & 0x3F))};
    else
      o += {static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
            static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
  }
  Status hex4(uint32_t* cp) {
    if (i_ + 4 > s_.size()) return err("short \\u escape");
    *cp = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      *cp <<= 4;
      if (c >= '0' && c <= '9')
        *cp |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        *cp |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        *cp |= static_cast<uint32_t>(c - 'A' + 10);
      else
        return err("bad \\u escape");
    }
    return Status::Ok();
  }
  Status string(std::string* o) {
    ++i_;  // opening quote
    while (true) {
      if (i_ >= s_.size()) return err("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return Status::Ok();
      if (static_cast<unsigned char>(c) < 0x20) return err("control character in string");
      if (c != '\\') {
        o->push_back(c);
        continue;
      }
      if (i_ >= s_.size()) return err("unterminated escape");
      const char e = s_[i_++];
      switch (e) {
        case '"':
          o->push_back('"');
          break;
        case '\\':
          o->push_back('\\');
          break;
        case '/':
          o->push_back('/');
          break;
        case 'b':
          o->push_back('\b');
          break;
        case 'f':
          o->push_back('\f');
          break;
        case 'n':
          o->push_back('\n');
          break;
        case 'r':
          o->push_back('\r');
          break;
        case 't':
          o->push_back('\t');
          break;
        case 'u': {
          uint32_t cp = 0;
          CISA_RETURN_IF_ERROR(hex4(&cp));
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(i_, 2) == "\\u") {
            i_ += 2;
            uint32_t lo = 0;
            CISA_RETURN_IF_ERROR(hex4(&lo));
            if (lo < 0xDC00 || lo >= 0xE000) return err("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          put_utf8(*o, cp);
          break;
        }
        default:
          return err("bad escape");
      }
    }
  }
  Status value(JsonValue* v, int depth) {
    if (depth > 64) return err("nesting too deep");
    ws();
    if (i_ >= s_.size()) return err("unexpected end");
    const char c = s_[i_];
    if (c == '{') {
      v->type = JsonValue::Type::kObject;
      ++i_;
      ws();
      if (i_ < s_.size() && s_[i_] == '}') return ++i_, Status::Ok();
      while (true) {
        ws();
        if (i_ >= s_.size() || s_[i_] != '"') return err("expected a key");
        std::string key;
        CISA_RETURN_IF_ERROR(string(&key));
        ws();
        if (i_ >= s_.size() || s_[i_] != ':') return err("expected ':'");
        ++i_;
        CISA_RETURN_IF_ERROR(value(&v->obj[key], depth + 1));
        ws();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == '}') return ++i_, Status::Ok();
        return err("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v->type = JsonValue::Type::kArray;
      ++i_;
      ws();
      if (i_ < s_.size() && s_[i_] == ']') return ++i_, Status::Ok();
      while (true) {
        v->arr.emplace_back();
        CISA_RETURN_IF_ERROR(value(&v->arr.back(), depth + 1));
        ws();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == ']') return ++i_, Status::Ok();
        return err("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v->type = JsonValue::Type::kString;
      return string(&v->str);
    }
    if (lit("true")) {
      v->type = JsonValue::Type::kBool;
      v->b = true;
      return Status::Ok();
    }
    if (lit("false")) {
      v->type = JsonValue::Type::kBool;
      return Status::Ok();
    }
    if (lit("null")) return Status::Ok();
    // Number: strtod on a bounded copy of the number's characters.
    size_t j = i_;
    while (j < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[j])) || s_[j] == '-' ||
                             s_[j] == '+' || s_[j] == '.' || s_[j] == 'e' || s_[j] == 'E'))
      ++j;
    if (j == i_) return err("unexpected character");
    const std::string num(s_.substr(i_, j - i_));
    char* end = nullptr;
    v->num = std::strtod(num.c_str(), &end);
    if (end != num.c_str() + num.size()) return err("bad number");
    v->type = JsonValue::Type::kNumber;
    i_ = j;
    return Status::Ok();
  }

  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace

const JsonValue* JsonValue::get(const std::string& key) const {
  if (type != Type::kObject) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &it->second;
}

double JsonValue::number(const std::string& key, double fallback) const {
  const JsonValue* v = get(key);
  return v && v->type == Type::kNumber ? v->num : fallback;
}

std::string JsonValue::string(const std::string& key, const std::string& fallback) const {
  const JsonValue* v = get(key);
  return v && v->type == Type::kString ? v->str : fallback;
}

std::vector<double> JsonValue::numbers(const std::string& key) const {
  std::vector<double> out;
  if (const JsonValue* v = get(key); v && v->type == Type::kArray)
    for (const auto& x : v->arr)
      if (x.type == Type::kNumber) out.push_back(x.num);
  return out;
}

std::vector<std::string> JsonValue::strings(const std::string& key) const {
  std::vector<std::string> out;
  if (const JsonValue* v = get(key); v && v->type == Type::kArray)
    for (const auto& x : v->arr)
      if (x.type == Type::kString) out.push_back(x.str);
  return out;
}

Result<JsonValue> parse_json(std::string_view text) {
  JsonValue v;
  Parser p(text);
  CISA_RETURN_IF_ERROR(p.parse(&v));
  return v;
}

}  // namespace cisa::eval::detail
