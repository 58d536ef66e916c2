#include "gpunodes/nn/serialize.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gpunodes/errors.h"
#include "gpunodes/nn/safetensors.h"

namespace gn::nn {
namespace {

constexpr char kMagic[8] = {'G', 'N', 'P', 'A', 'R', 'A', 'M', 'S'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxRank = 8;
// Far past any model this builds (ResNet-18 is 45 MB): the file is read whole into memory.
constexpr int64_t kMaxFileBytes = int64_t(16) << 30;

class Writer {
 public:
  void bytes(const void* p, size_t n) {
    auto* c = static_cast<const char*>(p);
    buf_.insert(buf_.end(), c, c + n);
  }
  template <class T>
  void pod(T v) {
    // The format is little-endian, as every machine this builds for.
    bytes(&v, sizeof v);
  }
  void str(const std::string& s) {
    pod(static_cast<uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  std::vector<char>& buffer() { return buf_; }

 private:
  std::vector<char> buf_;
};

class Reader {
 public:
  Reader(const std::vector<char>& buf, size_t end, std::string path)
      : buf_(buf), end_(end), path_(std::move(path)) {}
  void bytes(void* p, size_t n, const char* what) {
    if (n > end_ - pos_) fail(std::string("it ends inside the ") + what);
    std::memcpy(p, buf_.data() + pos_, n);
    pos_ += n;
  }
  template <class T>
  T pod(const char* what) {
    T v;
    bytes(&v, sizeof v, what);
    return v;
  }
  std::string str(const char* what, uint32_t max) {
    const uint32_t n = pod<uint32_t>(what);
    if (n > max) fail(std::string("implausible length of the ") + what);
    std::string s(n, '\0');
    bytes(s.data(), n, what);
    return s;
  }
  void skip(size_t n) { pos_ += n; }  // callers check remaining() first
  size_t pos() const { return pos_; }
  size_t remaining() const { return end_ - pos_; }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("parameter file " + path_ + " is corrupt: " + what);
  }

 private:
  const std::vector<char>& buf_;
  size_t end_, pos_ = 0;
  std::string path_;
};

// Parses and checks the whole file; `values_at` gets where each entry's values start.
ParamsFileInfo parse(const std::vector<char>& buf, const std::string& path, std::vector<size_t>* values_at) {
  if (buf.size() < sizeof kMagic || std::memcmp(buf.data(), kMagic, sizeof kMagic) != 0)
    throw Error("parameter file " + path + " is not a gpunodes parameter file (no GNPARAMS magic)");
  if (buf.size() < sizeof kMagic + 8) throw Error("parameter file " + path + " is corrupt: too short");
  const size_t body = buf.size() - 4;
  uint32_t stored_crc;
  std::memcpy(&stored_crc, buf.data() + body, 4);
  const uint32_t crc =
      static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(body)));
  Reader r(buf, body, path);
  char magic[8];
  r.bytes(magic, 8, "magic");
  if (crc != stored_crc) r.fail("checksum mismatch (the file was changed or truncated)");
  ParamsFileInfo info;
  info.version = r.pod<uint32_t>("version");
  if (info.version != kVersion)
    throw Error("parameter file " + path + " has format version " + std::to_string(info.version) +
                "; this build reads version " + std::to_string(kVersion));
  info.signature = r.str("signature", 4096);
  const uint32_t count = r.pod<uint32_t>("entry count");
  if (count > 1u << 20) r.fail("implausible entry count");
  std::vector<int64_t> numels;
  for (uint32_t i = 0; i < count; ++i) {
    ParamsFileEntry e;
    e.name = r.str("entry name", 4096);
    e.trainable = r.pod<uint8_t>("entry flags") != 0;
    const uint32_t rank = r.pod<uint32_t>("entry rank");
    if (rank > kMaxRank) r.fail("entry " + e.name + " has rank " + std::to_string(rank));
    int64_t numel = 1;
    for (uint32_t d = 0; d < rank; ++d) {
      const int64_t dim = r.pod<int64_t>("entry shape");
      if (dim < 0 || (dim > 0 && numel > (int64_t(1) << 40) / dim))
        r.fail("entry " + e.name + " has a bad shape");
      e.shape.push_back(dim);
      numel *= dim;
    }
    numels.push_back(numel);
    info.entries.push_back(std::move(e));
  }
  for (size_t i = 0; i < info.entries.size(); ++i) {
    const size_t bytes = static_cast<size_t>(numels[i]) * sizeof(float);
    if (bytes > r.remaining()) r.fail("the values of " + info.entries[i].name + " are cut off");
    if (values_at) values_at->push_back(r.pos());
    r.skip(bytes);
  }
  if (r.remaining() != 0) r.fail(std::to_string(r.remaining()) + " unexpected bytes after the values");
  return info;
}

// By content, never by the file's name: a .params file may hold safetensors and the reverse.
ParamsFormat detect(const std::vector<char>& buf, const std::string& path) {
  if (buf.size() >= sizeof kMagic && std::memcmp(buf.data(), kMagic, sizeof kMagic) == 0)
    return ParamsFormat::Gnparams;
  if (looks_like_safetensors(buf.data(), buf.size())) return ParamsFormat::Safetensors;
  throw Error("parameter file " + path +
              " is not a gpunodes parameter file (no GNPARAMS magic) nor a safetensors file (no JSON header "
              "after an 8-byte length)");
}

[[noreturn]] void write_failed(const std::string& path, const std::string& tmp, const std::string& why) {
  std::remove(tmp.c_str());
  throw Error("cannot write parameter file " + path + ": " + why);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

ParamsFileInfo safetensors_info(const std::vector<char>& buf, const std::string& path) {
  const SafetensorsHeader h = parse_safetensors(buf, path);
  ParamsFileInfo info;
  info.format = ParamsFormat::Safetensors;
  if (const std::string* sig = h.find_metadata("gpunodes.signature")) info.signature = *sig;
  for (const SafetensorsEntry& t : h.tensors) {
    if (ends_with(t.name, "num_batches_tracked")) continue;  // PyTorch's counter, not a state entry
    info.entries.push_back(
        {t.name, t.shape, !ends_with(t.name, "running_mean") && !ends_with(t.name, "running_var")});
  }
  return info;
}

}  // namespace

const char* params_format_name(ParamsFormat format) {
  return format == ParamsFormat::Safetensors ? "safetensors" : "gpunodes";
}

ParamsFormat parse_params_format(const std::string& name) {
  for (ParamsFormat f : {ParamsFormat::Gnparams, ParamsFormat::Safetensors})
    if (name == params_format_name(f)) return f;
  throw Error("unknown parameter file format '" + name + "': expected gpunodes or safetensors");
}

// Checked before reading: a device (/dev/zero), a pipe or a huge sparse file must not be read into memory
// without end, and a directory must not read as an empty file.
std::vector<char> read_params_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status))
    throw Error("cannot open parameter file " + path + ": " + (ec ? ec.message() : "no such file"));
  if (!fs::is_regular_file(status))
    throw Error("parameter file " + path + " is not a regular file (" +
                (fs::is_directory(status) ? "a directory" : "a device, pipe or socket") + ")");
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec) throw Error("cannot read parameter file " + path + ": " + ec.message());
  if (size > kMaxFileBytes)
    throw Error("parameter file " + path + " is " + format_bytes(static_cast<int64_t>(size)) + ", over the " +
                format_bytes(kMaxFileBytes) + " limit for parameter files");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open parameter file " + path + ": " + std::strerror(errno));
  std::vector<char> buf(static_cast<size_t>(size));
  in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
  // A file that shrank while being read is a truncated file; the parsers say so.
  buf.resize(static_cast<size_t>(in.gcount()));
  if (in.bad()) throw Error("cannot read parameter file " + path);
  return buf;
}

void write_params_file(const std::string& path, const std::vector<char>& bytes) {
  // A name of this writer's own: two processes saving one path (the points of a sweep on two ranks) must
  // not rename each other's half-written file.
  static std::atomic<uint64_t> writes{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(writes++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) throw Error("cannot write parameter file " + path + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "the disk took no more bytes";
      ::close(fd);
      write_failed(path, tmp, why);
    }
    done += static_cast<size_t>(n);
  }
  // Flushed before the rename: otherwise a crash soon after could leave the new name on an empty file.
  if (::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    write_failed(path, tmp, why);
  }
  if (::close(fd) != 0) write_failed(path, tmp, std::strerror(errno));
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) write_failed(path, tmp, ec.message());
  // The rename itself lives in the directory; without this a crash could bring back the old file.
  // Best effort: some file systems refuse to sync a directory, and the data is safe either way.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

ModelOptions options_from_signature(const std::string& signature) {
  if (signature.rfind("network ", 0) == 0) {  // a drawn network: its whole architecture
    ModelOptions o;
    o.arch = Arch::Network;
    o.network = std::make_shared<const NetworkSpec>(NetworkSpec::parse(signature));
    return o;
  }
  std::istringstream in(signature);
  std::string arch, tok;
  in >> arch;
  ModelOptions o;
  o.arch = parse_arch(arch);
  while (in >> tok) {
    const auto eq = tok.find('=');
    if (eq == std::string::npos) throw Error("malformed model signature '" + signature + "'");
    const std::string key = tok.substr(0, eq), value = tok.substr(eq + 1);
    int64_t v = 0;
    try {
      v = std::stoll(value);
    } catch (const std::exception&) {
      throw Error("malformed model signature '" + signature + "': " + key + " is not a number");
    }
    if (key == "classes")
      o.classes = v;
    else if (key == "in_channels")
      o.in_channels = v;
    else if (key == "image_size")
      o.image_size = v;
    else
      throw Error("malformed model signature '" + signature + "': unknown key " + key);
  }
  return o;
}

void save_params(const Model& model, const std::string& path, ParamsFormat format) {
  if (format == ParamsFormat::Safetensors) return save_safetensors(model, path);
  Writer w;
  w.bytes(kMagic, sizeof kMagic);
  w.pod(kVersion);
  w.str(model.signature());
  auto state = model.state();
  w.pod(static_cast<uint32_t>(state.size()));
  for (const Parameter* p : state) {
    w.str(p->name);
    w.pod(static_cast<uint8_t>(p->trainable ? 1 : 0));
    w.pod(static_cast<uint32_t>(p->value.shape().size()));
    for (int64_t d : p->value.shape()) w.pod(d);
  }
  for (const Parameter* p : state) {
    std::vector<float> v = to_host(p->value);
    w.bytes(v.data(), v.size() * sizeof(float));
  }
  auto& buf = w.buffer();
  const uint32_t crc = static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(buf.size())));
  w.pod(crc);
  write_params_file(path, buf);
}

ParamsFileInfo read_params_info(const std::string& path) {
  const std::vector<char> buf = read_params_file(path);
  if (detect(buf, path) == ParamsFormat::Safetensors) return safetensors_info(buf, path);
  return parse(buf, path, nullptr);
}

void load_params(Model& model, const std::string& path) {
  const std::vector<char> buf = read_params_file(path);
  if (detect(buf, path) == ParamsFormat::Safetensors) return load_safetensors(model, buf, path);
  std::vector<size_t> at;
  ParamsFileInfo info = parse(buf, path, &at);
  if (info.signature != model.signature())
    throw Error("parameter file " + path + " holds a '" + info.signature + "' model, not the '" +
                model.signature() + "' it is loaded into");
  auto state = model.state();
  if (info.entries.size() != state.size())
    throw Error("parameter file " + path + " has " + std::to_string(info.entries.size()) +
                " entries; the model has " + std::to_string(state.size()));
  for (size_t i = 0; i < state.size(); ++i) {
    const ParamsFileEntry& e = info.entries[i];
    if (e.name != state[i]->name || e.shape != state[i]->value.shape())
      throw Error("parameter file " + path + ": entry " + std::to_string(i) + " is " + e.name + " " +
                  shape_str(e.shape) + " but the model expects " + state[i]->name + " " +
                  shape_str(state[i]->value.shape()));
  }
  for (size_t i = 0; i < state.size(); ++i) {
    std::vector<float> v(static_cast<size_t>(state[i]->value.numel()));
    std::memcpy(v.data(), buf.data() + at[i], v.size() * sizeof(float));
    write_values(state[i]->value, std::move(v));
  }
}

std::unique_ptr<Model> load_model(Runtime& rt, const std::string& path, Device device) {
  ParamsFileInfo info = read_params_info(path);
  if (info.format == ParamsFormat::Safetensors && info.signature.empty())
    throw Error("safetensors file " + path +
                " has no \"gpunodes.signature\" metadata (another program, such as PyTorch, wrote it), so it "
                "does not say which model it holds: build that model and load the file into it (in a graph: "
                "wire the model into LoadParams' like input)");
  auto model = Model::create(rt, options_from_signature(info.signature), device);
  load_params(*model, path);
  return model;
}

}  // namespace gn::nn
