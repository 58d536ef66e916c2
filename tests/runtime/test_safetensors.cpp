// safetensors files: every built-in architecture through a file and back, the exact bytes of a tiny model's
// file against a layout built here by hand, loading by content whatever the file's name, the other float
// dtypes, and hostile files: each refused with a message that names the problem, the model untouched.
#include <QtTest>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "gpunodes/errors.h"
#include "gpunodes/nn/safetensors.h"
#include "gpunodes/nn/serialize.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;
namespace fs = std::filesystem;

namespace {

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

template <class T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::string u64(uint64_t v) {
  return std::string(reinterpret_cast<const char*>(&v), 8);
}

// A safetensors file from a header text (padded with spaces to a multiple of 8, as the reference writer
// does) and data bytes.
std::string st_file(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return u64(header.size()) + header + data;
}

// Every state entry with values of its own, BatchNorm variances positive: a round trip that only kept the
// initialisation would not pass.
void randomize(Model& m, uint32_t seed) {
  std::mt19937 gen(seed);
  for (Parameter* p : m.state()) {
    const bool var = p->name.ends_with("running_var");
    std::uniform_real_distribution<float> dist(var ? 0.5f : -1.0f, var ? 1.5f : 1.0f);
    std::vector<float> v(static_cast<size_t>(p->value.numel()));
    for (float& x : v) x = dist(gen);
    write_values(p->value, std::move(v));
  }
}

std::vector<std::vector<float>> values(const Model& m) {
  std::vector<std::vector<float>> out;
  for (const Parameter* p : m.state()) out.push_back(to_host(p->value));
  return out;
}

ModelOptions small(Arch arch, uint64_t seed) {
  ModelOptions o = modelOptions(arch, seed);
  if (arch == Arch::Linear) {
    o.in_channels = 3;
    o.classes = 2;
  }
  if (arch == Arch::ResNet18) o.image_size = 16;
  return o;
}

}  // namespace

class SafetensorsTest : public QObject {
  Q_OBJECT

 private slots:
  void every_architecture_round_trips_data() {
    QTest::addColumn<int>("arch");
    for (Arch a : {Arch::Linear, Arch::Mlp, Arch::LeNet, Arch::ResNet18})
      QTest::newRow(arch_name(a)) << static_cast<int>(a);
  }
  void every_architecture_round_trips() {
    QFETCH(int, arch);
    const Arch a = static_cast<Arch>(arch);
    Runtime rt({.cpu_devices = 2});
    TempDir dir;
    auto m = Model::create(rt, small(a, 1), Device::cpu(0));
    randomize(*m, 7);
    m->set_batches_tracked(41);
    const std::string path = dir.file("model.safetensors");
    save_params(*m, path, ParamsFormat::Safetensors);
    // Only the file itself: the temporary it was written to was renamed.
    QCOMPARE(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), std::ptrdiff_t(1));

    const ParamsFileInfo info = read_params_info(path);
    QCOMPARE(info.format, ParamsFormat::Safetensors);
    QCOMPARE(info.signature, m->signature());
    QCOMPARE(info.entries.size(), m->state().size());
    for (size_t i = 0; i < info.entries.size(); ++i) {
      QCOMPARE(info.entries[i].name, m->state()[i]->name);
      QCOMPARE(info.entries[i].shape, m->state()[i]->value.shape());
      QCOMPARE(info.entries[i].trainable, m->state()[i]->trainable);
    }

    // Into a model of another seed on the other device, and as a new model: the identical state.
    auto b = Model::create(rt, small(a, 2), Device::cpu(1));
    load_params(*b, path);
    QCOMPARE(values(*b), values(*m));
    const bool has_bn = a == Arch::ResNet18;
    QCOMPARE(b->batches_tracked(), has_bn ? int64_t(41) : int64_t(0));
    auto c = load_model(rt, path, Device::cpu(1));
    QCOMPARE(c->signature(), m->signature());
    QCOMPARE(values(*c), values(*m));

    // The layout: 8-byte aligned header, every tensor aligned to its element size, no gaps, nothing after.
    const SafetensorsHeader h = read_safetensors_header(path);
    QCOMPARE(h.data_start % 8, uint64_t(0));
    QVERIFY(h.find_metadata("format") && *h.find_metadata("format") == "pt");
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    size_t counters = 0;
    for (const SafetensorsEntry& t : h.tensors) {
      QCOMPARE(t.begin % (t.dtype == "I64" ? 8 : 4), uint64_t(0));
      spans.emplace_back(t.begin, t.end);
      if (t.dtype == "I64") ++counters;
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) QCOMPARE(spans[i].first, spans[i - 1].second);
    QCOMPARE(spans.front().first, uint64_t(0));
    QCOMPARE(h.data_start + spans.back().second, uint64_t(fs::file_size(path)));
    QCOMPARE(counters, has_bn ? size_t(17) : size_t(0));  // ResNet-18: the stem's BatchNorm and 2 per block
  }

  void files_do_not_depend_on_the_device() {
    // From the GPU where there is one (the CPU otherwise) onto the CPU, and back.
    Runtime rt;
    TempDir dir;
    const Device gpu = rt.try_gpu();
    auto m = Model::create(rt, small(Arch::LeNet, 5), gpu);
    randomize(*m, 9);
    const std::string path = dir.file("lenet.safetensors");
    save_params(*m, path, ParamsFormat::Safetensors);
    auto on_cpu = load_model(rt, path, Device::cpu());
    QCOMPARE(on_cpu->state()[0]->value.device(), Device::cpu());
    QCOMPARE(values(*on_cpu), values(*m));
    save_params(*on_cpu, path, ParamsFormat::Safetensors);
    auto back = Model::create(rt, small(Arch::LeNet, 6), gpu);
    load_params(*back, path);
    QCOMPARE(back->state()[0]->value.device(), gpu);
    QCOMPARE(values(*back), values(*m));
  }

  void tiny_model_file_is_byte_exact() {
    Runtime rt;
    TempDir dir;
    auto m = Model::create(rt, small(Arch::Linear, 0), Device::cpu());
    const std::vector<float> w = {1.5f, -2.0f, 0.25f, 3.0f, -0.5f, 8.0f}, bias = {0.125f, -7.0f};
    write_values(m->state()[0]->value, w);
    write_values(m->state()[1]->value, bias);
    const std::string path = dir.file("tiny.safetensors");
    save_params(*m, path, ParamsFormat::Safetensors);

    // Written out independently of the writer: the compact JSON the reference writer produces, padded with
    // spaces to a multiple of 8, then the float32 values in state order.
    const std::string header =
        R"({"__metadata__":{"format":"pt","gpunodes.signature":"linear classes=2 in_channels=3"},)"
        R"("0.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
        R"("0.bias":{"dtype":"F32","shape":[2],"data_offsets":[24,32]}})";
    const std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
    QCOMPARE(padded.size() % 8, size_t(0));
    const std::string expected = u64(padded.size()) + padded + raw(w) + raw(bias);
    const std::vector<char> got = read_bytes(path);
    QCOMPARE(std::string(got.begin(), got.end()), expected);
  }

  void batchnorm_counters_follow_their_layers() {
    Runtime rt;
    TempDir dir;
    auto m = Model::create(rt, small(Arch::ResNet18, 0), Device::cpu());
    m->set_batches_tracked(9);
    const std::string path = dir.file("resnet.safetensors");
    save_params(*m, path, ParamsFormat::Safetensors);
    const std::vector<char> bytes = read_bytes(path);
    uint64_t n;
    std::memcpy(&n, bytes.data(), 8);
    const std::string header(bytes.data() + 8, n);
    // PyTorch's state_dict order: each counter right after its layer's running_var; the I64 data first.
    QVERIFY(header.find(R"("1.running_var":{"dtype":"F32","shape":[64],"data_offsets":[)") !=
            std::string::npos);
    QVERIFY(header.find(R"("0.weight":{"dtype":"F32","shape":[64,1,3,3],"data_offsets":[136,2440]},)") !=
            std::string::npos);
    QVERIFY(header.find(
                R"(]},"1.num_batches_tracked":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                R"("resnet_block1.0.conv1.weight":{"dtype":"F32","shape":[64,64,3,3],"data_offsets":[)") !=
            std::string::npos);
    QVERIFY(header.find(R"("resnet_block4.1.bn2.num_batches_tracked":{"dtype":"I64","shape":[],)"
                        R"("data_offsets":[128,136]})") != std::string::npos);
    int64_t first;
    std::memcpy(&first, bytes.data() + 8 + n, 8);
    QCOMPARE(first, int64_t(9));

    // Counters that disagree: the largest wins.
    std::string edited(bytes.begin(), bytes.end());
    const int64_t more = 12;
    std::memcpy(edited.data() + 8 + n + 8 * 7, &more, 8);
    auto b = Model::create(rt, small(Arch::ResNet18, 1), Device::cpu());
    load_params(*b, write_bytes(dir.file("edited.safetensors"), edited));
    QCOMPARE(b->batches_tracked(), int64_t(12));

    // Without counters (other writers may leave them out) the model's own count stays.
    auto c = Model::create(rt, small(Arch::ResNet18, 1), Device::cpu());
    c->set_batches_tracked(3);
    std::string stripped = header;
    size_t at;
    while ((at = stripped.find("num_batches_tracked")) != std::string::npos) {
      const size_t open = stripped.rfind(",\"", at), close = stripped.find('}', at);
      stripped.erase(open, close + 1 - open);
    }
    while (!stripped.empty() && stripped.back() == ' ') stripped.pop_back();
    const std::string data(bytes.begin() + static_cast<long>(8 + n), bytes.end());
    load_params(*c, write_bytes(dir.file("stripped.safetensors"), st_file(stripped, data)));
    QCOMPARE(c->batches_tracked(), int64_t(3));
    QCOMPARE(values(*c), values(*m));
  }

  void format_comes_from_content_not_name() {
    Runtime rt;
    TempDir dir;
    auto m = Model::create(rt, small(Arch::LeNet, 3), Device::cpu());
    randomize(*m, 3);
    const std::string st = dir.file("looks-native.params"), native = dir.file("looks-foreign.safetensors");
    save_params(*m, st, ParamsFormat::Safetensors);
    save_params(*m, native, ParamsFormat::Gnparams);
    QCOMPARE(read_params_info(st).format, ParamsFormat::Safetensors);
    QCOMPARE(read_params_info(native).format, ParamsFormat::Gnparams);
    for (const std::string& path : {st, native}) {
      auto b = Model::create(rt, small(Arch::LeNet, 4), Device::cpu());
      load_params(*b, path);
      QCOMPARE(values(*b), values(*m));
      QCOMPARE(load_model(rt, path, Device::cpu())->signature(), m->signature());
    }
    QCOMPARE(parse_params_format("safetensors"), ParamsFormat::Safetensors);
    expect_error([] { parse_params_format("pickle"); }, {"pickle", "gpunodes or safetensors"});
  }

  void a_file_without_signature_needs_a_model() {
    Runtime rt;
    TempDir dir;
    const std::vector<float> w = {1, 2, 3, 4, 5, 6}, bias = {7, 8};
    const std::string path = write_bytes(
        dir.file("from-torch.safetensors"),
        st_file(
            R"({"__metadata__":{"format":"pt"},"0.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
            R"("0.bias":{"dtype":"F32","shape":[2],"data_offsets":[24,32]}})",
            raw(w) + raw(bias)));
    QCOMPARE(read_params_info(path).signature, std::string());
    expect_error([&] { load_model(rt, path, Device::cpu()); },
                 {QString::fromStdString(path), "gpunodes.signature", "LoadParams", "like"});
    auto m = Model::create(rt, small(Arch::Linear, 0), Device::cpu());
    load_params(*m, path);
    QCOMPARE(to_host(m->state()[0]->value), w);
    QCOMPARE(to_host(m->state()[1]->value), bias);
  }

  void other_float_dtypes_convert() {
    Runtime rt;
    TempDir dir;
    auto m = Model::create(rt, small(Arch::Linear, 0), Device::cpu());
    // 1, -2, 0.5, 65504 (the largest half), 2^-24 (the smallest subnormal half), -0 in F16; the bias in BF16.
    const std::vector<uint16_t> half = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x8000};
    const std::vector<uint16_t> bf16 = {0x3FC0, 0xC2F6};  // 1.5, -123
    load_params(*m, write_bytes(dir.file("half.safetensors"),
                                st_file(R"({"0.weight":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]},)"
                                        R"("0.bias":{"dtype":"BF16","shape":[2],"data_offsets":[12,16]}})",
                                        raw(half) + raw(bf16))));
    QCOMPARE(to_host(m->state()[0]->value),
             (std::vector<float>{1, -2, 0.5f, 65504, std::ldexp(1.0f, -24), -0.0f}));
    QCOMPARE(to_host(m->state()[1]->value), (std::vector<float>{1.5f, -123}));
    const std::vector<double> wide = {0.1, 1e-3, -4, 5, 6, 7}, wide_bias = {1e10, -2.5};
    load_params(*m, write_bytes(dir.file("double.safetensors"),
                                st_file(R"({"0.bias":{"dtype":"F64","shape":[2],"data_offsets":[48,64]},)"
                                        R"("0.weight":{"dtype":"F64","shape":[2,3],"data_offsets":[0,48]}})",
                                        raw(wide) + raw(wide_bias))));
    QCOMPARE(to_host(m->state()[0]->value), (std::vector<float>{0.1f, 1e-3f, -4, 5, 6, 7}));
    QCOMPARE(to_host(m->state()[1]->value), (std::vector<float>{1e10f, -2.5f}));
  }

  void hostile_files_are_refused_before_any_change() {
    Runtime rt;
    TempDir dir;
    auto m = Model::create(rt, small(Arch::Linear, 0), Device::cpu());
    randomize(*m, 5);
    m->set_batches_tracked(4);
    const auto before = values(*m);
    const std::string data = raw(std::vector<float>(8, 0.5f));  // 32 bytes: weight [2,3] and bias [2]
    const std::string w = R"("0.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";
    const std::string b = R"("0.bias":{"dtype":"F32","shape":[2],"data_offsets":[24,32]})";
    const std::string good = "{" + w + "," + b + "}";
    int count = 0;
    auto refused = [&](const std::string& bytes, const QStringList& needles) {
      const std::string path =
          write_bytes(dir.file("hostile" + std::to_string(count++) + ".safetensors"), bytes);
      QStringList all = needles;
      all << QString::fromStdString(path);
      const std::string what = expect_error([&] { load_params(*m, path); }, all);
      qInfo("%s", what.c_str());
      QCOMPARE(values(*m), before);
      QCOMPARE(m->batches_tracked(), int64_t(4));
    };
    // The control: the good file loads (into a copy, so that the model above stays as it was).
    {
      auto copy = Model::create(rt, small(Arch::Linear, 0), Device::cpu());
      load_params(*copy, write_bytes(dir.file("good.safetensors"), st_file(good, data)));
      QCOMPARE(to_host(copy->state()[0]->value), std::vector<float>(6, 0.5f));
    }

    // The header length.
    std::string past = st_file(good, data);
    const uint64_t too_long = past.size() - 8 + 1;
    std::memcpy(past.data(), &too_long, 8);
    refused(past, {"corrupt", "header length " + QString::number(too_long), "past the end of the file"});
    refused(u64(0) + "{}" + data, {"corrupt", "header length 0 is too small"});
    refused(u64(uint64_t(1) << 40) + good + data, {"corrupt", "header length 1099511627776", "100.00 MiB"});
    refused(u64(1) + "{", {"corrupt", "header length 1 is too small"});
    // The JSON.
    refused(st_file("{this is not json}", data), {"corrupt", "not valid JSON"});
    refused(st_file("{" + w + "," + b, data), {"corrupt", "not valid JSON", "ends early"});
    refused(u64(24) + good.substr(0, 24) + data,
            {"corrupt", "not valid JSON"});  // length cut inside the JSON
    refused(st_file("{" + w + "," + w + "," + b + "}", data), {"tensor '0.weight' appears twice"});
    refused(st_file(R"({"__metadata__":{"format":3},)" + w + "," + b + "}", data),
            {"__metadata__ entry 'format'", "not a string"});
    refused(st_file(R"({"0.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24],"extra":1},)" + b + "}",
                    data),
            {"'0.weight'", "unknown field 'extra'"});
    refused(st_file(R"({"0.weight":{"dtype":"F32","shape":[2,3]},)" + b + "}", data),
            {"'0.weight'", "lacks its data_offsets"});
    // Dtypes, shapes and offsets.
    refused(st_file(R"({"0.weight":{"dtype":"Q7","shape":[2,3],"data_offsets":[0,24]},)" + b + "}", data),
            {"'0.weight'", "unknown dtype 'Q7'"});
    refused(st_file(R"({"0.weight":{"dtype":"I32","shape":[2,3],"data_offsets":[0,24]},)" + b + "}", data),
            {"'0.weight'", "dtype I32", "F32, F16, BF16 or F64"});
    refused(st_file(R"({"0.weight":{"dtype":"F32","shape":[-2,3],"data_offsets":[0,24]},)" + b + "}", data),
            {"'0.weight'", "shape entry -2", "not a non-negative integer"});
    refused(st_file(R"({"0.weight":{"dtype":"F32","shape":[2.0,3],"data_offsets":[0,24]},)" + b + "}", data),
            {"'0.weight'", "shape entry 2.0"});
    refused(st_file(R"({"0.weight":{"dtype":"F32","shape":"2x3","data_offsets":[0,24]},)" + b + "}", data),
            {"'0.weight'", "shape that is a string"});
    refused(st_file(R"({"0.weight":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,24]},)" +
                        b + "}",
                    data),
            {"'0.weight'", "more than the 32 bytes of data hold"});
    refused(st_file(R"({"0.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[8,1000]},)" + b + "}", data),
            {"'0.weight'", "[8, 1000]", "past the end of the data (32 bytes)"});
    refused(st_file(R"({"0.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[24,0]},)" + b + "}", data),
            {"'0.weight'", "end before they begin"});
    refused(st_file(R"({"0.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,-24]},)" + b + "}", data),
            {"'0.weight'", "data offset -24"});
    refused(st_file(R"({"0.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]},)" + b + "}", data),
            {"'0.weight'", "needs 24 bytes", "[0, 20] span 20"});
    refused(st_file("{" + w + R"(,"0.bias":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})", data),
            {"'0.weight' [0, 24]", "'0.bias' [16, 24]", "overlap"});
    // The match with the model: one error naming the tensor, both shapes where they differ, and the file.
    refused(st_file("{" + w + "}", data), {"'0.bias' [2]", "missing from the file"});
    refused(st_file("{" + w + "," + b + R"(,"0.extra":{"dtype":"F32","shape":[0],"data_offsets":[32,32]}})",
                    data),
            {"'0.extra' [0]", "not a parameter or buffer of the model"});
    refused(st_file("{" + w + "," + b +
                        R"(,"0.num_batches_tracked":{"dtype":"I64","shape":[],"data_offsets":[32,40]}})",
                    data + u64(5)),
            {"'0.num_batches_tracked'", "not a parameter or buffer"});
    refused(st_file(R"({"0.weight":{"dtype":"F32","shape":[3,2],"data_offsets":[0,24]},)" + b + "}", data),
            {"tensor '0.weight' has shape [3, 2] in the file but the model expects [2, 3]"});
    // A file of another gpunodes model says which.
    refused(st_file(R"({"__metadata__":{"gpunodes.signature":"linear classes=2 in_channels=2"},)"
                    R"("0.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)" +
                        b + "}",
                    data),
            {"[2, 2] in the file but the model expects [2, 3]", "'linear classes=2 in_channels=2' model"});
    // Neither format: a safetensors header is a JSON object, so a file whose JSON is an array is not one.
    expect_error([&] { load_params(*m, write_bytes(dir.file("text.params"), "hello, world")); },
                 {"not a gpunodes parameter file", "nor a safetensors file"});
    expect_error(
        [&] { load_params(*m, write_bytes(dir.file("array.safetensors"), st_file("[1, 2]", data))); },
        {"nor a safetensors file"});
    expect_error([&] { parse_safetensors(std::vector<char>(8, '\0'), "direct"); }, {"direct", "too small"});
    QCOMPARE(values(*m), before);
  }

  void batchnorm_counter_of_the_wrong_dtype() {
    Runtime rt;
    TempDir dir;
    auto m = Model::create(rt, small(Arch::ResNet18, 0), Device::cpu());
    const std::string path = dir.file("resnet.safetensors");
    save_params(*m, path, ParamsFormat::Safetensors);
    std::vector<char> bytes = read_bytes(path);
    std::string text(bytes.begin(), bytes.end());
    // The same byte length: only the dtype check can refuse it.
    for (const char* dt : {"F64", "U64"}) {
      const std::string dtype = dt;
      std::string edited = text;
      const std::string from = R"("resnet_block3.1.bn1.num_batches_tracked":{"dtype":"I64")";
      const size_t at = edited.find(from);
      QVERIFY(at != std::string::npos);
      edited.replace(at + from.size() - 4, 3, dtype);
      auto b = Model::create(rt, small(Arch::ResNet18, 1), Device::cpu());
      const auto before = to_host(b->state()[0]->value);
      expect_error(
          [&] { load_params(*b, write_bytes(dir.file("bad.safetensors"), edited)); },
          {"'resnet_block3.1.bn1.num_batches_tracked'", QString::fromStdString(dtype) + " []", "I64 scalar"});
      QCOMPARE(to_host(b->state()[0]->value), before);
    }
  }
};

QTEST_GUILESS_MAIN(SafetensorsTest)
#include "test_safetensors.moc"
