// Model, Forward, Parameters, SaveParams and LoadParams: a network on a device, applied to tensors, looked
// at, and written to and read from a parameter file (the seed's "nets on the GPU" and its exercise on reading
// and writing parameters there).
#include <QDir>
#include <QFileInfo>
#include <QJsonArray>

#include "gpunodes/dist/world.h"
#include "gpunodes/errors.h"
#include "gpunodes/nn/serialize.h"
#include "model_values.h"
#include "node_util.h"

namespace gn::nodes {
namespace {

using core::PortType;

class ModelNode final : public GpuNode {
 public:
  ModelNode()
      : GpuNode(
            {
                .name = "Model",
                .category = "Models",
                .description =
                    "A network whose parameters are created on a device and stay there (the seed's "
                    "net.to(device=try_gpu())). linear is the seed's nn.Linear(in_channels, classes); mlp "
                    "Flatten-784-256-ReLU-classes; lenet d2l's LeNet (sigmoid, average pooling); resnet18 "
                    "the "
                    "d2l ResNet-18 of the concise multi-GPU chapter (3x3 stem, no max-pool). The report "
                    "lists "
                    "every parameter's name, shape and device. This is the quick way to the seed's models; "
                    "to "
                    "draw "
                    "a network of your own, wire nodes of the Layers category into a Network node "
                    "(lenet-layers.json and resnet18-layers.json draw these two).",
                .inputs = {inPort(
                    "device", PortType::Devices,
                    "Where the parameters live: a Device, or Devices (try_all_gpus), whose first "
                    "device holds the model; Train replicates it onto the others. Open: the CPU.",
                    false)},
                .outputs = {outPort("model", PortType::Model, "The initialised model.")},
                .params =
                    {
                        enumParam(
                            "arch", {"linear", "mlp", "lenet", "resnet18"}, "mlp",
                            "linear: one Linear(in_channels, classes) layer on [N, in_channels] tensors. "
                            "mlp, lenet, resnet18: image classifiers."),
                        intParam("classes", 10, 1, 100000, "Outputs: classes (linear: out_features)."),
                        intParam("in_channels", 1, 1, 100000,
                                 "Image channels (1 for Fashion-MNIST); linear: in_features."),
                        intParam(
                            "image_size", 28, 1, 4096,
                            "The square image side the mlp and lenet are built for (28, or the Dataset's "
                            "resize). resnet18 takes any size; linear ignores it."),
                        enumParam(
                            "init", {"normal", "xavier", "kaiming"}, "normal",
                            "Weights: normal(0, init_std) as the seed's nn.init.normal_(std=0.01); xavier "
                            "(Glorot uniform); kaiming (He normal). Biases start at 0, BatchNorm at 1 and "
                            "0."),
                        floatParam("init_std", 0.01, "normal: the standard deviation (above 0)."),
                        intParam("seed", 0, 0, 9007199254740991.0,
                                 "Random seed: the same seed gives the same parameters on every device."),
                    },
            },
            Reuse::Pure) {}

  QStringList validateParams(const QJsonObject& params) const override {
    QStringList problems;
    const double std = params["init_std"].toDouble();
    if (params["init"].toString() == "normal" && !(std > 0 && std < 1e6))
      problems.append("init_std: must be above 0");
    if (params["arch"].toString() == "lenet" && params["image_size"].toInteger() < 12)
      problems.append("image_size: lenet needs images of at least 12x12");
    return problems;
  }

  // The model on the device wired in (the CPU when open); its parameters and buffers must fit there.
  Outputs check(NodeCheck& check) const override {
    const QJsonObject& p = check.params();
    Known m = check.modelDevice("device");
    try {
      m.model = modelOptionsOf(p);
    } catch (const std::exception&) {
      // The params' own checks name the bad value.
    }
    // Parameters and buffers that cannot fit: refused before the run, not by the allocator mid-way.
    if (m.model && m.devices.size() == 1) {
      const double values = nn::state_elements(*m.model);
      check.checkFits("params.arch", m.devices.front(), values * sizeof(float),
                      QString("the %1's %2 parameter and buffer values")
                          .arg(p["arch"].toString())
                          .arg(values, 0, 'g', 4));
    }
    return {{"model", m}};
  }

  void execute(core::NodeContext& ctx) const override {
    NodesSession& session = sessionOf(ctx);
    std::vector<Device> devices = deviceInput(ctx, "device");
    const Device device = devices.empty() ? Device::cpu() : devices.front();
    if (!session.runtime().has(device)) throw Error("no such device: " + device.str());
    std::shared_ptr<nn::Model> model =
        nn::Model::create(session.runtime(), modelOptionsOf(ctx.params()), device);
    reportModel(ctx, *model);
    ctx.reportField("layers", qs(model->summary()));
    ctx.setOutput("model", std::make_shared<ModelValue>(session.runtimePtr(), std::move(model)));
  }
};

class ForwardNode final : public GpuNode {
 public:
  ForwardNode()
      : GpuNode(
            {
                .name = "Forward",
                .category = "Models",
                .description =
                    "The model applied to each tensor of the batch, in evaluation mode (the seed's "
                    "net(X)). The tensors must be on the model's device: nothing is copied, and a "
                    "tensor elsewhere fails with the framework's same-device error.",
                .inputs = {inPort("model", PortType::Model, "The model."),
                           inPort("in", PortType::Tensor,
                                  "Inputs: [N, in_channels] for linear, [N, C, H, W] images otherwise.")},
                .outputs = {outPort("out", PortType::Tensor,
                                    "The outputs [N, classes], on the model's device.")},
                .params = {},
            },
            Reuse::Pure) {}

  // The tensors on the model's device, of a shape the model takes; out is [N, classes] (or the network's).
  Outputs check(NodeCheck& check) const override {
    const Known model = check.inputOrUnknown("model"), in = check.inputOrUnknown("in");
    check.checkSameDevice("inputs.in", "in", in, "model", model);
    if (model.model && in.shape) {
      const QString why = inputMismatch(*model.model, *in.shape);
      if (!why.isEmpty()) check.error("inputs.in", why);
    }
    Known t;
    t.isTensors = true;
    t.placeLike(model);
    t.count = in.count;
    if (model.model && in.shape && !in.shape->empty()) {
      if (model.model->arch == nn::Arch::Network) {
        t.shape = model.model->network->infer().back().out;
        t.shape->insert(t.shape->begin(), (*in.shape)[0]);
      } else {
        t.shape = Shape{(*in.shape)[0], model.model->classes};
      }
    }
    return {{"out", t}};
  }

  void execute(core::NodeContext& ctx) const override {
    auto model = modelInput(ctx, "model");
    auto in = tensorInput(ctx, "in");
    std::vector<Tensor> out;
    for (const Tensor& x : in->tensors()) {
      if (ctx.cancelled()) throw CancelledError();
      out.push_back(nn::forward(model->model(), x));
    }
    setTensors(ctx, "out", std::move(out));
  }
};

class ParametersNode final : public GpuNode {
 public:
  ParametersNode()
      : GpuNode(
            {
                .name = "Parameters",
                .category = "Models",
                .description =
                    "The model's parameters and buffers as a batch of tensors, in state-dict order (the "
                    "seed's net[0].weight.data). Wire it into Inspect to see where each lives and its "
                    "values; the report names them.",
                .inputs = {inPort("model", PortType::Model, "The model.")},
                .outputs = {outPort(
                    "out", PortType::Tensor,
                    "One tensor per parameter or buffer, on the model's device (the model's own "
                    "storage, not a copy).")},
                .params = {},
            },
            Reuse::Pure) {}

  // Tensors on the model's device.
  Outputs check(NodeCheck& check) const override {
    Known t;
    t.isTensors = true;
    t.placeLike(check.inputOrUnknown("model"));
    return {{"out", t}};
  }

  void execute(core::NodeContext& ctx) const override {
    auto model = modelInput(ctx, "model");
    std::vector<Tensor> out;
    QJsonArray names;
    for (const nn::Parameter* p : std::as_const(model->model()).state()) {
      out.push_back(p->value);
      names.append(qs(p->name));
    }
    ctx.reportField("names", names);
    ctx.reportField("parameters", describeJson(model->model()));
    setTensors(ctx, "out", std::move(out));
  }
};

class SaveParamsNode final : public GpuNode {
 public:
  SaveParamsNode()
      : GpuNode({
            .name = "SaveParams",
            .category = "Models",
            .description =
                "Writes the model's parameters and buffers to a file, whatever device they are on (a "
                "blocking read). format gpunodes: gpunodes' documented binary format (runtime/include/"
                "gpunodes/nn/serialize.h: magic GNPARAMS, the model signature, names and shapes, float32 "
                "values, CRC-32). format safetensors: Hugging Face's safetensors, which PyTorch reads "
                "(state_dict names such as 0.weight, float32, each BatchNorm's num_batches_tracked, and the "
                "model signature as metadata): torch's load_state_dict(strict=True) takes it for the same "
                "network built in torch. Neither depends on the device, so a file saved from a GPU loads "
                "onto the CPU.",
            .inputs = {inPort("model", PortType::Model, "The model to save.")},
            .outputs = {outPort("model", PortType::Model,
                                "The same model, once the file is written: wire it into LoadParams' like "
                                "input to load the file after it exists.")},
            .params = {pathParam("path", "model.params", core::FileUse::WriteFile,
                                   "The file to write (replaced atomically); a relative path is relative to "
                                   "the graph file's folder. A graph writes only inside its own folder unless "
                                   "the user allows another place."),
                       enumParam(
                           "format", {"gpunodes", "safetensors"}, "gpunodes",
                           "gpunodes: the checksummed GNPARAMS format. safetensors: for PyTorch and the "
                           "Hugging Face tools. LoadParams reads both, telling them apart by content.")},
        }) {}

  QStringList validateParams(const QJsonObject& params) const override {
    if (params["path"].toString().trimmed().isEmpty()) return {"path: give the file to write"};
    return {};
  }

  // The model passes through; the file it writes is one a LoadParams of the graph may read.
  Outputs check(NodeCheck& check) const override { return {{"model", check.inputOrUnknown("model")}}; }

  void execute(core::NodeContext& ctx) const override {
    auto model = modelInput(ctx, "model");
    const QString path = ctx.params()["path"].toString();
    const QString format = ctx.params()["format"].toString();
    // In a distributed run every rank holds the same trained model; rank 0 alone writes it, so that ranks
    // on one machine never write one file at once.
    const bool writes =
        !dist::launch_info().under_mpirun || !dist::World::get().joint_runs() || dist::World::get().is_root();
    try {
      if (writes)
        nn::save_params(model->model(), path.toStdString(), nn::parse_params_format(format.toStdString()));
    } catch (const CancelledError&) {
      throw;
    } catch (const std::exception& e) {
      // A value that failed upstream surfaces here, in the blocking read.
      throw Error(std::string("could not save: ") + e.what());
    }
    if (!writes) {
      ctx.reportField("written_by", "rank 0");
      ctx.setOutput("model", model);
      return;
    }
    ctx.reportField("path", QFileInfo(path).absoluteFilePath());
    ctx.reportField("format", format);
    // Not "bytes": the host's report fills that with the node's traced bytes.
    ctx.reportField("file_bytes", static_cast<double>(QFileInfo(path).size()));
    reportModel(ctx, model->model());
    ctx.setOutput("model", model);
  }
};

class LoadParamsNode final : public GpuNode {
 public:
  LoadParamsNode()
      : GpuNode(
            {
                .name = "LoadParams",
                .category = "Models",
                .description =
                    "Builds the model a parameter file describes on a device and loads the file's values "
                    "into "
                    "it: parameters saved from one device load onto any other. Reads gpunodes' GNPARAMS "
                    "files "
                    "and "
                    "safetensors files (SaveParams' two formats, and weights saved from PyTorch's "
                    "state_dict), "
                    "telling them apart by content, not by the file name. With `like` wired, the file must "
                    "hold "
                    "a model of that architecture and size, or the node fails saying what the file holds. A "
                    "safetensors file written by PyTorch does not say which model it holds: wire a Model of "
                    "the "
                    "same network into `like`, and every tensor's name and shape must match it. A truncated "
                    "or "
                    "corrupt file fails too, before any parameter is touched.",
                .inputs =
                    {inPort("device", PortType::Device, "Where the loaded parameters live."),
                     inPort("like", PortType::Model,
                            "Optional: the architecture the file must hold (arch, classes, channels, image "
                            "size); needed for a safetensors file from PyTorch. Wiring SaveParams' output "
                            "here also loads only after it saved.",
                            false)},
                .outputs = {outPort("model", PortType::Model, "The model with the file's parameters.")},
                .params = {pathParam("path", "model.params", core::FileUse::Read, "The parameter file to read.")},
            },
            Reuse::Pure) {}

  QStringList validateParams(const QJsonObject& params) const override {
    if (params["path"].toString().trimmed().isEmpty()) return {"path: give the file to read"};
    return {};
  }

  // The file's size and time: a file written again since is read again.
  QByteArray cacheIdentity(const QJsonObject& p, core::RunSession* session) const override {
    Q_UNUSED(session);
    return fileIdentity(p["path"].toString());
  }

  // The file must exist, or be written by a SaveParams of this graph first.
  Outputs check(NodeCheck& check) const override {
    const QString path = check.params()["path"].toString();
    if (!path.trimmed().isEmpty() && !QFileInfo::exists(path) && !check.writtenByGraph(path))
      check.error("params.path", "the parameter file " + QDir::cleanPath(QFileInfo(path).absoluteFilePath()) +
                                     " does not exist, and no SaveParams in this graph writes it");
    Known m;
    if (auto like = check.input("like")) m.model = like->model;
    if (auto dev = check.input("device"); dev && dev->isDevices && dev->devices.size() == 1)
      m.placeLike(*dev);
    return {{"model", m}};
  }

  void execute(core::NodeContext& ctx) const override {
    NodesSession& session = sessionOf(ctx);
    const std::vector<Device> devices = deviceInput(ctx, "device");
    if (devices.size() != 1) throw Error("input device must carry exactly one device");
    const Device device = devices.front();
    if (!session.runtime().has(device)) throw Error("no such device: " + device.str());
    const std::string path = ctx.params()["path"].toString().toStdString();
    // The whole file is checked (magic, version, sizes, CRC; a safetensors header and its layout) before a
    // model is built.
    const nn::ParamsFileInfo info = nn::read_params_info(path);
    // Only a safetensors file from another program has no signature; load_params then matches every tensor
    // against like's model by name and shape.
    const bool foreign = info.format == nn::ParamsFormat::Safetensors && info.signature.empty();
    nn::ModelOptions options;
    if (ctx.input("like")) {
      auto like = modelInput(ctx, "like");
      const std::string want = like->model().signature();
      if (!foreign && info.signature != want)
        throw Error("parameter file " + path + " holds a '" + info.signature + "' model, not the '" + want +
                    "' that input like expects: wrong architecture");
      options = like->model().options();
    } else if (foreign) {
      throw Error("safetensors file " + path +
                  " has no gpunodes.signature metadata (another program, such as PyTorch, wrote it), so it "
                  "does not say which network it holds: wire a Model of that network into input like");
    } else {
      options = nn::options_from_signature(info.signature);
    }
    std::shared_ptr<nn::Model> model = nn::Model::create(session.runtime(), options, device);
    nn::load_params(*model, path);
    ctx.reportField("path", QFileInfo(QString::fromStdString(path)).absoluteFilePath());
    ctx.reportField("format", nn::params_format_name(info.format));
    reportModel(ctx, *model);
    ctx.setOutput("model", std::make_shared<ModelValue>(session.runtimePtr(), std::move(model)));
  }
};

}  // namespace

core::NodeTypePtr makeModelNode() {
  return std::make_shared<ModelNode>();
}
core::NodeTypePtr makeForwardNode() {
  return std::make_shared<ForwardNode>();
}
core::NodeTypePtr makeParametersNode() {
  return std::make_shared<ParametersNode>();
}
core::NodeTypePtr makeSaveParamsNode() {
  return std::make_shared<SaveParamsNode>();
}
core::NodeTypePtr makeLoadParamsNode() {
  return std::make_shared<LoadParamsNode>();
}

}  // namespace gn::nodes
