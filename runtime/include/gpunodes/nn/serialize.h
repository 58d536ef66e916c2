// Saving and loading a model's parameters and buffers: the seed's exercise "how do we read and write model
// parameters on the GPU". The file is independent of the device: parameters saved from cuda:0 load onto
// cpu, and back.
//
// Format "gpunodes params", version 1, little-endian:
//   8 bytes   magic "GNPARAMS"
//   u32       version (1)
//   u32 n, n bytes   the model signature, e.g. "resnet18 classes=10 in_channels=1" (Model::signature())
//   u32       entry count E
//   E times:  u32 n, n bytes name ("0.weight"); u8 trainable (0 for BatchNorm running statistics);
//             u32 rank; rank x i64 dimensions
//   E times:  the entry's values, float32, row-major
//   u32       CRC-32 (zlib's) of every byte before it
// Loading checks all of it before touching the model: a file of another architecture, another size, a
// truncated or corrupted file each fail with an Error that says which.
//
// The same entry points read Hugging Face safetensors files too (safetensors.h), told apart from this format
// by the file's first bytes, never by its name: PyTorch's weights load, and gpunodes' load into PyTorch.
#pragma once
#include <string>
#include <vector>

#include "gpunodes/nn/model.h"

namespace gn::nn {

struct ParamsFileEntry {
  std::string name;
  Shape shape;
  bool trainable = true;
};

enum class ParamsFormat {
  Gnparams,     // the format above
  Safetensors,  // safetensors.h
};
const char* params_format_name(ParamsFormat format);        // "gpunodes", "safetensors"
ParamsFormat parse_params_format(const std::string& name);  // throws Error listing the names it knows

struct ParamsFileInfo {
  ParamsFormat format = ParamsFormat::Gnparams;
  uint32_t version = 0;   // the GNPARAMS format version; 0 for safetensors
  std::string signature;  // empty for a safetensors file without "gpunodes.signature" (written by torch)
  // The model's state as the file holds it; a safetensors file's num_batches_tracked scalars are not listed.
  std::vector<ParamsFileEntry> entries;
};

// Writes atomically (a temporary file renamed over `path`). Waits for the values (a blocking read).
void save_params(const Model& model, const std::string& path, ParamsFormat format = ParamsFormat::Gnparams);
// Loads into `model`, on whatever device it lives; the copies are enqueued. Either format.
void load_params(Model& model, const std::string& path);
// A new model built from the file's signature, on `device`, holding the file's values. A safetensors file
// without a signature cannot say which model it holds: load_params() into a model built for it instead.
std::unique_ptr<Model> load_model(Runtime& rt, const std::string& path, Device device);
// The header only (after checking the whole file). Either format.
ParamsFileInfo read_params_info(const std::string& path);
// Model options from a signature ("mlp classes=10 in_channels=1 image_size=28"); throws Error when malformed.
ModelOptions options_from_signature(const std::string& signature);

// Shared by both formats. The whole file, after checking that it is a regular file (not a directory, device
// or pipe) within the size limit for parameter files.
std::vector<char> read_params_file(const std::string& path);
// Replaces `path` atomically: a temporary file next to it, written and fsync'ed, then renamed over it, so
// that a crash leaves the old file or the new one, never half of one.
void write_params_file(const std::string& path, const std::vector<char>& bytes);

}  // namespace gn::nn
