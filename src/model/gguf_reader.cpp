// gguf_reader.cpp — parses a GGUF byte span: header, metadata, tensor table, data section.
//
// Every read goes through Cursor, which checks the remaining length first, so a truncated or
// corrupt file yields a kDataLoss status naming what was being read and at which offset. Counts
// read from the file are checked against the bytes left before anything is allocated for them,
// so a forged count cannot make us reserve gigabytes.
#include <algorithm>
#include <cstring>
#include <limits>

#include "cisa/model/gguf.h"

namespace cisa {
namespace {

constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;

std::string at(uint64_t pos) {
  return " at byte " + std::to_string(pos);
}

class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> b) : b_(b) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return b_.size() - pos_; }

  Status need(uint64_t n, const char* what) const {
    if (n > left())
      return data_loss(std::string("truncated file: ") + what + " needs " + std::to_string(n) +
                       " bytes" + at(pos_) + " but only " + std::to_string(left()) + " remain");
    return Status::Ok();
  }
  template <class T>
  Status read(T* out, const char* what) {
    CISA_RETURN_IF_ERROR(need(sizeof(T), what));
    std::memcpy(out, b_.data() + pos_, sizeof(T));  // little-endian host assumed (x86, arm64)
    pos_ += sizeof(T);
    return Status::Ok();
  }
  Status read_string(std::string_view* out, const char* what) {
    uint64_t len = 0;
    CISA_RETURN_IF_ERROR(read(&len, what));
    CISA_RETURN_IF_ERROR(need(len, what));
    *out = std::string_view(reinterpret_cast<const char*>(b_.data() + pos_), len);
    pos_ += len;
    return Status::Ok();
  }
  Status take(uint64_t n, std::span<const uint8_t>* out, const char* what) {
    CISA_RETURN_IF_ERROR(need(n, what));
    *out = b_.subspan(pos_, n);
    pos_ += n;
    return Status::Ok();
  }

 private:
  std::span<const uint8_t> b_;
  uint64_t pos_ = 0;
};

// Size in bytes of a fixed-size scalar metadata type; 0 for string/array/unknown.
uint64_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8:
    case GgufValueType::I8:
    case GgufValueType::BOOL:
      return 1;
    case GgufValueType::U16:
    case GgufValueType::I16:
      return 2;
    case GgufValueType::U32:
    case GgufValueType::I32:
    case GgufValueType::F32:
      return 4;
    case GgufValueType::U64:
    case GgufValueType::I64:
    case GgufValueType::F64:
      return 8;
    default:
      return 0;
  }
}

bool value_type_known(uint32_t raw) {
  return raw <= static_cast<uint32_t>(GgufValueType::F64);
}

// Decodes one scalar of type t from p (scalar_size(t) bytes) into kv's u/i/f fields.
Status decode_scalar(GgufValueType t, const uint8_t* p, GgufKv* kv, uint64_t pos) {
  auto load = [&](auto v) {
    std::memcpy(&v, p, sizeof(v));
    return v;
  };
  switch (t) {
    case GgufValueType::U8:
      kv->u = load(uint8_t{});
      break;
    case GgufValueType::U16:
      kv->u = load(uint16_t{});
      break;
    case GgufValueType::U32:
      kv->u = load(uint32_t{});
      break;
    case GgufValueType::U64:
      kv->u = load(uint64_t{});
      break;
    case GgufValueType::I8:
      kv->i = load(int8_t{});
      break;
    case GgufValueType::I16:
      kv->i = load(int16_t{});
      break;
    case GgufValueType::I32:
      kv->i = load(int32_t{});
      break;
    case GgufValueType::I64:
      kv->i = load(int64_t{});
      break;
    case GgufValueType::F32:
      kv->f = load(float{});
      break;
    case GgufValueType::F64:
      kv->f = load(double{});
      break;
    case GgufValueType::BOOL: {
      uint8_t b = load(uint8_t{});
      if (b > 1)
        return data_loss("bool metadata value " + std::to_string(b) + " is not 0 or 1" + at(pos));
      kv->u = b;
      break;
    }
    default:
      return internal_error("decode_scalar on a non-scalar type");
  }
  return Status::Ok();
}

Status read_value(Cursor& c, GgufKv* kv) {
  const uint64_t start = c.pos();
  if (kv->type == GgufValueType::STRING) return c.read_string(&kv->s, "string metadata value");
  if (kv->type != GgufValueType::ARRAY) {
    std::span<const uint8_t> raw;
    CISA_RETURN_IF_ERROR(c.take(scalar_size(kv->type), &raw, "scalar metadata value"));
    return decode_scalar(kv->type, raw.data(), kv, start);
  }
  uint32_t et = 0;
  CISA_RETURN_IF_ERROR(c.read(&et, "array element type"));
  if (!value_type_known(et))
    return data_loss("unknown metadata array element type " + std::to_string(et) + " for key '" +
                     std::string(kv->key) + "'" + at(start));
  kv->elem_type = static_cast<GgufValueType>(et);
  CISA_RETURN_IF_ERROR(c.read(&kv->count, "array length"));
  if (kv->elem_type == GgufValueType::ARRAY)
    return unimplemented("nested metadata arrays are not supported (key '" + std::string(kv->key) +
                         "')");
  if (kv->elem_type == GgufValueType::STRING) {
    // Each string costs at least its 8-byte length, which bounds a plausible count.
    if (kv->count > c.left() / 8)
      return data_loss("truncated file: string array '" + std::string(kv->key) + "' claims " +
                       std::to_string(kv->count) + " entries" + at(start));
    kv->strings.resize(kv->count);
    for (auto& s : kv->strings) CISA_RETURN_IF_ERROR(c.read_string(&s, "string array entry"));
    return Status::Ok();
  }
  const uint64_t es = scalar_size(kv->elem_type);
  if (kv->count > c.left() / es)
    return data_loss("truncated file: array '" + std::string(kv->key) + "' of " +
                     std::to_string(kv->count) + " elements runs past the end" + at(start));
  CISA_RETURN_IF_ERROR(c.take(kv->count * es, &kv->raw, "array payload"));
  if (kv->elem_type == GgufValueType::BOOL)
    for (uint8_t b : kv->raw)
      if (b > 1)
        return data_loss("bool array '" + std::string(kv->key) + "' holds a value other than 0/1");
  return Status::Ok();
}

// One entry of the tensor table at the cursor: name, shape, type and data offset (a multiple of
// `alignment`), with its element count and byte size checked against overflow.
Status read_tensor_info(Cursor& c, uint64_t alignment, GgufTensor* t) {
  CISA_RETURN_IF_ERROR(c.read_string(&t->name, "tensor name"));
  const std::string name(t->name);
  uint32_t n_dims = 0;
  CISA_RETURN_IF_ERROR(c.read(&n_dims, "tensor rank"));
  if (n_dims == 0 || n_dims > kMaxDims)
    return data_loss("tensor '" + name + "' has " + std::to_string(n_dims) +
                     " dimensions (1 to 4 allowed)");
  t->n_dims = static_cast<int>(n_dims);
  uint64_t count = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    uint64_t ne = 0;
    CISA_RETURN_IF_ERROR(c.read(&ne, "tensor dimension"));
    // An empty dimension would make a tensor with rows of data but no bytes; no model has one.
    if (ne == 0)
      return data_loss("tensor '" + name + "' has an empty dimension " + std::to_string(d));
    if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (ne != 0 && count > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / ne))
      return data_loss("tensor '" + name + "': element count overflows");
    t->ne[d] = static_cast<int64_t>(ne);
    count *= ne;
  }
  t->n_elements = static_cast<int64_t>(count);
  uint32_t type = 0;
  CISA_RETURN_IF_ERROR(c.read(&type, "tensor type"));
  if (!ggml_type_is_known(type))
    return data_loss("tensor '" + name + "' has unknown type " + std::to_string(type));
  t->type = static_cast<GgmlType>(type);
  CISA_RETURN_IF_ERROR(c.read(&t->offset, "tensor offset"));
  auto rb = ggml_row_bytes(t->type, t->ne[0]);
  if (!rb.ok()) return data_loss("tensor '" + name + "': " + rb.status().message());
  const uint64_t rows = t->ne[0] ? count / static_cast<uint64_t>(t->ne[0]) : 0;
  if (rows != 0 && *rb > std::numeric_limits<uint64_t>::max() / rows)
    return data_loss("tensor '" + name + "': byte size overflows");
  t->n_bytes = *rb * rows;
  if (t->offset % alignment != 0)
    return data_loss("tensor '" + name + "': offset " + std::to_string(t->offset) +
                     " is not a multiple of the alignment " + std::to_string(alignment));
  return Status::Ok();
}

}  // namespace

Status GgufFile::parse_into(GgufFile& f) {
  Cursor c(f.bytes_);
  // ---- header: magic, version, counts
  std::span<const uint8_t> magic;
  if (f.bytes_.size() < 4)
    return data_loss("not a GGUF file: only " + std::to_string(f.bytes_.size()) +
                     " bytes (truncated)");
  CISA_RETURN_IF_ERROR(c.take(4, &magic, "magic"));
  if (std::memcmp(magic.data(), "GGUF", 4) != 0)
    return invalid_argument("not a GGUF file: the first 4 bytes are not the magic 'GGUF'");
  CISA_RETURN_IF_ERROR(c.read(&f.version_, "version"));
  if (f.version_ != 2 && f.version_ != 3) {
    std::string hint = (f.version_ & 0xFFFF) == 0 ? " (a big-endian file?)" : "";
    return unimplemented("unsupported GGUF version " + std::to_string(f.version_) + hint +
                         "; this reader supports versions 2 and 3");
  }
  uint64_t n_tensors = 0, n_kv = 0;
  CISA_RETURN_IF_ERROR(c.read(&n_tensors, "tensor count"));
  CISA_RETURN_IF_ERROR(c.read(&n_kv, "metadata count"));
  // A key/value takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor description at
  // least 8 + 4 + 8 + 4 + 8. Larger counts cannot fit in what is left.
  if (n_kv > c.left() / 13)
    return data_loss("truncated file: header claims " + std::to_string(n_kv) + " metadata entries");
  if (n_tensors > c.left() / 32)
    return data_loss("truncated file: header claims " + std::to_string(n_tensors) + " tensors");

  // ---- metadata
  f.kvs_.resize(n_kv);
  f.kv_index_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    GgufKv& kv = f.kvs_[k];
    const uint64_t start = c.pos();
    CISA_RETURN_IF_ERROR(c.read_string(&kv.key, "metadata key"));
    uint32_t t = 0;
    CISA_RETURN_IF_ERROR(c.read(&t, "metadata value type"));
    if (!value_type_known(t))
      return data_loss("unknown metadata value type " + std::to_string(t) + " for key '" +
                       std::string(kv.key) + "'" + at(start));
    kv.type = static_cast<GgufValueType>(t);
    CISA_RETURN_IF_ERROR(read_value(c, &kv));
    if (!f.kv_index_.emplace(kv.key, k).second)
      return data_loss("duplicate metadata key '" + std::string(kv.key) + "'" + at(start));
  }
  if (const GgufKv* a = f.find("general.alignment")) {
    if (a->type != GgufValueType::U32)
      return data_loss(std::string("general.alignment must be u32, not ") +
                       gguf_value_type_name(a->type));
    if (a->u == 0 || (a->u & (a->u - 1)) != 0)
      return data_loss("general.alignment " + std::to_string(a->u) + " is not a power of two");
    f.alignment_ = a->u;
  } else {
    f.alignment_ = kDefaultAlignment;
  }

  // ---- tensor table
  f.tensors_.resize(n_tensors);
  f.tensor_index_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor& t = f.tensors_[k];
    const uint64_t start = c.pos();
    CISA_RETURN_IF_ERROR(read_tensor_info(c, f.alignment_, &t));
    if (!f.tensor_index_.emplace(t.name, k).second)
      return data_loss("duplicate tensor name '" + std::string(t.name) + "'" + at(start));
  }

  // ---- data section: starts at the next multiple of the alignment
  const uint64_t pad = (f.alignment_ - c.pos() % f.alignment_) % f.alignment_;
  f.data_offset_ = c.pos() + pad;
  if (n_tensors > 0 && f.data_offset_ > f.bytes_.size())
    return data_loss("truncated file: the data section would start at byte " +
                     std::to_string(f.data_offset_) + " past the end (" +
                     std::to_string(f.bytes_.size()) + " bytes)");
  const uint64_t data_size =
      f.bytes_.size() > f.data_offset_ ? f.bytes_.size() - f.data_offset_ : 0;
  for (GgufTensor& t : f.tensors_) {
    if (t.offset > data_size || t.n_bytes > data_size - t.offset)
      return data_loss("truncated file: tensor '" + std::string(t.name) + "' (" +
                       std::to_string(t.n_bytes) + " bytes at data offset " +
                       std::to_string(t.offset) + ") runs past the end of the data section (" +
                       std::to_string(data_size) + " bytes)");
    t.data = f.bytes_.data() + f.data_offset_ + t.offset;
  }
  // Tensors must not overlap: sort by offset and compare neighbours.
  std::vector<const GgufTensor*> by_offset;
  by_offset.reserve(f.tensors_.size());
  for (const GgufTensor& t : f.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const GgufTensor* p = by_offset[k - 1];
    if (p->n_bytes > 0 && p->offset + p->n_bytes > by_offset[k]->offset)
      return data_loss("tensors '" + std::string(p->name) + "' and '" +
                       std::string(by_offset[k]->name) + "' overlap in the data section");
  }
  return Status::Ok();
}

Result<GgufFile> GgufFile::parse(std::span<const uint8_t> bytes) {
  GgufFile f;
  f.bytes_ = bytes;
  CISA_RETURN_IF_ERROR(parse_into(f));
  return f;
}

const GgufKv* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second];
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::string_view GgufFile::architecture() const {
  const GgufKv* kv = find("general.architecture");
  return kv && kv->type == GgufValueType::STRING ? kv->s : std::string_view();
}

}  // namespace cisa
