#include "onnx_reader.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QRegularExpression>
#include <algorithm>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace gn::nodes::onnx {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::string dimsText(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + str(dims[i]);
  return s + "]";
}

// Closes the file however the parse ends.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string printable(const std::string& text) {
  std::string out;
  out.reserve(std::min(text.size(), kMaxMessage) + 8);
  for (const char c : text) {
    if (out.size() >= kMaxMessage) {
      out += "...";
      break;
    }
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

int64_t TensorValues::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

int64_t checkedNumel(const std::vector<int64_t>& dims, const std::string& what) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0 || d > kMaxDim)
      throw OnnxError(what + " has dims " + dimsText(dims) + ": each must be in [0, 2^31]");
    if (d != 0 && n > kMaxElements / d)
      throw OnnxError(what + " has dims " + dimsText(dims) + ": more than 2^31 elements");
    n *= d;
  }
  return n;
}

std::unique_ptr<OnnxModel> readModel(const std::string& path) {
  const QFileInfo info(QString::fromStdString(path));
  if (!info.exists()) throw OnnxError("no such file");
  if (!info.isFile()) throw OnnxError("not a regular file");
  auto model = std::make_unique<OnnxModel>();
  model->path = info.absoluteFilePath().toStdString();
  model->folder = QFileInfo(info.absolutePath()).canonicalFilePath().toStdString();
  Fd fd{::open(path.c_str(), O_RDONLY)};
  if (fd.fd < 0) throw OnnxError(std::string("cannot open: ") + std::strerror(errno));
  {
    // Parsed from the file through a small buffer: the bytes are never held whole beside the message.
    google::protobuf::io::FileInputStream file(fd.fd);
    google::protobuf::io::CodedInputStream coded(&file);
    coded.SetTotalBytesLimit(INT32_MAX);
    if (!model->proto.ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage())
      throw OnnxError("not an ONNX model (the bytes do not parse as an ONNX ModelProto: truncated, or "
                             "another kind of file)");
  }
  const ::onnx::ModelProto& m = model->proto;
  if (!m.has_ir_version() || m.ir_version() < kMinIrVersion || m.ir_version() > kMaxIrVersion)
    throw OnnxError("IR version " + (m.has_ir_version() ? str(m.ir_version()) : "missing") +
                    ": gpunodes reads IR versions " + str(kMinIrVersion) + " to " + str(kMaxIrVersion));
  if (!m.has_graph()) throw OnnxError("the model has no graph");
  if (m.functions_size() > 0)
    throw OnnxError("the model defines functions ('" + m.functions(0).name() +
                    "'): gpunodes imports graphs of standard operators only");
  bool found = false;
  for (const ::onnx::OperatorSetIdProto& op : m.opset_import())
    if (op.domain().empty() || op.domain() == "ai.onnx") {
      model->opset = op.version();
      found = true;
    }
  if (!found) throw OnnxError("the model imports no opset of the default domain (ai.onnx)");
  if (model->opset < kMinOpset || model->opset > kMaxOpset)
    throw OnnxError("opset " + str(model->opset) + ": gpunodes imports opsets " + str(kMinOpset) +
                    " to " + str(kMaxOpset) + " of the default domain");
  return model;
}

namespace {

// Reads `bytes` bytes at `offset` of the external file `location`, which must lie inside the model's folder.
std::string readExternal(const OnnxModel& model, const std::string& location, int64_t offset, int64_t bytes,
                         const std::string& what) {
  const QString loc = QString::fromStdString(location);
  if (loc.isEmpty()) throw OnnxError(what + ": external data without a location");
  if (QDir::isAbsolutePath(loc) || loc.startsWith('\\') || (loc.size() > 1 && loc[1] == ':'))
    throw OnnxError(what + ": external data at the absolute path '" + location +
                    "': it must be a file inside the model's folder");
  for (const QString& part : loc.split(QRegularExpression("[/\\\\]")))
    if (part == "..")
      throw OnnxError(what + ": external data at '" + location + "' leaves the model's folder ('..')");
  const QString folder = QString::fromStdString(model.folder);
  const QFileInfo file(folder + "/" + loc);
  if (!file.exists()) throw OnnxError(what + ": external data file '" + location + "' does not exist");
  // A link may lead anywhere: what counts is where the file really is.
  const QString real = file.canonicalFilePath();
  if (real.isEmpty() || !real.startsWith(folder + "/"))
    throw OnnxError(what + ": external data file '" + location + "' leads outside the model's folder (to " +
                    real.toStdString() + ")");
  if (!QFileInfo(real).isFile()) throw OnnxError(what + ": external data '" + location + "' is not a file");
  QFile f(real);
  if (!f.open(QIODevice::ReadOnly)) throw OnnxError(what + ": cannot open external data '" + location + "'");
  if (offset < 0 || bytes < 0 || offset > f.size() || bytes > f.size() - offset)
    throw OnnxError(what + ": external data '" + location + "' holds " + str(f.size()) + " bytes, not " +
                    str(bytes) + " at offset " + str(offset));
  std::string data(static_cast<size_t>(bytes), '\0');
  if (!f.seek(offset) || f.read(data.data(), bytes) != bytes)
    throw OnnxError(what + ": cannot read external data '" + location + "'");
  return data;
}

template <typename T, typename Out>
void fromRaw(const std::string& raw, std::vector<Out>& out, int64_t n) {
  out.resize(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    T v;
    std::memcpy(&v, raw.data() + k * sizeof(T), sizeof(T));  // little-endian, as the format stores it
    out[static_cast<size_t>(k)] = static_cast<Out>(v);
  }
}

}  // namespace

TensorValues takeTensor(OnnxModel& model, ::onnx::TensorProto& t, const std::string& what) {
  TensorValues v;
  v.dims.assign(t.dims().begin(), t.dims().end());
  const int64_t n = checkedNumel(v.dims, what);
  if (t.segment().begin() != 0 || t.has_segment())
    throw OnnxError(what + " is split in segments, which gpunodes does not read");
  int64_t elemSize = 0;
  switch (t.data_type()) {
    case ::onnx::TensorProto::FLOAT: elemSize = 4; break;
    case ::onnx::TensorProto::DOUBLE: elemSize = 8; break;
    case ::onnx::TensorProto::INT64: elemSize = 8; v.integer = true; break;
    case ::onnx::TensorProto::INT32: elemSize = 4; v.integer = true; break;
    case ::onnx::TensorProto::BOOL: elemSize = 1; v.integer = true; break;
    default:
      throw OnnxError(what + " has element type " +
                      ::onnx::TensorProto::DataType_Name(static_cast<::onnx::TensorProto::DataType>(t.data_type())) +
                      ": gpunodes reads FLOAT, DOUBLE, INT64, INT32 and BOOL tensors");
  }
  std::string external;
  const std::string* raw = nullptr;
  if (t.data_location() == ::onnx::TensorProto::EXTERNAL) {
    std::string location;
    int64_t offset = 0, length = -1;
    for (const ::onnx::StringStringEntryProto& e : t.external_data()) {
      bool ok = true;
      try {
        if (e.key() == "location") location = e.value();
        else if (e.key() == "offset") offset = std::stoll(e.value());
        else if (e.key() == "length") length = std::stoll(e.value());
      } catch (const std::exception&) {
        ok = false;
      }
      if (!ok) throw OnnxError(what + ": external data " + e.key() + " '" + e.value() + "' is not a number");
    }
    const int64_t want = n * elemSize;
    if (length >= 0 && length != want)
      throw OnnxError(what + ": external data length " + str(length) + " bytes, but dims " + dimsText(v.dims) +
                      " need " + str(want));
    external = readExternal(model, location, offset, want, what);
    raw = &external;
  } else if (t.has_raw_data()) {
    raw = &t.raw_data();
  }
  if (raw) {
    if (static_cast<int64_t>(raw->size()) != n * elemSize)
      throw OnnxError(what + " declares dims " + dimsText(v.dims) + " (" + str(n * elemSize) + " bytes) but holds " +
                      str(static_cast<int64_t>(raw->size())) + " bytes of data");
    switch (t.data_type()) {
      case ::onnx::TensorProto::FLOAT: fromRaw<float>(*raw, v.f, n); break;
      case ::onnx::TensorProto::DOUBLE: fromRaw<double>(*raw, v.f, n); break;
      case ::onnx::TensorProto::INT64: fromRaw<int64_t>(*raw, v.i, n); break;
      case ::onnx::TensorProto::INT32: fromRaw<int32_t>(*raw, v.i, n); break;
      default: fromRaw<uint8_t>(*raw, v.i, n); break;
    }
  } else {
    int64_t have = 0;
    switch (t.data_type()) {
      case ::onnx::TensorProto::FLOAT: have = t.float_data_size(); break;
      case ::onnx::TensorProto::DOUBLE: have = t.double_data_size(); break;
      case ::onnx::TensorProto::INT64: have = t.int64_data_size(); break;
      default: have = t.int32_data_size(); break;  // INT32 and BOOL
    }
    if (have != n)
      throw OnnxError(what + " declares dims " + dimsText(v.dims) + " (" + str(n) + " values) but holds " +
                      str(have) + " values");
    switch (t.data_type()) {
      case ::onnx::TensorProto::FLOAT: v.f.assign(t.float_data().begin(), t.float_data().end()); break;
      case ::onnx::TensorProto::DOUBLE: v.f.assign(t.double_data().begin(), t.double_data().end()); break;
      case ::onnx::TensorProto::INT64: v.i.assign(t.int64_data().begin(), t.int64_data().end()); break;
      default: v.i.assign(t.int32_data().begin(), t.int32_data().end()); break;
    }
  }
  // The message no longer holds the values: the model's bytes are in memory once.
  t.clear_raw_data();
  t.clear_float_data();
  t.clear_double_data();
  return v;
}

}  // namespace gn::nodes::onnx
