// dtf/detail/archive.hpp — cereal archives for control messages, with bounds.
//
// cereal's binary archives trust the lengths they read: a garbage length makes them allocate
// whatever it says before failing. Control messages arrive from the network, so dtf reads
// them with binary_reader, which refuses a length larger than the bytes left in the message
// (every element takes at least one byte) and any read past the end. Tensor bytes never pass
// through an archive: they travel as the raw payload of a frame.
#pragma once

#include <dtf/error.hpp>

#include <cereal/cereal.hpp>
#include <cereal/types/array.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace dtf::detail {

/// Appends the binary encoding of values to a byte vector (host byte order, like
/// cereal::BinaryOutputArchive).
class binary_writer : public cereal::OutputArchive<binary_writer, cereal::AllowEmptyClassElision> {
 public:
  explicit binary_writer(std::vector<std::byte>& out)
      : cereal::OutputArchive<binary_writer, cereal::AllowEmptyClassElision>(this), out_(out) {}
  void save_binary(const void* data, std::size_t size) {
    if (size == 0) return;
    const std::size_t at = out_.size();
    out_.resize(at + size);
    std::memcpy(out_.data() + at, data, size);
  }

 private:
  std::vector<std::byte>& out_;
};

/// Reads values from a byte span; every read and every length is checked against the bytes
/// left. Errors: dtf::error(errc::corrupt_data).
class binary_reader : public cereal::InputArchive<binary_reader, cereal::AllowEmptyClassElision> {
 public:
  explicit binary_reader(std::span<const std::byte> in)
      : cereal::InputArchive<binary_reader, cereal::AllowEmptyClassElision>(this), in_(in) {}
  void load_binary(void* data, std::size_t size) {
    if (size == 0) return;  // data may be null (an empty vector's)
    if (size > remaining())
      throw error(errc::corrupt_data, "message truncated: needs " + std::to_string(size) + " more bytes, has " +
                                          std::to_string(remaining()));
    std::memcpy(data, in_.data() + pos_, size);
    pos_ += size;
  }
  std::size_t remaining() const noexcept { return in_.size() - pos_; }

 private:
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

template <class T>
  requires std::is_arithmetic_v<T>
void CEREAL_SAVE_FUNCTION_NAME(binary_writer& ar, const T& t) {
  ar.save_binary(std::addressof(t), sizeof(t));
}
template <class T>
  requires std::is_arithmetic_v<T>
void CEREAL_LOAD_FUNCTION_NAME(binary_reader& ar, T& t) {
  if constexpr (std::is_same_v<T, bool>) {
    // A bool read from raw bytes must be 0 or 1 (any other byte is not a bool: undefined
    // behaviour to load, e.g. std::optional's engaged flag in a crafted message).
    unsigned char b = 0;
    ar.load_binary(&b, 1);
    if (b > 1) throw error(errc::corrupt_data, "message holds " + std::to_string(b) + " where a bool (0 or 1) belongs");
    t = b == 1;
  } else {
    ar.load_binary(std::addressof(t), sizeof(t));
  }
}
template <class T>
void CEREAL_SAVE_FUNCTION_NAME(binary_writer& ar, const cereal::NameValuePair<T>& t) {
  ar(t.value);
}
template <class T>
void CEREAL_LOAD_FUNCTION_NAME(binary_reader& ar, cereal::NameValuePair<T>& t) {
  ar(t.value);
}
template <class T>
void CEREAL_SAVE_FUNCTION_NAME(binary_writer& ar, const cereal::SizeTag<T>& t) {
  ar(t.size);
}
template <class T>
void CEREAL_LOAD_FUNCTION_NAME(binary_reader& ar, cereal::SizeTag<T>& t) {
  ar(t.size);
  if (t.size > ar.remaining())
    throw error(errc::corrupt_data, "message declares " + std::to_string(t.size) + " elements but has only " +
                                        std::to_string(ar.remaining()) + " bytes left");
}
template <class T>
void CEREAL_SAVE_FUNCTION_NAME(binary_writer& ar, const cereal::BinaryData<T>& bd) {
  ar.save_binary(bd.data, static_cast<std::size_t>(bd.size));
}
template <class T>
void CEREAL_LOAD_FUNCTION_NAME(binary_reader& ar, cereal::BinaryData<T>& bd) {
  ar.load_binary(bd.data, static_cast<std::size_t>(bd.size));
}

/// The encoding of a control message.
template <class T>
std::vector<std::byte> encode_message(const T& msg) {
  std::vector<std::byte> out;
  binary_writer ar(out);
  ar(msg);
  return out;
}

/// Decodes a control message, refusing leftovers; `what` names the message in errors.
template <class T>
T decode_message(std::span<const std::byte> bytes, const char* what) {
  T msg{};
  try {
    binary_reader ar(bytes);
    ar(msg);
    if (ar.remaining() != 0)
      throw error(errc::corrupt_data, std::to_string(ar.remaining()) + " trailing bytes");
  } catch (const dtf::error& e) {
    throw error(errc::corrupt_data, std::string("malformed ") + what + " message: " + e.message());
  } catch (const std::exception& e) {  // cereal::Exception, std::length_error
    throw error(errc::corrupt_data, std::string("malformed ") + what + " message: " + e.what());
  }
  return msg;
}

}  // namespace dtf::detail

CEREAL_REGISTER_ARCHIVE(dtf::detail::binary_writer)
CEREAL_REGISTER_ARCHIVE(dtf::detail::binary_reader)
CEREAL_SETUP_ARCHIVE_TRAITS(dtf::detail::binary_reader, dtf::detail::binary_writer)
