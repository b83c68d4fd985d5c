// gguf_fuzz — libFuzzer target for the GGUF reader (tests/fuzz/CMakeLists.txt says how to run it).
//
// Any input must either fail to parse with a Status or parse into a file whose every metadata
// value, string and tensor byte can be read; ASan reports any access outside the input. The
// tokenizer metadata of a file that parses is untrusted too: Tokenizer::from_gguf either explains
// why it refuses it or gives a tokenizer whose ids stay inside its vocabulary.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cisa/model/gguf.h"
#include "cisa/model/quant.h"
#include "cisa/model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copy into an exactly sized heap buffer so ASan sees its end.
  std::vector<uint8_t> bytes(data, data + size);
  auto r = cisa::GgufFile::parse(std::span<const uint8_t>(bytes.data(), bytes.size()));
  if (!r.ok()) {
    if (r.status().message().empty()) __builtin_trap();  // every error explains itself
    return 0;
  }
  const cisa::GgufFile& f = *r;
  size_t sink = 0;
  for (const cisa::GgufKv& kv : f.metadata()) {
    sink += kv.to_display_string(4).size();
    (void)f.get_string_array(kv.key);
    (void)f.get_f32_array(kv.key);
    (void)f.get_i32_array(kv.key);
    (void)f.get_u64(kv.key);
    for (std::string_view s : kv.strings)
      sink += s.empty() ? 0 : static_cast<unsigned char>(s.back());
  }
  std::vector<float> row;
  for (const cisa::GgufTensor& t : f.tensors()) {
    if (f.find_tensor(t.name) != &t) __builtin_trap();  // names are unique
    if (t.n_bytes > 0) sink += t.data[0] + t.data[t.n_bytes - 1];
    // Decode the first row of small tensors of a supported type.
    if (cisa::ggml_type_is_supported(t.type) && t.ne[0] > 0 && t.ne[0] <= 4096) {
      row.resize(static_cast<size_t>(t.ne[0]));
      if (!cisa::dequantize_row(t.type, t.data, row.data(), t.ne[0]).ok()) __builtin_trap();
    }
  }
  auto tok = cisa::Tokenizer::from_gguf(f);
  if (!tok.ok()) {
    if (tok.status().message().empty()) __builtin_trap();
  } else {
    for (const char* text : {"a b\xC3\xA9 12 <s>", "\xFF\xE2\x96\x81 x", ""}) {
      for (int32_t id : tok->encode(text, true, true)) {
        if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
        sink += tok->token_to_piece(id, true).size();
      }
    }
  }
  return static_cast<int>(sink & 0);
}
