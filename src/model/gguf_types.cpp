// gguf_types.cpp — the table of GGML tensor types (block sizes and bytes per block) and
// metadata value-type names.
#include <limits>

#include "cisa/model/gguf.h"

namespace cisa {
namespace {

struct TypeRow {
  GgmlType type;
  const char* name;
  int64_t block;   // elements per block
  int64_t bytes;   // bytes per block
  bool supported;  // dequantise + matmul implemented in quant_*.cpp
};

// Block layouts (docs/gguf.md): a "_0" block is a scale plus packed values, "_1" adds a minimum,
// the K-quants pack 256 elements in sub-blocks with quantised per-sub-block scales.
constexpr TypeRow kTypes[] = {
    {GgmlType::F32, "F32", 1, 4, true},
    {GgmlType::F16, "F16", 1, 2, true},
    {GgmlType::Q4_0, "Q4_0", 32, 2 + 16, true},
    {GgmlType::Q4_1, "Q4_1", 32, 2 + 2 + 16, true},
    {GgmlType::Q5_0, "Q5_0", 32, 2 + 4 + 16, true},
    {GgmlType::Q5_1, "Q5_1", 32, 2 + 2 + 4 + 16, true},
    {GgmlType::Q8_0, "Q8_0", 32, 2 + 32, true},
    {GgmlType::Q8_1, "Q8_1", 32, 2 + 2 + 32, false},
    {GgmlType::Q2_K, "Q2_K", 256, 16 + 64 + 2 + 2, false},
    {GgmlType::Q3_K, "Q3_K", 256, 32 + 64 + 12 + 2, false},
    {GgmlType::Q4_K, "Q4_K", 256, 2 + 2 + 12 + 128, true},
    {GgmlType::Q5_K, "Q5_K", 256, 2 + 2 + 12 + 32 + 128, false},
    {GgmlType::Q6_K, "Q6_K", 256, 128 + 64 + 16 + 2, true},
    {GgmlType::Q8_K, "Q8_K", 256, 4 + 256 + 32, false},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 2 + 64, false},
    {GgmlType::IQ2_XS, "IQ2_XS", 256, 2 + 64 + 8, false},
    {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 2 + 96, false},
    {GgmlType::IQ1_S, "IQ1_S", 256, 2 + 32 + 16, false},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 2 + 16, false},
    {GgmlType::IQ3_S, "IQ3_S", 256, 2 + 64 + 8 + 32 + 4, false},
    {GgmlType::IQ2_S, "IQ2_S", 256, 2 + 64 + 16, false},
    {GgmlType::IQ4_XS, "IQ4_XS", 256, 2 + 2 + 4 + 128, false},
    {GgmlType::I8, "I8", 1, 1, false},
    {GgmlType::I16, "I16", 1, 2, false},
    {GgmlType::I32, "I32", 1, 4, false},
    {GgmlType::I64, "I64", 1, 8, false},
    {GgmlType::F64, "F64", 1, 8, false},
    {GgmlType::IQ1_M, "IQ1_M", 256, 32 + 16 + 8, false},
    {GgmlType::BF16, "BF16", 1, 2, true},
};

const TypeRow* row_of(uint32_t raw) {
  for (const auto& r : kTypes)
    if (static_cast<uint32_t>(r.type) == raw) return &r;
  return nullptr;
}

}  // namespace

bool ggml_type_is_known(uint32_t raw) {
  return row_of(raw) != nullptr;
}

const char* ggml_type_name(GgmlType type) {
  const TypeRow* r = row_of(static_cast<uint32_t>(type));
  return r ? r->name : "unknown";
}

int64_t ggml_block_size(GgmlType type) {
  const TypeRow* r = row_of(static_cast<uint32_t>(type));
  return r ? r->block : 0;
}

int64_t ggml_block_bytes(GgmlType type) {
  const TypeRow* r = row_of(static_cast<uint32_t>(type));
  return r ? r->bytes : 0;
}

bool ggml_type_is_supported(GgmlType type) {
  const TypeRow* r = row_of(static_cast<uint32_t>(type));
  return r && r->supported;
}

Result<uint64_t> ggml_row_bytes(GgmlType type, int64_t n) {
  const TypeRow* r = row_of(static_cast<uint32_t>(type));
  if (!r)
    return invalid_argument("unknown tensor type " + std::to_string(static_cast<uint32_t>(type)));
  if (n < 0) return invalid_argument("negative row length " + std::to_string(n));
  if (n % r->block != 0)
    return invalid_argument(std::string("row length ") + std::to_string(n) +
                            " is not a multiple of the " + r->name + " block size " +
                            std::to_string(r->block));
  const uint64_t blocks = static_cast<uint64_t>(n / r->block);
  if (blocks > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(r->bytes))
    return invalid_argument("row byte size overflows");
  return blocks * static_cast<uint64_t>(r->bytes);
}

const char* gguf_value_type_name(GgufValueType type) {
  switch (type) {
    case GgufValueType::U8:
      return "u8";
    case GgufValueType::I8:
      return "i8";
    case GgufValueType::U16:
      return "u16";
    case GgufValueType::I16:
      return "i16";
    case GgufValueType::U32:
      return "u32";
    case GgufValueType::I32:
      return "i32";
    case GgufValueType::F32:
      return "f32";
    case GgufValueType::BOOL:
      return "bool";
    case GgufValueType::STRING:
      return "string";
    case GgufValueType::ARRAY:
      return "array";
    case GgufValueType::U64:
      return "u64";
    case GgufValueType::I64:
      return "i64";
    case GgufValueType::F64:
      return "f64";
  }
  return "unknown";
}

}  // namespace cisa
