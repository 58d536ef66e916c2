// Corrupt and hostile parameter files and dataset files, beyond the plain corruptions test_nn_models and
// test_safetensors cover: files that are not files (a directory, /dev/zero, a pipe with no writer), headers
// whose checksum is right but whose sizes are absurd, safetensors headers built to exhaust the parser, and
// IDX headers that claim gigabytes. Each gives a clear gn::Error quickly, and nothing allocates what a header
// claims before the bytes are there.
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QTemporaryDir>
#include <QtTest>
#include <cstring>
#include <fstream>

#include "gpunodes/errors.h"
#include "gpunodes/nn/data.h"
#include "gpunodes/nn/serialize.h"
#include "time_scale.h"

using namespace gn;
using namespace gn::nn;

namespace {

// Runs fn, which must throw gn::Error naming every needle, within a second; returns the message.
// budgetMs bounds the refusal (times kTimeScale under sanitizers): it catches hangs and quadratic work.
QString expectError(const std::function<void()>& fn, const QStringList& needles, int budgetMs = 1000) {
  QElapsedTimer timer;
  timer.start();
  QString what;
  try {
    fn();
  } catch (const Error& e) {
    what = QString::fromUtf8(e.what());
  }
  if (what.isEmpty()) {
    QTest::qFail("no error was thrown", __FILE__, __LINE__);
    return {};
  }
  for (const QString& n : needles)
    if (!what.contains(n))
      QTest::qFail(qPrintable("'" + what + "' does not mention '" + n + "'"), __FILE__, __LINE__);
  if (timer.elapsed() > budgetMs * kTimeScale)
    QTest::qFail(qPrintable(QStringLiteral("took %1 ms: %2").arg(timer.elapsed()).arg(what)), __FILE__,
                 __LINE__);
  return what;
}

long peakRssMiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

void writeFile(const QString& path, const std::string& bytes) {
  std::ofstream out(path.toStdString(), std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The parameter file format (serialize.h), written by hand so that a test can make the checksum right and
// everything else wrong.
class ParamsFile {
 public:
  explicit ParamsFile(const std::string& signature) {
    bytes_.append("GNPARAMS", 8);
    u32(1);
    u32(static_cast<uint32_t>(signature.size()));
    bytes_ += signature;
  }
  void u32(uint32_t v) { bytes_.append(reinterpret_cast<const char*>(&v), 4); }
  void i64(int64_t v) { bytes_.append(reinterpret_cast<const char*>(&v), 8); }
  void entry(const std::string& name, std::vector<int64_t> shape) {
    u32(static_cast<uint32_t>(name.size()));
    bytes_ += name;
    bytes_ += '\1';
    u32(static_cast<uint32_t>(shape.size()));
    for (int64_t d : shape) i64(d);
  }
  void raw(const std::string& b) { bytes_ += b; }
  // With the CRC-32 (zlib's polynomial) of everything before it.
  std::string finished() const {
    uint32_t crc = 0xFFFFFFFFu;
    for (unsigned char c : bytes_) {
      crc ^= c;
      for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    crc ^= 0xFFFFFFFFu;
    return bytes_ + std::string(reinterpret_cast<const char*>(&crc), 4);
  }

 private:
  std::string bytes_;
};

// A safetensors file: the 8-byte header length, the header padded with spaces to a multiple of 8, the data.
std::string safetensors(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
}

std::string bigEndian(uint32_t v) {
  const char b[4] = {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
  return std::string(b, 4);
}

// An uncompressed IDX file (gzread passes plain files through).
std::string idx(int dims, std::vector<uint32_t> sizes, const std::string& data) {
  std::string s = bigEndian(0x00000800u | static_cast<uint32_t>(dims));
  for (uint32_t d : sizes) s += bigEndian(d);
  return s + data;
}

}  // namespace

class CorruptFilesTest : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;

  QString path(const QString& name) const { return dir_.filePath(name); }

 private slots:
  void initTestCase() { QVERIFY(dir_.isValid()); }

  void parameterFilesThatAreNotFiles() {
    Runtime rt;
    expectError([&] { load_model(rt, dir_.path().toStdString(), Device::cpu()); },
                {dir_.path(), "not a regular file (a directory)"});
    // /dev/zero never ends; before this was checked, reading it filled memory until the process died.
    expectError([&] { read_params_info("/dev/zero"); }, {"/dev/zero", "not a regular file"});
    // A pipe nobody writes to: opening it would block for ever.
    const QString fifo = path("pipe.params");
    QCOMPARE(mkfifo(fifo.toLocal8Bit().constData(), 0600), 0);
    expectError([&] { read_params_info(fifo.toStdString()); }, {fifo, "not a regular file"});
    // A sparse file of 20 GiB: refused from its size, without reading.
    const QString huge = path("huge.params");
    QFile f(huge);
    QVERIFY(f.open(QIODevice::WriteOnly));
    QVERIFY(f.resize(20LL << 30));
    f.close();
    expectError([&] { read_params_info(huge.toStdString()); },
                {huge, "20.00 GiB", "limit for parameter files"});
    f.remove();
  }

  void checksummedButAbsurdParameterFiles() {
    Runtime rt;
    const long rssBefore = peakRssMiB();
    // Model sizes far past anything real, from a file whose checksum is right.
    for (const std::string& sig :
         {std::string("mlp classes=10000000000000 in_channels=1 image_size=28"),
          std::string("mlp classes=10 in_channels=1 image_size=4294967296"),
          std::string("resnet18 classes=10 in_channels=-3"),
          std::string("lenet classes=10 in_channels=1 image_size=9223372036854775807")}) {
      ParamsFile pf(sig);
      pf.u32(0);  // no entries: the model is built from the signature before they are compared
      const QString p = path("sig.params");
      writeFile(p, pf.finished());
      expectError([&] { load_model(rt, p.toStdString(), Device::cpu()); }, {"model options"});
    }
    // Large but within the bounds: the model would need far more memory than the machine has. The allocator
    // says so before asking the system for it.
    {
      const std::string sig = "mlp classes=1048576 in_channels=1048576 image_size=65536";
      ParamsFile pf(sig);
      pf.u32(0);
      const QString p = path("big.params");
      writeFile(p, pf.finished());
      expectError([&] { load_model(rt, p.toStdString(), Device::cpu()); },
                  {"Out of memory on cpu", "tried to allocate"});
    }
    // A million entries announced, none there.
    {
      ParamsFile pf("mlp classes=10 in_channels=1 image_size=28");
      pf.u32(1u << 20);
      const QString p = path("entries.params");
      writeFile(p, pf.finished());
      expectError([&] { read_params_info(p.toStdString()); }, {"corrupt", "ends inside"});
    }
    // One entry claiming 2^40 values, with four bytes of them.
    {
      ParamsFile pf("linear classes=1 in_channels=3");
      pf.u32(1);
      pf.entry("0.weight", {int64_t(1) << 20, int64_t(1) << 20});
      pf.raw("abcd");
      const QString p = path("values.params");
      writeFile(p, pf.finished());
      expectError([&] { read_params_info(p.toStdString()); }, {"corrupt", "values of 0.weight are cut off"});
    }
    // A shape whose product overflows int64.
    {
      ParamsFile pf("linear classes=1 in_channels=3");
      pf.u32(1);
      pf.entry("0.weight", {int64_t(1) << 40, int64_t(1) << 40, int64_t(1) << 40});
      const QString p = path("overflow.params");
      writeFile(p, pf.finished());
      expectError([&] { read_params_info(p.toStdString()); }, {"corrupt", "bad shape"});
    }
    QVERIFY2(peakRssMiB() - rssBefore < 512,
             qPrintable(QStringLiteral("memory grew by %1 MiB").arg(peakRssMiB() - rssBefore)));
  }

  void safetensorsWithAbsurdHeaders() {
    Runtime rt;
    const long rssBefore = peakRssMiB();
    const QString p = path("absurd.safetensors");
    // A header length of 2^63 in a file of 16 bytes.
    {
      std::string bytes = safetensors("{}", "");
      const uint64_t n = uint64_t(1) << 63;
      std::memcpy(bytes.data(), &n, 8);
      writeFile(p, bytes);
      expectError([&] { read_params_info(p.toStdString()); }, {p, "corrupt", "header length", "limit"});
    }
    // Nesting a recursive parser would follow until the stack overflows.
    writeFile(p, safetensors(R"({"__metadata__":{"a":)" + std::string(1000000, '[') +
                                 std::string(1000000, ']') + "}}",
                             ""));
    expectError([&] { read_params_info(p.toStdString()); }, {"corrupt", "nested deeper than"});
    // 20 MB of JSON in one value where a string belongs: skipped without being stored.
    {
      std::string zeros = "[0";
      for (int i = 0; i < 10000000; ++i) zeros += ",0";
      writeFile(p, safetensors(R"({"__metadata__":{"a":)" + zeros + "]}}", ""));
      // 3 s: about 0.25 s here, and 5-17 s in the unoptimised ASan build on a busy machine.
      expectError([&] { read_params_info(p.toStdString()); },
                  {"__metadata__ entry 'a'", "an array, not a string"}, 3000);
    }
    // More tensor entries than any checkpoint has: refused at the limit, the rest never parsed.
    {
      std::string header = "{";
      for (int i = 0; i < 200000; ++i)
        header += (i ? "," : "") + ('"' + std::to_string(i)) +
                  "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}";
      writeFile(p, safetensors(header + "}", ""));
      expectError([&] { read_params_info(p.toStdString()); }, {"corrupt", "more than 131072 tensors"}, 3000);
    }
    // 2^80 values claimed, four bytes there.
    writeFile(p, safetensors(R"({"0.weight":{"dtype":"F32","shape":[1099511627776,1099511627776],)"
                             R"("data_offsets":[0,4]}})",
                             "abcd"));
    expectError([&] { read_params_info(p.toStdString()); },
                {"'0.weight'", "more than the 4 bytes of data hold"});
    // A signature of absurd model options: refused by the model's bounds, before anything is built.
    writeFile(
        p, safetensors(R"({"__metadata__":{"gpunodes.signature":"mlp classes=10000000000000 in_channels=1 )"
                       R"(image_size=28"}})",
                       ""));
    expectError([&] { load_model(rt, p.toStdString(), Device::cpu()); }, {"model options"});
    QVERIFY2(peakRssMiB() - rssBefore < 512,
             qPrintable(QStringLiteral("memory grew by %1 MiB").arg(peakRssMiB() - rssBefore)));
  }

  void datasetFilesWithAbsurdHeaders() {
    auto dataset = [&](const QString& name, const std::string& images, const std::string& labels) {
      QDir(dir_.path()).mkpath(name);
      writeFile(path(name + "/train-images-idx3-ubyte"), images);
      writeFile(path(name + "/train-labels-idx1-ubyte"), labels);
      return path(name).toStdString();
    };
    const std::string three(3 * 28 * 28, '\x40');
    const std::string okLabels = idx(1, {3}, std::string("\0\1\2", 3));

    // 5,000,000 images announced (3.9 GB), 10 bytes there: an error at once, and no 3.9 GB allocated.
    const long rssBefore = peakRssMiB();
    std::string d = dataset("claims", idx(3, {5000000, 28, 28}, "0123456789"), okLabels);
    expectError([&] { load_fashion_mnist(Split::Train, d); },
                {"train-images-idx3-ubyte", "corrupt", "ends inside the data"});
    QVERIFY2(peakRssMiB() - rssBefore < 512,
             qPrintable(QStringLiteral("memory grew by %1 MiB").arg(peakRssMiB() - rssBefore)));
    // Dimensions whose product passes 2^32, or wraps around 2^64.
    d = dataset("dims", idx(3, {0xFFFFFFFFu, 0xFFFFFFFFu, 0x10000u}, ""), okLabels);
    expectError([&] { load_fashion_mnist(Split::Train, d); }, {"implausible dimensions"});
    d = dataset("zero", idx(3, {0, 28, 28}, ""), okLabels);
    expectError([&] { load_fashion_mnist(Split::Train, d); }, {"implausible dimensions"});
    // Well-formed files that disagree with each other or with Fashion-MNIST.
    d = dataset("side", idx(3, {3, 32, 32}, std::string(3 * 32 * 32, '\0')), okLabels);
    expectError([&] { load_fashion_mnist(Split::Train, d); }, {"images are 32x32, not 28x28"});
    d = dataset("count", idx(3, {3, 28, 28}, three), idx(1, {4}, std::string("\0\1\2\3", 4)));
    expectError([&] { load_fashion_mnist(Split::Train, d); }, {"4 labels for 3 images"});
    d = dataset("label", idx(3, {3, 28, 28}, three), idx(1, {3}, std::string("\0\x0b\2", 3)));
    expectError([&] { load_fashion_mnist(Split::Train, d); }, {"label 11 at 1"});
    d = dataset("empty", "", okLabels);
    expectError([&] { load_fashion_mnist(Split::Train, d); },
                {"train-images-idx3-ubyte", "ends inside the header"});
    // A directory where the images file should be.
    QDir(dir_.path()).mkpath("dir/train-images-idx3-ubyte.gz");
    writeFile(path("dir/train-labels-idx1-ubyte"), okLabels);
    expectError([&] { load_fashion_mnist(Split::Train, path("dir").toStdString()); },
                {"train-images-idx3-ubyte.gz"});
    // And a good set of three images loads: the checks above are not simply refusing everything.
    d = dataset("good", idx(3, {3, 28, 28}, three), okLabels);
    DatasetPtr ok = load_fashion_mnist(Split::Train, d);
    QCOMPARE(ok->count, int64_t(3));
    QCOMPARE(int(ok->labels[2]), 2);
  }
};

QTEST_GUILESS_MAIN(CorruptFilesTest)
#include "test_corrupt_files.moc"
