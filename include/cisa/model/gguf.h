// cisa/model/gguf.h — a bounds-checked reader for GGUF model files (versions 2 and 3).
//
// A GGUF file is a header, a table of typed metadata key/values, a table of tensor descriptions
// and an aligned data section (docs/gguf.md describes the layout). GgufFile parses all of it up
// front, checking every length, count, type and offset against the bytes it was given, so that
// nothing afterwards can read past the buffer. Strings and tensor data are views into the bytes:
// a GgufFile made by open() owns them (a read-only memory mapping, or with GgufLoad::kRead a
// private copy; either stays valid when the GgufFile is moved); one made by parse() borrows the
// caller's span, which must outlive it.
//
// A mapped file that another process truncates in place while it is mapped makes the next read of
// a page past the new end fault (SIGBUS), which no bounds check can catch. open() checks the file
// once more after mapping it, check_file() re-checks it on demand (one fstat), and GgufLoad::kRead
// (llama.cpp's --no-mmap) removes the window at the cost of the file's size in memory; docs/gguf.md
// says which window remains. Replacing the file by rename (what `cisa pull` does) is safe.
//
//   CISA_ASSIGN_OR_RETURN(cisa::GgufFile f,
//   cisa::GgufFile::open("models/gemma-3-270m-q4_k_m.gguf"));
//   CISA_ASSIGN_OR_RETURN(std::string_view arch, f.get_string("general.architecture"));
//   CISA_ASSIGN_OR_RETURN(uint32_t n_layer, f.get_u32(std::string(arch) + ".block_count"));
//   const cisa::GgufTensor* w = f.find_tensor("blk.0.attn_q.weight");
//   if (w) use(w->type, w->ne[0], w->ne[1], w->data);   // ne[0]: the fastest-varying dimension
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cisa/core/status.h"

namespace cisa {

// ---- tensor element types
// ------------------------------------------------------------------------

// GGML's tensor type numbering, as stored in GGUF tensor descriptions.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  // 4 and 5 were Q4_2 / Q4_3, removed from the format.
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
};

// True when `raw` names a type whose block layout this reader knows (so sizes can be checked).
bool ggml_type_is_known(uint32_t raw);
// "Q4_K", "F32", ...; "unknown" for a value ggml_type_is_known rejects.
const char* ggml_type_name(GgmlType type);
// Elements per block (1 for plain types, 32 for Q4_0.., 256 for the K-quants).
int64_t ggml_block_size(GgmlType type);
// Bytes per block (4 for F32, 18 for Q4_0, 144 for Q4_K, ...).
int64_t ggml_block_bytes(GgmlType type);
// True when quant.h can dequantise and multiply tensors of this type.
bool ggml_type_is_supported(GgmlType type);
// Bytes of a row of n elements; an error when n is not a multiple of the block size or overflows.
Result<uint64_t> ggml_row_bytes(GgmlType type, int64_t n);

// ---- metadata values
// -----------------------------------------------------------------------------

enum class GgufValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};

const char* gguf_value_type_name(GgufValueType type);  // "u32", "string", "array", ...

// One metadata entry. Scalars are decoded at parse time; arrays keep a view of their raw
// little-endian payload (string arrays are split into views at parse time).
struct GgufKv {
  std::string_view key;
  GgufValueType type = GgufValueType::U8;
  // Scalars: exactly one of these is meaningful, by type.
  uint64_t u = 0;      // U8/U16/U32/U64 and BOOL (0 or 1)
  int64_t i = 0;       // I8/I16/I32/I64
  double f = 0;        // F32/F64
  std::string_view s;  // STRING
  // ARRAY: element type, element count, raw payload (numeric element types) or split strings.
  GgufValueType elem_type = GgufValueType::U8;
  uint64_t count = 0;
  std::span<const uint8_t> raw;
  std::vector<std::string_view> strings;

  bool is_array() const { return type == GgufValueType::ARRAY; }
  // A short human-readable rendering: scalars in full, arrays summarised after `max_items`.
  std::string to_display_string(size_t max_items = 8) const;
};

// ---- tensors
// -------------------------------------------------------------------------------------

struct GgufTensor {
  std::string_view name;
  GgmlType type = GgmlType::F32;
  int n_dims = 0;
  std::array<int64_t, 4> ne = {1, 1, 1, 1};  // ne[0] varies fastest (a row); unused dims are 1
  int64_t n_elements = 0;
  uint64_t n_bytes = 0;  // bytes of the whole tensor
  uint64_t offset = 0;   // from the start of the data section (a multiple of the alignment)
  const uint8_t* data = nullptr;  // offset applied; valid for n_bytes bytes

  int64_t row_length() const { return ne[0]; }
  int64_t n_rows() const { return ne[0] ? n_elements / ne[0] : 0; }
  uint64_t row_bytes() const { return n_rows() ? n_bytes / static_cast<uint64_t>(n_rows()) : 0; }
  const uint8_t* row(int64_t r) const { return data + static_cast<uint64_t>(r) * row_bytes(); }
  std::span<const uint8_t> bytes() const { return {data, static_cast<size_t>(n_bytes)}; }
  std::string shape_string() const;  // "[640, 2048]"
};

// ---- the file
// ------------------------------------------------------------------------------------

// How GgufFile::open brings a file's bytes into memory.
enum class GgufLoad {
  kMap,   // mmap, read-only (the default): nothing is read until used, pages are shared with the
          // page cache and other processes; a truncation in place while mapped is a SIGBUS
  kRead,  // read the whole file into owned, page-aligned memory: costs its size in memory and the
          // read time at open; later changes to the file cannot affect it
};

struct GgufOpenOptions {
  GgufLoad load = GgufLoad::kMap;
};

class GgufFile {
 public:
  // Maps (or reads, by options.load) the file and parses it. Errors: kNotFound (no such file),
  // kDataLoss (truncated or corrupt, or changed while being opened), kUnimplemented (unsupported
  // version), kInvalidArgument (not GGUF).
  static Result<GgufFile> open(const std::string& path, const GgufOpenOptions& options = {});
  // Parses bytes the caller keeps alive for the lifetime of the result.
  static Result<GgufFile> parse(std::span<const uint8_t> bytes);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section
  std::span<const uint8_t> bytes() const { return bytes_; }
  const std::string& path() const { return path_; }  // empty for parse()
  // True for open() with GgufLoad::kMap: the bytes are the file's pages, not a copy.
  bool is_mapped() const;
  // For a mapped file: OK while the file has the size and modification time open() saw (one
  // fstat of the descriptor it keeps); kDataLoss saying how it changed otherwise, e.g. "shrank
  // from 253113024 to 4096 bytes (truncated while in use)". Call it before touching tensor data
  // after a pause (loading weights, a new request); it cannot stop a truncation that happens
  // after it returns. Always OK for kRead and parse(), whose bytes cannot change.
  Status check_file() const;

  // -- metadata --
  std::span<const GgufKv> metadata() const { return kvs_; }
  const GgufKv* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  // Typed getters: kNotFound when absent, kInvalidArgument when the stored type does not
  // convert (integers convert between widths when the value fits; f32 accepts f32/f64).
  Result<std::string_view> get_string(std::string_view key) const;
  Result<uint32_t> get_u32(std::string_view key) const;
  Result<int32_t> get_i32(std::string_view key) const;
  Result<uint64_t> get_u64(std::string_view key) const;
  Result<int64_t> get_i64(std::string_view key) const;
  Result<float> get_f32(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  Result<std::span<const std::string_view>> get_string_array(std::string_view key) const;
  Result<std::vector<float>> get_f32_array(std::string_view key) const;    // f32/f64 elements
  Result<std::vector<int32_t>> get_i32_array(std::string_view key) const;  // any integer fitting
  // Same as the getters above but the default when the key is absent (errors on a wrong type).
  Result<uint32_t> get_u32_or(std::string_view key, uint32_t dflt) const;
  Result<float> get_f32_or(std::string_view key, float dflt) const;

  // `general.architecture`, or "" when absent.
  std::string_view architecture() const;

  // -- tensors --
  std::span<const GgufTensor> tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;

 private:
  GgufFile();
  static Status parse_into(GgufFile& f);

  struct Mapping;  // the owned bytes of open(): a mapping and its descriptor, or a heap copy
  std::unique_ptr<Mapping> mapping_;
  std::string path_;
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKv> kvs_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string_view, size_t> kv_index_, tensor_index_;
};

}  // namespace cisa
