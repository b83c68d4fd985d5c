// cisa/json.h — a small JSON value for `--json` output and result files.
//
//   cisa::Json j = cisa::Json::object();
//   j["context"] = 65536;
//   j["ratios"] = cisa::Json::array({1.0, 2.5});
//   std::cout << j.dump(2) << "\n";
//
// Objects keep insertion order so printed documents read in the order they were built.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace cisa {

class Json {
 public:
  using Array = std::vector<Json>;
  using Object = std::vector<std::pair<std::string, Json>>;

  Json() : v_(nullptr) {}
  Json(std::nullptr_t) : v_(nullptr) {}
  Json(bool b) : v_(b) {}
  Json(int x) : v_(static_cast<int64_t>(x)) {}
  Json(long x) : v_(static_cast<int64_t>(x)) {}
  Json(long long x) : v_(static_cast<int64_t>(x)) {}
  Json(unsigned x) : v_(static_cast<int64_t>(x)) {}
  Json(unsigned long x) : v_(static_cast<int64_t>(x)) {}
  Json(unsigned long long x) : v_(static_cast<int64_t>(x)) {}
  Json(double x) : v_(x) {}
  Json(float x) : v_(static_cast<double>(x)) {}
  Json(const char* s) : v_(std::string(s)) {}
  Json(std::string s) : v_(std::move(s)) {}
  Json(Array a) : v_(std::move(a)) {}

  static Json object() { Json j; j.v_ = Object{}; return j; }
  static Json array(std::initializer_list<Json> items = {}) { return Json(Array(items)); }

  // Object access; turns a null into an object. Inserts the key when absent.
  Json& operator[](const std::string& key);
  // Array append; turns a null into an array.
  void push_back(Json j);

  bool is_object() const { return std::holds_alternative<Object>(v_); }
  bool is_array() const { return std::holds_alternative<Array>(v_); }
  // Compact when indent < 0; otherwise pretty with `indent` spaces.
  std::string dump(int indent = -1) const;

 private:
  void dump_to(std::string& out, int indent, int depth) const;
  std::variant<std::nullptr_t, bool, int64_t, double, std::string, Array, Object> v_;
};

// Escapes a string for inclusion in JSON (with the quotes). The output is always valid UTF-8 JSON:
// control characters become \u00XX, and every byte that is not part of a well-formed UTF-8
// sequence becomes \ufffd (the replacement character).
std::string json_quote(const std::string& s);

}  // namespace cisa
