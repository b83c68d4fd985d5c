// gguf_file.cpp — GgufFile's memory mapping, typed metadata getters and display helpers.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>

#include "cisa/model/gguf.h"

namespace cisa {

// The bytes of an opened file, owned: either a read-only mapping (kMap; the descriptor stays open
// so that check_file() can fstat it) or a heap copy (kRead). Either way the address never
// changes, so views into it stay valid when the GgufFile that owns it is moved.
struct GgufFile::Mapping {
  void* addr = nullptr;  // mmap'ed (fd >= 0) or allocated with kHeapAlign (fd < 0)
  size_t size = 0;
  int fd = -1;
  struct stat at_open {};  // the file as open() found it (kMap)
  ~Mapping() {
    if (fd >= 0) {
      if (addr) munmap(addr, size);
      ::close(fd);
    } else if (addr) {
      ::operator delete(addr, kHeapAlign);
    }
  }
  // A heap copy is page-aligned, as a mapping is, so tensor data keeps the file's alignment.
  static constexpr std::align_val_t kHeapAlign{4096};
};

namespace {

std::string describe_change(const struct stat& then, const struct stat& now) {
  if (now.st_size < then.st_size)
    return "shrank from " + std::to_string(then.st_size) + " to " + std::to_string(now.st_size) +
           " bytes (truncated while in use)";
  if (now.st_size != then.st_size)
    return "grew from " + std::to_string(then.st_size) + " to " + std::to_string(now.st_size) +
           " bytes (rewritten while in use)";
  return "was modified in place (rewritten while in use)";
}

bool same_file_state(const struct stat& a, const struct stat& b) {
  return a.st_size == b.st_size && a.st_mtim.tv_sec == b.st_mtim.tv_sec &&
         a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

}  // namespace

GgufFile::GgufFile() = default;
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

namespace {

// Reads size bytes from the start of fd into dst; the count read (short at an early end of file).
Result<size_t> read_all(int fd, uint8_t* dst, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, dst + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return data_loss(std::string("read failed: ") + std::strerror(errno));
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

}  // namespace

Result<GgufFile> GgufFile::open(const std::string& path, const GgufOpenOptions& options) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    const std::string why = std::strerror(e);
    if (e == ENOENT) return not_found("cannot open '" + path + "': " + why);
    return invalid_argument("cannot open '" + path + "': " + why);
  }
  struct FdCloser {
    int fd;
    ~FdCloser() {
      if (fd >= 0) ::close(fd);
    }
  } closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0)
    return invalid_argument("cannot stat '" + path + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return invalid_argument("'" + path + "' is not a regular file");
  if (st.st_size == 0) return data_loss("'" + path + "' is empty: not a GGUF file (truncated)");

  auto map = std::make_unique<Mapping>();
  map->size = static_cast<size_t>(st.st_size);
  map->at_open = st;
  if (options.load == GgufLoad::kRead) {
    map->addr = ::operator new(map->size, Mapping::kHeapAlign, std::nothrow);
    if (!map->addr)
      return resource_exhausted("cannot allocate " + std::to_string(map->size) +
                                " bytes to read '" + path + "'");
    auto n = read_all(fd, static_cast<uint8_t*>(map->addr), map->size);
    if (!n.ok()) return Status(n.status().code(), "'" + path + "': " + n.status().message());
    struct stat after {};
    if (fstat(fd, &after) != 0) after = st;
    if (*n < map->size || !same_file_state(st, after))
      return data_loss("'" + path + "' " + describe_change(st, after) + " while being read (" +
                       std::to_string(*n) + " of " + std::to_string(map->size) + " bytes read)");
  } else {
    void* addr = mmap(nullptr, map->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED)
      return resource_exhausted("cannot map '" + path + "': " + std::strerror(errno));
    map->addr = addr;
    map->fd = fd;  // kept open for check_file(); ~Mapping closes it
    closer.fd = -1;
  }

  GgufFile f;
  f.mapping_ = std::move(map);
  f.path_ = path;
  f.bytes_ =
      std::span<const uint8_t>(static_cast<const uint8_t*>(f.mapping_->addr), f.mapping_->size);
  // A file that shrank between fstat and mmap would fault (SIGBUS) in the parse below.
  CISA_RETURN_IF_ERROR(f.check_file());
  Status s = parse_into(f);
  if (!s.ok()) return Status(s.code(), "'" + path + "': " + s.message());
  return f;
}

bool GgufFile::is_mapped() const {
  return mapping_ && mapping_->fd >= 0;
}

Status GgufFile::check_file() const {
  if (!is_mapped()) return Status();
  struct stat now {};
  if (fstat(mapping_->fd, &now) != 0)
    return data_loss("cannot stat '" + path_ + "': " + std::strerror(errno));
  if (same_file_state(mapping_->at_open, now)) return Status();
  return data_loss("'" + path_ + "' " + describe_change(mapping_->at_open, now) +
                   " after it was mapped; reopen it (GgufLoad::kRead keeps a private copy)");
}

// ---- typed getters ----------------------------------------------------------------------------

namespace {

Status wrong_type(std::string_view key, const GgufKv& kv, const char* want) {
  return invalid_argument("metadata '" + std::string(key) + "' is " +
                          gguf_value_type_name(kv.type) + ", expected " + want);
}

bool is_unsigned(GgufValueType t) {
  return t == GgufValueType::U8 || t == GgufValueType::U16 || t == GgufValueType::U32 ||
         t == GgufValueType::U64;
}
bool is_signed(GgufValueType t) {
  return t == GgufValueType::I8 || t == GgufValueType::I16 || t == GgufValueType::I32 ||
         t == GgufValueType::I64;
}

// Any integer metadata value as a 128-bit-safe pair: fits [lo, hi]?
template <class T>
Result<T> integer_as(std::string_view key, const GgufKv& kv) {
  constexpr auto lo = std::numeric_limits<T>::min();
  constexpr auto hi = std::numeric_limits<T>::max();
  if (is_unsigned(kv.type)) {
    if (kv.u > static_cast<uint64_t>(hi))
      return out_of_range("metadata '" + std::string(key) + "' = " + std::to_string(kv.u) +
                          " does not fit");
    return static_cast<T>(kv.u);
  }
  if (is_signed(kv.type)) {
    if (kv.i < 0 ? (std::is_unsigned_v<T> || kv.i < static_cast<int64_t>(lo))
                 : static_cast<uint64_t>(kv.i) > static_cast<uint64_t>(hi))
      return out_of_range("metadata '" + std::string(key) + "' = " + std::to_string(kv.i) +
                          " does not fit");
    return static_cast<T>(kv.i);
  }
  return wrong_type(key, kv, "an integer");
}

// Reads element k of a numeric array payload as int64/double.
template <class T>
T load_at(std::span<const uint8_t> raw, uint64_t k) {
  T v;
  std::memcpy(&v, raw.data() + k * sizeof(T), sizeof(T));
  return v;
}

}  // namespace

#define CISA_FIND_KV_(key)      \
  const GgufKv* kv = find(key); \
  if (!kv) return not_found("metadata key '" + std::string(key) + "' not found")

Result<std::string_view> GgufFile::get_string(std::string_view key) const {
  CISA_FIND_KV_(key);
  if (kv->type != GgufValueType::STRING) return wrong_type(key, *kv, "string");
  return kv->s;
}

Result<uint32_t> GgufFile::get_u32(std::string_view key) const {
  CISA_FIND_KV_(key);
  return integer_as<uint32_t>(key, *kv);
}
Result<int32_t> GgufFile::get_i32(std::string_view key) const {
  CISA_FIND_KV_(key);
  return integer_as<int32_t>(key, *kv);
}
Result<uint64_t> GgufFile::get_u64(std::string_view key) const {
  CISA_FIND_KV_(key);
  return integer_as<uint64_t>(key, *kv);
}
Result<int64_t> GgufFile::get_i64(std::string_view key) const {
  CISA_FIND_KV_(key);
  return integer_as<int64_t>(key, *kv);
}

Result<float> GgufFile::get_f32(std::string_view key) const {
  CISA_FIND_KV_(key);
  if (kv->type != GgufValueType::F32 && kv->type != GgufValueType::F64)
    return wrong_type(key, *kv, "f32");
  return static_cast<float>(kv->f);
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  CISA_FIND_KV_(key);
  if (kv->type != GgufValueType::BOOL) return wrong_type(key, *kv, "bool");
  return kv->u != 0;
}

Result<std::span<const std::string_view>> GgufFile::get_string_array(std::string_view key) const {
  CISA_FIND_KV_(key);
  if (kv->type != GgufValueType::ARRAY || kv->elem_type != GgufValueType::STRING)
    return wrong_type(key, *kv, "array of strings");
  return std::span<const std::string_view>(kv->strings);
}

Result<std::vector<float>> GgufFile::get_f32_array(std::string_view key) const {
  CISA_FIND_KV_(key);
  if (kv->type != GgufValueType::ARRAY ||
      (kv->elem_type != GgufValueType::F32 && kv->elem_type != GgufValueType::F64))
    return wrong_type(key, *kv, "array of f32");
  std::vector<float> out(kv->count);
  for (uint64_t k = 0; k < kv->count; ++k)
    out[k] = kv->elem_type == GgufValueType::F32 ? load_at<float>(kv->raw, k)
                                                 : static_cast<float>(load_at<double>(kv->raw, k));
  return out;
}

Result<std::vector<int32_t>> GgufFile::get_i32_array(std::string_view key) const {
  CISA_FIND_KV_(key);
  if (kv->type != GgufValueType::ARRAY || !(is_signed(kv->elem_type) || is_unsigned(kv->elem_type)))
    return wrong_type(key, *kv, "array of integers");
  std::vector<int32_t> out(kv->count);
  GgufKv elem;
  elem.type = kv->elem_type;
  for (uint64_t k = 0; k < kv->count; ++k) {
    elem.u = 0;
    elem.i = 0;
    switch (kv->elem_type) {
      case GgufValueType::U8:
        elem.u = load_at<uint8_t>(kv->raw, k);
        break;
      case GgufValueType::U16:
        elem.u = load_at<uint16_t>(kv->raw, k);
        break;
      case GgufValueType::U32:
        elem.u = load_at<uint32_t>(kv->raw, k);
        break;
      case GgufValueType::U64:
        elem.u = load_at<uint64_t>(kv->raw, k);
        break;
      case GgufValueType::I8:
        elem.i = load_at<int8_t>(kv->raw, k);
        break;
      case GgufValueType::I16:
        elem.i = load_at<int16_t>(kv->raw, k);
        break;
      case GgufValueType::I32:
        elem.i = load_at<int32_t>(kv->raw, k);
        break;
      default:
        elem.i = load_at<int64_t>(kv->raw, k);
        break;
    }
    auto v = integer_as<int32_t>(key, elem);
    if (!v.ok())
      return out_of_range("metadata array '" + std::string(key) + "' element " + std::to_string(k) +
                          " does not fit in i32");
    out[k] = *v;
  }
  return out;
}

Result<uint32_t> GgufFile::get_u32_or(std::string_view key, uint32_t dflt) const {
  if (!has(key)) return dflt;
  return get_u32(key);
}

Result<float> GgufFile::get_f32_or(std::string_view key, float dflt) const {
  if (!has(key)) return dflt;
  return get_f32(key);
}

#undef CISA_FIND_KV_

// ---- display ----------------------------------------------------------------------------------

namespace {

std::string quote_short(std::string_view s, size_t max_len = 60) {
  std::string out = "\"";
  for (size_t k = 0; k < s.size() && k < max_len; ++k) {
    const unsigned char ch = static_cast<unsigned char>(s[k]);
    if (ch == '\n')
      out += "\\n";
    else if (ch == '"')
      out += "\\\"";
    else if (ch < 0x20)
      out += "\\x" + std::string(1, "0123456789abcdef"[ch >> 4]) + "0123456789abcdef"[ch & 15];
    else
      out += static_cast<char>(ch);
  }
  if (s.size() > max_len) out += "...";
  return out + "\"";
}

// Shortest text that reads back to the same value (f32 values printed as floats: 1e-06, not
// 9.99999997e-07).
std::string format_number(double v, bool is_f32) {
  char buf[64];
  auto r = is_f32 ? std::to_chars(buf, buf + sizeof buf, static_cast<float>(v))
                  : std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string scalar_string(GgufValueType t, const GgufKv& kv) {
  if (is_unsigned(t)) return std::to_string(kv.u);
  if (is_signed(t)) return std::to_string(kv.i);
  if (t == GgufValueType::BOOL) return kv.u ? "true" : "false";
  if (t == GgufValueType::F32 || t == GgufValueType::F64)
    return format_number(kv.f, t == GgufValueType::F32);
  if (t == GgufValueType::STRING) return quote_short(kv.s);
  return "?";
}

}  // namespace

std::string GgufKv::to_display_string(size_t max_items) const {
  if (type != GgufValueType::ARRAY) return scalar_string(type, *this);
  std::string out = "[";
  const uint64_t shown = std::min<uint64_t>(count, max_items);
  const uint64_t es = elem_type == GgufValueType::STRING ? 0 : raw.size() / (count ? count : 1);
  for (uint64_t k = 0; k < shown; ++k) {
    if (k) out += ", ";
    if (elem_type == GgufValueType::STRING) {
      out += quote_short(strings[k], 24);
      continue;
    }
    GgufKv e;
    const uint8_t* p = raw.data() + k * es;
    switch (elem_type) {
      case GgufValueType::U8:
        e.u = p[0];
        break;
      case GgufValueType::BOOL:
        e.u = p[0];
        break;
      case GgufValueType::I8:
        e.i = static_cast<int8_t>(p[0]);
        break;
      case GgufValueType::U16: {
        uint16_t v;
        std::memcpy(&v, p, 2);
        e.u = v;
        break;
      }
      case GgufValueType::I16: {
        int16_t v;
        std::memcpy(&v, p, 2);
        e.i = v;
        break;
      }
      case GgufValueType::U32: {
        uint32_t v;
        std::memcpy(&v, p, 4);
        e.u = v;
        break;
      }
      case GgufValueType::I32: {
        int32_t v;
        std::memcpy(&v, p, 4);
        e.i = v;
        break;
      }
      case GgufValueType::U64:
        std::memcpy(&e.u, p, 8);
        break;
      case GgufValueType::I64:
        std::memcpy(&e.i, p, 8);
        break;
      case GgufValueType::F32: {
        float v;
        std::memcpy(&v, p, 4);
        e.f = v;
        break;
      }
      case GgufValueType::F64:
        std::memcpy(&e.f, p, 8);
        break;
      default:
        break;
    }
    out += scalar_string(elem_type, e);
  }
  if (count > shown)
    out += ", ... (" + std::to_string(count) + " " + gguf_value_type_name(elem_type) + ")";
  return out + "]";
}

std::string GgufTensor::shape_string() const {
  std::string out = "[";
  for (int d = 0; d < n_dims; ++d) out += (d ? ", " : "") + std::to_string(ne[d]);
  return out + "]";
}

}  // namespace cisa
