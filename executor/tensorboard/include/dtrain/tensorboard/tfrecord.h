// TFRecord, the container of TensorBoard's event files: a sequence of records, each
//
//   uint64 length | uint32 masked_crc32c(the length's 8 bytes) | `length` bytes of data | uint32 masked_crc32c(data)
//
// with every integer little-endian. CRC32C is the Castagnoli CRC (polynomial 0x1EDC6F41, reflected, initial and final
// value 0xFFFFFFFF; RFC 3720, B.4), "masked" as TensorFlow's lib/hash/crc32c.h does so that the CRC of a string that
// holds CRCs is not degenerate: ((crc >> 15) | (crc << 17)) + 0xa282ead8. Format: docs/formats.md#tensorboard.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dtrain::tensorboard {

// CRC32C of `bytes` (Boost.CRC): crc32c("123456789") is 0xE3069283.
std::uint32_t crc32c(std::string_view bytes);

// The masked CRC32C TFRecord stores.
std::uint32_t masked_crc32c(std::string_view bytes);

// `data` framed as one record: length, its masked CRC, the data, the data's masked CRC.
std::string tfrecord(std::string_view data);

}  // namespace dtrain::tensorboard
