// A small, explicit byte format for what ranks exchange through the bootstrap:
// fixed-width little-endian fields, length-prefixed strings, and a reader that
// throws (instead of reading past the end) on a truncated or corrupt blob.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/errors.hpp"

namespace pyccl {

using Bytes = std::vector<uint8_t>;

class ByteWriter {
 public:
  template <typename T>
  ByteWriter& put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
    return *this;
  }
  ByteWriter& putBytes(const void* data, size_t size) {
    put<uint64_t>(size);
    const auto* p = static_cast<const uint8_t*>(data);
    bytes_.insert(bytes_.end(), p, p + size);
    return *this;
  }
  ByteWriter& putString(const std::string& s) { return putBytes(s.data(), s.size()); }
  Bytes take() { return std::move(bytes_); }

 private:
  Bytes bytes_;
};

class ByteReader {
 public:
  ByteReader(const Bytes& bytes, const char* what) : bytes_(bytes), what_(what) {}
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  Bytes getBytes() {
    auto size = get<uint64_t>();
    need(size);
    Bytes out(bytes_.begin() + pos_, bytes_.begin() + pos_ + size);
    pos_ += size;
    return out;
  }
  std::string getString() {
    auto b = getBytes();
    return std::string(b.begin(), b.end());
  }
  bool atEnd() const { return pos_ == bytes_.size(); }

 private:
  void need(uint64_t n) const {
    if (n > bytes_.size() - pos_) {
      throw InvalidArgument(strCat("invalid argument '", what_, "': truncated or corrupt (",
                                   bytes_.size(), " bytes, needed ", n, " more at offset ", pos_,
                                   ")"));
    }
  }
  const Bytes& bytes_;
  const char* what_;
  size_t pos_ = 0;
};

}  // namespace pyccl
