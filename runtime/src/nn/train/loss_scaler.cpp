#include "loss_scaler.h"

#include <cmath>

#include "gpunodes/nn/layers.h"
#include "gpunodes/nn/optim.h"

namespace gn::nn {

const char* loss_scale_mode_name(LossScaleMode mode) {
  switch (mode) {
    case LossScaleMode::Auto:
      return "auto";
    case LossScaleMode::Dynamic:
      return "dynamic";
    case LossScaleMode::Off:
      return "off";
  }
  return "?";
}

std::optional<LossScaleMode> parse_loss_scale_mode(std::string_view text) {
  for (LossScaleMode m : {LossScaleMode::Auto, LossScaleMode::Dynamic, LossScaleMode::Off})
    if (text == loss_scale_mode_name(m)) return m;
  return std::nullopt;
}

}  // namespace gn::nn

namespace gn::nn::trainer_parts {

LossScaler::LossScaler(Runtime& rt, const LossScaleOptions& options, Precision precision)
    : rt_(rt), options_(options), scale_(options.enabled(precision) ? options.init : 0) {}

std::vector<std::string> LossScaler::problems(const LossScaleOptions& o) {
  std::vector<std::string> out;
  if (!(o.init > 0 && std::isfinite(o.init))) out.push_back("loss_scale_init: must be above 0");
  if (!(o.growth >= 1 && std::isfinite(o.growth))) out.push_back("loss scale growth: must be 1 or more");
  if (!(o.backoff > 0 && o.backoff < 1)) out.push_back("loss scale backoff: must be between 0 and 1");
  if (o.interval < 1) out.push_back("loss_scale_interval: must be at least 1");
  return out;
}

bool LossScaler::unscale(const std::vector<Tensor>& summed, double clip_grad_norm,
                         const std::vector<Device>& devices, std::vector<Tensor>& clip) {
  // Replica 0's norm decides for every replica, identically on every rank. Its sum of squares runs in
  // double: an overflow of the float32 gradients shows as an inf or NaN norm.
  std::vector<Tensor> all;
  for (const Tensor& g : summed)
    if (g.defined()) all.push_back(g);
  const float scaled_norm = all.empty() ? 0.0f : to_host(grad_clip_coefficient(all, 1.0f))[0];
  const double scale = scale_;
  if (!std::isfinite(scaled_norm)) {
    scale_ *= options_.backoff;
    good_steps_ = 0;
    ++skipped_steps_;
    return false;
  }
  if (++good_steps_ >= options_.interval) {
    scale_ *= options_.growth;
    good_steps_ = 0;
  }
  // PyTorch unscales (g / scale) and then clips with the unscaled norm, in float32; one factor does both, to
  // the same floats when the scale is a power of two.
  const float inv = static_cast<float>(1.0 / scale);
  const float norm = scaled_norm * inv;
  float factor = inv;
  if (clip_grad_norm > 0) {
    const float q = static_cast<float>(clip_grad_norm) / (norm + 1e-6f);
    if (q < 1.0f) factor = q * inv;
  }
  clip.assign(devices.size(), Tensor());
  for (size_t r = 0; r < devices.size(); ++r) {
    clip[r] = Tensor(rt_, {2}, devices[r]);
    write_values(clip[r], {norm, factor});
  }
  return true;
}

void LossScaler::restore(const State& state) {
  // A checkpoint of a run with the same settings has a scale exactly when this run scales.
  if (!enabled()) return;
  scale_ = state.scale;
  good_steps_ = state.good_steps;
  skipped_steps_ = state.skipped_steps;
}

}  // namespace gn::nn::trainer_parts
