// The values that flow on the GPU node set's wires. The host sees them only as opaque PortValues.
#pragma once
#include <QString>
#include <memory>
#include <vector>

#include "gpunodes/core/node_type.h"
#include "gpunodes/device.h"
#include "gpunodes/runtime.h"
#include "gpunodes/tensor.h"

namespace gn::nodes {

// A Tensor port's value: a batch of one or more tensors (the seed's run(x) returns a list). Nodes map over it
// element by element, so downstream work on element i waits only for element i.
class TensorBatch final : public core::PortValue {
 public:
  TensorBatch(std::shared_ptr<Runtime> runtime, std::vector<Tensor> tensors)
      : runtime_(std::move(runtime)), tensors_(std::move(tensors)) {}
  const std::vector<Tensor>& tensors() const { return tensors_; }
  size_t size() const { return tensors_.size(); }
  const Tensor& at(size_t i) const { return tensors_.at(i); }
  QString summary() const override;
  qint64 bytes() const override;

 private:
  // Declared first so that it is destroyed last: tensors free their storage through the runtime, and a batch
  // may outlive the run session that made it.
  std::shared_ptr<Runtime> runtime_;
  std::vector<Tensor> tensors_;
};

// A Device port's value (one device) or a Devices port's value (a list, as try_all_gpus returns).
class DeviceValue final : public core::PortValue {
 public:
  explicit DeviceValue(std::vector<Device> devices) : devices_(std::move(devices)) {}
  const std::vector<Device>& devices() const { return devices_; }
  QString summary() const override;

 private:
  std::vector<Device> devices_;
};

// A Scalar port's value: numbers already on the host (a Norm node's log, read back).
class ScalarValue final : public core::PortValue {
 public:
  explicit ScalarValue(std::vector<double> values) : values_(std::move(values)) {}
  const std::vector<double>& values() const { return values_; }
  QString summary() const override;
  qint64 bytes() const override { return qint64(values_.size() * sizeof(double)); }

 private:
  std::vector<double> values_;
};

}  // namespace gn::nodes
