// gguf_test_builder.h — writes small GGUF files byte by byte for the reader's tests and the
// fuzzer's seeds. It records where each field landed so a test can corrupt exactly one of them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace cisa::testing {

class GgufBuilder {
 public:
  // Value type codes of the GGUF format (written raw, so tests can also write invalid ones).
  enum : uint32_t { U8 = 0, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 };

  uint32_t version = 3;
  uint64_t alignment = 32;  // the data section's alignment (written as general.alignment if != 32)

  struct KvPos {
    size_t key, type, value;
  };
  struct TensorPos {
    size_t name, n_dims, dims, type, offset;
  };
  std::vector<KvPos> kv_pos;
  std::vector<TensorPos> tensor_pos;
  size_t count_pos = 0;  // the tensor count; the metadata count follows at +8
  size_t data_pos = 0;   // start of the data section in the built file

  void add_u32(const std::string& k, uint32_t v) { scalar(k, U32, &v, 4); }
  void add_i32(const std::string& k, int32_t v) { scalar(k, I32, &v, 4); }
  void add_u64(const std::string& k, uint64_t v) { scalar(k, U64, &v, 8); }
  void add_i64(const std::string& k, int64_t v) { scalar(k, I64, &v, 8); }
  void add_u8(const std::string& k, uint8_t v) { scalar(k, U8, &v, 1); }
  void add_i8(const std::string& k, int8_t v) { scalar(k, I8, &v, 1); }
  void add_u16(const std::string& k, uint16_t v) { scalar(k, U16, &v, 2); }
  void add_i16(const std::string& k, int16_t v) { scalar(k, I16, &v, 2); }
  void add_f32(const std::string& k, float v) { scalar(k, F32, &v, 4); }
  void add_f64(const std::string& k, double v) { scalar(k, F64, &v, 8); }
  void add_bool(const std::string& k, bool v) {
    uint8_t b = v;
    scalar(k, BOOL, &b, 1);
  }
  void add_string(const std::string& k, const std::string& v) {
    std::vector<uint8_t> p;
    put_str(p, v);
    kvs_.push_back({k, STRING, p});
  }
  void add_string_array(const std::string& k, const std::vector<std::string>& v) {
    std::vector<uint8_t> p;
    put(p, uint32_t{STRING});
    put(p, static_cast<uint64_t>(v.size()));
    for (const auto& s : v) put_str(p, s);
    kvs_.push_back({k, ARRAY, p});
  }
  template <class T>
  void add_array(const std::string& k, uint32_t elem_type, const std::vector<T>& v) {
    std::vector<uint8_t> p;
    put(p, elem_type);
    put(p, static_cast<uint64_t>(v.size()));
    for (const T& x : v) put(p, x);
    kvs_.push_back({k, ARRAY, p});
  }
  // A raw value payload (for invalid types).
  void add_raw(const std::string& k, uint32_t type, std::vector<uint8_t> payload) {
    kvs_.push_back({k, type, std::move(payload)});
  }

  // A tensor with dims ne (ne[0] fastest) and its data bytes; offsets are assigned in order.
  void add_tensor(const std::string& name, uint32_t type, std::vector<uint64_t> ne,
                  std::vector<uint8_t> data) {
    tensors_.push_back({name, type, std::move(ne), std::move(data)});
  }

  std::vector<uint8_t> build() {
    std::vector<uint8_t> b;
    kv_pos.clear();
    tensor_pos.clear();
    for (char c : {'G', 'G', 'U', 'F'}) b.push_back(static_cast<uint8_t>(c));
    put(b, version);
    count_pos = b.size();
    const bool write_align = alignment != 32;
    put(b, static_cast<uint64_t>(tensors_.size()));
    put(b, static_cast<uint64_t>(kvs_.size() + (write_align ? 1 : 0)));
    if (write_align) {
      kv_pos.push_back({b.size(), 0, 0});
      put_str(b, "general.alignment");
      kv_pos.back().type = b.size();
      put(b, uint32_t{U32});
      kv_pos.back().value = b.size();
      put(b, static_cast<uint32_t>(alignment));
    }
    for (const auto& kv : kvs_) {
      KvPos pos{b.size(), 0, 0};
      put_str(b, kv.key);
      pos.type = b.size();
      put(b, kv.type);
      pos.value = b.size();
      b.insert(b.end(), kv.payload.begin(), kv.payload.end());
      kv_pos.push_back(pos);
    }
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      TensorPos pos{b.size(), 0, 0, 0, 0};
      put_str(b, t.name);
      pos.n_dims = b.size();
      put(b, static_cast<uint32_t>(t.ne.size()));
      pos.dims = b.size();
      for (uint64_t d : t.ne) put(b, d);
      pos.type = b.size();
      put(b, t.type);
      pos.offset = b.size();
      put(b, offset);
      offsets.push_back(offset);
      offset += (t.data.size() + alignment - 1) / alignment * alignment;
      tensor_pos.push_back(pos);
    }
    while (b.size() % alignment) b.push_back(0);
    data_pos = b.size();
    for (size_t k = 0; k < tensors_.size(); ++k) {
      b.resize(data_pos + offsets[k], 0);
      b.insert(b.end(), tensors_[k].data.begin(), tensors_[k].data.end());
    }
    return b;
  }

  template <class T>
  static void poke(std::vector<uint8_t>& b, size_t pos, T v) {
    std::memcpy(b.data() + pos, &v, sizeof(T));
  }

 private:
  struct Kv {
    std::string key;
    uint32_t type;
    std::vector<uint8_t> payload;
  };
  struct Tensor {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> ne;
    std::vector<uint8_t> data;
  };

  template <class T>
  static void put(std::vector<uint8_t>& b, T v) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
  }
  static void put_str(std::vector<uint8_t>& b, const std::string& s) {
    put(b, static_cast<uint64_t>(s.size()));
    b.insert(b.end(), s.begin(), s.end());
  }
  void scalar(const std::string& k, uint32_t type, const void* v, size_t n) {
    std::vector<uint8_t> p(n);
    std::memcpy(p.data(), v, n);
    kvs_.push_back({k, type, p});
  }

  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace cisa::testing
