// json_dump writes what the project's own writer wrote before nlohmann-json held the values (the
// committed results and eval files depend on it): %.10g numbers, the same escapes, the same layout;
// json_parse reads it back, rejects malformed input with an error value, and bounds the nesting.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "cisa/core/json.h"

namespace cisa {
namespace {

TEST(JsonFormat, Numbers) {
  EXPECT_EQ(json_dump(Json(0)), "0");
  EXPECT_EQ(json_dump(Json(-12)), "-12");
  EXPECT_EQ(json_dump(Json(int64_t{1} << 40)), "1099511627776");
  EXPECT_EQ(json_dump(Json(std::numeric_limits<int64_t>::min())), "-9223372036854775808");
  EXPECT_EQ(json_dump(Json(std::numeric_limits<uint64_t>::max())), "18446744073709551615");
  EXPECT_EQ(json_dump(Json(size_t{7})), "7");
  // Doubles: %.10g, never nlohmann's "1.0" or its 17 digits.
  EXPECT_EQ(json_dump(Json(1.0)), "1");
  EXPECT_EQ(json_dump(Json(-0.25)), "-0.25");
  EXPECT_EQ(json_dump(Json(1e-5)), "1e-05");
  EXPECT_EQ(json_dump(Json(-3e-5)), "-3e-05");
  EXPECT_EQ(json_dump(Json(0.1 + 0.2)), "0.3");
  EXPECT_EQ(json_dump(Json(2.0 / 3.0)), "0.6666666667");
  EXPECT_EQ(json_dump(Json(1234567890.0)), "1234567890");
  EXPECT_EQ(json_dump(Json(12345678901.0)), "1.23456789e+10");
  EXPECT_EQ(json_dump(Json(1.5e300)), "1.5e+300");
  EXPECT_EQ(json_dump(Json(0.1f)), "0.1000000015");  // a float widened to double, as before
  // JSON has no NaN or infinity.
  EXPECT_EQ(json_dump(Json(std::nan(""))), "null");
  EXPECT_EQ(json_dump(Json(std::numeric_limits<double>::infinity())), "null");
  EXPECT_EQ(json_dump(Json(-std::numeric_limits<double>::infinity())), "null");
}

TEST(JsonFormat, Scalars) {
  EXPECT_EQ(json_dump(Json()), "null");
  EXPECT_EQ(json_dump(Json(nullptr)), "null");
  EXPECT_EQ(json_dump(Json(true)), "true");
  EXPECT_EQ(json_dump(Json(false)), "false");
  EXPECT_EQ(json_dump(Json("text")), "\"text\"");
  EXPECT_EQ(json_dump(Json(std::string("a\0b", 3))), "\"a\\u0000b\"");
}

TEST(JsonFormat, Escapes) {
  EXPECT_EQ(json_quote("\"\\/"), "\"\\\"\\\\/\"");
  EXPECT_EQ(json_quote("\n\r\t"), "\"\\n\\r\\t\"");
  // Other control characters and DEL as \u00xx (lower-case hex), \b and \f included.
  EXPECT_EQ(json_quote("\b\f\x01\x1f\x7f"), "\"\\u0008\\u000c\\u0001\\u001f\\u007f\"");
  // Well-formed UTF-8 passes through; each byte of a malformed sequence becomes \ufffd.
  EXPECT_EQ(json_quote("\xc3\xa9\xe2\x96\x81\xf0\x9f\x98\x80"),
            "\"\xc3\xa9\xe2\x96\x81\xf0\x9f\x98\x80\"");
  EXPECT_EQ(json_quote("a\xe2\x96"), "\"a\\ufffd\\ufffd\"");
  EXPECT_EQ(json_quote("\xe9t\xe9"), "\"\\ufffdt\\ufffd\"");
  // Keys are escaped the same way; the whole document is then valid UTF-8 JSON.
  Json j = Json::object();
  j["k\"\xff"] = "v\x1b";
  EXPECT_EQ(json_dump(j), "{\"k\\\"\\ufffd\":\"v\\u001b\"}");
  auto back = json_parse(json_dump(j));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(json_string(*back, "k\"\xef\xbf\xbd"), "v\x1b");
}

TEST(JsonFormat, LayoutKeepsInsertionOrder) {
  Json j = Json::object();
  j["zeta"] = 1;
  j["alpha"] = Json::array({1.5, 2, "x"});
  j["empty_list"] = Json::array();
  j["empty_object"] = Json::object();
  j["nested"]["b"] = true;  // a null member becomes an object
  j["nested"]["a"] = nullptr;
  j["list"].push_back(Json::object());  // a null member becomes an array
  EXPECT_EQ(json_dump(j),
            "{\"zeta\":1,\"alpha\":[1.5,2,\"x\"],\"empty_list\":[],\"empty_object\":{},"
            "\"nested\":{\"b\":true,\"a\":null},\"list\":[{}]}");
  EXPECT_EQ(json_dump(j, 2),
            "{\n"
            "  \"zeta\": 1,\n"
            "  \"alpha\": [\n"
            "    1.5,\n"
            "    2,\n"
            "    \"x\"\n"
            "  ],\n"
            "  \"empty_list\": [],\n"
            "  \"empty_object\": {},\n"
            "  \"nested\": {\n"
            "    \"b\": true,\n"
            "    \"a\": null\n"
            "  },\n"
            "  \"list\": [\n"
            "    {}\n"
            "  ]\n"
            "}");
  EXPECT_EQ(json_dump(Json::array({1, 2}), 4), "[\n    1,\n    2\n]");
}

TEST(JsonParse, ReadsWhatJsonDumpWrites) {
  Json j = Json::object();
  j["id"] = "niah_single/4096/0";
  j["text"] = std::string("line\n\"quoted\"\t\\ \x01 \xc3\xa9");
  j["score"] = 0.25;
  j["n"] = -12;
  j["list"] = Json::array({1.5, 2, -3e-5, "skipped"});
  j["names"] = Json::array({"a", 1, "b"});
  j["flag"] = true;
  j["none"] = nullptr;
  auto v = json_parse(json_dump(j));
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(json_string(*v, "id"), "niah_single/4096/0");
  EXPECT_EQ(json_string(*v, "text"), std::string("line\n\"quoted\"\t\\ \x01 \xc3\xa9"));
  EXPECT_EQ(json_number(*v, "score"), 0.25);
  EXPECT_EQ(json_number(*v, "n"), -12);
  EXPECT_EQ(json_numbers(*v, "list"), (std::vector<double>{1.5, 2, -3e-5}));
  EXPECT_EQ(json_strings(*v, "names"), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(json_member(*v, "flag")->get<bool>());
  EXPECT_TRUE(json_member(*v, "none")->is_null());
  EXPECT_EQ(json_member(*v, "missing"), nullptr);
  // Lenient reads: absent, another type, or no object at all give the fallback.
  EXPECT_EQ(json_number(*v, "missing", 7), 7);
  EXPECT_EQ(json_number(*v, "id", 7), 7);
  EXPECT_EQ(json_string(*v, "score", "fb"), "fb");
  EXPECT_TRUE(json_numbers(*v, "score").empty());
  EXPECT_EQ(json_number(Json::array({1}), "x", 3), 3);
  EXPECT_EQ(json_string(Json(), "x"), "");
}

TEST(JsonParse, UnicodeEscapes) {
  auto v = json_parse(R"({"a":"\u00e9\ud83d\ude00\/"})");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(json_string(*v, "a"), "\xc3\xa9\xF0\x9F\x98\x80/");
}

TEST(JsonParse, RejectsMalformedWithAMessage) {
  for (const char* bad : {"", "{", "{\"a\":}", "{\"a\":1,}", "[1 2]", "{\"a\":\"x}", "{\"a\":tru}",
                          "{} x", "{\"a\":\"\\q\"}", "{\"a\":\"\\ud800\\u0041\"}", "{\"a\":1e}",
                          "\"\x01\"", "\"\xff\"", "{\"a\":NaN}"}) {
    auto r = json_parse(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(r.status().message().rfind("JSON: ", 0), 0u) << r.status().message();
    EXPECT_EQ(r.status().message().find("[json.exception"), std::string::npos);
  }
  EXPECT_NE(json_parse("{\"a\":").status().message().find("column"), std::string::npos);
}

TEST(JsonParse, BoundsTheNesting) {
  auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  EXPECT_TRUE(json_parse(nested(kJsonMaxDepth)).ok());
  auto deep = json_parse(nested(100));
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("nesting"), std::string::npos);
  EXPECT_FALSE(json_parse(nested(100000)).ok());
}

// The JSON documents committed under docs/eval/runs (cisa eval's run.json and results.jsonl) and
// bench/results (`cisa bench model --json` outputs; the other files there were assembled by Python
// scripts) were written by the writer before this one: re-writing the parsed value must give the
// same bytes.
std::vector<std::filesystem::path> committed(const char* dir, const char* ext) {
  std::vector<std::filesystem::path> out;
  const std::filesystem::path root = std::filesystem::path(CISA_SOURCE_DIR) / dir;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file() && it->path().extension() == ext) out.push_back(it->path());
  return out;
}

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(JsonFormat, RewritesCommittedDocumentsByteForByte) {
  std::vector<std::filesystem::path> pretty = committed("docs/eval/runs", ".json");
  for (const auto& p : committed("bench/results", ".json")) {
    const std::string name = p.filename().string();
    if (name.find("gemma3") != std::string::npos && name.find("llamacpp") == std::string::npos)
      pretty.push_back(p);
  }
  int documents = 0;
  for (const auto& p : pretty) {
    const std::string text = read_all(p);
    auto v = json_parse(text);
    ASSERT_TRUE(v.ok()) << p << ": " << v.status().message();
    EXPECT_EQ(json_dump(*v, 2) + "\n", text) << p;
    ++documents;
  }
  for (const auto& p : committed("docs/eval/runs", ".jsonl")) {
    std::ifstream in(p, std::ios::binary);
    std::string line;
    while (std::getline(in, line)) {
      auto v = json_parse(line);
      ASSERT_TRUE(v.ok()) << p << ": " << v.status().message();
      EXPECT_EQ(json_dump(*v), line) << p;
      ++documents;
    }
  }
  if (documents == 0) GTEST_SKIP() << "no committed JSON documents under " << CISA_SOURCE_DIR;
  RecordProperty("documents", documents);
}

}  // namespace
}  // namespace cisa
