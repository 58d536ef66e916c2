// Reading an ONNX file from a stranger: the protobuf parsed straight from the file (never held whole
// beside the parsed message), the IR version, opsets and domains checked, and tensors' values taken out of
// the message one at a time with every declared size checked against the bytes that are there. External
// data (the format of models over 2 GB) is read only from regular files inside the model's own folder.
#pragma once
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace gn::nodes::onnx {

// `text` as one printable line: control characters (a newline in a node's name) as \xNN, and at most
// kMaxMessage bytes, so that names from the file cannot break the one line of a refusal or make it unbounded.
constexpr size_t kMaxMessage = 3000;
std::string printable(const std::string& text);

// What went wrong, naming the node or tensor; the importer turns it into the one message of a failed import.
// The message is made printable (printable()), whatever the file's names hold.
struct OnnxError : std::runtime_error {
  explicit OnnxError(const std::string& what) : std::runtime_error(printable(what)) {}
};

// The IR versions and default-domain opsets the reader takes.
constexpr int64_t kMinIrVersion = 3, kMaxIrVersion = 10;
constexpr int64_t kMinOpset = 11, kMaxOpset = 17;
// Dimensions above this, or tensors of more elements, are refused before anything is allocated: 2^31
// floats is 8 GiB, more than any model gpunodes trains holds in one tensor.
constexpr int64_t kMaxDim = int64_t(1) << 31;
constexpr int64_t kMaxElements = int64_t(1) << 31;

struct OnnxModel {
  ::onnx::ModelProto proto;
  std::string path, folder;  // the file, and its folder (absolute, canonical): external data stays inside
  int64_t opset = 0;         // the default domain's
};

// Parses and checks the model's frame (IR version, opsets, no functions, the graph present). Throws
// OnnxError: "not an ONNX model" for bytes protobuf cannot parse as one.
std::unique_ptr<OnnxModel> readModel(const std::string& path);

// A tensor's values as floats or integers (for shapes), with its dims.
struct TensorValues {
  std::vector<int64_t> dims;
  bool integer = false;
  std::vector<float> f;    // FLOAT, DOUBLE (narrowed)
  std::vector<int64_t> i;  // INT64, INT32, and BOOL as 0 / 1
  int64_t numel() const;
};
// The values of `t` (a node's Constant or an initializer), its dims and data checked first: every dim in
// [0, kMaxDim], at most kMaxElements, and the data exactly as large as the dims say. The raw bytes are
// released from the message once read. `what` names the tensor in messages.
TensorValues takeTensor(OnnxModel& model, ::onnx::TensorProto& t, const std::string& what);

// The checked element count of dims (each in [0, kMaxDim], the product at most kMaxElements).
int64_t checkedNumel(const std::vector<int64_t>& dims, const std::string& what);

}  // namespace gn::nodes::onnx
