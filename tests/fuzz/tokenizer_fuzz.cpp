// tokenizer_fuzz — libFuzzer target for the tokenizers on arbitrary text (tests/fuzz/CMakeLists.txt
// says how to run it; seeds in tests/fuzz/corpus/tokenizer/).
//
// The tokenizers come from GGUF metadata, as in `cisa run`: three small synthetic vocabularies
// written here (SentencePiece with byte fallback, the same with a space prefix, byte-level BPE with
// the smollm pre-tokenizer), plus the real models' vocabularies when their files exist: every
// path in CISA_FUZZ_MODELS (colon-separated), else every models/*.gguf under the working folder
// (Gemma 3: SentencePiece, SmolLM2: byte-level BPE).
//
// Input: byte 0 picks the tokenizer (modulo how many loaded), byte 1 the flags (bit 0:
// parse_special, bit 1: add_bos); the rest is the text. Invariants:
//  - every id encode returns is inside the vocabulary; with add_bos on a model that adds BOS, the
//    first id is BOS;
//  - decode equals the streamed pieces joined by Utf8StreamBuffer (up to the one leading space a
//    space-prefix tokenizer removes);
//  - decode(encode(x)) == x (rendering specials) for valid UTF-8 without add_bos, when the
//    vocabulary spells every byte of x (SentencePiece: <0xNN>; byte-level BPE: the byte's unit;
//    SmolLM2 lacks some control bytes' units and drops them, as llama.cpp does), no token of the
//    output renders as nothing (unused / undefined types, as llama.cpp), and, for SentencePiece,
//    the tokenizer adds no space prefix and x has no U+2581 (which decodes to ' ').
//    docs/tokenizers.md gives the rules.
#include <dirent.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cisa/model/gguf.h"
#include "cisa/model/tokenizer.h"
#include "gguf_test_builder.h"

namespace {

using cisa::testing::GgufBuilder;

[[noreturn]] void fail(const char* why) {
  std::fprintf(stderr, "tokenizer_fuzz: invariant broken: %s\n", why);
  __builtin_trap();
}

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// GPT-2's printable unit of byte b: bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF stand for themselves,
// the other 68 take U+0100 upwards in byte order.
std::string byte_unit(uint32_t b) {
  uint32_t next = 256;
  for (uint32_t x = 0; x < 256; ++x) {
    const bool self = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
    if (x == b) {
      std::string u;
      append_utf8(u, self ? b : next);
      return u;
    }
    if (!self) ++next;
  }
  return "";
}

struct Loaded {
  std::string name;
  std::unique_ptr<cisa::GgufFile> file;  // kept alive with the tokenizer made from it
  std::vector<uint8_t> bytes;            // the synthetic file's bytes (parse() borrows them)
  std::unique_ptr<cisa::Tokenizer> tok;
  bool lossless = false;  // the round trip holds for valid UTF-8 (see the header comment)
  bool space_prefix = false;
  // Bytes the vocabulary can spell: SentencePiece <0xNN>, byte-level BPE the byte's unit. Text
  // with another byte loses it (<unk>, or dropped as llama.cpp drops it), so it is not lossless.
  std::array<bool, 256> byte_covered{};
};

std::vector<Loaded>& tokenizers() {
  static std::vector<Loaded> t;
  return t;
}

void add_from_gguf(Loaded l) {
  auto t = cisa::Tokenizer::from_gguf(*l.file);
  if (!t.ok()) {
    std::fprintf(stderr, "tokenizer_fuzz: %s: %s (skipped)\n", l.name.c_str(),
                 t.status().message().c_str());
    return;
  }
  l.tok = std::make_unique<cisa::Tokenizer>(std::move(*t));
  int covered = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    std::string spelling;
    if (l.tok->kind() == cisa::TokenizerKind::kSentencePiece) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", b);
      spelling = hex;
    } else {
      spelling = byte_unit(b);
    }
    l.byte_covered[b] = l.tok->find_token(spelling) >= 0;
    covered += l.byte_covered[b];
  }
  std::fprintf(stderr, "tokenizer_fuzz: tokenizer %zu: %s (%d tokens, %d of 256 bytes spelt)\n",
               tokenizers().size(), l.name.c_str(), l.tok->vocab_size(), covered);
  tokenizers().push_back(std::move(l));
}

void add_synthetic(const std::string& name, GgufBuilder& g, bool lossless, bool space_prefix) {
  Loaded l;
  l.name = name;
  l.bytes = g.build();
  auto f = cisa::GgufFile::parse(std::span<const uint8_t>(l.bytes.data(), l.bytes.size()));
  if (!f.ok()) fail("the synthetic GGUF does not parse");
  l.file = std::make_unique<cisa::GgufFile>(std::move(*f));
  l.lossless = lossless;
  l.space_prefix = space_prefix;
  add_from_gguf(std::move(l));
}

// SentencePiece: <unk>, three control tokens, one user-defined, one unused, the 256 byte tokens,
// then pieces with scores so that merges compete.
void add_synthetic_spm(bool space_prefix) {
  std::vector<std::string> tokens = {"<unk>",           "<bos>", "<eos>",
                                     "<start_of_turn>", "<ud>",  "<unused0>"};
  std::vector<int32_t> types = {2, 3, 3, 3, 4, 5};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    tokens.push_back(hex);
    types.push_back(6);
  }
  for (const char* p : {"\xE2\x96\x81",
                        "a",
                        "b",
                        "c",
                        "e",
                        "h",
                        "t",
                        "ab",
                        "abc",
                        "bc",
                        "th",
                        "he",
                        "the",
                        "\xE2\x96\x81t",
                        "\xE2\x96\x81the",
                        "\xE2\x96\x81\xE2\x96\x81",
                        "\xC3\xA9",
                        "\xE4\xB8\xAD",
                        "\n",
                        "\n\n",
                        "1",
                        "12"}) {
    tokens.push_back(p);
    types.push_back(1);
  }
  std::vector<float> scores;
  for (size_t i = 0; i < tokens.size(); ++i)
    scores.push_back(types[i] == 1 ? -static_cast<float>(i % 7) : 0.0f);
  GgufBuilder g;
  g.add_string("general.architecture", "llama");
  g.add_string("tokenizer.ggml.model", "llama");
  g.add_string_array("tokenizer.ggml.tokens", tokens);
  g.add_array<float>("tokenizer.ggml.scores", GgufBuilder::F32, scores);
  g.add_array<int32_t>("tokenizer.ggml.token_type", GgufBuilder::I32, types);
  g.add_u32("tokenizer.ggml.unknown_token_id", 0);
  g.add_u32("tokenizer.ggml.bos_token_id", 1);
  g.add_u32("tokenizer.ggml.eos_token_id", 2);
  g.add_bool("tokenizer.ggml.add_space_prefix", space_prefix);
  add_synthetic(space_prefix ? "synthetic SentencePiece, space prefix" : "synthetic SentencePiece",
                g, /*lossless=*/!space_prefix, space_prefix);
}

// Byte-level BPE: GPT-2's 256 printable byte units, control tokens, and a few merges.
void add_synthetic_bpe() {
  std::vector<std::string> tokens;
  for (uint32_t b = 0; b < 256; ++b) tokens.push_back(byte_unit(b));
  std::vector<int32_t> types(tokens.size(), 1);
  const std::string sp = "\xC4\xA0";  // 'Ġ', the unit of ' '
  // "é" is the bytes C3 A9, whose units are U+00C3 'Ã' and U+00A9 '©'.
  const std::string e_acute = "\xC3\x83\xC2\xA9";
  const std::vector<std::string> merges = {sp + " t", "h e",         sp + "t he",        "a b",
                                           "1 2",     sp + " " + sp, "\xC3\x83 \xC2\xA9"};
  for (const std::string& t : {sp + "t", std::string("he"), sp + "the", std::string("ab"),
                               std::string("12"), sp + sp, e_acute}) {
    tokens.push_back(t);
    types.push_back(1);
  }
  for (const char* c : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    tokens.push_back(c);
    types.push_back(3);
  }
  GgufBuilder g;
  g.add_string("general.architecture", "llama");
  g.add_string("tokenizer.ggml.model", "gpt2");
  g.add_string("tokenizer.ggml.pre", "smollm");
  g.add_string_array("tokenizer.ggml.tokens", tokens);
  g.add_array<int32_t>("tokenizer.ggml.token_type", GgufBuilder::I32, types);
  g.add_string_array("tokenizer.ggml.merges", merges);
  const uint32_t eot = static_cast<uint32_t>(tokens.size() - 3);
  g.add_u32("tokenizer.ggml.bos_token_id", eot + 1);
  g.add_u32("tokenizer.ggml.eos_token_id", eot + 2);
  g.add_bool("tokenizer.ggml.add_bos_token", true);
  add_synthetic("synthetic byte-level BPE", g, /*lossless=*/true, /*space_prefix=*/false);
}

void add_model_file(const std::string& path) {
  auto f = cisa::GgufFile::open(path);
  if (!f.ok()) {
    std::fprintf(stderr, "tokenizer_fuzz: %s: %s (skipped)\n", path.c_str(),
                 f.status().message().c_str());
    return;
  }
  Loaded l;
  l.name = path;
  l.file = std::make_unique<cisa::GgufFile>(std::move(*f));
  const auto model = l.file->get_string("tokenizer.ggml.model");
  const auto prefix = l.file->get_bool("tokenizer.ggml.add_space_prefix");
  const bool spm = model.ok() && *model == "llama";
  l.space_prefix = prefix.ok() ? *prefix : spm;
  // Gemma 3 has every byte token; SmolLM2 has every byte unit.
  l.lossless = !l.space_prefix;
  add_from_gguf(std::move(l));
}

std::vector<std::string> model_paths() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("CISA_FUZZ_MODELS")) {
    std::string s = env;
    for (size_t b = 0; b <= s.size();) {
      size_t e = s.find(':', b);
      if (e == std::string::npos) e = s.size();
      if (e > b) out.push_back(s.substr(b, e - b));
      b = e + 1;
    }
    return out;
  }
  if (DIR* d = opendir("models")) {
    while (const dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > 5 && n.compare(n.size() - 5, 5, ".gguf") == 0) out.push_back("models/" + n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    const auto c1 = n > 1 ? static_cast<unsigned char>(s[i + 1]) : 0;
    if (n == 3 && ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F))) return false;
    if (n == 4 && ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F))) return false;
    i += n;
  }
  return true;
}

// Printable ASCII as is, everything else as \xNN, for failure reports.
std::string escaped(std::string_view s) {
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out += ch;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  add_synthetic_spm(/*space_prefix=*/false);
  add_synthetic_spm(/*space_prefix=*/true);
  add_synthetic_bpe();
  for (const std::string& p : model_paths()) add_model_file(p);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2 || tokenizers().empty()) return 0;
  const Loaded& l = tokenizers()[data[0] % tokenizers().size()];
  const cisa::Tokenizer& t = *l.tok;
  const bool parse_special = data[1] & 1, add_bos = data[1] & 2;
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);

  const std::vector<int32_t> ids = t.encode(text, add_bos, parse_special);
  bool renders_all = true;
  for (int32_t id : ids) {
    if (id < 0 || id >= t.vocab_size()) fail("encode returned an id outside the vocabulary");
    const cisa::TokenType type = t.token_type(id);
    if (type == cisa::TokenType::kUnused || type == cisa::TokenType::kUndefined)
      renders_all = false;
  }
  if (add_bos && t.adds_bos() && (ids.empty() || ids[0] != t.bos_id()))
    fail("add_bos on a model that adds BOS did not start with BOS");

  for (bool render_special : {false, true}) {
    const std::string decoded = t.decode(ids, render_special);
    cisa::Utf8StreamBuffer stream;
    std::string joined;
    for (int32_t id : ids) joined += stream.push(t.token_to_piece(id, render_special));
    joined += stream.flush();
    const bool same = decoded == joined || (l.space_prefix && !joined.empty() && joined[0] == ' ' &&
                                            decoded == std::string_view(joined).substr(1));
    if (!same) fail("decode differs from the streamed pieces");
  }

  bool covered = true;
  for (unsigned char c : text) covered &= l.byte_covered[c];
  if (l.lossless && !add_bos && renders_all && covered && valid_utf8(text) &&
      (t.kind() == cisa::TokenizerKind::kByteBpe ||
       text.find("\xE2\x96\x81") == std::string::npos)) {
    const std::string back = t.decode(ids, /*render_special=*/true);
    if (back != text) {
      std::fprintf(stderr, "tokenizer %s, text [%s], decoded [%s], ids", l.name.c_str(),
                   escaped(text).c_str(), escaped(back).c_str());
      for (int32_t id : ids)
        std::fprintf(stderr, " %d [%s] type %d", id, escaped(t.token_text(id)).c_str(),
                     static_cast<int>(t.token_type(id)));
      std::fprintf(stderr, "\n");
      fail("decode(encode(x)) != x");
    }
  }
  return 0;
}
