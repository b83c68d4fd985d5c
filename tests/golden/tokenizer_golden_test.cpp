// Our tokenizers against llama.cpp on the two real models.
//
// The fixtures (tests/golden/fixtures/tokens_*.json, logits_*.bin) were written by
// tests/golden/scripts/make_llamacpp_fixtures.py from llama.cpp's own tokenizer; the models come
// from $CISA_MODELS_DIR or <repo>/models (scripts/pull_model.py). Every case must give identical
// token IDs, identical detokenized bytes, and every vocabulary entry must render to the same
// bytes (checked through per-block digests).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cisa/model/gguf.h"
#include "cisa/model/tokenizer.h"

namespace cisa {
namespace {

// ---- a minimal JSON reader for the fixture files --------------------------------------------

struct JValue {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<JValue> arr;
  std::map<std::string, JValue> obj;

  const JValue& operator[](const std::string& k) const {
    static const JValue null;
    auto it = obj.find(k);
    return it == obj.end() ? null : it->second;
  }
  bool has(const std::string& k) const { return obj.count(k) != 0; }
  int64_t i() const { return static_cast<int64_t>(num); }
};

class JParser {
 public:
  explicit JParser(const std::string& s) : s_(s) {}
  bool parse(JValue& out) {
    if (!value(out)) return false;
    ws();
    return p_ == s_.size();
  }

 private:
  void ws() {
    while (p_ < s_.size() && std::strchr(" \t\r\n", s_[p_]) != nullptr) ++p_;
  }
  bool lit(const char* w) {
    const size_t n = std::strlen(w);
    if (s_.compare(p_, n, w) != 0) return false;
    p_ += n;
    return true;
  }
  static void put_utf8(std::string& o, uint32_t cp) {
    if (cp < 0x80) {
      o += static_cast<char>(cp);
    } else if (cp < 0x800) {
      o += static_cast<char>(0xC0 | (cp >> 6));
      o += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      o += static_cast<char>(0xE0 | (cp >> 12));
      o += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      o += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      o += static_cast<char>(0xF0 | (cp >> 18));
      o += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      o += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      o += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  bool hex4(uint32_t& v) {
    if (p_ + 4 > s_.size()) return false;
    v = static_cast<uint32_t>(std::stoul(s_.substr(p_, 4), nullptr, 16));
    p_ += 4;
    return true;
  }
  bool string(std::string& o) {
    if (s_[p_] != '"') return false;
    ++p_;
    while (p_ < s_.size() && s_[p_] != '"') {
      char c = s_[p_++];
      if (c != '\\') {
        o += c;
        continue;
      }
      if (p_ >= s_.size()) return false;
      c = s_[p_++];
      switch (c) {
        case 'n':
          o += '\n';
          break;
        case 't':
          o += '\t';
          break;
        case 'r':
          o += '\r';
          break;
        case 'b':
          o += '\b';
          break;
        case 'f':
          o += '\f';
          break;
        case 'u': {
          uint32_t cp = 0;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && lit("\\u")) {
            uint32_t lo = 0;
            if (!hex4(lo)) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          put_utf8(o, cp);
          break;
        }
        default:
          o += c;  // \" \\ \/
      }
    }
    if (p_ >= s_.size()) return false;
    ++p_;
    return true;
  }
  bool value(JValue& v) {
    ws();
    if (p_ >= s_.size()) return false;
    const char c = s_[p_];
    if (c == '{') {
      v.kind = JValue::kObject;
      ++p_;
      ws();
      if (s_[p_] == '}') return ++p_, true;
      while (true) {
        ws();
        std::string key;
        if (!string(key)) return false;
        ws();
        if (s_[p_++] != ':') return false;
        if (!value(v.obj[key])) return false;
        ws();
        if (s_[p_] == ',') {
          ++p_;
          continue;
        }
        if (s_[p_] == '}') return ++p_, true;
        return false;
      }
    }
    if (c == '[') {
      v.kind = JValue::kArray;
      ++p_;
      ws();
      if (s_[p_] == ']') return ++p_, true;
      while (true) {
        v.arr.emplace_back();
        if (!value(v.arr.back())) return false;
        ws();
        if (s_[p_] == ',') {
          ++p_;
          continue;
        }
        if (s_[p_] == ']') return ++p_, true;
        return false;
      }
    }
    if (c == '"') {
      v.kind = JValue::kString;
      return string(v.str);
    }
    if (lit("true")) {
      v.kind = JValue::kBool;
      v.b = true;
      return true;
    }
    if (lit("false")) {
      v.kind = JValue::kBool;
      v.b = false;
      return true;
    }
    if (lit("null")) {
      v.kind = JValue::kNull;
      return true;
    }
    size_t used = 0;
    v.num = std::stod(s_.substr(p_, 40), &used);
    v.kind = JValue::kNumber;
    p_ += used;
    return used > 0;
  }
  const std::string& s_;
  size_t p_ = 0;
};

// ---- helpers --------------------------------------------------------------------------------

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string from_hex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  }
  return out;
}

std::string printable(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F) {
      o += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      o += buf;
    }
  }
  return o;
}

std::string models_dir() {
  const char* env = std::getenv("CISA_MODELS_DIR");
  return env && *env ? std::string(env) : std::string(CISA_SOURCE_DIR) + "/models";
}

struct ModelCase {
  const char* name;  // fixture suffix
  const char* file;  // GGUF file name in the models directory
};

void PrintTo(const ModelCase& m, std::ostream* os) {
  *os << m.name;
}

const ModelCase kModels[] = {
    {"gemma3-270m", "gemma-3-270m-q4_k_m.gguf"},
    {"smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"},
};

class TokenizerGolden : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    const ModelCase& mc = GetParam();
    const std::string fixture =
        std::string(CISA_SOURCE_DIR) + "/tests/golden/fixtures/tokens_" + mc.name + ".json";
    const std::string text = read_file(fixture);
    ASSERT_FALSE(text.empty()) << "missing fixture " << fixture
                               << " (tests/golden/scripts/make_llamacpp_fixtures.py)";
    ASSERT_TRUE(JParser(text).parse(fx_)) << "cannot parse " << fixture;

    const std::string path = models_dir() + "/" + mc.file;
    if (!std::ifstream(path).good()) {
      GTEST_SKIP() << "model file " << path << " is absent; fetch it with scripts/pull_model.py "
                   << "or point CISA_MODELS_DIR at a directory holding it";
    }
    auto file = GgufFile::open(path);
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    auto tok = Tokenizer::from_gguf(*file);
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    tok_ = std::make_unique<Tokenizer>(std::move(*tok));
  }

  JValue fx_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_P(TokenizerGolden, VocabularyAndSpecialIds) {
  EXPECT_EQ(tok_->vocab_size(), fx_["vocab_size"].i());
  EXPECT_EQ(tok_->bos_id(), fx_["bos"].i());
  EXPECT_EQ(tok_->eos_id(), fx_["eos"].i());
  EXPECT_EQ(tok_->adds_bos(), fx_["add_bos"].b);
  // llama.cpp picks the end-of-turn token by iterating a hash map when several texts qualify
  // (SmolLM2: <|im_end|> and <|endoftext|>); we take the first in its list. Both end generation.
  EXPECT_TRUE(tok_->is_eog(tok_->eot_id()));
  EXPECT_TRUE(tok_->is_eog(static_cast<int32_t>(fx_["eot"].i())));
  std::vector<int32_t> eog;
  for (int32_t id = 0; id < tok_->vocab_size(); ++id) {
    if (tok_->is_eog(id)) eog.push_back(id);
  }
  std::vector<int32_t> want;
  for (const JValue& v : fx_["eog_ids"].arr) want.push_back(static_cast<int32_t>(v.i()));
  EXPECT_EQ(eog, want);
}

TEST_P(TokenizerGolden, TokenIdsMatchLlamaCpp) {
  ASSERT_GT(fx_["cases"].arr.size(), 100u);
  int round_trips = 0;
  for (const JValue& c : fx_["cases"].arr) {
    const std::string text = from_hex(c["text_hex"].str);
    const bool add_special = c["add_special"].b;
    const bool parse_special = c["parse_special"].b;
    std::vector<int32_t> want;
    for (const JValue& v : c["ids"].arr) want.push_back(static_cast<int32_t>(v.i()));
    const std::vector<int32_t> got = tok_->encode(text, add_special, parse_special);
    EXPECT_EQ(got, want) << "case " << c["name"].str << " add_special=" << add_special
                         << " parse_special=" << parse_special << " text=\"" << printable(text)
                         << "\"";

    const std::string detok = from_hex(c["detok_hex"].str);
    EXPECT_EQ(printable(tok_->decode(want)), printable(detok)) << "decode, case " << c["name"].str;
    EXPECT_EQ(printable(tok_->decode(want, /*render_special=*/true)),
              printable(from_hex(c["detok_special_hex"].str)))
        << "decode with specials, case " << c["name"].str;
    if (detok == text) {
      ++round_trips;
      EXPECT_EQ(printable(tok_->decode(tok_->encode(text, add_special, parse_special))),
                printable(text))
          << "round trip, case " << c["name"].str;
    }
  }
  EXPECT_GT(round_trips, 50);
}

uint64_t fnv1a64(const std::string& bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

TEST_P(TokenizerGolden, EveryTokenPieceMatchesLlamaCpp) {
  const int64_t block = fx_["piece_digest_block"].i();
  ASSERT_GT(block, 0);
  for (bool special : {false, true}) {
    const JValue& digests = fx_[special ? "piece_digests_special" : "piece_digests"];
    ASSERT_EQ(static_cast<int64_t>(digests.arr.size()), (tok_->vocab_size() + block - 1) / block);
    int mismatches = 0;
    for (size_t b = 0; b < digests.arr.size(); ++b) {
      uint64_t h = 0xCBF29CE484222325ull;
      const int32_t end =
          static_cast<int32_t>(std::min<int64_t>((b + 1) * block, tok_->vocab_size()));
      for (int32_t id = static_cast<int32_t>(b * block); id < end; ++id) {
        const std::string p = tok_->token_to_piece(id, special);
        const uint32_t n = static_cast<uint32_t>(p.size());
        std::string len(4, '\0');
        for (int k = 0; k < 4; ++k) len[k] = static_cast<char>((n >> (8 * k)) & 0xFF);
        h = fnv1a64(len + p, h);
      }
      char hex[20];
      std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
      if (digests.arr[b].str != hex && ++mismatches <= 5) {
        ADD_FAILURE() << "token pieces (special=" << special << ") differ in ids [" << b * block
                      << ", " << end << ")";
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

// The long prompts of the logits fixtures: thousands of tokens of 19th-century prose.
TEST_P(TokenizerGolden, LongPromptsMatchLlamaCpp) {
  const std::string path =
      std::string(CISA_SOURCE_DIR) + "/tests/golden/fixtures/logits_" + GetParam().name + ".bin";
  const std::string bin = read_file(path);
  if (bin.empty()) GTEST_SKIP() << "no logits fixture " << path;
  size_t p = 0;
  auto need = [&](size_t n) { return p + n <= bin.size(); };
  auto u32 = [&]() {
    uint32_t v = 0;
    std::memcpy(&v, bin.data() + p, 4);
    p += 4;
    return v;
  };
  auto str = [&]() {
    const uint32_t n = u32();
    std::string s = bin.substr(p, n);
    p += n;
    return s;
  };
  ASSERT_TRUE(need(12));
  ASSERT_EQ(bin.substr(0, 8), "CISALOG1");
  p = 8;
  ASSERT_EQ(u32(), 1u);
  str();  // metadata
  ASSERT_TRUE(need(12));
  u32();  // n_vocab
  const uint32_t top_k = u32();
  const uint32_t n_prompts = u32();
  ASSERT_GE(n_prompts, 3u);
  for (uint32_t i = 0; i < n_prompts; ++i) {
    const std::string name = str();
    str();  // source
    const std::string text = str();
    ASSERT_TRUE(need(4));
    const uint32_t n = u32();
    ASSERT_TRUE(need(4ull * n));
    std::vector<int32_t> want(n);
    std::memcpy(want.data(), bin.data() + p, 4ull * n);
    p += 4ull * n;
    const uint32_t n_pos = u32();
    p += 4ull * n_pos + static_cast<size_t>(n_pos) * (8ull * top_k + 4);
    ASSERT_LE(p, bin.size());
    const std::vector<int32_t> got = tok_->encode(text, /*add_bos=*/true);
    ASSERT_EQ(got.size(), want.size()) << name;
    size_t first_diff = 0;
    while (first_diff < n && got[first_diff] == want[first_diff]) ++first_diff;
    EXPECT_EQ(first_diff, want.size()) << name << ": first difference at token " << first_diff;
    EXPECT_EQ(tok_->decode(got), text) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TokenizerGolden, ::testing::ValuesIn(kModels),
                         [](const ::testing::TestParamInfo<ModelCase>& info) {
                           std::string s = info.param.name;
                           for (char& c : s) {
                             if (c == '-') c = '_';
                           }
                           return s;
                         });

}  // namespace
}  // namespace cisa
