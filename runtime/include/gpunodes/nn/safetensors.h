// Hugging Face's safetensors format, so that weights travel between gpunodes and PyTorch. Read and written
// here without a library (the runtime has no JSON dependency):
//   u64 N (little-endian), N bytes of JSON header, then the tensors' raw little-endian bytes.
//   Header: {"__metadata__": {string: string}, "<name>": {"dtype": "F32", "shape": [2, 3],
//            "data_offsets": [begin, end]}, ...}, offsets relative to the first byte after the header, padded
//            with spaces so that N is a multiple of 8 (as the reference writer does).
// gpunodes writes every state entry (Model::state(), PyTorch's state_dict names) as F32, and for every
// BatchNorm layer its "<prefix>num_batches_tracked" as an I64 scalar (Model::batches_tracked()), so that
// torch's load_state_dict(strict=True) takes the file as it is. Metadata: "format": "pt" and
// "gpunodes.signature": Model::signature(). Loading checks the whole header and its match with the model
// before touching any parameter; F32, F16, BF16 and F64 tensors load (converted to float32).
//
// load_params() and read_params_info() (serialize.h) tell the formats apart by the file's first bytes;
// save_params() writes either.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gpunodes/nn/model.h"

namespace gn::nn {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as in the file: "F32", "I64", ...
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data region
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;                      // in the header's order
  std::vector<std::pair<std::string, std::string>> metadata;  // "__metadata__", in the header's order
  uint64_t data_start = 0;                                    // 8 + N: where offset 0 lies in the file
  // The metadata value of `key`, or nullptr.
  const std::string* find_metadata(const std::string& key) const;
};

// Whether a file starting with these bytes is meant as safetensors: an 8-byte length, then a JSON object.
// Nothing else is checked here, so that a damaged safetensors file is reported as one.
bool looks_like_safetensors(const char* bytes, size_t size);

// One tensor to write: its bytes, little-endian, row-major.
struct SafetensorsBlob {
  std::string name;
  std::string dtype;  // "F32", "F64", "I64", ...
  Shape shape;
  std::vector<char> bytes;
};
// A whole file: the metadata and the tensors, listed in the header in the order given. Throws Error when a
// blob's size does not match its dtype and shape.
std::vector<char> encode_safetensors(const std::vector<std::pair<std::string, std::string>>& metadata,
                                     const std::vector<SafetensorsBlob>& tensors);
// The values as the bytes of an F32 blob.
std::vector<char> float_bytes(const std::vector<float>& values);

// Writes atomically (serialize.h's write_params_file). Waits for the values (a blocking read).
void save_safetensors(const Model& model, const std::string& path);
// Parses and checks the header and the layout it describes (dtypes, shapes, offsets inside the data, no
// overlaps) of a whole file in memory. `path` is for the messages.
SafetensorsHeader parse_safetensors(const std::vector<char>& file, const std::string& path);
// The header of the file at `path`, after parse_safetensors' checks.
SafetensorsHeader read_safetensors_header(const std::string& path);
// Checks `file` against `model` (every state name with its exact shape, nothing unexpected) and only then
// loads it: the values are enqueued; num_batches_tracked entries, when present, set batches_tracked.
void load_safetensors(Model& model, const std::vector<char>& file, const std::string& path);

}  // namespace gn::nn
